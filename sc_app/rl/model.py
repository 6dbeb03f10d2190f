"""A tiny causal language model: token + position embeddings, pre-norm transformer blocks, tied output."""

from __future__ import annotations

import torch
from torch import nn

from sc_app.config.app import ModelConfig


class TinyCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.n_heads, dim_feedforward=4 * cfg.d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` [B, T] → logits [B, T, V]; position t sees only positions <= t."""
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.tok(tokens) + self.pos(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        x = self.blocks(x, mask=mask, is_causal=True)
        return self.head(self.norm(x))


def response_logprobs(model: nn.Module, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Log-probabilities of the response tokens ``tokens[:, prompt_len:]`` under ``model``: [B, R]."""
    logits = model(tokens[:, :-1])
    logp = torch.log_softmax(logits.float(), dim=-1)
    target = tokens[:, 1:]
    picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return picked[:, prompt_len - 1 :]
