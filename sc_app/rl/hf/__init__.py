"""The Hugging Face backend (``model.backend: hf``): a local HF causal LM, your JSONL data and reward, generation
behind an engine interface, data-parallel (DDP) or sharded (FSDP2) trainers, and sharded policy checkpoints with
``torch.distributed.checkpoint`` that reshard on load.

One job per module: ``errors`` (the one base of every input problem), ``model_dir`` (check and load a local model
directory; nothing is ever downloaded), ``dataset`` (JSONL prompts with an exact index → row mapping and a content
hash), ``rewards`` (built-ins and ``package.module:function``), ``inputs`` (what a run checks before Ray starts),
``chat`` (chat template + padding), ``tasks`` (prompts and rewards in token space), ``logprobs`` (the one
log-probability function generation and training share), ``engine`` (the generation-engine interface and its
``generate()`` implementation), ``engine_factory`` (which engine a worker holds), ``vllm_engine`` /
``vllm_weights`` (the vLLM engine and the worker extension its weight transports land in; the transports themselves
are ``sc_app.rl.weight_sync``),
``parallel`` (DDP / FSDP2 wrapping), ``policy_ckpt`` (sharded save/load with
verified reads), ``trainer`` (the trainer side), ``backend`` (both behind ``sc_app.rl.backend``'s
interfaces), ``export`` (bundle → Hugging Face directory), ``random_model`` (a tiny random model + tokenizer built
locally for tests, benchmarks and smoke runs).

Importing this package does not import ``transformers``; its modules do.
"""
