"""Subprocess helpers for the end-to-end tests: run the real CLI in its own session and leave nothing behind.

A run is started with ``start_new_session=True``, so every process it starts (Ray's GCS, raylet and workers —
which get process groups of their own) shares its session id. Cleanup kills exactly that session, never by
name and never with ``ray stop``: other engineers run Ray on the same machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_app.attempt.ray_start import TIMEOUT_MARK

REPO = Path(__file__).resolve().parents[2]
SC_APP = [sys.executable, "-m", "sc_app"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pids_with(marker: str) -> list[int]:
    """PIDs whose command line mentions ``marker`` (a temp dir unique to the caller): only processes it started."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() in (proc / "cmdline").read_bytes():
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) != sid:
                continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, FileNotFoundError, PermissionError, IndexError):
            continue
        if state != "Z":
            found.append(pid)
    return found


def sigkill_until_gone(find: Callable[[], list[int]], timeout: float = 30.0) -> list[int]:
    """SIGKILL every process ``find()`` names, again until it names none or ``timeout`` passes; the survivors."""
    deadline = time.monotonic() + timeout
    while (pids := find()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    return find()


def kill_session(sid: int, timeout: float = 30.0) -> None:
    """SIGKILL the process group ``sid``, then any straggler of the same session."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)
    survivors = sigkill_until_gone(lambda: session_members(sid), timeout)
    if survivors:
        raise AssertionError(f"processes of session {sid} survived SIGKILL: {survivors}")


# Ray's own line when its node did not register within Ray's fixed 30 s (``ray/_private/node.py``), which sc-app
# recognises by ``TIMEOUT_MARK`` and quotes in its one-line refusal after its one retry.
RAY_START_TIMEOUT = f"The current node {TIMEOUT_MARK}"


class RayDidNotStart(Exception):
    """A run ended before training because Ray's node did not start in time, twice: an overloaded machine (two
    suites on 2 cores at load 35 did it), not what any end-to-end test checks (the refusal itself is tested in
    ``tests/unit/attempt/test_ray_start.py``). The suite runs a test that failed with it once more (pyproject:
    ``reruns``, ``only_rerun``); every other failure fails at once."""


def ray_did_not_start(out: str) -> None:
    """``RayDidNotStart`` quoting sc-app's line when ``out`` (a run's output) says Ray could not start in time."""
    for line in out.splitlines():
        if RAY_START_TIMEOUT in line:
            raise RayDidNotStart(line.strip())


@dataclass
class Finished:
    rc: int
    out: str


def start_sc_app(
    *args: str, stdout: int | object = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SC_APP, *args],
        cwd=REPO,
        stdout=stdout,  # type: ignore[arg-type]
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def start_logged(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start the CLI with its output in ``log``; the caller must ``kill_session(proc.pid)`` when done."""
    with open(log, "w") as out:
        proc = start_sc_app(*args, stdout=out, env=env)
    proc.sc_app_log = log  # type: ignore[attr-defined]  # wait_for quotes it, and reads why the run ended
    return proc


def driver_stacks(pid: int) -> str:
    """Every thread's Python stack in process ``pid`` (``py-spy dump``; Ray's default extras install it), for a
    timeout's message; a line saying why where it cannot be read."""
    spy = Path(sys.executable).with_name("py-spy")
    try:
        got = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no stacks: {exc})"
    return (got.stdout or got.stderr)[-8000:]


def finish(proc: subprocess.Popen[str], timeout: float, what: str) -> Finished:
    """Wait for ``proc``; whatever its session left behind is killed afterwards."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = driver_stacks(proc.pid)  # where it waits, before it is killed
        kill_session(proc.pid)
        out, _ = proc.communicate()
        log = getattr(proc, "sc_app_log", None)
        tail = (log.read_text(errors="replace") if log is not None and log.exists() else out or "")[-4000:]
        raise AssertionError(f"{what} timed out after {timeout}s:\n{tail}\n--- its threads:\n{stacks}") from None
    finally:
        kill_session(proc.pid)
    if proc.returncode != 0:
        ray_did_not_start(out or "")
    return Finished(proc.returncode, out or "")


def sc_app(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> Finished:
    """Run the CLI to completion in its own session."""
    return finish(start_sc_app(*args, env=env), timeout, f"sc-app {' '.join(args)}")


def run_args(ckpt: Path, trace: Path, max_steps: int, *extra: str) -> list[str]:
    """``sc-app run`` on ``ckpt`` with a bundle every 2 steps and a JSONL trace; ``extra`` appended."""
    return [
        "run",
        "--checkpoint-dir",
        str(ckpt),
        "--max-steps",
        str(max_steps),
        "--set",
        "checkpoint.save_period=2",
        "--set",
        f"run.trace_file={trace}",
        *extra,
    ]


def placed_run_args(address: str, ckpt: Path, trace: Path, max_steps: int, *extra: str) -> list[str]:
    """``run_args`` on the Ray cluster at ``address``, placing the trainers on nodes with the custom resource
    ``trainer_node``, the generation worker on ``gen_node`` and TransferQueue's storage units on ``tq_node``."""
    placement = ["trainer.resources={trainer_node: 1}", "generation.resources={gen_node: 1}"]
    placement += ["data_plane.storage_node_resource=tq_node", f"ray.address={address}"]
    return run_args(ckpt, trace, max_steps, *[a for kv in placement for a in ("--set", kv)], *extra)


