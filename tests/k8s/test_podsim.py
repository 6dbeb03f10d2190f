"""The pod stand-in behaves like a pod where later tests rely on it: the container command is PID 1 of its own PID
namespace, volumes sit at their real paths and are shared where the PVC is, Service names resolve through the
cluster DNS stand-in, and ``terminate`` is the kubelet's order (preStop to completion, SIGTERM to PID 1, SIGKILL
when the grace period ends). Needs root (network, PID and mount namespaces)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.podsim import Container, Mount, Network, Pod, missing_tools

_MISSING = missing_tools()
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)} for pod stand-ins")

ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/home/app"}


@pytest.fixture
def net(tmp_path: Path) -> Iterator[tuple[Network, Path]]:
    network = Network(f"scps{os.getpid() % 100000}", tmp_path)
    try:
        yield network, tmp_path
    finally:
        network.close()


def _pod(net: tuple[Network, Path], name: str) -> Pod:
    network, root = net
    return Pod(network, name, "ml", {"app": name}, root)


def test_container_is_pid_1_with_its_volumes_and_cluster_dns(net: tuple[Network, Path]) -> None:
    network, root = net
    pvc = root / "pvc"
    pvc.mkdir()
    a, b = _pod(net, "a"), _pod(net, "b")
    try:
        network.add_dns("a-svc.ml.svc.cluster.local", a.ip)
        mounts = [Mount("/checkpoints", pvc), Mount("/dev/shm", None, 2**27)]
        a.start(Container("main", ["/bin/bash", "-c", "--", "exec sleep 600"], ENV, mounts))
        b.start(Container("main", ["/bin/bash", "-c", "--", "exec sleep 600"], ENV, [Mount("/checkpoints", pvc)]))
        assert a.exec(["cat", "/proc/1/cmdline"], timeout=30).out.split("\0")[0] == "sleep"
        assert a.exec(["hostname"], timeout=30).out.strip() == "a"
        assert a.exec(["df", "-B1", "--output=size", "/dev/shm"], timeout=30).out.split()[-1] == str(2**27)
        assert a.exec(["touch", "/checkpoints/from-a"], timeout=30).rc == 0
        assert (pvc / "from-a").exists(), "the PVC stand-in is one host directory"
        assert b.exec(["ls", "/checkpoints"], timeout=30).out.split() == ["from-a"]
        resolve = "import socket; print(socket.gethostbyname('a-svc.ml.svc.cluster.local'))"
        assert b.exec(["python", "-c", resolve], timeout=60).out.strip() == a.ip
        assert not Path("/checkpoints").exists(), "mounts stay inside the pod"
    finally:
        a.close()
        b.close()


def test_terminate_runs_pre_stop_then_sigterm_then_sigkill(net: tuple[Network, Path]) -> None:
    root = net[1]
    shared = root / "shared"
    shared.mkdir()
    mounts = [Mount("/shared", shared)]
    # PID 1 with a SIGTERM handler: exits on SIGTERM, after the hook finished.
    graceful = _pod(net, "graceful")
    stubborn = _pod(net, "stubborn")
    try:
        trap = "trap 'echo term >> /shared/order; exit 0' TERM; while true; do sleep 0.1; done"
        graceful.start(Container("main", ["/bin/bash", "-c", "--", trap], ENV, mounts))
        graceful.pid1  # noqa: B018 - waits until PID 1 exists
        hook = ["/bin/sh", "-c", "sleep 1; echo pre-stop >> /shared/order"]
        ended = graceful.terminate(30, hook)
        assert ended.pre_stop is not None and ended.pre_stop.rc == 0
        assert ended.ended_by == "SIGTERM"
        assert (shared / "order").read_text().split() == ["pre-stop", "term"]

        # bash as PID 1 running a child installs no SIGTERM handler: the kernel ignores SIGTERM for a namespace's
        # init, so only SIGKILL at the end of the grace period ends it (what happens in a real container too).
        stubborn.start(Container("main", ["/bin/bash", "-c", "--", "sleep 600; echo never"], ENV, mounts))
        stubborn.pid1  # noqa: B018
        ended = stubborn.terminate(3, None)
        assert ended.ended_by == "SIGKILL" and ended.seconds >= 3
        assert not stubborn.running()
    finally:
        graceful.close()
        stubborn.close()


def test_read_only_root_leaves_only_the_volumes_writable(net: tuple[Network, Path]) -> None:
    """securityContext.readOnlyRootFilesystem as a runtime gives it: a write anywhere but a writable volume, /dev
    and /dev/shm fails with EROFS — the root's /tmp and $HOME, /etc, the image's directories (here the host's,
    this checkout and its interpreter among them) and a readOnly volume alike."""
    root = net[1]
    data = root / "data"
    data.mkdir()
    mounts = [Mount("/data", data), Mount("/scratch", None, 2**24), Mount("/etc/conf", data, read_only=True),
              Mount("/dev/shm", None, 2**24)]
    pod = _pod(net, "ro")
    try:
        pod.start(Container("main", ["/bin/bash", "-c", "--", "exec sleep 600"], ENV, mounts, read_only_root=True))
        for path in ("/data/x", "/scratch/x", "/dev/shm/x"):
            result = pod.exec(["touch", path], timeout=30)
            assert result.rc == 0, f"{path}: {result.out}"
        checkout = Path(__file__).resolve().parents[2]
        for path in ("/x", "/tmp/x", "/home/app/x", "/root/x", "/etc/x", "/etc/conf/y", "/usr/x",
                     f"{checkout}/x", f"{Path(sys.prefix).resolve()}/x"):
            result = pod.exec(["touch", path], timeout=30)
            assert result.rc != 0 and "Read-only file system" in result.out, f"{path} is writable: {result.out}"
        assert (data / "x").exists() and not (checkout / "x").exists()
    finally:
        pod.close()
