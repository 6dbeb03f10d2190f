"""Spare trainer ranks on a real local Ray (``sc_app.attempt.spares``, ``TrainerSpare``): a spare is handed out once
warmed up and becomes a rank in its own process, at its normal priority; one no node can hold is never handed out
and is killed before the job's actors start again; a dead one is dropped. The warm reset that gives a spare a dead
rank's place, with real SIGKILLs, is ``tests/e2e/test_in_job_restore.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from sc_app.attempt.spares import Spares, gcs_state  # noqa: E402
from sc_app.config.app import AppConfig, load_config  # noqa: E402
from sc_app.rl.trainer import SPARE_NICE  # noqa: E402
from tests.support.proc import wait_for  # noqa: E402


def thread_nices(pid: int) -> set[int]:
    """The nice value of every thread of ``pid`` (``/proc/<pid>/task/<tid>/stat``, field 19)."""
    stats = (t.read_text() for t in Path(f"/proc/{pid}/task").glob("*/stat"))
    return {int(st.rsplit(")", 1)[1].split()[16]) for st in stats}


def config(*sets: str) -> AppConfig:
    return load_config(None, ["trainer.spare_ranks=1", *sets])


def test_a_warmed_up_spare_becomes_a_rank_in_its_own_process(local_ray: Any) -> None:
    spares = Spares(config())
    try:
        spares.fill()
        spares.fill()  # already full: no second spare
        assert len(spares.pool) == 1
        (spare,) = spares.pool
        if not ray.wait([spare.ready], timeout=0)[0]:
            assert spares.take() is None and spares.pool == [spare], "warming up: never handed out"
        assert ray.get(spare.ready, timeout=600) == gcs_state(spare.handle)[1], "it warmed up in the GCS's process"
        taken = spares.take()
        assert taken is not None and not spares.pool and spares.take() is None, "handed out once"
        title = Path(f"/proc/{taken.pid}/cmdline").read_bytes()
        assert title.startswith(b"ray::TrainerSpare"), title[:60]
        rank = taken.handle
        assert ray.get(rank.take_rank.remote(0), timeout=60) == taken.pid
        assert ray.get(rank.setup.remote("", 0), timeout=120) == "none", "one rank: no group to form"
        assert ray.get(rank.pid.remote(), timeout=60) == taken.pid, "the rank is the spare's process"
        assert SPARE_NICE not in thread_nices(taken.pid), "only the warm-up's own thread ran at nice 19"
        with pytest.raises(ray.exceptions.RayTaskError, match="trainer rank 0 already"):
            ray.get(rank.take_rank.remote(1), timeout=60)
        ray.kill(rank)
    finally:
        spares.close()


def test_a_spare_no_node_can_hold_is_never_handed_out_and_is_killed_before_actors_start(local_ray: Any) -> None:
    spares = Spares(config('trainer.resources={"no_node_has_this": 1}'))
    try:
        spares.fill()
        (pending,) = spares.pool
        assert spares.take() is None and spares.pool == [pending], "not placed: kept, never handed out"
        spares.drop_unplaced()
        assert not spares.pool
        wait_for(lambda: gcs_state(pending.handle)[0] == "DEAD", 30, "the pending spare killed")
    finally:
        spares.close()


def test_a_dead_spare_is_dropped_and_a_placed_one_kept_before_actors_start(local_ray: Any) -> None:
    spares = Spares(config())
    try:
        spares.fill()
        (spare,) = spares.pool
        ray.get(spare.ready, timeout=600)
        spares.drop_unplaced()
        assert spares.pool == [spare], "a placed spare holds its resources already: kept"
        ray.kill(spare.handle)
        wait_for(lambda: gcs_state(spare.handle)[0] == "DEAD", 30, "the spare's death in the GCS")
        assert spares.take() is None and not spares.pool
    finally:
        spares.close()