def wait_for(
    predicate: Any,
    timeout: float,
    what: str,
    proc: subprocess.Popen[str] | None = None,
    *,
    log: Path | None = None,
    poll: float = 0.25,
) -> None:
    """Poll ``predicate`` every ``poll`` s until true; fails early if ``proc`` exits first (quoting the tail of
    ``log``, by default the one ``start_logged`` wrote; ``RayDidNotStart`` if Ray could not start in time)."""
    log = log if log is not None else getattr(proc, "sc_app_log", None)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            if log is not None and log.exists():
                ray_did_not_start(log.read_text())
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}{_tail(log)}")
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{_tail(log)}")


def _tail(log: Path | None) -> str:
    return f":\n{log.read_text()[-4000:]}" if log is not None and log.exists() else ""


def kill_when(predicate: Any, proc: subprocess.Popen[str], timeout: float, what: str, *, log: Path) -> None:
    """Wait for ``predicate`` (as ``wait_for``, polling often: the kill should land right after the moment it
    names), then SIGKILL ``proc``'s whole session; fails unless the run died of that SIGKILL."""
    try:
        wait_for(predicate, timeout, what, proc, log=log, poll=0.05)
    finally:
        kill_session(proc.pid)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"{what}: exit {proc.returncode}, not SIGKILL"


def read_trace(path: Path) -> list[dict[str, Any]]:
    """Events of a ``run.trace_file``; a last line cut by SIGKILL is skipped."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def trace_runs(path: Path) -> list[list[dict[str, Any]]]:
    """The events of a ``run.trace_file`` split into runs: one list per ``start`` event, in order."""
    runs: list[list[dict[str, Any]]] = []
    for ev in read_trace(path):
        if ev["ev"] == "start":
            runs.append([])
        assert runs, "trace does not begin with a start event"
        runs[-1].append(ev)
    return runs


def past_a_new_bundle(trace: Path, run: int, at_least: int, *, holding_rows: bool = False) -> bool:
    """Run number ``run`` of the trace saved a bundle of step >= ``at_least`` (one holding replay rows, if asked)
    and trained past it: the moment a SIGKILL loses trained steps that the next run must not count twice."""
    runs = trace_runs(trace)
    if len(runs) <= run:
        return False
    saves = [e for e in runs[run] if e["ev"] == "save"]
    trained = max((e["step"] for e in runs[run] if e["ev"] == "train"), default=0)
    if not saves or saves[-1]["step"] < at_least or (holding_rows and saves[-1]["groups"] == 0):
        return False
    return trained > saves[-1]["step"]


def trained_prompts(trace: Path, killed_run: int, bundle_step: int) -> list[int]:
    """Every prompt index the trace's runs trained, in order, leaving out the steps the SIGKILLed run
    ``killed_run`` trained after its newest bundle ``bundle_step`` (lost with the kill, so trained again)."""
    return [
        prompt
        for i, events in enumerate(trace_runs(trace))
        for ev in events
        if ev["ev"] == "train" and (i != killed_run or ev["step"] <= bundle_step)
        for prompt in ev["prompts"]
    ]


def step_bundles(root: Path) -> dict[int, Path]:
    """The published ``step_N`` bundles under a checkpoint directory, by step."""
    return {int(p.name.split("_")[1]): p for p in root.glob("step_*") if re.fullmatch(r"step_\d+", p.name)}


def load_sidecar(path: Path) -> dict[str, Any]:
    import torch

    sd = torch.load(path, map_location="cpu", weights_only=True)
    assert isinstance(sd, dict)
    return sd


DROP_DAC = "-dac_override,-dac_read_search"


def unprivileged(argv: list[str]) -> list[str] | None:
    """``argv`` run so that file permission bits apply to it, or ``None`` when this machine cannot do that.

    As root, permission bits do not stop reads (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``): the command then
    runs under ``setpriv`` with both capabilities dropped from its bounding and inheritable sets, so an ``000`` file
    is unreadable to it exactly as to any other user (the interpreter itself stays reachable, unlike under a uid
    that cannot enter the directory it is installed in). Not root: permission bits already apply."""
    if os.geteuid() != 0:
        return argv
    setpriv = ["setpriv", f"--bounding-set={DROP_DAC}", f"--inh-caps={DROP_DAC}", "--"]
    try:
        probe = subprocess.run([*setpriv, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [*setpriv, *argv] if probe.returncode == 0 else None


def finishes(fn: Callable[[], Any], within: float = 300) -> Any:
    """``fn()``'s result; fails (instead of hanging the suite) if it has not returned after ``within`` seconds."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(within)
    assert not t.is_alive(), f"did not return within {within}s: a hang"
    assert box, "raised instead of returning"
    return box[0]


def actor_pids(sid: int, actor_class: str) -> list[int]:
    """PIDs of the Ray worker processes of session ``sid`` running an actor of ``actor_class`` (Ray titles them
    ``ray::<Class>``), e.g. ``TrainerWorker``, ``SimpleStorageUnit``, ``TransferQueueController``."""
    out = []
    for pid in session_members(sid):
        try:
            if f"ray::{actor_class}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out


def trained_lineage(events: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Step → prompts trained, as the run's newest state has it: a ``start`` event (a process restart or an
    in-job restore from the bundle of step S) discards what was trained after S before it — that work was lost
    and is trained again. Fails if a step is trained twice within one lineage."""
    steps: dict[int, list[int]] = {}
    for e in events:
        if e["ev"] == "start":
            steps = {s: p for s, p in steps.items() if s <= e["step"]}
        elif e["ev"] == "train":
            assert e["step"] not in steps, f"step {e['step']} trained twice without a restore between"
            steps[e["step"]] = list(e["prompts"])
    return steps
