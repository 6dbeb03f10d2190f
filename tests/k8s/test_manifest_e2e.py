"""Manifest-driven local end to end: the *rendered* RayJob, run the way KubeRay would run it, on this machine.

One scenario. Render the chart (ci/cpu-values.yaml + small overrides) → run the head initContainer's command as
rendered → ``ray start --head`` with the rendered ``rayStartParams`` (+ the auth env KubeRay injects from the
rendered Secret) → ``ray job submit`` the rendered entrypoint (what the K8sJobMode submitter does) → once a bundle
exists, SIGKILL every process of that head (the preemption) → a fresh head, preflight again, submit again (the
``backoffLimit`` retry) → it resumes from the newest complete bundle and finishes. The only translation is the
volume: the mount path and the ConfigMap's file are mapped to temp dirs.

While the retry trains, the head's metrics export port (the chart's ``rayPorts.metrics``, what the PodMonitor
scrapes) is scraped and parsed with ``prometheus_client``: the driver's sc-app metrics must be there. Afterwards the
run log on the volume must hold both attempts.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sc_app.observe.reader import read_history
from tests.k8s.k8s_helpers import CHART_DIR, by_kind, load_values, objects, render
from tests.k8s.test_k8s_runbooks import run_local_commands
from tests.support.proc import pids_with
from tests.support.prometheus import one, try_scrape

pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

BIN = Path(sys.executable).parent
MAX_STEPS = 60
SAVE_PERIOD = 5
PREEMPT_AT_STEP = 10
REPORT_INTERVAL_MS = "1000"  # RAY_metrics_report_interval_ms on the heads: the retry's metrics show within seconds


def _free_ports(names: tuple[str, ...]) -> dict[str, int]:
    """One distinct free port per name: every socket stays bound until all are picked, so none repeats."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in names]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return {name: int(sock.getsockname()[1]) for name, sock in zip(names, socks, strict=True)}


def _values() -> dict[str, Any]:
    """ci/cpu-values.yaml with free local ports (so a concurrent Ray on this machine cannot collide)."""
    values = load_values(CHART_DIR / "ci" / "cpu-values.yaml")
    ports = _free_ports(("gcs", "dashboard", "client", "metrics", "nodeManager", "objectManager",
                         "runtimeEnvAgent", "dashboardAgentGrpc", "dashboardAgentHttp"))
    base = random.randrange(30000, 60000, 200)
    while any(base <= p <= base + 150 for p in ports.values()):  # the worker range must not hold a component port
        base = random.randrange(30000, 60000, 200)
    ports |= {"minWorkerPort": base, "maxWorkerPort": base + 150}
    values["rayPorts"] = ports
    values["config"]["run"]["max_steps"] = MAX_STEPS
    values["config"]["checkpoint"]["save_period"] = SAVE_PERIOD
    return values


def _steps(ckpt: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in ckpt.glob("step_*") if p.name.split("_")[1].isdigit())


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


