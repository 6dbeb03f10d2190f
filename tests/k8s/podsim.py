"""Pod stand-ins on one machine, close to what the kubelet and a container runtime give a pod.

* ``Network``: a bridge in a network namespace of its own; every pod is a network namespace with one veth
  (``eth0``, its own IP, a default route to the bridge). Nothing is added to the host's namespace, so no traffic
  leaves the simulated pods.
* ``Pod``: a network namespace, a hostname (UTS namespace) and ``/etc/hosts`` (the cluster DNS stand-in). Each
  container runs in its own PID namespace (its command is PID 1, as under containerd) and mount namespace, chrooted
  into a root assembled from the host's directories, with a private ``/tmp``, ``/root``, ``/home``, ``/run``,
  ``/etc`` (an overlay, so ``/etc/hosts`` and new mount points stay in the pod) and a 64 MiB ``/dev/shm``; its
  volumes are mounted at their real paths, so rendered commands run verbatim. With ``read_only_root``
  (``securityContext.readOnlyRootFilesystem``) every other mount of that root is read-only and there is no private
  ``/tmp``: only the writable volumes, ``/dev`` and ``/dev/shm`` take writes. Mounts exist only in that mount
  namespace and vanish with it.
* Kubelet behaviour: init containers run to completion first; ``exec`` enters the container's namespaces (what an
  exec hook or ``kubectl exec`` does); ``terminate(grace)`` runs the ``preStop`` command to completion (bounded
  by the grace period), then sends SIGTERM to the container's PID 1 and SIGKILL when the grace period ends (at
  least 2 s after a hook that used it all up, like the kubelet).

Not simulated: cgroup limits (requests/limits are not enforced), the non-root user of ``securityContext``
(containers run as root here), image layers (the host's ``/usr``, ``/opt``, ``/work`` ... are bound in).
Needs root, ``ip`` (iproute2), ``unshare``/``nsenter`` (util-linux) and overlayfs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.proc import kill_session

SUBNET = "10.244.0"  # /24 inside the simulated network only; .1 is the node (bridge, cluster DNS)
HOST_DIRS_NOT_SHARED = {"proc", "sys", "dev", "tmp", "etc", "root", "home", "run", "lost+found", "old_root"}
DEFAULT_SHM_BYTES = 64 * 2**20
MIN_KILL_GRACE_S = 2.0  # kubelet: minimumGracePeriodInSeconds after a preStop hook
_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 10**-3, "": 1}


def quantity(text: str | int | float) -> float:
    """A Kubernetes resource quantity ("500m", "4Gi", "2") as a number."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def missing_tools() -> list[str]:
    """What this machine lacks to run pod stand-ins ([] = ready)."""
    missing = [] if os.geteuid() == 0 else ["root (network, PID and mount namespaces)"]
    missing += [t for t in ("ip", "unshare", "nsenter", "chroot") if shutil.which(t, path=_SYSTEM_PATH) is None]
    return missing


@dataclass(frozen=True)
class Mount:
    """A volume inside a container. ``source`` None = a fresh tmpfs of ``size_bytes``."""

    path: str
    source: Path | None = None
    size_bytes: int | None = None
    read_only: bool = False


@dataclass(frozen=True)
class Container:
    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    mounts: Sequence[Mount] = ()
    # securityContext.readOnlyRootFilesystem: everything but the volumes, /dev (with /dev/shm), /proc and /sys is
    # read-only, the root's /tmp, /root, /home and /run included (no private /tmp then: only a volume makes it writable)
    read_only_root: bool = False
    workdir: str = "/"


@dataclass(frozen=True)
class Exited:
    """A finished command. ``rc`` None = it ran past its timeout and was killed."""

    rc: int | None
    out: str


@dataclass(frozen=True)
class Termination:
    """What a kubelet-like stop did: the hook's result, the signal that ended PID 1, how long each part took."""

    pre_stop: Exited | None
    pre_stop_s: float
    ended_by: str  # "SIGTERM" (PID 1 exited within the grace period) or "SIGKILL"
    seconds: float


_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _tool(name: str) -> str:
    found = shutil.which(name, path=_SYSTEM_PATH)
    if found is None:
        raise RuntimeError(f"{name} not found in {_SYSTEM_PATH}")
    return found


