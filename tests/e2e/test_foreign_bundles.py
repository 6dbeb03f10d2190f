"""A bundle copied in from another job (another lineage), newer than the directory's own: every command that uses
bundles refuses it — ``run`` and ``preflight`` do not resume it, ``export`` does not export it, ``ckpt list`` and
``ckpt verify`` call it BAD, ``ckpt prune`` neither deletes nor counts it. ``sc-app``'s ``main`` in this process (the
``cli`` fixture), real bundles (``tests.support.bundles``), no Ray: every refusal happens before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sc_app.checkpoint.lineage import ensure_lineage
from sc_app.config.app import dump_config
from tests.support.bundles import CFG, make_bundle, tree
from tests.support.cli import InProcess

OURS, THEIRS = "lin-ours", "lin-theirs"
FOREIGN = "belongs to lineage lin-theirs"


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """step_4 of this directory's lineage, step_90 of another job's."""
    root = tmp_path / "ckpt"
    root.mkdir()
    ensure_lineage(root, adopt=OURS)
    make_bundle(root, 4, lineage=OURS)
    make_bundle(root, 90, lineage=THEIRS)
    return root


@pytest.fixture
def only_foreign(tmp_path: Path) -> Path:
    root = tmp_path / "foreign"
    root.mkdir()
    ensure_lineage(root, adopt=OURS)
    make_bundle(root, 90, lineage=THEIRS)
    return root


def config_file(tmp_path: Path) -> str:
    """The config the test bundles were written with, so only the lineage tells the foreign bundle apart."""
    path = tmp_path / "job.yaml"
    path.write_text(dump_config(CFG))
    return str(path)


def test_run_refuses_a_directory_whose_only_bundle_is_foreign(
    cli: InProcess, only_foreign: Path, tmp_path: Path
) -> None:
    before = tree(only_foreign / "step_90")
    out = cli("run", "--config", config_file(tmp_path), "--checkpoint-dir", str(only_foreign))
    assert out.rc == 2, out.stdout + out.stderr
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and FOREIGN in errors[0], out.stderr
    assert "resuming" not in out.stdout and "starting fresh" not in out.stdout
    assert tree(only_foreign / "step_90") == before


def test_preflight_resumes_the_own_bundle_and_refuses_only_foreign_ones(
    cli: InProcess, ckpt: Path, only_foreign: Path, tmp_path: Path
) -> None:
    out = cli("preflight", "--checkpoint-dir", str(ckpt), "--config", config_file(tmp_path), "--dry-run", "--json")
    assert out.rc == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["decision"] == "resume" and plan["step"] == 4
    assert plan["checked"][0]["name"] == "step_90" and FOREIGN in plan["checked"][0]["problems"][0]
    refused = cli("preflight", "--checkpoint-dir", str(only_foreign), "--dry-run")
    assert refused.rc == 2 and "decision: refuse" in refused.stdout and FOREIGN in refused.stdout


def test_export_never_takes_a_foreign_bundle_for_the_newest(
    cli: InProcess, ckpt: Path, only_foreign: Path, tmp_path: Path
) -> None:
    out = cli("export", "--checkpoint-dir", str(ckpt), "--out", str(tmp_path / "out"))
    assert "skipped step_90: " in out.stdout and FOREIGN in out.stdout, out.stdout
    # step_4 is the one chosen: a tiny-backend bundle, so there is nothing to export from it
    assert out.rc == 2 and "step_4 holds a model.backend=tiny policy" in out.stderr, out.stderr
    named = cli("export", "--checkpoint-dir", str(ckpt), "--step", "90", "--out", str(tmp_path / "out"))
    assert named.rc == 2 and FOREIGN in named.stderr and "export another --step" in named.stderr
    none = cli("export", "--checkpoint-dir", str(only_foreign), "--out", str(tmp_path / "out"))
    assert none.rc == 2 and "no verified step_N bundle" in none.stderr, none.stderr
    assert not (tmp_path / "out").exists()


def test_ckpt_list_and_verify_call_a_foreign_bundle_bad(cli: InProcess, ckpt: Path) -> None:
    listed = cli("ckpt", "list", "--checkpoint-dir", str(ckpt), "--json")
    assert listed.rc == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)["bundles"]}
    assert rows["step_4"]["ok"] and not rows["step_90"]["ok"] and FOREIGN in rows["step_90"]["problems"][0]
    verified = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert verified.rc == 2 and "step_4: verified" in verified.stdout
    assert "step_90: BAD: " in verified.stdout and FOREIGN in verified.stdout


def test_ckpt_prune_neither_deletes_nor_counts_a_foreign_bundle(cli: InProcess, ckpt: Path) -> None:
    make_bundle(ckpt, 2, lineage=OURS)
    foreign = tree(ckpt / "step_90")
    out = cli("ckpt", "prune", "--checkpoint-dir", str(ckpt), "--keep", "1", "--json")
    assert out.rc == 0, out.stderr
    assert json.loads(out.stdout) == {"removed": ["step_2"]}, "step_4 is the anchor, not the foreign step_90"
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_4", "step_90"]
    assert tree(ckpt / "step_90") == foreign
    assert yaml.safe_load((ckpt / "LINEAGE").read_text())["lineage"] == OURS
