"""ops/image-smoke.sh's own logic with stand-ins for buildah/podman/debootstrap/runc (the real run needs a Debian
host as root with those tools and several minutes; see ops/README.md). What is checked here: the kill must land while
the first container still trains — a first run that finished, or whose newest bundle is the last step, fails the
smoke instead of passing a "resume" that resumed nothing — and the second run must resume from that very bundle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.k8s.k8s_helpers import REPO_ROOT

FAKE = r'''#!PYTHON
import json, os, sys
from pathlib import Path
tool, args = Path(sys.argv[0]).name, sys.argv[1:]
scenario = json.loads(Path(os.environ["FAKE_SCENARIO"]).read_text())
if tool != "podman":
    sys.exit(0)
if "exists" in args:
    sys.exit(0)
if "run" in args:
    with open(os.environ["FAKE_SCENARIO"] + ".runs", "a") as runs:
        runs.write(json.dumps(args) + "\n")
if "inspect" in args:
    fmt = args[args.index("--format") + 1]
    size = "104857600" if args[-1] == "localhost/sc-app-base:bookworm" else "734003200"
    print({"{{.Size}}": size, "{{.Config.User}}": "10001:10001", "{{.State.Running}}": "true"}[fmt])
elif "run" in args and "/run/sc-app-engine-check.py" in args:
    print(scenario.get("engine", "vllm engine ok: vllm 0.32.0 on cpu, 12.5 s"))
elif "run" in args and "du" in args:
    print("614400\t/opt/sc-app")
elif "run" in args and "-d" in args:
    ckpt = next(a.split(":")[0] for a in args if a.endswith(":/checkpoints"))
    for step in scenario["bundles"]:
        Path(ckpt, f"step_{step}").mkdir(parents=True, exist_ok=True)
elif "logs" in args:
    print(scenario["run1_log"], end="")
elif "run" in args and "sc-app-smoke-2" in args:
    print(scenario["run2_log"], end="")
'''


def smoke(tmp_path: Path, scenario: dict, max_steps: int | None = None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("buildah", "podman", "debootstrap", "runc"):
        (bin_dir / tool).write_text(FAKE.replace("PYTHON", sys.executable, 1))
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "scenario.json").write_text(json.dumps(scenario))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SCENARIO": str(tmp_path /
           "scenario.json"), "SC_SMOKE_DIR": str(tmp_path / "work")}
    if max_steps is not None:
        env["SC_SMOKE_MAX_STEPS"] = str(max_steps)
    return subprocess.run(["bash", str(REPO_ROOT / "ops" / "image-smoke.sh")], env=env, capture_output=True,
                          text=True, timeout=120)


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="ops/image-smoke.sh refuses to run without root")
STEP = "step {n:>4}/{m}  reward 0.5  loss +0.0  staleness 1.00  rows_in_tq   64  0.10s\n"


def test_a_kill_while_training_and_a_resume_from_that_bundle_pass(tmp_path: Path) -> None:
    run1 = "".join(STEP.format(n=n, m=200) for n in range(1, 4)) + "step    2/200  saved step_2 (0.1s)\n"
    run2 = "resuming from /checkpoints/step_2 (step 2): newest verified bundle\ndone: step 200 in 30.0s\n"
    proc = smoke(tmp_path, {"bundles": [2], "run1_log": run1, "run2_log": run2})
    assert proc.returncode == 0, proc.stderr
    assert "killed the first container at step 3 of 200; newest bundle step_2" in proc.stderr
    size_line = ("image size: localhost/sc-app:smoke 700 MiB = base localhost/sc-app-base:bookworm 100 MiB + "
                 "/opt/sc-app venv 600 MiB")
    assert size_line in proc.stderr and proc.stdout.strip() == size_line, proc.stdout
    # Every container of the image runs as the chart runs it by default: read-only root, /tmp and $HOME writable.
    runs = [json.loads(line) for line in (tmp_path / "scenario.json.runs").read_text().splitlines()]
    assert len(runs) == 5  # the contract check, the size probe, the engine, the killed run, the resumed run
    assert "vllm engine ok: vllm 0.32.0 on cpu" in proc.stderr
    for args in runs:
        assert {"--read-only", "--read-only-tmpfs=false", "/tmp:rw,mode=1777"} <= set(args), args
        assert "/home/scapp:rw,mode=0700,U" in args, args


@pytest.mark.parametrize(("max_steps", "bundles", "run1", "expected"), [
    (8, [2, 4, 6, 8], "".join(STEP.format(n=n, m=8) for n in range(1, 9)) + "done: step 8 in 3.0s\n",
     "FAIL: the first run finished before the kill (nothing to resume)"),
    (8, [2, 4, 6, 8], "".join(STEP.format(n=n, m=8) for n in range(1, 9)),
     "FAIL: newest bundle step_8 is the last step: the kill came after training"),
], ids=["finished", "last-step-bundle"])
def test_a_kill_after_training_fails_the_smoke(tmp_path: Path, max_steps, bundles, run1, expected) -> None:
    run2 = "resuming from /checkpoints/step_8 (step 8): newest verified bundle\ndone: step 8 in 1.0s\n"
    proc = smoke(tmp_path, {"bundles": bundles, "run1_log": run1, "run2_log": run2}, max_steps)
    assert proc.returncode == 1 and expected in proc.stderr, proc.stderr


def test_a_resume_from_another_bundle_fails_the_smoke(tmp_path: Path) -> None:
    run1 = "".join(STEP.format(n=n, m=200) for n in range(1, 6))
    run2 = "starting fresh: no step_N bundle\ndone: step 200 in 30.0s\n"
    proc = smoke(tmp_path, {"bundles": [2, 4], "run1_log": run1, "run2_log": run2})
    assert proc.returncode == 1 and "FAIL: second run did not resume from step_4" in proc.stderr, proc.stderr


def test_an_image_whose_engine_does_not_start_fails_the_smoke(tmp_path: Path) -> None:
    run1 = "".join(STEP.format(n=n, m=200) for n in range(1, 4))
    proc = smoke(tmp_path, {"bundles": [2], "run1_log": run1, "run2_log": "", "engine": "ModuleNotFoundError: vllm"})
    assert proc.returncode == 1 and "FAIL: no vLLM engine starts in the image" in proc.stderr, proc.stderr
    assert not (tmp_path / "work" / "checkpoints").exists() or not any((tmp_path / "work" / "checkpoints").iterdir())
