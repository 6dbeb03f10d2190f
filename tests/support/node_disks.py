"""A Ray node with a disk of its own at the checkpoint path: what a worker pod with an emptyDir or a per-pod
ReadWriteOnce volume sees, on one machine.

The node is ``ray start --address=<head> --block`` run inside a mount namespace of its own (``unshare -m``, private
propagation) in which a fresh tmpfs is mounted over the checkpoint directory: its raylet and every worker process
it starts (trainer ranks, storage units, ...) see that empty tmpfs at the path where the head's processes see the
real directory — the same path, another disk, as on two pods. Everything else (``/tmp/ray``, the repository) is
shared. Needs root (``mount``); ``skip_reason`` says why it cannot run otherwise.

The node's processes are in a session of their own and are SIGKILLed with it (``stop``): a lost pod.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.proc import kill_session

RAY = Path(sys.executable).with_name("ray")


def skip_reason() -> str | None:
    """Why a node with its own disk cannot be started here, else None."""
    if os.geteuid() != 0:
        return "a node with its own disk needs root (a mount namespace and a tmpfs mount)"
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare and nsenter (util-linux) are not installed"
    if not RAY.exists():
        return f"{RAY} is not installed"
    return None


@dataclass
class OwnDiskNode:
    """A worker node of the cluster at ``address`` whose processes see their own tmpfs at ``path``."""

    proc: subprocess.Popen[bytes]
    log: Path
    path: Path

    @classmethod
    def start(
        cls, address: str, path: Path, log: Path, *, num_cpus: int, resources: dict[str, float],
        env: dict[str, str] | None = None,
    ) -> OwnDiskNode:  # fmt: skip
        """``env``: added to this process's environment for the node's processes (a pod's own variables)."""
        mount = f"mount -t tmpfs -o size=512m sc-app-node-disk {path}"
        ray_start = [str(RAY), "start", f"--address={address}", f"--num-cpus={num_cpus}", "--block"]
        ray_start += [f"--resources={json.dumps(resources)}", "--disable-usage-stats"]
        script = f"{mount} && exec {' '.join(_quote(a) for a in ray_start)}"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        return cls(proc, log, path)

    def files_under(self, path: Path) -> list[str]:
        """Every file under ``path`` as the node's processes see it (its own disk), relative to ``path``."""
        script = f"cd {_quote(str(path))} 2>/dev/null && find . -type f || true"
        out = subprocess.run(["nsenter", f"--target={self.proc.pid}", "--mount", "--", "bash", "-c", script],
                             capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
        return sorted(line.removeprefix("./") for line in out.stdout.splitlines())

    def stop(self) -> None:
        """SIGKILL every process of the node (its tmpfs goes with its namespace's last process)."""
        kill_session(self.proc.pid)
        self.proc.wait(timeout=30)


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def wait_for_nodes(address: str, count: int, *nodes: OwnDiskNode, timeout: float = 120) -> None:
    """Until ``count`` nodes are alive in the cluster at ``address`` (asked from a short-lived driver); one of
    ``nodes`` exiting meanwhile fails at once."""
    import ray

    deadline = time.monotonic() + timeout
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        while time.monotonic() < deadline:
            alive = [n for n in ray.nodes() if n["Alive"]]
            if len(alive) >= count:
                return
            for node in nodes:
                if node.proc.poll() is not None:
                    raise AssertionError(f"a node with its own disk exited ({node.proc.returncode}): {_tail(node)}")
            time.sleep(0.5)
        raise AssertionError(f"{count} nodes not alive after {timeout}s: " + " | ".join(map(_tail, nodes)))
    finally:
        ray.shutdown()


def _tail(node: OwnDiskNode) -> Any:
    return node.log.read_text(errors="replace")[-2000:] if node.log.exists() else "(no log)"
