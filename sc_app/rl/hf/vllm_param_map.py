"""Weights at the speed of a copy: a trainer state dict mapped once onto a running vLLM model's own parameters, then
copied into them for every version — no per-layer ``weight_loader``, no re-allocation.

``build`` (once per run, and again only if the trainer's names, shapes or dtypes change) resolves each trainer
tensor through the model's own declaration of its checkpoint layout (``hf_to_vllm_mapper``: a Hugging Face name →
the vLLM parameter and, for a fused one, its shard id: q/k/v of ``qkv_proj``, 0/1 of ``gate_up_proj``) to a row
range of one vLLM parameter, in the shape and dtype vLLM recorded before its kernels processed the weights
(``restore_metadata``, what vLLM's own in-place reload restores). It refuses (``Unmapped``, one line naming what)
unless the map covers every row of every parameter of the engine exactly once and uses every trainer tensor but
the ones vLLM's own loader drops (a tied ``lm_head``, rotary caches): quantized models, tensor/pipeline
parallelism, a model without the mapper, or any name or shape the map does not explain. The caller then falls
back to vLLM's ``reload_weights``.

``ParamMap.load`` (per version) ``copy_``s every piece into its destination, converting dtype on the way. The
destination is the live parameter when the engine computes with it (GPU: unquantized linear layers compute on
their parameter, so a version is one ``copy_`` per tensor into addresses CUDA graphs hold), or a staging tensor
allocated once where the kernel took a packed copy of the weight and emptied the parameter (vLLM's CPU linear
layers, oneDNN). Every layer written to then gets its quantization method's ``process_weights_after_loading``
again — the same step vLLM's reload ends with; on CPU that re-packs the layer from the staging tensor (the packing
is a copy of the same bytes, so CPU sync is bounded by two copies), on GPU it does nothing for unquantized layers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

# trainer tensors vLLM's own loaders drop: rotary caches (recomputed), the output projection of a tied model
_DROPPED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
_QKV_SHARDS = {"q": 0, "k": 1, "v": 2}


class Unmapped(Exception):
    """The fast map cannot cover this model/state dict; ``str()`` is one line naming why."""


@dataclass(frozen=True)
class Piece:
    source: str  # trainer name
    start: int  # first row of the destination (dim 0)
    rows: int


@dataclass
class Target:
    module: torch.nn.Module
    attr: str  # the parameter's name on ``module``
    name: str  # its full name in the vLLM model
    shape: tuple[int, ...]
    dtype: torch.dtype
    pieces: list[Piece] = field(default_factory=list)
    packed: bool = False  # the kernel holds a packed copy and emptied the live parameter (vLLM CPU linear)
    pad_from: int | None = None  # a padded vocabulary: rows from here on are zeros (as vLLM's loader leaves them)


def signature(weights: Mapping[str, torch.Tensor]) -> tuple[tuple[str, tuple[int, ...], torch.dtype], ...]:
    return tuple((k, tuple(v.shape), v.dtype) for k, v in weights.items())


@dataclass
class ParamMap:
    targets: list[Target]  # in model order
    reprocess: list[torch.nn.Module]  # layers holding a written live parameter (tied aliases too), in model order
    dropped: tuple[str, ...]  # trainer names not loaded (as vLLM's own loader drops them)
    key: tuple[Any, ...]  # the ``signature`` of the state dict it was built for
    staging: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict)  # (shape, dtype, device) → buffer
    last_seconds: dict[str, float] = field(default_factory=dict)  # the last load's phases (the bench reads them)

    @torch.no_grad()
    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy one version into the engine: every live parameter, then each packed layer through one staging
        tensor per shape (copy, re-pack), then ``process_weights_after_loading`` of every other written layer."""
        t0 = time.perf_counter()
        packed = []
        for t in self.targets:
            if t.packed:
                packed.append(t)
            else:
                _fill(t.module._parameters[t.attr], t, weights)
        seconds = {"copy": time.perf_counter() - t0, "repack": 0.0}
        for t in packed:
            self._repack(t, weights, seconds)
        t1 = time.perf_counter()
        for module in self.reprocess:
            _process(module)
        seconds["process"] = time.perf_counter() - t1
        self.last_seconds = seconds

    def _repack(self, t: Target, weights: Mapping[str, torch.Tensor], seconds: dict[str, float]) -> None:
        """One packed layer: its weight from the trainer's tensor as it is where that is the whole weight in the
        engine's dtype, else through a staging tensor (one per shape, reused); then the kernel packs it again."""
        t0 = time.perf_counter()
        kernel = t.module._parameters[t.attr]
        src = weights[t.pieces[0].source] if len(t.pieces) == 1 else None
        key = (t.shape, t.dtype, kernel.device)
        if src is not None and tuple(src.shape) == t.shape and src.dtype == t.dtype and src.device == kernel.device:
            weight = src.detach().contiguous()
        else:
            weight = self.staging.get(key)
            if weight is None:
                weight = self.staging[key] = torch.empty(t.shape, dtype=t.dtype, device=kernel.device)
            _fill(weight, t, weights)
        t1 = time.perf_counter()
        t.module._parameters[t.attr] = torch.nn.Parameter(weight, requires_grad=False)
        _process(t.module)
        processed = t.module._parameters[t.attr]
        if processed is not None and processed.data_ptr() == weight.data_ptr():
            # this kernel computes on the parameter itself: give it a buffer of its own, live from now on
            t.module._parameters[t.attr] = torch.nn.Parameter(weight.clone(), requires_grad=False)
            t.packed = False
            self.staging.pop(key, None)
        elif processed is not None and processed.shape == kernel.shape:
            kernel.data.copy_(processed)  # keep the parameter object vLLM had (references to it stay valid)
            t.module._parameters[t.attr] = kernel
        seconds["copy"] += t1 - t0
        seconds["repack"] += time.perf_counter() - t1