def _private_host_dirs_needed() -> list[str]:
    """Host dirs the pods need from places they do not share (/tmp, /root, /home, /run): this interpreter's
    installation (which the venv's ``python`` links to), the venv and this checkout — the image's Python and
    ``/app`` in the stand-in — wherever the clone happens to live."""
    private = HOST_DIRS_NOT_SHARED - {"proc", "sys", "dev", "etc"}
    wanted = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(__file__).resolve().parents[2]}
    dirs = sorted(str(p) for p in wanted if len(p.parts) > 1 and p.parts[1] in private)
    return [d for d in dirs if not any(d.startswith(f"{other}/") for other in dirs)]


def _read_only_root_lines(root: str, writable: Sequence[str]) -> list[str]:
    """Shell that makes every mount of the assembled root read-only (the tmpfs root itself, the host directories
    bound in as image layers and their submounts, /etc) except the container's writable volumes and what the
    runtime keeps writable whatever the securityContext says (/dev, /dev/shm; /proc and /sys as they are)."""
    keep = [f"{root}{p}" for p in ("/dev", "/dev/*", "/proc", "/proc/*", "/sys", "/sys/*")]
    keep += [f"{root}{shlex.quote(p.rstrip('/'))}" for p in writable]
    return [
        f"awk -v r={root} '$5 == r || index($5, r \"/\") == 1 {{print $5}}' /proc/self/mountinfo | sort -u |",
        "while read -r mp; do",
        f"  case \"$mp\" in {'|'.join(keep)}) continue ;; esac",
        '  mount -o remount,bind,ro "$mp"',
        "done",
    ]


@dataclass(frozen=True)
class Launched:
    proc: subprocess.Popen[bytes]
    log: Path


def _run(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, **kw)


