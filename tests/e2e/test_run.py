"""End to end through the real CLI in subprocesses (real Ray, real TransferQueue, embedded default).

Three training runs share one checkpoint directory, so the whole file pays for three Ray start-ups:
  A. ``sc-app run --max-steps 6 --set checkpoint.save_period=2`` → step_2, step_4, step_6, hashes match;
  B. a rerun with a far-away ``--max-steps`` resumes from step_6; it is SIGKILLed (whole process group) once a
     newer bundle exists and training has gone past it;
  C. a rerun resumes from the newest complete bundle: step counter, loader position and the restored TransferQueue
     rows are checked against the JSONL trace and the bundle's sidecar.
Corruption tests (truncated / missing file) run on copies of A's bundles and stop before Ray starts.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sc_app.io import hashing
from tests.support.proc import (
    Finished,
    kill_when,
    load_sidecar,
    past_a_new_bundle,
    run_args,
    sc_app,
    start_logged,
    step_bundles,
    trace_runs,
)

pytestmark = pytest.mark.slow

GROUP_SIZE = 8  # grpo.group_size of the embedded default
RUN_TIMEOUT = 300


def tree_state(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under the bundle dirs (step_*, tmp_step_*, quarantine/) with size and sha256."""
    state = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and re.match(r"(step_|tmp_step_|quarantine/)", rel):
            state[rel] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return state


# ------------------------------------------------------------------------------------------------ the runs
@dataclass
class RunA:
    ckpt: Path
    pristine: Path  # copy of A's bundles taken before B touched the directory
    trace: Path
    result: Finished


@dataclass
class KilledAndResumed:
    a: RunA
    b_out: str
    bundle_step: int  # newest complete bundle when B was killed
    b_last_trained: int
    tmp_leftovers: list[str]
    c: Finished
    c_max_steps: int


@pytest.fixture(scope="module")
def run_a(tmp_path_factory: pytest.TempPathFactory) -> RunA:
    base = tmp_path_factory.mktemp("e2e")
    ckpt, trace = base / "ckpt", base / "trace.jsonl"
    result = sc_app(*run_args(ckpt, trace, 6))
    assert result.rc == 0, result.out[-4000:]
    pristine = base / "pristine"
    shutil.copytree(ckpt, pristine)
    return RunA(ckpt, pristine, trace, result)


@pytest.fixture(scope="module")
def killed_and_resumed(run_a: RunA) -> KilledAndResumed:
    ckpt, trace = run_a.ckpt, run_a.trace
    log = trace.with_name("run_b.log")
    proc = start_logged(*run_args(ckpt, trace, 10_000), log=log)
    # mid-training: a newer bundle than A's exists, it holds rows (so the restore check below is not vacuous: a slow
    # generator can leave the index empty right after a train step), and training went on past it
    past = "run B past a new bundle holding rows"
    kill_when(lambda: past_a_new_bundle(trace, 1, 8, holding_rows=True), proc, RUN_TIMEOUT, past, log=log)
    bundles = step_bundles(ckpt)
    bundle_step = max(bundles)
    b_last_trained = max(e["step"] for e in trace_runs(trace)[1] if e["ev"] == "train")
    tmp_leftovers = sorted(p.name for p in ckpt.glob("tmp_step_*"))
    c_max_steps = bundle_step + 3
    c = sc_app(*run_args(ckpt, trace, c_max_steps))
    return KilledAndResumed(run_a, log.read_text(), bundle_step, b_last_trained, tmp_leftovers, c, c_max_steps)


# ------------------------------------------------------------------------------------------------ run A
def test_run_writes_a_bundle_every_save_period(run_a: RunA) -> None:
    out = run_a.result.out
    assert "starting fresh" in out
    for step in range(1, 7):
        assert re.search(rf"^step\s+{step}/6\s+reward [0-9.]+", out, re.M), f"no progress line for step {step}"
    assert sorted(step_bundles(run_a.pristine)) == [2, 4, 6]
    assert not list(run_a.pristine.glob("tmp_step_*")), "a tmp_step_N survived a clean run"
    for step, bundle in step_bundles(run_a.pristine).items():
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
    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(run_a.pristine), timeout=120)
    assert verify.rc == 0, verify.out
    for name in ("step_2", "step_4", "step_6"):
        assert f"{name}: verified" in verify.out


