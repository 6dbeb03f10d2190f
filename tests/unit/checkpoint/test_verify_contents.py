"""Verification parses every file with the validator its restore uses: what verifies is what restores.

Each case rewrites one file of a good bundle with content that is *loadable* (a weights-only torch file) but wrong,
and recomputes the manifest's hashes as someone without the HMAC key would. Hashes alone cannot catch it; the test
asserts that verification names the file, and that the restore's own code path refuses the same content (so a file
that verifies is one the restore takes, and one the restore refuses never verifies).
"""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.checkpoint import layout, plan_resume, verify_bundle
from sc_app.checkpoint.manifest import Manifest
from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
from sc_app.data_plane.replay_buffer import TQReplayBuffer
from sc_app.io.digest import sidecar_digest
from sc_app.rl.loader import PromptLoader
from sc_app.rl.model import TinyCausalLM
from sc_app.rl.state_schema import PolicyTemplate, check_model_state, check_optimizer_state, new_optimizer
from tests.support.bundles import CFG, COMPAT, GROUP_SIZE, PARTITION, edit_manifest, make_bundle, reseal

Edit = Callable[[Any], Any]


def _trainer_template() -> PolicyTemplate:
    """What ``TrainerWorker.load`` checks against: the model and optimizer the trainer builds."""
    model = TinyCausalLM(CFG.model)
    return PolicyTemplate.of(model, new_optimizer(model.parameters(), lr=CFG.grpo.learning_rate))


def restore_model(obj: Any, _digest: str) -> None:
    check_model_state(obj, _trainer_template())


def restore_optimizer(obj: Any, _digest: str) -> None:
    check_optimizer_state(obj, _trainer_template())


def restore_loader(obj: Any, _digest: str) -> None:
    PromptLoader().load_state_dict(obj, skip=set())


def restore_sidecar(obj: Any, digest: str) -> None:
    buf = TQReplayBuffer(None, DataPlaneCheckpointBarrier(), partition=PARTITION, group_size=GROUP_SIZE)  # type: ignore[arg-type]
    buf.load_state_dict(obj, expected_digest=digest)


RESTORE: dict[str, Callable[[Any, str], None]] = {
    "policy/model.pt": restore_model,
    "policy/optimizer.pt": restore_optimizer,
    layout.LOADER_FILE: restore_loader,
    layout.SIDECAR_FILE: restore_sidecar,
}


def _set(*path: Any, value: Any) -> Edit:
    def edit(obj: Any) -> Any:
        node = obj
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        return obj

    return edit


def _drop(*path: Any) -> Edit:
    def edit(obj: Any) -> Any:
        node = obj
        for p in path[:-1]:
            node = node[p]
        del node[path[-1]]
        return obj

    return edit


def _resealed_sidecar(edit: Edit) -> Edit:
    def both(sd: Any) -> Any:
        sd = edit(sd)
        sd["digest"] = sidecar_digest(sd)
        return sd

    return both


# file → case → (edit of the loaded object, words the problem must contain)
CASES: dict[str, dict[str, tuple[Edit, str]]] = {
    "policy/model.pt": {
        "not a mapping": (lambda _: [1, 2, 3], "expected a mapping of 'model' and 'version'"),
        "extra top-level key": (_set("extra", value=1), "expected a mapping"),
        "version a string": (_set("version", value="4"), "version '4'"),
        "negative version": (_set("version", value=-1), "version -1"),
        "weight missing": (_drop("model", "head.weight"), "missing head.weight"),
        "unexpected weight": (_set("model", "extra.weight", value=torch.zeros(2)), "unexpected extra.weight"),
        "weight of another shape": (_set("model", "tok.weight", value=torch.zeros(3, 3)), "'tok.weight' is (3, 3)"),
        "weight of another dtype": (
            lambda o: _set("model", "tok.weight", value=o["model"]["tok.weight"].double())(o),
            "torch.float64",
        ),
        "weight not a tensor": (_set("model", "pos.weight", value=[0.0] * 4), "not a tensor"),
    },
    "policy/optimizer.pt": {
        "empty mapping": (lambda _: {}, "expected an optimizer state_dict"),
        "a parameter short": (
            lambda o: _set("param_groups", 0, "params", value=o["param_groups"][0]["params"][:-1])(o),
            "param groups index",
        ),
        "hyperparameter of another kind": (_set("param_groups", 0, "lr", value="fast"), "lr is 'fast'"),
        "hyperparameter missing": (_drop("param_groups", 0, "amsgrad"), "param group 0 holds"),
        "two groups": (lambda o: _set("param_groups", value=o["param_groups"] * 2)(o), "1 group(s)"),
        "state of another shape": (_set("state", 0, "exp_avg", value=torch.zeros(1)), "'exp_avg' of parameter 0"),
        "state for a parameter the model lacks": (
            lambda o: _set("state", 999, value=o["state"][0])(o),
            "parameter 999",
        ),
        "state key missing": (_drop("state", 0, "exp_avg_sq"), "state of parameter 0 holds"),
        "state not a tensor": (_set("state", 0, "exp_avg", value="x"), "not a tensor"),
    },
    layout.LOADER_FILE: {
        "not a mapping": (lambda _: (1, 2), "not a mapping"),
        "schema version": (_set("schema_version", value=2), "schema_version 2"),
        "next_index a string": (_set("next_index", value="5"), "next_index '5'"),
        "next_index negative": (_set("next_index", value=-1), "next_index -1"),
        "reissue not below next_index": (_set("reissue", value=[10_000]), "below next_index"),
        "reissue twice": (lambda o: _set("reissue", value=[o["reissue"][0]] * 2)(o), "twice"),
        "extra key": (_set("extra", value=1), "holds keys"),
    },
    layout.SIDECAR_FILE: {
        "not a mapping": (lambda _: [1], "not a mapping"),
        "schema version": (_set("schema_version", value=7), "schema_version 7"),
        "extra key": (_set("extra", value=1), "holds keys"),
        "record with an extra key": (
            _resealed_sidecar(lambda sd: _set("groups", next(iter(sd["groups"])), "x", value=1)(sd)),
            "is not a {sample_ids, prompt_index, version} record",
        ),
        "sample id of another group": (
            _resealed_sidecar(
                lambda sd: _set("groups", (g := next(iter(sd["groups"]))), "sample_ids", value=["zz:0", f"{g}:1"])(sd)
            ),
            "does not belong to it",
        ),
        "negative prompt index": (
            _resealed_sidecar(lambda sd: _set("groups", next(iter(sd["groups"])), "prompt_index", value=-3)(sd)),
            "prompt_index must be a non-negative integer",
        ),
    },
}

