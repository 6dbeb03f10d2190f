"""What a bundle is checked against is built once per process and config, and the driver builds it ahead, once the
first bundle landed: a restore's re-plan (which checks the newest bundle) then finds it built. The checkers key it by
what a manifest records (tiny: ``compat``'s ``model.*``; hf: the bundle's copy of ``config.json``), so the template
built from the run's config is the one a check of its bundles uses."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from sc_app.attempt import cluster_job
from sc_app.attempt.cluster_job import ClusterJob
from sc_app.checkpoint.compat import compat_of
from sc_app.config.app import AppConfig
from sc_app.io import strict_json
from sc_app.progress import SaveRecord, StepRecord
from sc_app.rl import state_schema
from sc_app.rl.factory import prepare_policy_check


def test_the_tiny_template_prepared_from_the_config_is_the_one_a_manifest_s_compat_finds() -> None:
    state_schema._template.cache_clear()
    cfg = AppConfig()
    prepare_policy_check(cfg)
    recorded = json.loads(json.dumps(compat_of(cfg)))  # as a manifest holds it
    before = state_schema._template.cache_info()
    template = state_schema.template_for(state_schema.model_keys_of(recorded))
    after = state_schema._template.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses), "the check built it again"
    assert template.state_keys == {"step", "exp_avg", "exp_avg_sq"}
    other = AppConfig.model_validate({"model": {"d_model": cfg.model.d_model * 2}})
    assert state_schema.template_for(state_schema.model_keys_of(compat_of(other))) is not template


def test_the_hf_template_prepared_from_the_model_directory_is_the_one_the_bundle_s_config_finds(
    tmp_path: Path,
) -> None:
    from sc_app.rl.hf import policy_check

    config = {
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(config, indent=1))  # the model directory's own layout
    cfg = SimpleNamespace(model=SimpleNamespace(backend="hf", path=str(tmp_path)))
    policy_check._model_template.cache_clear()
    prepare_policy_check(cfg)  # type: ignore[arg-type]
    in_bundle = strict_json.parse(json.dumps(config).encode())  # the bundle's policy/hf/config.json, parsed
    state, params = policy_check.model_template(in_bundle)
    info = policy_check._model_template.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    assert state["lm_head.weight"] == (64, 32) and "model.embed_tokens.weight" in params


def save(step: int, emergency: bool = False) -> SaveRecord:
    return SaveRecord(step, f"step_{step}", 0.1, 0.0, 0.0, 1, 0, emergency=emergency)


def job(monkeypatch: pytest.MonkeyPatch, restores: int, fails: bool = False) -> tuple[ClusterJob, list[int]]:
    built: list[int] = []

    def prepare(cfg: AppConfig) -> None:
        built.append(cfg.run.max_in_job_restores)
        if fails:
            raise FileNotFoundError("config.json")

    monkeypatch.setattr(cluster_job, "prepare_policy_check", prepare)
    cfg = AppConfig.model_validate({"run": {"max_in_job_restores": restores}})
    attempt = SimpleNamespace(cfg=cfg, calls=SimpleNamespace(on_progress=lambda record: None))
    return ClusterJob(attempt, lambda: False, lambda *_: (None, None)), built


def test_the_driver_prepares_the_check_once_after_the_first_bundle_landed(monkeypatch: pytest.MonkeyPatch) -> None:
    driven, built = job(monkeypatch, restores=3)
    driven._progress(StepRecord(1, 0.5, 0.1, 0.0, 0, 1.0))
    assert built == [], "before a bundle there is nothing a restore would check"
    driven._progress(save(2, emergency=True))
    assert built == [], "a stop's bundle ends the run: no restore follows it"
    driven._progress(save(4))
    driven._progress(save(6))
    assert built == [3]


def test_no_preparing_without_in_job_restores_and_a_failure_is_not_the_run_s(monkeypatch: pytest.MonkeyPatch) -> None:
    driven, built = job(monkeypatch, restores=0)
    driven._progress(save(2))
    assert built == []
    driven, built = job(monkeypatch, restores=1, fails=True)
    driven._progress(save(2))  # no exception: the check reports a bad config where it matters
    driven._progress(save(4))
    assert built == [1]
