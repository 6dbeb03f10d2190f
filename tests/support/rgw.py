"""A real S3 server for the suite: Ceph's RADOS Gateway (Debian's ``radosgw``) on one host, started in a fresh dir.

One monitor (msgr2 on a free 127.0.0.1 port, no cephx), one memstore OSD, and ``radosgw`` (beast) on another free
loopback port; a user with fixed keys, a read-only subuser (for the read-only-bucket refusal) and one bucket. Ready in
~5 s, ~130 MiB RSS (memstore keeps objects in RAM). The configuration facts that make it start are in the
project's notes on this server (``auth ... = none`` plus ``ms mon client mode = crc secure``, fast paxos, pool size
one, every run/log path under the data dir, daemons' stdout redirected, always a fresh dir). The monitor's refusal
to start on a host disk under 5% free (``mon data avail crit``) is off: memstore keeps nothing there, and a suite
must not fail for the host's disk (it did, the OSD's mkfs hanging on a monitor that never came up).

``make test-sysdeps`` installs the packages as root; without them ``skip_reason()`` says why the S3 tests skip.
Every daemon is stopped by its PID (SIGTERM, then SIGKILL) in ``stop()``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool")
ACCESS_KEY = "SCAPPTESTACCESSKEY01"
SECRET_KEY = "sc-app-test-secret-key-0000000000000000"
RO_ACCESS_KEY = "SCAPPTESTREADONLY001"
RO_SECRET_KEY = "sc-app-test-readonly-secret-000000000000"


def skip_reason() -> str | None:
    """Why the real S3 server cannot run here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"no Ceph RADOS Gateway here ({', '.join(missing)} missing): `make test-sysdeps` installs ceph-mon "
            "ceph-osd radosgw as root"
        )
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(d: Path, mon_port: int, rgw_port: int) -> str:
    return f"""[global]
fsid = {uuid.uuid4()}
mon host = v2:127.0.0.1:{mon_port}
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc secure
ms bind msgr1 = false
paxos propose interval = 0.05
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
osd crush chooseleaf type = 0
mon cluster log to file = false
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
mon data = {d}/mon/$cluster-$id
osd data = {d}/osd/$cluster-$id
osd objectstore = memstore
memstore device bytes = 2147483648
osd max object size = 134217728
mon max pg per osd = 1000
mon data avail crit = 0
mon data avail warn = 0
rgw frontends = beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1
rgw dns name = 127.0.0.1
rgw data = {d}/rgw
"""


@dataclass
class Rgw:
    """A running radosgw: its endpoint, the owner's keys and a bucket; ``stop()`` ends every daemon by PID."""

    root: Path
    endpoint: str = ""
    bucket: str = "sc-app-test"
    pids: list[int] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "ceph.conf"

    def _daemon(self, *argv: str) -> int:
        log = open(self.root / "log" / f"{argv[0]}.out", "ab")  # noqa: SIM115 - the daemon keeps it
        proc = subprocess.Popen(
            [*argv, "-c", str(self.conf), "-f"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        self.pids.append(proc.pid)
        return proc.pid

    def _run(self, *argv: str, timeout: float = 60) -> str:
        out = subprocess.run(
            [*argv, "-c", str(self.conf)], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr[-2000:]}")
        return out.stdout

    def start(self, timeout: float = 120) -> Rgw:
        for sub in ("run", "log", "mon", "osd/ceph-0", "rgw"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        mon_port, rgw_port = _free_port(), _free_port()
        self.conf.write_text(_conf(self.root, mon_port, rgw_port))
        monmap = self.root / "monmap"
        subprocess.run(
            ["monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{mon_port}]", str(monmap)],
            check=True,
            capture_output=True,
        )
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(monmap))
        self._daemon("ceph-mon", "-i", "a")
        self._run("ceph-osd", "-i", "0", "--mkfs", timeout=timeout)
        self._daemon("ceph-osd", "-i", "0")
        self._run("radosgw-admin", "user", "create", "--uid=sc", "--display-name=sc-app tests",
                  f"--access-key={ACCESS_KEY}", f"--secret-key={SECRET_KEY}", timeout=timeout)  # fmt: skip
        self._run("radosgw-admin", "subuser", "create", "--uid=sc", "--subuser=sc:ro", "--access=read",
                  "--key-type=s3", f"--access-key={RO_ACCESS_KEY}", f"--secret-key={RO_SECRET_KEY}")  # fmt: skip
        self._daemon("radosgw", "-n", "client.rgw")
        self.endpoint = f"http://127.0.0.1:{rgw_port}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client().create_bucket(Bucket=self.bucket)
                return self
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"radosgw did not answer within {timeout:g} s; logs in {self.root / 'log'}"
                    ) from None
                time.sleep(0.3)

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=Config(
                s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=5, read_timeout=30
            ),
        )

    def env(self, *, read_only: bool = False) -> dict[str, str]:
        """The standard environment variables boto3 reads credentials from (what a pod gets)."""
        return {
            "AWS_ACCESS_KEY_ID": RO_ACCESS_KEY if read_only else ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": RO_SECRET_KEY if read_only else SECRET_KEY,
        }

    def kill_gateway(self) -> None:
        """SIGKILL radosgw (the server dies mid-request); the monitor and OSD, and so the objects, stay."""
        pid = self.pids.pop()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    def pause_gateway(self, paused: bool) -> None:
        """SIGSTOP / SIGCONT radosgw: a server that stalls (connections accepted, nothing answered)."""
        os.kill(self.pids[-1], signal.SIGSTOP if paused else signal.SIGCONT)

    def restart_gateway(self, timeout: float = 60) -> None:
        self._daemon("radosgw", "-n", "client.rgw")
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client().head_bucket(Bucket=self.bucket)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"radosgw did not come back within {timeout:g} s") from None
                time.sleep(0.2)

    def stop(self) -> None:
        for pid in reversed(self.pids):
            _end(pid)
        self.pids.clear()


def _end(pid: int, grace: float = 5.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