PARAMS = [pytest.param(rel, case, id=f"{rel}:{case}") for rel, cases in CASES.items() for case in cases]


@pytest.mark.parametrize(("rel", "case"), PARAMS)
def test_each_pt_file_is_checked_by_its_restore_validator(tmp_path: Path, rel: str, case: str) -> None:
    older = make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    edit, needle = CASES[rel][case]
    obj = edit(copy.deepcopy(torch.load(bundle / rel, weights_only=True)))
    torch.save(obj, bundle / rel)
    reseal(bundle)
    digest = Manifest(json.loads((bundle / "manifest.json").read_text())).replay_digest

    report = verify_bundle(bundle, expected_compat=COMPAT)
    named = [p for p in report.problems if p.startswith(f"{bundle / rel}:")]
    assert named and any(needle in p for p in named), report.problems
    with pytest.raises(ValueError):  # the restore refuses exactly what verification refused
        RESTORE[rel](torch.load(bundle / rel, weights_only=True), digest)

    plan = plan_resume(tmp_path, expected_compat=COMPAT)
    assert plan.decision == "resume" and plan.bundle == older, "fallback goes on to the older good bundle"


@pytest.mark.parametrize("rel", list(RESTORE))
def test_a_good_bundle_restores_through_the_same_validators(tmp_path: Path, rel: str) -> None:
    bundle = make_bundle(tmp_path, 2)
    report = verify_bundle(bundle, expected_compat=COMPAT)
    assert report.ok and not report.notes, report.problems
    RESTORE[rel](torch.load(bundle / rel, weights_only=True), report.manifest.replay_digest)  # type: ignore[union-attr]


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path(self.marker).write_text, ("unpickled!",))


@pytest.mark.parametrize("rel", list(RESTORE))
@pytest.mark.parametrize("content", ["pickle", "garbage", "empty"])
def test_a_file_that_does_not_load_is_named(tmp_path: Path, rel: str, content: str) -> None:
    bundle = make_bundle(tmp_path, 2)
    marker = tmp_path / "marker"
    data = {
        "pickle": pickle.dumps(_Boom(str(marker))),
        "garbage": b"PK\x03\x04" + b"\x00" * 100,
        "empty": b"",
    }[content]
    (bundle / rel).write_bytes(data)
    reseal(bundle)
    report = verify_bundle(bundle)
    assert any(p.startswith(f"{bundle / rel}:") and "does not load" in p for p in report.problems), report.problems
    assert not marker.exists(), "a pickle reached an unpickler"


def test_sidecar_and_data_plane_must_hold_the_same_rows(tmp_path: Path) -> None:
    """Digests all agree (resealed everywhere) but the sidecar indexes rows the data plane does not hold: the
    restore's inventory check would refuse to start, so verification refuses it first."""
    older = make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    sd = torch.load(bundle / layout.SIDECAR_FILE, weights_only=True)
    sd["groups"].pop(next(iter(sd["groups"])))
    sd["digest"] = sidecar_digest(sd)
    torch.save(sd, bundle / layout.SIDECAR_FILE)
    meta_path = bundle / "data_plane" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["user_metadata"]["digest"] = sd["digest"]
    meta_path.write_text(json.dumps(meta))
    reseal(bundle, lambda d: d["replay"].update(digest=sd["digest"]))
    report = verify_bundle(bundle)
    assert any(p.startswith(f"{bundle / layout.SIDECAR_FILE}:") and "does not list group" in p for p in report.problems)
    assert plan_resume(tmp_path).bundle == older


def test_native_data_plane_verifies_with_a_note_saying_its_pickles_are_unchecked(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2, data_plane="native")
    report = verify_bundle(bundle, expected_compat=COMPAT)
    assert report.ok, report.problems
    assert report.notes and "pickles" in report.notes[0] and "SC_APP_CHECKPOINT_HMAC_KEY" in report.notes[0]
    assert report.as_dict()["notes"] == report.notes


def test_policy_without_a_recorded_model_config_is_a_problem(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    edit_manifest(bundle, lambda d: d.update(compat={k: v for k, v in d["compat"].items() if "model." not in k}))
    report = verify_bundle(bundle)
    assert any("records no model.* config" in p for p in report.problems), report.problems