class Network:
    """The pod network: one bridge (in netns ``<tag>-net``), one veth per pod. ``dns``: name → IP for /etc/hosts."""

    def __init__(self, tag: str, root: Path) -> None:
        self.tag = tag
        self.netns: list[str] = []
        self.dns: dict[str, str] = {}
        self._next = 2
        self._dns_file = root / f"{tag}-dns.json"
        self._dns_file.write_text("{}")
        self._dns_proc: subprocess.Popen[bytes] | None = None
        self.bridge_ns = self._add_netns("net")
        _run(["ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.bridge_ns, "addr", "add", f"{self.node_ip}/24", "dev", "br0"])
        _run(["ip", "-n", self.bridge_ns, "link", "set", "br0", "up"])
        with open(root / f"{tag}-dns.log", "ab") as out:
            self._dns_proc = subprocess.Popen(
                ["ip", "netns", "exec", self.bridge_ns, sys.executable, str(Path(__file__).with_name("cluster_dns.py")),
                 self.node_ip, str(self._dns_file)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def add_dns(self, name: str, ip: str) -> None:
        """Register ``name`` (e.g. a Service's FQDN) → ``ip`` with the cluster DNS."""
        self.dns[name.lower()] = ip
        tmp = self._dns_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.dns))
        tmp.replace(self._dns_file)

    def resolv_conf(self, namespace: str) -> str:
        """A pod's /etc/resolv.conf, as the kubelet writes it for dnsPolicy ClusterFirst."""
        return (f"nameserver {self.node_ip}\nsearch {namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
                "options ndots:5\n")

    def _add_netns(self, name: str) -> str:
        netns = f"{self.tag}-{name}"
        _run(["ip", "netns", "add", netns])
        self.netns.append(netns)
        _run(["ip", "-n", netns, "link", "set", "lo", "up"])
        return netns

    def attach(self, name: str) -> tuple[str, str]:
        """A new pod network namespace on the bridge → (netns name, pod IP)."""
        netns = self._add_netns(name)
        ip, port = f"{SUBNET}.{self._next}", f"v{self._next}"
        self._next += 1
        _run(["ip", "-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns])
        _run(["ip", "-n", self.bridge_ns, "link", "set", port, "master", "br0", "up"])
        _run(["ip", "-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0"])
        _run(["ip", "-n", netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", netns, "route", "add", "default", "via", f"{SUBNET}.1"])
        return netns, ip

    def http_ok(self, url: str, timeout: float = 5.0) -> bool:
        """An HTTP GET from the node (the bridge's namespace, where the kubelet's probes come from) → 2xx?"""
        code = ("import sys, urllib.request\n"
                "try:\n    urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))\n"
                "except Exception:\n    sys.exit(1)\n")
        proc = subprocess.run(["ip", "netns", "exec", self.bridge_ns, sys.executable, "-c", code, url, str(timeout)],
                              capture_output=True, check=False, timeout=timeout + 30)
        return proc.returncode == 0

    node_ip = f"{SUBNET}.1"  # the node's address on the pod network: kubelet probes and the cluster DNS

    def close(self) -> None:
        if self._dns_proc is not None:
            kill_session(self._dns_proc.pid)
            self._dns_proc.wait()
            self._dns_proc = None
        for netns in reversed(self.netns):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        self.netns.clear()


class Pod:
    """One pod stand-in: see the module docstring. Call ``close()`` (or ``kill()``) whatever happens."""

    def __init__(self, net: Network, name: str, namespace: str, labels: Mapping[str, str], root: Path) -> None:
        self.net, self.name, self.namespace, self.labels = net, name, namespace, dict(labels)
        self.netns, self.ip = net.attach(name)
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.container: Container | None = None
        self._pid1: int | None = None
        self._execs: list[subprocess.Popen[bytes]] = []

    # --- the container's root and launch line -------------------------------------------------------------------
    def _etc_files(self) -> tuple[Path, Path]:
        """The kubelet-managed /etc/hosts (localhost, the pod itself) and /etc/resolv.conf (the cluster DNS)."""
        hosts, resolv = self.dir / "hosts", self.dir / "resolv.conf"
        hosts.write_text(f"127.0.0.1\tlocalhost\n{self.ip}\t{self.name}\n")
        resolv.write_text(self.net.resolv_conf(self.namespace))
        return hosts, resolv

    def _setup_script(self, c: Container) -> str:
        """Shell run as PID 1 in the new namespaces: assemble the root, then exec the container's argv chrooted."""
        d = self.dir / c.name
        for sub in ("root", "tmp", "etc-upper", "etc-work"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "tmp").chmod(0o1777)
        r = shlex.quote(str(d / "root"))
        q = shlex.quote
        hosts, resolv = self._etc_files()
        lines = ["set -eu", 'CONTAINER_PATH="${PATH:-}"', f"PATH={_SYSTEM_PATH}", f"hostname {q(self.name)}",
                 f"mount -t tmpfs -o mode=755 podroot {r}"]
        for entry in sorted(os.scandir("/"), key=lambda e: e.name):
            if entry.is_symlink():
                lines.append(f"ln -s {q(os.readlink(entry.path))} {r}/{q(entry.name)}")
            elif entry.is_dir() and entry.name not in HOST_DIRS_NOT_SHARED:
                lines.append(f"mkdir {r}/{q(entry.name)} && mount --rbind {q(entry.path)} {r}/{q(entry.name)}")
        lines += [
            f"mkdir {r}/etc && mount -t overlay overlay -o lowerdir=/etc,upperdir={q(str(d / 'etc-upper'))},"
            f"workdir={q(str(d / 'etc-work'))} {r}/etc",
            f"cat {q(str(hosts))} > {r}/etc/hosts && cat {q(str(resolv))} > {r}/etc/resolv.conf && "
            f"echo {q(self.name)} > {r}/etc/hostname",
            f"mkdir {r}/dev && mount --rbind /dev {r}/dev",
            f"mount -t tmpfs -o size={DEFAULT_SHM_BYTES} shm {r}/dev/shm",
            f"mkdir {r}/proc && mount -t proc proc {r}/proc",
            f"mkdir {r}/sys && mount --rbind /sys {r}/sys",
            f"mkdir {r}/tmp" + ("" if c.read_only_root else f" && mount --bind {q(str(d / 'tmp'))} {r}/tmp"),
            f"mkdir -p {r}/root {r}/home {r}/run",
        ]
        for shared in _private_host_dirs_needed():
            lines.append(f"mkdir -p {r}{q(shared)} && mount --rbind {q(shared)} {r}{q(shared)}")
        for m in sorted(c.mounts, key=lambda m: m.path.count("/")):
            target = f"{r}{q(m.path)}"
            if m.source is None:
                lines.append(f"mkdir -p {target} && mount -t tmpfs -o size={m.size_bytes or DEFAULT_SHM_BYTES} "
                             f"vol {target}")
            elif m.source.is_dir():
                lines.append(f"mkdir -p {target} && mount --bind {q(str(m.source))} {target}")
            else:
                lines.append(f"mkdir -p $(dirname {target}) && touch {target} && "
                             f"mount --bind {q(str(m.source))} {target}")
            if m.read_only:
                lines.append(f"mount -o remount,bind,ro {target}")
        if home := c.env.get("HOME"):
            lines.append(f"mkdir -p {r}{q(home)}")
        if c.read_only_root:
            lines += _read_only_root_lines(r, [m.path for m in c.mounts if not m.read_only])
        lines.append('export PATH="$CONTAINER_PATH"')
        lines.append(f'exec {_tool("chroot")} {r} /usr/bin/env -C {q(c.workdir)} "$@"')
        return "\n".join(lines)

    def _launch(self, c: Container, log_path: Path) -> subprocess.Popen[bytes]:
        argv = ["ip", "netns", "exec", self.netns, "unshare", "--pid", "--fork", "--kill-child", "--mount", "--uts",
                "--propagation", "private", "--", "/bin/sh", "-c", self._setup_script(c), "podsim", *c.argv]
        env = {"HOSTNAME": self.name, **c.env}
        with open(log_path, "ab") as out:
            return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    # --- kubelet-like operations ----------------------------------------------------------------------------------
    def run(self, c: Container, timeout: float) -> Exited:
        """Run a container to completion (an init container)."""
        return self.finish(self.launch(c), timeout)

    def launch(self, c: Container) -> Launched:
        """Start a container that is meant to finish (an init container); ``finish()`` collects it."""
        log_path = self.dir / f"{c.name}.log"
        return Launched(self._launch(c, log_path), log_path)

    def finish(self, launched: Launched, timeout: float) -> Exited:
        """Wait for a ``launch()``ed container (killed past ``timeout``) → its exit status and output."""
        proc, log_path = launched.proc, launched.log
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            kill_session(proc.pid)
            proc.wait()
        return Exited(rc, log_path.read_text(errors="replace"))

    def start(self, c: Container, timeout: float = 60) -> None:
        """Start the pod's main container; its argv becomes PID 1 of a new PID namespace. Returns once PID 1 runs
        in the container's root (what "Running" means to the kubelet), so ``exec`` sees the container's mounts."""
        assert self.proc is None, f"{self.name}: already started"
        self.container = c
        self.proc = self._launch(c, self.dir / f"{c.name}.log")
        self._pid1 = None
        root = str(self.dir / c.name / "root")
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:  # a container that already exited is left to wait()
            with contextlib.suppress(OSError, RuntimeError):
                if os.readlink(f"/proc/{self.pid1}/root") == root:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: container did not start in {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.02)

    @property
    def pid1(self) -> int:
        """Host PID of the container's PID 1 (the process ``unshare`` forked)."""
        assert self.proc is not None, f"{self.name}: not started"
        deadline = time.monotonic() + 30
        while self._pid1 is None:
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
                if children:
                    self._pid1 = int(children[0])
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: container exited before PID 1 was seen:\n{self.log()[-2000:]}")
            time.sleep(0.05)
        return self._pid1

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        if self.container is None:
            return ""
        path = self.dir / f"{self.container.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def exec(self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Exited:
        """Run ``argv`` inside the running container (its namespaces, root and environment), like an exec hook."""
        assert self.container is not None
        enter = ["nsenter", "-t", str(self.pid1), "-n", "-m", "-u", "-p", "-r", "-w", "--", *argv]
        proc = subprocess.Popen(enter, env=dict(env if env is not None else self.container.env),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        self._execs.append(proc)
        try:
            out, _ = proc.communicate(timeout=timeout)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            out, _ = proc.communicate()
            rc = None
        finally:
            kill_session(proc.pid)
        return Exited(rc, out.decode(errors="replace"))

    def netns_run(self, argv: Sequence[str], timeout: float) -> Exited:
        """Run a host command in this pod's network namespace only (probes from pods that run no container)."""
        try:
            proc = subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            return Exited(None, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else "")
        return Exited(proc.returncode, proc.stdout + proc.stderr)

    def wait(self, timeout: float) -> int | None:
        """Wait for the main container to exit → its status, or None while it still runs."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, grace_s: float, pre_stop: Sequence[str] | None = None) -> Termination:
        """The kubelet's container stop: preStop to completion (within the grace period), SIGTERM to PID 1,
        SIGKILL when the grace period is over (never sooner than 2 s after SIGTERM when the hook used it up)."""
        start = time.monotonic()
        pid1 = self.pid1
        hook: Exited | None = None
        if pre_stop:
            hook = self.exec(pre_stop, timeout=grace_s)
        hook_s = time.monotonic() - start
        remaining = max(grace_s - hook_s, MIN_KILL_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid1, signal.SIGTERM)
        ended_by = "SIGTERM"
        if self.wait(remaining) is None:
            ended_by = "SIGKILL"
            self.kill()
        return Termination(hook, hook_s, ended_by, time.monotonic() - start)

    def kill(self) -> None:
        """SIGKILL PID 1 (the kernel then kills every process of its PID namespace), then the launcher's session."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, RuntimeError):
            if self.proc.poll() is None:
                os.kill(self.pid1, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        kill_session(self.proc.pid)
        for proc in self._execs:
            kill_session(proc.pid)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- pod template → containers (the kubelet's view of a rendered pod spec) -------------------------------------------
@dataclass
class Volumes:
    """Where a pod's volumes come from: claims (PVC name → shared host dir, the RWX stand-in) and the rendered
    ConfigMaps/Secrets (name → ``data``) that configMap/secret volumes project."""

    claims: Mapping[str, Path]
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def of_release(cls, objs: Sequence[Mapping[str, Any]], pvc: Path) -> Volumes:
        """A rendered release's volumes: every PersistentVolumeClaim on the one host dir ``pvc``, and its
        ConfigMaps and Secrets as rendered."""

        def named(kind: str) -> dict[str, Any]:
            return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}

        return cls(
            claims=dict.fromkeys(named("PersistentVolumeClaim"), pvc),
            config_maps={name: o["data"] for name, o in named("ConfigMap").items()},
            secrets={name: o["data"] for name, o in named("Secret").items()},
        )


def image_env() -> dict[str, str]:
    """What the image sets (Dockerfile ENV): this checkout's venv stands in for /opt/sc-app."""
    venv = Path(sys.executable).parent.parent
    return {"PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(venv), "HOME": "/home/scapp",
            "PYTHONUNBUFFERED": "1"}


def container_mounts(pod_spec: Mapping[str, Any], container: Mapping[str, Any], volumes: Volumes,
                     pod_dir: Path) -> list[Mount]:
    """The container's ``volumeMounts`` resolved against the pod's ``volumes``."""
    by_name = {v["name"]: v for v in pod_spec.get("volumes", [])}
    out = []
    for vm in container.get("volumeMounts", []):
        vol = by_name[vm["name"]]
        ro = bool(vm.get("readOnly"))
        if "persistentVolumeClaim" in vol:
            out.append(Mount(vm["mountPath"], volumes.claims[vol["persistentVolumeClaim"]["claimName"]], read_only=ro))
        elif "emptyDir" in vol:
            ed = vol["emptyDir"] or {}
            if ed.get("medium") == "Memory":
                size = int(quantity(ed["sizeLimit"])) if ed.get("sizeLimit") else None
                out.append(Mount(vm["mountPath"], None, size, ro))
            else:
                src = pod_dir / "volumes" / vm["name"]
                src.mkdir(parents=True, exist_ok=True)
                out.append(Mount(vm["mountPath"], src, read_only=ro))
        elif "configMap" in vol or "secret" in vol:
            if "configMap" in vol:
                data = dict(volumes.config_maps[vol["configMap"]["name"]])
            else:
                secret = volumes.secrets[vol["secret"]["secretName"]]
                data = {k: base64.b64decode(v).decode() for k, v in secret.items()}
            src = pod_dir / "volumes" / vm["name"]
            src.mkdir(parents=True, exist_ok=True)
            for key, text in data.items():
                (src / key).write_text(text)
            out.append(Mount(vm["mountPath"], src, read_only=True))
        else:
            raise ValueError(f"volume {vm['name']}: kind not simulated: {sorted(vol)}")
    return out