class Head:
    """One Ray head started from the rendered headGroupSpec; ``kill()`` is the node loss."""

    def __init__(self, rayjob: dict[str, Any], env: dict[str, str], root: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="scr", dir="/tmp"))  # short: Ray's socket paths have a limit
        self.job_marker = str(root)  # the driver (a job subprocess with a session of its own) names files under it
        self.params = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]
        argv = [str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats", f"--temp-dir={self.root}"]
        argv += [f"--{k}={v}" for k, v in self.params.items()]
        self.log = (root / f"head-{self.root.name}.log").open("w")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.address = f"http://127.0.0.1:{self.params['dashboard-port']}"

    def wait_ready(self, env: dict[str, str], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"ray start exited: {Path(self.log.name).read_text()[-2000:]}"
            probe = subprocess.run([str(BIN / "ray"), "job", "list", "--address", self.address], env=env,
                                   capture_output=True, text=True, timeout=60)
            if probe.returncode == 0:
                return
            time.sleep(2)
        raise AssertionError(f"head not ready after {timeout}s: {Path(self.log.name).read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL the whole head, as a lost pod: its process group, every process under its session dir, and the
        driver (the job's entrypoint names the test's config file)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        # a pod is gone once its processes are: kill what matches until nothing does (a worker forked while the
        # first list was read escaped it once and published a bundle after the "loss"), then wait for them to die
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            doomed = [p for p in pids_with(str(self.root)) + pids_with(self.job_marker) if _running(p)]
            if not doomed:
                break
            for pid in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        self.proc.wait(timeout=30)
        self.log.close()

    def cleanup(self) -> None:
        if self.proc.poll() is None or pids_with(str(self.root)):
            self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def heads() -> Iterator[list[Head]]:
    started: list[Head] = []
    yield started
    for head in started:
        head.cleanup()


def test_rendered_rayjob_resumes_after_head_loss(tmp_path: Path, heads: list[Head]) -> None:
    values = _values()
    objs = objects(render(values, name="e2e", namespace="ml"))
    (rayjob,) = by_kind(objs, "RayJob")
    (configmap,) = by_kind(objs, "ConfigMap")
    (secret,) = by_kind(objs, "Secret")
    assert rayjob["spec"]["backoffLimit"] >= 1, "the retry below is what backoffLimit buys"
    head_spec = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mount = values.get("checkpoint", {}).get("mountPath", "/checkpoints")

    # The volumes: PVC → tmp dir, ConfigMap → its file with checkpoint.dir pointing at the mapped mount.
    ckpt = tmp_path / "pvc"
    ckpt.mkdir()
    config_file = tmp_path / "etc-sc-app" / "config.yaml"
    config_file.parent.mkdir()
    cfg = yaml.safe_load(configmap["data"]["config.yaml"])
    assert cfg["checkpoint"]["dir"] == mount and cfg["ray"]["address"] == "auto"
    cfg["checkpoint"]["dir"] = str(ckpt)
    config_file.write_text(yaml.safe_dump(cfg))

    def mapped(text: str) -> str:
        return text.replace("/etc/sc-app/config.yaml", str(config_file)).replace(mount, str(ckpt))

    # What KubeRay injects from authOptions + the rendered Secret, on every Ray container and the submitter.
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(tmp_path / "home"),
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "PYTHONUNBUFFERED": "1",
           "RAY_metrics_report_interval_ms": REPORT_INTERVAL_MS}
    for e in head_spec["containers"][0].get("env", []):
        if "value" in e:
            env[e["name"]] = mapped(e["value"])
    (tmp_path / "home").mkdir()
    init_cmd = [mapped(a) for a in head_spec["initContainers"][0]["command"]]
    # KubeRay's submitter puts the entrypoint string into a shell command line after `ray job submit ... --`.
    entrypoint = shlex.split(mapped(rayjob["spec"]["entrypoint"]))

    def preflight() -> dict[str, Any]:
        proc = subprocess.run(init_cmd, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"initContainer failed: {proc.stdout}\n{proc.stderr}"
        return json.loads(proc.stdout)

    def start_head() -> Head:
        head = Head(rayjob, env, tmp_path)
        heads.append(head)
        head.wait_ready(env)
        return head

    # Attempt 1: fresh start, preempted once a bundle past PREEMPT_AT_STEP exists.
    plan = preflight()
    assert plan["decision"] == "fresh", plan
    head = start_head()
    submit = [str(BIN / "ray"), "job", "submit", "--address", head.address]
    subprocess.run([*submit, "--submission-id", "attempt-1", "--no-wait", "--", *entrypoint], env=env, check=True,
                   capture_output=True, text=True, timeout=120)
    deadline = time.monotonic() + 240
    while not (_steps(ckpt) and _steps(ckpt)[-1] >= PREEMPT_AT_STEP):
        assert time.monotonic() < deadline, f"no bundle >= step {PREEMPT_AT_STEP} in 240s: {list(ckpt.iterdir())}"
        time.sleep(0.2)
    head.kill()
    before = _steps(ckpt)
    assert before and before[-1] < MAX_STEPS, f"training finished before the preemption: {before}"
    (ckpt / f"tmp_step_{before[-1] + SAVE_PERIOD}").mkdir(exist_ok=True)  # a save the kill may have cut short

    # Attempt 2 (the backoffLimit retry): new head, same volume.
    plan = preflight()
    assert plan["decision"] == "resume" and plan["step"] == before[-1], plan
    assert not (ckpt / f"tmp_step_{before[-1] + SAVE_PERIOD}").exists(), "preflight must move leftovers aside"
    head = start_head()
    submit = [str(BIN / "ray"), "job", "submit", "--address", head.address]
    job_log = tmp_path / "attempt-2.log"
    with job_log.open("w") as sink:
        job = subprocess.Popen([*submit, "--submission-id", "attempt-2", "--", *entrypoint], env=env,
                               stdout=sink, stderr=subprocess.STDOUT)
    scraped: dict[str, Any] = {}
    deadline = time.monotonic() + 300
    while job.poll() is None:  # scrape the head's metrics export port while the retry trains
        assert time.monotonic() < deadline, f"attempt 2 did not finish in 300s: {job_log.read_text()[-3000:]}"
        # Per sample name the newest rows: a gauge's keepalive can run late on a loaded machine, so one scrape may
        # miss a gauge for a moment (the agent forgets it after two report intervals) while the next has it again.
        scraped.update(try_scrape(int(head.params["metrics-export-port"])))
        time.sleep(0.3)
    out = job_log.read_text()
    assert job.returncode == 0, out[-3000:]
    assert f"resuming from {ckpt / f'step_{before[-1]}'}" in out, out[-3000:]
    assert f"done: step {MAX_STEPS}" in out, out[-3000:]
    assert _steps(ckpt)[-1] == MAX_STEPS
    head.kill()

    # The retry's driver recorded sc-app's metrics; the head's export port served them, in Prometheus' format.
    assert scraped, "no sc_app metric on the head's metrics export port while attempt 2 trained"
    assert one(scraped, "ray_sc_app_attempt") == 2
    assert one(scraped, "ray_sc_app_resumes_total") == 1
    assert before[-1] <= one(scraped, "ray_sc_app_step") <= MAX_STEPS
    assert one(scraped, "ray_sc_app_step_seconds_count") >= 1
    # The run log on the volume survived the head's loss: every step once or more, the retry's resume recorded.
    history = read_history(ckpt / "logs")
    assert [s.step for s in history.effective_steps()] == list(range(1, MAX_STEPS + 1))
    assert [(e.step, e.data["bundle"]) for e in history.events_named("resume")] == [(before[-1], f"step_{before[-1]}")]
    first, retry = history.attempts()
    # the lost head: no exit line, or the driver outlived its actors for a moment and logged the failure
    assert first.exit_code in (None, 1) and retry.exit_code == 0
    assert {lab["run_id"] for lab, _ in scraped["ray_sc_app_step"]} == {retry.run_id}

    # The runbook's local commands against these real bundles (verify, list, preflight --dry-run, submit --dry-run).
    run_local_commands(ckpt)