# ------------------------------------------------------------------------------------------------ kill + resume
def test_resume_after_sigkill_picks_newest_complete_bundle(killed_and_resumed: KilledAndResumed) -> None:
    k = killed_and_resumed
    assert "resuming from" in k.b_out and "step_6" in k.b_out, "run B did not resume from run A's step_6"
    assert k.b_last_trained > k.bundle_step, "B was not killed mid-training (nothing trained past the bundle)"
    assert k.c.rc == 0, k.c.out[-4000:]
    m = re.search(r"resuming from (\S+) \(step (\d+)\)", k.c.out)
    assert m, k.c.out[-4000:]
    assert Path(m.group(1)).name == f"step_{k.bundle_step}" and int(m.group(2)) == k.bundle_step
    assert f"done: step {k.c_max_steps}" in k.c.out
    # a save cut by the kill is never resumed: it is moved to quarantine/, not deleted
    ckpt = k.a.ckpt
    assert not list(ckpt.glob("tmp_step_*"))
    for name in k.tmp_leftovers:
        assert f"quarantined {name}" in k.c.out
        assert list((ckpt / "quarantine").glob(f"{name}.*")), f"{name} vanished instead of being quarantined"


def test_step_counter_continues_after_resume(killed_and_resumed: KilledAndResumed) -> None:
    k = killed_and_resumed
    runs = trace_runs(k.a.trace)
    assert len(runs) == 3, [r[0] for r in runs]
    starts = [r[0]["step"] for r in runs]
    assert starts == [0, 6, k.bundle_step]
    for run, start, end in ((runs[1], 6, None), (runs[2], k.bundle_step, k.c_max_steps)):
        steps = [e["step"] for e in run if e["ev"] == "train"]
        assert steps[0] == start + 1, f"first trained step after resuming from step_{start} is {steps[0]}"
        assert steps == list(range(start + 1, start + 1 + len(steps))), "steps repeat or skip"
        if end is not None:
            assert steps[-1] == end
    for line in re.findall(r"^step\s+(\d+)/", k.c.out, re.M):
        assert int(line) > k.bundle_step


def _consumed_before(run: list[dict[str, Any]], bundle_step: int) -> list[int]:
    """Prompts this run trained in steps <= bundle_step, or dropped as stale before training that step."""
    consumed: list[int] = []
    for ev in run:
        if ev["ev"] == "train":
            if ev["step"] > bundle_step:
                break
            consumed.extend(ev["prompts"])
        elif ev["ev"] == "drop_stale":
            consumed.extend(ev["prompts"])
        if ev["ev"] == "train" and ev["step"] == bundle_step:
            break
    return consumed


def test_loader_position_continues_without_repeat_or_gap(killed_and_resumed: KilledAndResumed) -> None:
    k = killed_and_resumed
    runs = trace_runs(k.a.trace)
    resume_steps = [r[0]["step"] for r in runs[1:]] + [None]
    effective: list[list[int]] = []
    for run, cut in zip(runs, resume_steps, strict=True):
        effective.append(_consumed_before(run, cut) if cut is not None else _consumed_before(run, 10**9))

    # no repeat: along the effective history (work lost with a killed run does not count) a prompt is consumed once
    everything = [p for part in effective for p in part]
    repeats = {p: n for p, n in Counter(everything).items() if n > 1}
    assert not repeats, f"prompts trained more than once across resumes: {sorted(repeats)[:10]}"
    assert len(everything) >= 8 * k.c_max_steps

    # no gap: after each resume every index below the highest issued is accounted for
    bundles = {6: k.a.pristine / "step_6", k.bundle_step: k.a.ckpt / f"step_{k.bundle_step}"}
    for i in (1, 2):
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


