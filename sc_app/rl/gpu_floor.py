"""The GPU node floor of the image's torch build, checked where a worker is given a GPU (``backend.device_for``).

torch 2.13.0's CUDA wheels (ops/image-constraints.txt) carry the CUDA 13.0 runtime: it needs an NVIDIA driver of
the R580 branch or newer on the node, and CUDA 13 builds no kernels for GPUs below compute capability 7.5 (Maxwell,
Pascal and Volta, e.g. V100, are gone). Without this check a node with an older driver is worse than a refusal:
``torch.cuda.is_available()`` is False, the worker silently trains on its CPU, and every KubeRay retry does the same.

Pure: the reports of ``torch.cuda`` and ``nvidia-smi`` come in as values (``probe_gpu`` in backend.py gathers
them), so the unit tests feed it what old drivers and old GPUs report. ``check`` returns one line, or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# CUDA runtime major -> (minimum Linux driver major, minimum compute capability); NVIDIA's release notes.
FLOORS: dict[int, tuple[int, tuple[int, int]]] = {13: (580, (7, 5)), 12: (525, (5, 0)), 11: (450, (3, 5))}
SMI_QUERY = ("nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap", "--format=csv,noheader")


@dataclass(frozen=True)
class SmiGpu:
    index: int
    name: str
    driver: str  # e.g. "580.65.06"
    capability: tuple[int, int] | None  # None where this nvidia-smi cannot report it


@dataclass(frozen=True)
class GpuReport:
    """What a worker given ``num_gpus`` sees: torch's build and devices, and nvidia-smi's view of the node."""

    num_gpus: float
    torch_version: str
    torch_cuda: str | None  # torch.version.cuda: "13.0"; None for a CPU build
    cuda_available: bool  # torch.cuda.is_available()
    capabilities: list[tuple[int, int]] = field(default_factory=list)  # torch.cuda.get_device_capability(i)
    smi: list[SmiGpu] | None = None  # None: nvidia-smi missing or failed


def parse_smi(text: str) -> list[SmiGpu]:
    """Rows of ``nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        cap = None
        major, _, minor = parts[3].partition(".")
        if major.isdigit() and minor.isdigit():
            cap = (int(major), int(minor))
        gpus.append(SmiGpu(int(parts[0]), parts[1], parts[2], cap))
    return gpus


def _driver_major(driver: str) -> int | None:
    head = driver.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def check(report: GpuReport) -> str | None:
    """One line naming why this node cannot run the image's CUDA build for a worker given GPUs, else None."""
    if report.num_gpus <= 0:
        return None
    if report.torch_cuda is None:
        return (
            f"this worker is given num_gpus={report.num_gpus:g} but torch {report.torch_version} is a CPU build: "
            "run the CUDA image (ops/image-constraints.txt from PyPI) on GPU nodes, or set num_gpus: 0"
        )
    runtime = report.torch_cuda
    major = int(runtime.split(".", 1)[0]) if runtime.split(".", 1)[0].isdigit() else 0
    min_driver, min_cap = FLOORS.get(major, (0, (0, 0)))
    for gpu in report.smi or []:
        have = _driver_major(gpu.driver)
        if have is not None and have < min_driver:
            return (
                f"GPU node driver {gpu.driver} is older than R{min_driver}, which CUDA {runtime} (torch "
                f"{report.torch_version} in the image) needs: move the job to nodes with driver >= {min_driver} "
                "(docs/vllm.md 'GPU nodes')"
            )
    caps = [(g.index, g.name, g.capability) for g in report.smi or [] if g.capability is not None]
    caps = caps or [(i, f"cuda:{i}", c) for i, c in enumerate(report.capabilities)]
    for index, name, cap in caps:
        if cap < min_cap:
            return (
                f"GPU {index} ({name}) has compute capability {cap[0]}.{cap[1]}; CUDA {runtime} builds need >= "
                f"{min_cap[0]}.{min_cap[1]} (Turing or newer): schedule the job on newer GPUs "
                "(docs/vllm.md 'GPU nodes')"
            )
    if not report.cuda_available:
        seen = ", ".join(f"{g.name} driver {g.driver}" for g in report.smi or []) or "nvidia-smi reports no GPU"
        return (
            f"this worker is given num_gpus={report.num_gpus:g} but torch sees no usable CUDA device ({seen}): "
            "check the node's NVIDIA driver (>= R580 for CUDA 13) and container toolkit / device plugin"
        )
    return None
