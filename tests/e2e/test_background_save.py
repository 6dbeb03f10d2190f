"""The save runs behind training: the train pump waits only for the window, and every bundle still holds exactly
the state captured in that window — real CLI, real Ray, real TransferQueue, real files.

The disk is made slow on purpose (``SC_APP_FAULT_ACTION=delay`` right after the window), so the train pump trains,
writes advantages onto captured groups and drops them while the snapshot has not read a byte yet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sc_app.checkpoint import verify_bundle
from sc_app.data_plane.streamed_format import iter_groups
from tests.support.proc import load_sidecar, read_trace, run_args, sc_app

pytestmark = pytest.mark.slow
DELAY_S = 3


def test_training_goes_on_while_a_slow_save_writes_the_captured_state(tmp_path: Path) -> None:
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    env = {"SC_APP_FAULT_AT": "save.loader", "SC_APP_FAULT_ACTION": "delay", "SC_APP_FAULT_DELAY_S": str(DELAY_S)}
    res = sc_app(*run_args(ckpt, trace, 6), env=env)
    assert res.rc == 0, res.out[-4000:]

    events = read_trace(trace)
    trained_at = {e["step"]: e["t"] for e in events if e["ev"] == "train"}
    saves = {e["step"]: e for e in events if e["ev"] == "save"}
    assert sorted(saves) == [2, 4, 6]
    for step in (2, 4):  # the train pump did not wait for the slow write
        assert trained_at[step + 1] < saves[step]["t"], f"step {step + 1} waited for the save of step {step}"
    assert trained_at[3] - trained_at[2] < DELAY_S, "the train pump waited out the slow disk"

    for step in (2, 4, 6):
        bundle = ckpt / f"step_{step}"
        report = verify_bundle(bundle)
        assert report.ok, report.problems
        manifest = json.loads((bundle / "manifest.json").read_text())
        # the policy is the one of the saved step, although training went on before its files were written
        assert manifest["trainer_version"] == step
        model = torch.load(bundle / "policy" / "model.pt", map_location="cpu", weights_only=True)
        assert model["version"] == step
        # the data plane holds exactly the captured index: groups dropped after the window are still in it,
        # and the advantages written onto captured groups after the window are not
        sidecar = load_sidecar(bundle / "replay_buffer_metadata.pt")
        groups = {g.group: g for g in iter_groups(bundle / "data_plane")}
        assert set(groups) == set(sidecar["groups"])
        for gid, g in groups.items():
            assert g.ids == list(sidecar["groups"][gid]["sample_ids"])
            assert set(g.data.keys()) == {"tokens", "logprobs", "reward"}, f"{bundle.name}/{gid}"
        assert saves[step]["groups"] == len(groups)
