"""The vLLM engine's pure parts: per-request seeds and the one-line start-up error (no engine started)."""

from __future__ import annotations

from sc_app.rl.hf.vllm_engine import _cause, _hint, request_seed


def test_a_request_seed_is_a_function_of_run_seed_prompt_index_and_version() -> None:
    base = request_seed(0, 5, 3)
    assert base == request_seed(0, 5, 3)
    assert len({base, request_seed(1, 5, 3), request_seed(0, 6, 3), request_seed(0, 5, 4)}) == 4
    assert all(0 <= request_seed(s, i, v) < 2**62 for s in range(3) for i in range(50) for v in range(5))


def test_the_cause_is_the_innermost_error_on_one_line() -> None:
    try:
        try:
            raise NotImplementedError("Unsupported CPU attention configuration: head_dim=16\nmore detail")
        except NotImplementedError as inner:
            raise RuntimeError("Engine core initialization failed. See root cause above.") from inner
    except RuntimeError as exc:
        cause = _cause(exc)
    assert cause == "NotImplementedError: Unsupported CPU attention configuration: head_dim=16"
    assert "generation.engine=hf" in _hint(cause)
    assert "gpu_memory_utilization" in _hint("ValueError: No available memory for the cache blocks")
    assert "does not support this model" in _hint("ValueError: Model architectures ['Foo'] are not supported")
