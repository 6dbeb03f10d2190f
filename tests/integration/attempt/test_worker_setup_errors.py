"""A worker's bad input at set-up reaches ``sc-app run`` as itself (a real local Ray carries the real exception).

The set-up awaits the workers' ``setup`` calls through ``worker_results``; a worker that cannot run the configured
model (``VLLMStartError`` from ``start_llm``, ``tests/integration/rl/hf/test_vllm_engine.py``), dataset or reward
raises an ``InputError``, and ``sc-app run`` must end with exit 2 and that one line, never Ray's wrapped traceback
and never the exit 1 of a failed job. Any other worker error stays Ray's (a defect, or a fault the in-job restore
handles)."""

from __future__ import annotations

from typing import Any

import pytest

ray = pytest.importorskip("ray")

from sc_app.attempt.setup import worker_results  # noqa: E402
from sc_app.exits import EXIT_BAD_INPUT, exit_for  # noqa: E402
from sc_app.rl.hf.vllm_engine import VLLMStartError  # noqa: E402

LINE = (
    "generation.engine=vllm cannot start model /models/head16: RuntimeError: Unsupported CPU attention "
    "configuration: head_dim=16; use generation.engine=hf"
)


@ray.remote(num_cpus=0)
class Worker:
    def setup(self, outcome: str) -> str:
        if outcome == "bad input":
            raise VLLMStartError(LINE)
        if outcome == "defect":
            raise KeyError("a defect")
        return "ready"


def test_a_workers_bad_input_is_raised_as_itself_and_ends_the_run_with_exit_2_and_its_line(local_ray: Any) -> None:
    workers = [Worker.remote(), Worker.remote()]
    assert worker_results([w.setup.remote("ok") for w in workers]) == ["ready", "ready"]
    with pytest.raises(VLLMStartError) as caught:
        worker_results([workers[0].setup.remote("ok"), workers[1].setup.remote("bad input")])
    assert type(caught.value) is VLLMStartError and str(caught.value) == LINE
    ended = exit_for(caught.value)
    assert ended is not None and (ended.code, ended.message) == (EXIT_BAD_INPUT, LINE)


def test_any_other_worker_error_stays_rays(local_ray: Any) -> None:
    with pytest.raises(ray.exceptions.RayTaskError) as caught:
        worker_results([Worker.remote().setup.remote("defect")])
    assert isinstance(caught.value.cause, KeyError) and exit_for(caught.value) is None
