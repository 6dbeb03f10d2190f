"""End to end through the real CLI in subprocesses (real Ray, real TransferQueue, embedded default).

The suite's shared interrupted run (``interrupted_run``, ``tests/support/interrupted.py``) is checked here for what
a resume must keep: A writes step_2 and step_4 and their hashes match; B resumes from step_4 and is SIGKILLed
(whole session) once a newer bundle exists and training has gone past it; C resumes from the newest complete bundle
(B's cut save quarantined) and is stopped by SIGTERM; D resumes from C's emergency bundle and finishes. Step
counter, loader position and the restored TransferQueue rows are checked against the JSONL trace and the bundles'
sidecars at each resume.
Corruption tests (truncated / missing file) run on copies of A's bundles and stop before Ray starts (in this
process: the ``cli`` fixture, like every ``ckpt verify`` here); the native snapshot test runs a job of its own
(another snapshot format).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sc_app.io import hashing
from tests.support.cli import InProcess
from tests.support.interrupted import Interrupted, resumed_from, trace_of
from tests.support.proc import load_sidecar, run_args, sc_app, step_bundles

pytestmark = pytest.mark.slow

GROUP_SIZE = 8  # grpo.group_size of the embedded default


def tree_state(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under the bundle dirs (step_*, tmp_step_*, quarantine/) with size and sha256."""
    state = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and re.match(r"(step_|tmp_step_|quarantine/)", rel):
            state[rel] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return state


# ------------------------------------------------------------------------------------------------ run A
def test_run_writes_a_bundle_every_save_period(cli: InProcess, interrupted_run: Interrupted) -> None:
    out = interrupted_run.outs["A"]
    pristine = interrupted_run.pristine
    assert "starting fresh" in out
    for step in range(1, 5):
        assert re.search(rf"^step\s+{step}/4\s+reward [0-9.]+", out, re.M), f"no progress line for step {step}"
    assert sorted(step_bundles(pristine)) == [2, 4]
    assert not list(pristine.glob("tmp_step_*")), "a tmp_step_N survived a clean run"
    for step, bundle in step_bundles(pristine).items():
        manifest = json.loads((bundle / "manifest.json").read_text())
        assert manifest["step"] == step
        on_disk = {
            p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file() and p.name != "manifest.json"
        }
        assert set(manifest["files"]) == on_disk
        for rel in ("train_dataloader.pt", "replay_buffer_metadata.pt", "data_plane/metadata.json"):
            assert rel in on_disk, f"{bundle.name} lacks {rel}"
        assert any(r.startswith("policy/") for r in on_disk)
        for rel, info in manifest["files"].items():
            data = (bundle / rel).read_bytes()
            assert len(data) == info["size"], f"{bundle.name}/{rel}: size differs from manifest"
            alg = manifest["hash_alg"]  # schema 2: every file digest by the manifest's own algorithm
            assert hashing.digest_bytes(data, alg) == info["digest"], f"{bundle.name}/{rel}: {alg} differs"
        dp = json.loads((bundle / "data_plane/metadata.json").read_text())
        sidecar = load_sidecar(bundle / "replay_buffer_metadata.pt")
        assert dp["user_metadata"]["digest"] == sidecar["digest"] == manifest["replay"]["digest"]
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(pristine))
    assert verify.rc == 0, verify.out
    for name in ("step_2", "step_4"):
        assert f"{name}: verified" in verify.out


# ------------------------------------------------------------------------------------------------ kill + resume
def test_resume_after_sigkill_picks_newest_complete_bundle(interrupted_run: Interrupted) -> None:
    k = interrupted_run
    assert "resuming from" in k.outs["B"] and "step_4" in k.outs["B"], "run B did not resume from run A's step_4"
    assert k.b_last_trained > k.bundle_step, "B was not killed mid-training (nothing trained past the bundle)"
    assert resumed_from(k.outs["C"]) == (f"step_{k.bundle_step}", k.bundle_step)
    assert f"done: step {k.final}" in k.outs["D"]
    # a save cut by the kill is never resumed: it is moved to quarantine/, not deleted
    assert k.tmp_leftovers, "B's hung save left no tmp dir"
    assert not list(k.ckpt.glob("tmp_step_*"))
    for name in k.tmp_leftovers:
        assert f"quarantined {name}" in k.outs["C"]
        assert list((k.ckpt / "quarantine").glob(f"{name}.*")), f"{name} vanished instead of being quarantined"


