"""What the runbooks do to shared things stays explicit (issue 27 part 8): the cluster-wide KubeRay operator is
installed and upgraded at a pinned ``--version`` with its CRDs applied explicitly (Helm never upgrades CRDs); no
``--reuse-values`` anywhere (it keeps the old chart's defaults); the RayJob's name comes from the chart's own
helper (``sc-app k8s name``), which is not always ``<release>-sc-app``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.k8s.k8s_helpers import CHART_DIR, REPO_ROOT, by_kind, load_values, objects, render

DOCS = [p for p in [*REPO_ROOT.glob("ops/*"), *REPO_ROOT.glob("docs/*.md"), REPO_ROOT / "README.md",
                    *CHART_DIR.rglob("*")] if p.is_file() and p.suffix in (".md", ".sh", ".txt", ".yaml", ".tpl")]
RUNBOOK = REPO_ROOT / "ops" / "RUNBOOKS.md"


def commands(path: Path) -> list[str]:
    """Shell lines of ``path`` with their continuation lines joined."""
    return path.read_text().replace("\\\n", " ").splitlines()


def test_no_reuse_values_anywhere() -> None:
    found = [f"{p.relative_to(REPO_ROOT)}:{i}" for p in DOCS for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"(?<!then-)reuse-values", line)]
    assert not found, found


def test_every_operator_install_or_upgrade_is_pinned() -> None:
    lines = [(p, ln) for p in DOCS for ln in commands(p)
             if re.search(r"helm (install|upgrade) kuberay-operator\b", ln)]
    assert len(lines) >= 3, "section 1 install and upgrade, section 12"
    for path, line in lines:
        assert re.search(r"--version \"?\$KUBERAY_VERSION\"?", line), f"{path.name}: {line}"


def test_crds_are_upgraded_explicitly_before_the_operator() -> None:
    lines = commands(RUNBOOK)
    crd = [i for i, ln in enumerate(lines) if "kubectl apply --server-side" in ln and "config/crd" in ln]
    upgrade = [i for i, ln in enumerate(lines) if "helm upgrade kuberay-operator" in ln]
    assert crd and upgrade and crd[0] < upgrade[0]
    assert "ref=v${KUBERAY_VERSION}" in lines[crd[0]]


@pytest.mark.parametrize(("release", "overrides"), [("grpo", {}), ("my-sc-app", {}),
                                                    ("grpo", {"fullnameOverride": "train"})])
def test_the_runbooks_job_name_is_the_one_the_chart_renders(tmp_path: Path, release: str,
                                                            overrides: dict[str, str]) -> None:
    import yaml

    (line,) = [ln for ln in RUNBOOK.read_text().splitlines() if ln.startswith("export JOB=")]
    assert "${RELEASE}-sc-app" not in line.partition("#")[0]
    values = load_values(CHART_DIR / "ci" / "cpu-values.yaml") | overrides
    (tmp_path / "my-values.yaml").write_text(yaml.safe_dump(values))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sc-app").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sc_app "$@"\n')
    (bin_dir / "sc-app").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO_ROOT),
           "RELEASE": release, "NS": "ml", "KUBECONFIG": "/nonexistent"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", f'{line}\necho "$JOB"'], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (job,) = by_kind(objects(render(values, name=release)), "RayJob")
    assert proc.stdout.strip() == job["metadata"]["name"]
    if release == "my-sc-app":
        assert job["metadata"]["name"] != f"{release}-sc-app", "the case the old ${RELEASE}-sc-app got wrong"


def test_jq_is_there_for_the_get_values_flow() -> None:
    assert shutil.which("jq")