def _fill(dest: torch.Tensor, t: Target, weights: Mapping[str, torch.Tensor]) -> None:
    if len(t.pieces) == 1 and (not t.shape or t.pieces[0].rows == t.shape[0]):
        dest.copy_(weights[t.pieces[0].source])
        return
    for p in t.pieces:
        dest[p.start : p.start + p.rows].copy_(weights[p.source])
    if t.pad_from is not None:
        dest[t.pad_from :].zero_()


def _process(module: torch.nn.Module) -> None:
    method = getattr(module, "quant_method", None)
    if method is None:
        return
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    if isinstance(method, QuantizeMethodBase):
        method.process_weights_after_loading(module)


def _recorded(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters as vLLM recorded them before processing (meta tensors), where it did."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:  # another vLLM: nothing recorded, the live shapes are all there is
        return {}
    info = LAYERWISE_INFO.get(module)
    return dict(info.restore_metadata[0]) if info is not None else {}


def _check_config(vllm_config: Any) -> None:
    model_config, parallel = vllm_config.model_config, vllm_config.parallel_config
    if getattr(model_config, "quantization", None) is not None:
        raise Unmapped(f"quantization {model_config.quantization}")
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(parallel, key, 1) != 1:
            raise Unmapped(f"{key}={getattr(parallel, key)}")
    if getattr(vllm_config, "lora_config", None) is not None:
        raise Unmapped("LoRA")


def _destinations(model: torch.nn.Module) -> tuple[dict[str, Target], dict[int, list[torch.nn.Module]]]:
    """Every parameter of the model once (by identity: a tied one under its first name), and for each parameter
    every module that holds it (a tied output projection is re-processed with its embedding)."""
    targets: dict[str, Target] = {}
    holders: dict[int, list[torch.nn.Module]] = {}
    seen: set[int] = set()
    for mname, module in model.named_modules():
        recorded = _recorded(module)
        for attr, live in module._parameters.items():
            if live is None:
                continue
            meta = recorded.get(attr)
            ref = meta if meta is not None and meta.numel() >= live.numel() else live
            key = id(live)
            holders.setdefault(key, []).append(module)
            if key in seen:
                continue
            seen.add(key)
            full = f"{mname}.{attr}" if mname else attr
            targets[full] = Target(module, attr, full, tuple(ref.shape), ref.dtype)
    return targets, holders


def _place(target: Target, source: str, tensor: torch.Tensor, shard: Any) -> Piece:
    rows = tuple(tensor.shape)
    if shard is None:
        vocab = getattr(target.module, "org_vocab_size", None)  # a vocabulary vLLM pads (embedding, lm_head)
        if rows != target.shape and not (rows[:1] == (vocab,) and rows[1:] == target.shape[1:]):
            raise Unmapped(f"{source} {list(rows)} does not match {target.name} {list(target.shape)}")
        return Piece(source, 0, rows[0] if rows else 1)
    sizes = getattr(target.module, "output_sizes", None)
    index = _QKV_SHARDS.get(shard, shard) if isinstance(shard, str) else shard
    if sizes is None or not isinstance(index, int) or not 0 <= index < len(sizes):
        raise Unmapped(f"{source}: shard {shard!r} of {target.name} has no known offset")
    start, size = sum(sizes[:index]), sizes[index]
    if rows[:1] != (size,) or rows[1:] != target.shape[1:]:
        raise Unmapped(f"{source} {list(rows)} does not fit shard {shard!r} of {target.name} {list(target.shape)}")
    return Piece(source, start, size)


def build(model: torch.nn.Module, vllm_config: Any, weights: Mapping[str, torch.Tensor]) -> ParamMap:
    """The map of ``weights`` (names, shapes, dtypes) onto ``model``; ``Unmapped`` if it does not cover both."""
    _check_config(vllm_config)
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None or not hasattr(mapper, "_map_name_with_shard"):
        raise Unmapped(f"{type(model).__name__} declares no hf_to_vllm_mapper")
    tied = bool(getattr(vllm_config.model_config.hf_config, "tie_word_embeddings", False))
    targets, holders = _destinations(model)
    dropped = []
    for source, tensor in weights.items():
        mapped = mapper._map_name_with_shard(source)
        if mapped is None or source.endswith(_DROPPED_SUFFIXES) or (tied and source.startswith("lm_head.")):
            dropped.append(source)
            continue
        name, shard = mapped
        target = targets.get(name)
        if target is None:
            raise Unmapped(f"{source} (as {name}) is no parameter of the engine's {type(model).__name__}")
        if isinstance(shard, list):
            raise Unmapped(f"{source} loads into several shards of {name}")
        target.pieces.append(_place(target, source, tensor, shard))
    for target in targets.values():
        rows = sorted((p.start, p.rows) for p in target.pieces)
        expected = target.shape[0] if target.shape else 1
        covered = 0
        for start, n in rows:
            if start != covered:
                raise Unmapped(f"rows {covered}-{start} of {target.name} have no trainer tensor")
            covered += n
        if rows and covered < expected and covered == getattr(target.module, "org_vocab_size", None):
            target.pad_from = covered
        elif covered != expected:
            missing = "no trainer tensor" if not rows else f"rows {covered}-{expected} have no trainer tensor"
            raise Unmapped(f"{target.name}: {missing}")
    order = {id(m): i for i, m in enumerate(model.modules())}
    written: dict[int, torch.nn.Module] = {}
    for target in targets.values():
        live = target.module._parameters[target.attr]
        target.packed = tuple(live.shape) != target.shape
        for module in holders[id(live)]:
            written[id(module)] = module
    for target in targets.values():  # a packed layer is re-processed once, by ``_repack`` (its bias filled before)
        if target.packed:
            written.pop(id(target.module), None)
    return ParamMap(
        targets=list(targets.values()),
        reprocess=sorted(written.values(), key=lambda m: order[id(m)]),
        dropped=tuple(dropped),
        key=signature(weights),
    )