def test_restored_rows_equal_sidecar_index(killed_and_resumed: KilledAndResumed) -> None:
    k = killed_and_resumed
    runs = trace_runs(k.a.trace)
    bundle = k.a.ckpt / f"step_{k.bundle_step}"
    sidecar = load_sidecar(bundle / "replay_buffer_metadata.pt")
    manifest = json.loads((bundle / "manifest.json").read_text())
    groups = sidecar["groups"]
    assert len(groups) > 0, "bundle holds no rows: the restore check would be vacuous"
    assert runs[2][0]["restored_rows"] == len(groups) * GROUP_SIZE == manifest["replay"]["rows"]
    assert all(len(rec["sample_ids"]) == GROUP_SIZE for rec in groups.values())
    a_sidecar = load_sidecar(k.a.pristine / "step_6" / "replay_buffer_metadata.pt")
    assert runs[1][0]["restored_rows"] == len(a_sidecar["groups"]) * GROUP_SIZE
    restored_prompts = {int(r["prompt_index"]) for r in groups.values()}
    consumed_in_c = {p for e in runs[2] if e["ev"] in ("train", "drop_stale") for p in e["prompts"]}
    assert restored_prompts & consumed_in_c, "no restored group was ever used after resume"


# ------------------------------------------------------------------------------------------------ corrupt bundles
def _corrupt_copy(run_a: RunA, tmp_path: Path, how: str) -> tuple[Path, Path]:
    root = tmp_path / "ckpt"
    shutil.copytree(run_a.pristine, root)
    victim = root / "step_6" / ("policy/optimizer.pt" if how == "truncate" else "replay_buffer_metadata.pt")
    if how == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(victim.stat().st_size // 2)
    else:
        victim.unlink()
    return root, victim


@pytest.mark.parametrize("how", ["truncate", "missing"])
def test_corrupt_bundle_is_named_and_nothing_deleted(run_a: RunA, tmp_path: Path, how: str) -> None:
    root, victim = _corrupt_copy(run_a, tmp_path, how)
    before = tree_state(root)

    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(root), timeout=120)
    assert verify.rc != 0
    assert str(victim) in verify.out, verify.out
    assert "step_6: BAD" in verify.out and "step_4: verified" in verify.out
    assert tree_state(root) == before

    strict = sc_app(*run_args(root, tmp_path / "t.jsonl", 8, "--set", "checkpoint.on_corrupt=strict"), timeout=120)
    assert strict.rc != 0, strict.out
    errors = [line for line in strict.out.splitlines() if line.startswith("sc-app: error:")]
    assert len(errors) == 1, strict.out
    assert str(victim) in errors[0] and "strict" in errors[0], errors[0]
    assert "Traceback" not in strict.out
    assert tree_state(root) == before, "a refused run changed or deleted bundle files"
    assert not (tmp_path / "t.jsonl").exists(), "the refused run started training"


def test_native_snapshot_saves_verify_and_resume(tmp_path: Path) -> None:
    """TransferQueue's own snapshot (data_plane.snapshot=native) writes inside the barrier window, into the tmp dir
    the writer makes for it before the window: bundles publish, verify (with the note that its pickles are taken on
    their sha256) and resume."""
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    native = ("--set", "data_plane.snapshot=native")
    first = sc_app(*run_args(ckpt, trace, 4, *native))
    assert first.rc == 0 and "saved step_4" in first.out, first.out[-3000:]
    assert sorted(step_bundles(ckpt)) == [2, 4] and not list(ckpt.glob("tmp_step_*"))
    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert verify.rc == 0 and "native format" in verify.out, verify.out
    second = sc_app(*run_args(ckpt, trace, 6, *native))
    assert second.rc == 0 and f"resuming from {ckpt / 'step_4'} (step 4)" in second.out, second.out[-3000:]
    assert "done: step 6" in second.out