def test_step_counter_continues_after_resume(interrupted_run: Interrupted) -> None:
    k = interrupted_run
    runs = trace_of(k)
    assert [r[0]["step"] for r in runs] == [0, 4, k.bundle_step, k.stopped_at]
    spans = ((runs[1], 4, None), (runs[2], k.bundle_step, k.stopped_at), (runs[3], k.stopped_at, k.final))
    for run, start, end in spans:
        steps = [e["step"] for e in run if e["ev"] == "train"]
        assert steps[0] == start + 1, f"first trained step after resuming from step_{start} is {steps[0]}"
        assert steps == list(range(start + 1, start + 1 + len(steps))), "steps repeat or skip"
        if end is not None:
            assert steps[-1] == end
    for out, after in ((k.outs["C"], k.bundle_step), (k.outs["D"], k.stopped_at)):
        for line in re.findall(r"^step\s+(\d+)/", out, re.M):
            assert int(line) > after


def _consumed_before(run: list[dict[str, Any]], bundle_step: int, *, emergency: bool = False) -> list[int]:
    """Prompts this run trained in steps <= bundle_step, or dropped as stale before the bundle was captured.

    A periodic bundle is captured right after its step trains, before the next step's sampler drops stale groups:
    drops logged after that step belong to the next one. An ``emergency`` bundle (a stop request) is captured after
    the sampler's last pass, so every drop logged after its step's train belongs to it (the bundle's index no longer
    holds those groups and its loader place is past them)."""
    consumed: list[int] = []
    for n, ev in enumerate(run):
        if ev["ev"] == "train" and ev["step"] > bundle_step:
            break
        if ev["ev"] in ("train", "drop_stale"):
            consumed.extend(ev["prompts"])
        if ev["ev"] == "train" and ev["step"] == bundle_step:
            if emergency:
                consumed.extend(p for later in run[n + 1 :] if later["ev"] == "drop_stale" for p in later["prompts"])
            break
    return consumed


def resumed_bundles(k: Interrupted) -> dict[int, Path]:
    """The bundle each of B, C and D resumed from, by step (every bundle is kept: ``checkpoint.keep=100``)."""
    return {4: k.pristine / "step_4", k.bundle_step: k.ckpt / f"step_{k.bundle_step}"} | {
        k.stopped_at: k.ckpt / f"step_{k.stopped_at}"
    }


def test_loader_position_continues_without_repeat_or_gap(interrupted_run: Interrupted) -> None:
    k = interrupted_run
    runs = trace_of(k)
    resume_steps = [r[0]["step"] for r in runs[1:]] + [None]
    assert k.stopped_at > k.bundle_step, "C's stop left no emergency bundle for D to resume from"
    emergency = [False, False, True, False]  # C's bundle (D's resume point) is its stop's emergency bundle
    effective = [
        _consumed_before(run, 10**9 if cut is None else cut, emergency=em)
        for run, cut, em in zip(runs, resume_steps, emergency, strict=True)
    ]

    # no repeat: along the effective history (work lost with a killed run does not count) a prompt is consumed once
    everything = [p for part in effective for p in part]
    repeats = {p: n for p, n in Counter(everything).items() if n > 1}
    assert not repeats, f"prompts trained more than once across resumes: {sorted(repeats)[:10]}"
    assert len(everything) >= 8 * k.final

    # no gap: after each resume every index below the highest issued is accounted for
    bundles = resumed_bundles(k)
    for i in (1, 2, 3):
        start_step = runs[i][0]["step"]
        held = {
            int(rec["prompt_index"])
            for rec in load_sidecar(bundles[start_step] / "replay_buffer_metadata.pt")["groups"].values()
        }
        before = {p for part in effective[:i] for p in part}
        issued = {p for ev in runs[i] if ev["ev"] == "issue" for p in ev["prompts"]}
        assert issued, f"run {i} issued nothing"
        assert not held & before, "a prompt consumed before the bundle is also held in its index"
        assert not issued & held, "a prompt held in the restored index was issued again (would be committed twice)"
        assert not issued & before, "a prompt consumed before the bundle was issued again"
        missing = sorted(set(range(max(issued))) - before - held - issued)
        assert not missing, f"run {i}: prompts silently skipped after resume: {missing[:20]}"
        trained_here = [p for ev in runs[i] if ev["ev"] == "train" for p in ev["prompts"]]
        assert set(trained_here) <= held | issued


