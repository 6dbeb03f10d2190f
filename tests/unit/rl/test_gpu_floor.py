"""The GPU node floor (CUDA 13 -> R580 driver, compute capability >= 7.5) on what torch.cuda and nvidia-smi report:
fakes of those reports for old drivers and old GPUs, and the real CPU torch of this machine for device_for."""

from __future__ import annotations

import pytest

from sc_app.rl.gpu_floor import GpuReport, SmiGpu, check, parse_smi

H100_580 = "0, NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n1, NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n"


def report(smi: str | None, *, cuda: str | None = "13.0", available: bool = True, caps=None) -> GpuReport:
    return GpuReport(1, "2.13.0", cuda, available, caps if caps is not None else [(9, 0)],
                     None if smi is None else parse_smi(smi))  # fmt: skip


def test_parse_smi_reads_each_gpu_and_skips_noise() -> None:
    rows = parse_smi(H100_580 + "No devices were found\n2, Tesla K80, 470.1, [N/A]\n")
    assert rows[0] == SmiGpu(0, "NVIDIA H100 80GB HBM3", "580.65.06", (9, 0))
    assert rows[2] == SmiGpu(2, "Tesla K80", "470.1", None) and len(rows) == 3


def test_a_current_node_passes_and_cpu_workers_are_not_checked() -> None:
    assert check(report(H100_580)) is None
    assert check(report(None)) is None  # no nvidia-smi in the container: torch's own view decides
    assert check(GpuReport(0, "2.13.0+cpu", None, False)) is None


@pytest.mark.parametrize(("smi", "kwargs", "expected"), [
    ("0, NVIDIA A100-SXM4-80GB, 550.90.07, 8.0\n", {"available": False},
     "GPU node driver 550.90.07 is older than R580, which CUDA 13.0 (torch 2.13.0 in the image) needs"),
    ("0, Tesla V100-SXM2-32GB, 580.65.06, 7.0\n", {"caps": [(7, 0)]},
     "GPU 0 (Tesla V100-SXM2-32GB) has compute capability 7.0; CUDA 13.0 builds need >= 7.5 (Turing or newer)"),
    (None, {"caps": [(6, 1)]}, "GPU 0 (cuda:0) has compute capability 6.1; CUDA 13.0 builds need >= 7.5"),
    (None, {"cuda": None, "available": False}, "is a CPU build: run the CUDA image"),
    ("0, NVIDIA L4, 580.82.07, 8.9\n", {"available": False, "caps": []},
     "torch sees no usable CUDA device (NVIDIA L4 driver 580.82.07)"),
    (None, {"available": False, "caps": []}, "torch sees no usable CUDA device (nvidia-smi reports no GPU)"),
], ids=["old-driver", "volta", "pascal-torch-only", "cpu-torch", "no-device", "nothing"])  # fmt: skip
def test_a_node_below_the_floor_is_named_in_one_line(smi, kwargs, expected) -> None:
    line = check(report(smi, **kwargs))
    assert line is not None and expected in line and "\n" not in line, line


def test_device_for_refuses_gpus_on_this_cpu_torch_instead_of_training_on_the_cpu() -> None:
    import torch

    from sc_app.rl.backend import GpuUnusable, device_for
    from sc_app.rl.hooks import InputError

    assert device_for(0) == torch.device("cpu")
    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU: the refusal needs a CPU torch")
    with pytest.raises(GpuUnusable) as exc:
        device_for(1)
    assert isinstance(exc.value, InputError)  # reported as one line, exit 2
    assert "num_gpus=1" in str(exc.value), exc.value
