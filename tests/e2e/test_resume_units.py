"""Resume onto a smaller cluster: a bundle cut with 2 TransferQueue storage units resumes with 1 (real CLI, real
Ray, real TransferQueue in subprocesses).

What a job that lost a node for good does: the retry comes back with fewer units. Run A trains 4 steps with
``data_plane.storage_units=2`` (step_2, step_4); run B resumes it with 1 unit to step 6. Checked: B resumes step_4
(no refusal over the unit count), restores exactly the bundle's rows (its ``start`` trace event against the
sidecar), continues the step counter, exits 0, and every bundle verifies. The bit-for-bit row check, both
directions, is ``tests/integration/data_plane/test_reroute.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import InProcess
from tests.support.proc import load_sidecar, read_trace, run_args, sc_app

pytestmark = pytest.mark.slow

CPUS = ("--set", "ray.num_cpus=16")


def test_a_two_unit_bundle_resumes_with_one_unit(cli: InProcess, tmp_path: Path) -> None:
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    a = sc_app(*run_args(ckpt, trace, 4, "--set", "data_plane.storage_units=2", *CPUS))
    assert a.rc == 0, a.out[-4000:]
    dp = json.loads((ckpt / "step_4" / "data_plane" / "metadata.json").read_text())
    assert len(dp["streams"]) == 2, "run A's snapshot must come from two units (else the resume proves nothing)"
    manifest = json.loads((ckpt / "step_4" / "manifest.json").read_text())
    assert manifest["compat"]["data_plane.storage_units"] == 2
    rows = manifest["replay"]["rows"]
    assert rows > 0, "step_4 holds no rows: the restore would be vacuous"

    b = sc_app(*run_args(ckpt, trace, 6, "--set", "data_plane.storage_units=1", *CPUS))
    assert b.rc == 0, b.out[-4000:]
    assert "resuming from" in b.out and "(step 4)" in b.out, b.out[-3000:]
    assert "done: step 6" in b.out
    starts = [e for e in read_trace(trace) if e["ev"] == "start"]
    assert [s["step"] for s in starts] == [0, 4]
    sidecar = load_sidecar(ckpt / "step_4" / "replay_buffer_metadata.pt")
    assert starts[1]["restored_rows"] == rows == sum(len(g["sample_ids"]) for g in sidecar["groups"].values())
    trained = [e["step"] for e in read_trace(trace) if e["ev"] == "train"]
    assert trained == [1, 2, 3, 4, 5, 6]
    dp6 = json.loads((ckpt / "step_6" / "data_plane" / "metadata.json").read_text())
    assert len(dp6["streams"]) <= 1, "run B's own bundle comes from its single unit"

    verify = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert verify.rc == 0, verify.out
    for name in ("step_2", "step_4", "step_6"):
        assert f"{name}: verified" in verify.out