def test_restored_rows_equal_sidecar_index(interrupted_run: Interrupted) -> None:
    """Each of the three resumes restored exactly the rows its bundle's index lists, and used them. Whether a bundle
    holds rows depends on how far generation ran ahead when it was cut: at least one of the three must."""
    k = interrupted_run
    runs = trace_of(k)
    bundles = resumed_bundles(k)
    held_any = False
    for run in runs[1:]:
        bundle = bundles[run[0]["step"]]
        groups = load_sidecar(bundle / "replay_buffer_metadata.pt")["groups"]
        manifest = json.loads((bundle / "manifest.json").read_text())
        assert run[0]["restored_rows"] == len(groups) * GROUP_SIZE == manifest["replay"]["rows"], bundle.name
        assert all(len(rec["sample_ids"]) == GROUP_SIZE for rec in groups.values())
        restored_prompts = {int(r["prompt_index"]) for r in groups.values()}
        consumed = {p for e in run if e["ev"] in ("train", "drop_stale") for p in e["prompts"]}
        assert not groups or restored_prompts & consumed, f"no group restored from {bundle.name} was ever used"
        held_any = held_any or bool(groups)
    assert held_any, "no resumed bundle held rows: the restore checks would be vacuous"


# ------------------------------------------------------------------------------------------------ corrupt bundles
def _corrupt_copy(run: Interrupted, tmp_path: Path, how: str) -> tuple[Path, Path]:
    root = tmp_path / "ckpt"
    shutil.copytree(run.pristine, root)
    victim = root / "step_4" / ("policy/optimizer.pt" if how == "truncate" else "replay_buffer_metadata.pt")
    if how == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(victim.stat().st_size // 2)
    else:
        victim.unlink()
    return root, victim


@pytest.mark.parametrize("how", ["truncate", "missing"])
def test_corrupt_bundle_is_named_and_nothing_deleted(
    cli: InProcess, interrupted_run: Interrupted, tmp_path: Path, how: str
) -> None:
    root, victim = _corrupt_copy(interrupted_run, tmp_path, how)
    before = tree_state(root)

    verify = cli("ckpt", "verify", "--checkpoint-dir", str(root))
    assert verify.rc != 0
    assert str(victim) in verify.out, verify.out
    assert "step_4: BAD" in verify.out and "step_2: verified" in verify.out
    assert tree_state(root) == before

    strict = cli(*run_args(root, tmp_path / "t.jsonl", 8, "--set", "checkpoint.on_corrupt=strict"))  # before Ray
    assert strict.rc != 0, strict.out
    errors = [line for line in strict.out.splitlines() if line.startswith("sc-app: error:")]
    assert len(errors) == 1, strict.out
    assert str(victim) in errors[0] and "strict" in errors[0], errors[0]
    assert "Traceback" not in strict.out
    assert tree_state(root) == before, "a refused run changed or deleted bundle files"
    assert not (tmp_path / "t.jsonl").exists(), "the refused run started training"


def test_native_snapshot_saves_verify_and_resume(cli: InProcess, tmp_path: Path) -> None:
    """TransferQueue's own snapshot (data_plane.snapshot=native) writes inside the barrier window, into the tmp dir
    the writer makes for it before the window: bundles publish, verify (with the note that its pickles are taken on
    their sha256) and resume."""
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    native = ("--set", "data_plane.snapshot=native")
    first = sc_app(*run_args(ckpt, trace, 4, *native))
    assert first.rc == 0 and "saved step_4" in first.out, first.out[-3000:]
    assert sorted(step_bundles(ckpt)) == [2, 4] and not list(ckpt.glob("tmp_step_*"))
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert verify.rc == 0 and "native format" in verify.out, verify.out
    second = sc_app(*run_args(ckpt, trace, 6, *native))
    assert second.rc == 0 and f"resuming from {ckpt / 'step_4'} (step 4)" in second.out, second.out[-3000:]
    assert "done: step 6" in second.out
