"""checkpoint.compat: what a bundle must share with the config that resumes it, across both backends."""

from __future__ import annotations

from pathlib import Path

from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.verify import compat_problems
from sc_app.config.app import load_config

HF = ["model.backend=hf", "model.path=/models/m"]
JSONL = [*HF, "task.name=jsonl", "task.path=/data/d.jsonl"]


def test_a_bundle_cut_before_model_backend_existed_resumes_as_tiny() -> None:
    tiny = compat_of(load_config())
    old = {k: v for k, v in tiny.items() if k != "model.backend"}
    assert compat_problems(old, tiny) == []
    assert compat_problems(old, compat_of(load_config(None, HF))) == [
        "incompatible: model.backend is 'tiny' in the bundle but 'hf' in the config"
    ]


def test_the_backend_cannot_change_under_a_bundle() -> None:
    problems = compat_problems(compat_of(load_config(None, HF)), compat_of(load_config()))
    assert problems[0] == "incompatible: model.backend is 'hf' in the bundle but 'tiny' in the config"


def test_hf_bundles_reshard_and_do_not_care_about_tiny_keys_path_or_dtype() -> None:
    saved = compat_of(load_config(None, [*HF, "trainer.num_workers=2", "trainer.strategy=fsdp"]))
    later = [*HF, "trainer.strategy=ddp", "model.path=/elsewhere", "model.dtype=bfloat16", "model.d_model=32"]
    assert compat_problems(saved, compat_of(load_config(None, later))) == []
    assert not any(k in saved for k in ("model.d_model", "model.vocab_size", "model.path"))


def test_jsonl_bundles_record_the_order_their_loader_place_counts_in() -> None:
    saved = compat_of(load_config(None, JSONL))
    assert saved["task.shuffle"] is True
    assert compat_problems(saved, compat_of(load_config(None, [*JSONL, "task.shuffle=false"]))) == [
        "incompatible: task.shuffle is True in the bundle but False in the config"
    ]


def test_storage_units_bind_only_a_data_plane_that_cannot_reroute() -> None:
    saved = compat_of(load_config(None, ["data_plane.storage_units=2", "ray.num_cpus=16"]))
    assert saved["data_plane.storage_units"] == 2  # still recorded
    fewer = compat_of(load_config())
    assert compat_problems(saved, fewer, reroutes=True) == []
    assert compat_problems(saved, fewer) == [
        "incompatible: data_plane.storage_units is 2 in the bundle but 1 in the config"
    ]
    # every other key still binds a re-routable bundle
    other = compat_of(load_config(None, ["run.seed=3"]))
    assert compat_problems(saved, other, reroutes=True) == [
        "incompatible: run.seed is 0 in the bundle but 3 in the config"
    ]


def test_verify_reroutes_a_streamed_bundle_and_refuses_a_native_one(tmp_path: Path) -> None:
    from sc_app.checkpoint.verify import verify_bundle
    from tests.support.bundles import COMPAT, make_bundle

    other_units = {**COMPAT, "data_plane.storage_units": COMPAT["data_plane.storage_units"] + 1}
    streamed = make_bundle(tmp_path / "s", 2)
    assert verify_bundle(streamed, expected_compat=other_units).ok
    native = make_bundle(tmp_path / "n", 2, data_plane="native")
    assert verify_bundle(native, expected_compat=COMPAT).ok
    report = verify_bundle(native, expected_compat=other_units)
    assert report.verified and not report.ok, "a config mismatch is no defect of the bundle"
    assert report.incompatible == [
        f"incompatible: data_plane.storage_units is {COMPAT['data_plane.storage_units']} in the bundle but "
        f"{other_units['data_plane.storage_units']} in the config"
    ]
