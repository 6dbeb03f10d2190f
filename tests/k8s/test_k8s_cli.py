"""``sc-app k8s ...`` against local HTTP servers that answer like the Kubernetes API server and a Ray head's Jobs API.

Real ``kubernetes`` client, real HTTP on 127.0.0.1 (see fake_apiserver.py for what the fakes follow); the hang and
kubeconfig cases use real sockets and files. The CLI runs in-process (``main``; the ``cli`` fixture, on a bounded
thread where a hang must be ruled out); ``tests/e2e/test_cli_smoke.py`` runs ``python -m sc_app k8s`` itself.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.k8s.fake_apiserver import FakeApiServer, FakeRayJobsApi, auth_secret, write_kubeconfig
from tests.k8s.k8s_helpers import CHART_DIR, REPO_ROOT
from tests.support.cli import InProcess
from tests.support.proc import free_port, pids_with, sigkill_until_gone

pytest.importorskip("kubernetes", reason="kubernetes client (k8s extra) is not installed")
pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

from sc_app.k8s import driver_log
from sc_app.k8s.cli import main
from sc_app.k8s.install import INVENTORY

JOB = "demo-sc-app"
CLUSTER = f"{JOB}-abcde"
HEAD_SVC = f"{CLUSTER}-head-svc"
AUTH_SECRET = f"{JOB}-ray-auth"
RAY_TOKEN = "s3cret-ray-token"
VALUES = str(CHART_DIR / "ci" / "cpu-values.yaml")
# What the driver prints (sc_app/cli/run.py); test_live_status_of_a_real_ray_head checks a real driver's output.
DRIVER_LOG = """\
sc-app 0.1.0: max_steps=150 checkpoint.dir=/checkpoints save_period=10 ray=auto
resuming from /checkpoints/step_0 (step 0): newest verified bundle
step    9/150  reward 0.081  loss -0.0101  staleness 1.00  rows_in_tq   64  0.09s
step   10/150  reward 0.086  loss -0.0081  staleness 1.00  rows_in_tq   64  0.09s
step   10/150  saved step_10 (0.11s, training paused 2 ms, window 2 ms)
(TrainerActor pid=4321) some Ray worker output
step   12/150  reward 0.090  loss -0.0050  staleness 1.00  rows_in_tq   64  0.09s
step   12/150  SAVE FAILED: disk full
"""


@pytest.fixture
def ray_api() -> Iterator[FakeRayJobsApi]:
    ray = FakeRayJobsApi(token=RAY_TOKEN)
    ray.url = ray.start()  # type: ignore[attr-defined]
    yield ray
    ray.stop()


def run(kubeconfig: str, *argv: str) -> int:
    verb, rest = argv[0], list(argv[1:])
    return main(["k8s", verb, "demo", "-n", "ml", "--kubeconfig", kubeconfig, *rest])


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("sc-app k8s: error: ")
    assert "Traceback" not in err
    return lines[0]


def live_objects(server: FakeApiServer) -> set[tuple[str, str]]:
    return {(plural, name) for plural, _, name in server.store}


# ---------------------------------------------------------------------------------------------- submit
def test_submit_creates_chart_objects_in_order_then_refuses_a_duplicate(api, capsys) -> None:
    server, kc = api
    assert run(kc, "submit", "-f", VALUES) == 0
    created = [(m, p) for m, p, _ in server.requests if m == "POST"]
    plurals = [p.rsplit("/", 1)[1] for _, p in created]
    assert plurals == ["serviceaccounts", "secrets", "configmaps", "persistentvolumeclaims", "networkpolicies",
                       "rayjobs"]
    job = server.store[("rayjobs", "ml", JOB)]
    # Same object as the chart renders for the same values (dry-run path = helm engine).
    capsys.readouterr()
    assert main(["k8s", "submit", "demo", "-n", "ml", "-f", VALUES, "--dry-run"]) == 0
    rendered = next(d for d in yaml.safe_load_all(capsys.readouterr().out) if d and d["kind"] == "RayJob")
    assert job["spec"] == rendered["spec"]
    assert job["spec"]["entrypoint"] == "sc-app run --config /etc/sc-app/config.yaml"
    # What delete will remove: every companion but the checkpoint claim.
    assert json.loads(job["metadata"]["annotations"][INVENTORY]) == [
        f"v1/ServiceAccount/{JOB}", f"v1/Secret/{AUTH_SECRET}", f"v1/ConfigMap/{JOB}-config",
        f"networking.k8s.io/v1/NetworkPolicy/{JOB}-ray"]

    writes_before = len([r for r in server.requests if r[0] != "GET"])
    assert run(kc, "submit", "-f", VALUES) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"rayjob/{JOB} already exists in namespace ml" in line and "sc-app k8s delete demo" in line
    assert len([r for r in server.requests if r[0] != "GET"]) == writes_before, "nothing written on refusal"


def test_resubmit_replaces_stale_companions_and_keeps_the_claim(api, capsys) -> None:
    """A RayJob removed on its own (kubectl delete rayjob) leaves its companions: the next submit must not run with
    the old ConfigMap, and must not touch the bundles' claim."""
    server, kc = api
    assert run(kc, "submit", "-f", VALUES) == 0
    server.store[("persistentvolumeclaims", "ml", f"{JOB}-ckpt")]["spec"]["marker"] = "bundles"
    old_token = server.store[("secrets", "ml", AUTH_SECRET)]["data"]["auth_token"]
    del server.store[("rayjobs", "ml", JOB)]
    capsys.readouterr()
    assert run(kc, "submit", "-f", VALUES, "--set", "config.run.max_steps=7") == 0
    out = capsys.readouterr().out
    config = yaml.safe_load(server.store[("configmaps", "ml", f"{JOB}-config")]["data"]["config.yaml"])
    assert config["run"]["max_steps"] == 7, "the resubmitted job must read the new config"
    assert f"replaced configmap/{JOB}-config" in out
    assert server.store[("secrets", "ml", AUTH_SECRET)]["data"]["auth_token"] != old_token
    assert f"kept existing persistentvolumeclaim/{JOB}-ckpt" in out
    assert server.store[("persistentvolumeclaims", "ml", f"{JOB}-ckpt")]["spec"]["marker"] == "bundles"
    assert not [r for r in server.requests if r[0] in ("PUT", "DELETE") and "persistentvolumeclaims" in r[1]]


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"annotations": {"meta.helm.sh/release-name": "demo"}, "labels": {"app.kubernetes.io/instance": "demo"}},
         "belongs to Helm release 'demo'"),
        ({"labels": {"app.kubernetes.io/instance": "other"}}, "belongs to release 'other'"),
        ({}, "belongs to no release (label app.kubernetes.io/instance unset)"),
    ],
    ids=["helm-release", "other-release", "unlabelled"],
)
def test_submit_never_overwrites_what_is_not_its_own(api, capsys, meta, expected) -> None:
    server, kc = api
    server.add("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": f"{JOB}-config", **meta}, "data": {"x": "1"}})
    assert run(kc, "submit", "-f", VALUES) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"configmap/{JOB}-config exists in namespace ml and it {expected}" in line
    assert [r for r in server.requests if r[0] != "GET"] == [], "nothing written"


def test_crd_not_installed_is_one_clear_line_and_creates_nothing(api, capsys) -> None:
    server, kc = api
    server.serve_rayjobs = False
    assert run(kc, "submit", "-f", VALUES) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "RayJob objects (ray.io/v1) are not served by this cluster" in line and "KubeRay operator" in line
    assert not server.store
    assert run(kc, "status") == 2
    assert "not served by this cluster" in one_error_line(capsys.readouterr().err)


def _chart_with_podmonitor(tmp_path: Path) -> Path:
    """The chart plus one kind it does not render today (a Prometheus Operator PodMonitor)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart)
    (chart / "templates" / "podmonitor.yaml").write_text(
        "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata:\n"
        '  name: {{ include "sc-app.fullname" . }}-metrics\n  labels:\n'
        '    {{- include "sc-app.labels" . | nindent 4 }}\n'
        "spec:\n  selector:\n    matchLabels:\n"
        '      {{- include "sc-app.selectorLabels" . | nindent 6 }}\n'
        "  podMetricsEndpoints: [{port: metrics}]\n"
    )
    return chart


def test_a_kind_new_to_the_chart_is_created_and_deleted(api, capsys, tmp_path) -> None:
    server, kc = api
    chart = str(_chart_with_podmonitor(tmp_path))
    assert run(kc, "submit", "-f", VALUES, "--chart", chart) == 2, "PodMonitor CRD not served yet"
    line = one_error_line(capsys.readouterr().err)
    assert "PodMonitor objects (monitoring.coreos.com/v1) are not served" in line and "Prometheus Operator" in line
    assert not server.store, "refused before writing anything"

    server.extra_groups["monitoring.coreos.com/v1"] = {"podmonitors": ("PodMonitor", True)}
    assert run(kc, "submit", "-f", VALUES, "--chart", chart) == 0
    posts = [p.rsplit("/", 1)[1] for m, p, _ in server.requests if m == "POST"]
    assert posts[-1] == "rayjobs" and "podmonitors" in posts, "the RayJob stays last"
    assert ("podmonitors", "ml", f"{JOB}-metrics") in server.store
    # delete reads what submit wrote off the RayJob: no chart or values needed to find the new kind.
    assert run(kc, "delete") == 0
    assert live_objects(server) == {("persistentvolumeclaims", f"{JOB}-ckpt")}


# ---------------------------------------------------------------------------------------------- delete
def _make_running(server: FakeApiServer) -> None:
    """What KubeRay does with a submitted RayJob: a cluster with a head pod and service, a running Ray job."""
    job = server.store[("rayjobs", "ml", JOB)]
    job["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": f"{JOB}-x7k2p",
                     "rayClusterName": CLUSTER, "failed": 0,
                     "dashboardURL": f"{HEAD_SVC}.ml.svc.cluster.local:8265"}
    labels = {"ray.io/cluster": CLUSTER, "ray.io/node-type": "head"}
    server.add("pods", {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": f"{CLUSTER}-head-q8z", "labels": labels}})
    server.add("services", {"apiVersion": "v1", "kind": "Service",
                            "metadata": {"name": HEAD_SVC, "labels": labels},
                            "spec": {"ports": [{"name": "dashboard", "port": 8265}]}})


def test_delete_removes_what_submit_created_but_never_the_claim(api, capsys) -> None:
    server, kc = api
    assert run(kc, "submit", "-f", VALUES) == 0
    _make_running(server)
    capsys.readouterr()
    assert run(kc, "delete") == 0
    out = capsys.readouterr().out
    assert live_objects(server) == {("persistentvolumeclaims", f"{JOB}-ckpt")}, out
    assert f"kept persistentvolumeclaim/{JOB}-ckpt: the checkpoint PVC and its bundles are kept" in out
    assert server.stuck == [], "KubeRay's finalizer found the auth Secret and stopped the Ray job"
    deletes = [p.split("/")[-2] for m, p, _ in server.requests if m == "DELETE"]
    assert deletes[0] == "rayjobs" and set(deletes[1:]) == {"secrets", "configmaps", "serviceaccounts",
                                                            "networkpolicies"}
    # The same release again, from scratch.
    assert run(kc, "submit", "-f", VALUES) == 0
    assert run(kc, "delete") == 0
    assert run(kc, "delete") == 0, "deleting what is gone is not an error"
    assert f"rayjob/{JOB}: already gone" in capsys.readouterr().out


def test_delete_keeps_companions_until_kuberay_has_let_the_job_go(api, capsys) -> None:
    server, kc = api
    assert run(kc, "submit", "-f", VALUES) == 0
    _make_running(server)
    server.kuberay_running = False  # the finalizer stays: nothing may pull the auth Secret from under it
    capsys.readouterr()
    assert run(kc, "delete", "--timeout", "0.3", "--poll", "0.05") == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"rayjob/{JOB} is still being deleted after 0.3s" in line and "run `sc-app k8s delete demo` again" in line
    assert ("secrets", "ml", AUTH_SECRET) in server.store and ("configmaps", "ml", f"{JOB}-config") in server.store
    assert run(kc, "submit", "-f", VALUES) == 2
    assert "still being deleted" in one_error_line(capsys.readouterr().err)
    server.kuberay_running = True
    assert run(kc, "delete", "--poll", "0.05") == 0
    assert live_objects(server) == {("persistentvolumeclaims", f"{JOB}-ckpt")}
    assert server.stuck == []


def test_delete_leaves_a_helm_release_to_helm(api, capsys) -> None:
    server, kc = api
    assert run(kc, "submit", "-f", VALUES) == 0
    server.store[("rayjobs", "ml", JOB)]["metadata"]["annotations"]["meta.helm.sh/release-name"] = "demo"
    assert run(kc, "delete") == 2
    assert "belongs to Helm release 'demo'" in one_error_line(capsys.readouterr().err)
    assert ("rayjobs", "ml", JOB) in server.store


# ---------------------------------------------------------------------------------------------- errors
def test_forbidden_is_one_clear_line(api, capsys) -> None:
    server, kc = api
    server.forbidden_user = "system:serviceaccount:ci:deployer"
    assert run(kc, "status") == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("sc-app k8s: error: forbidden: ")
    assert 'cannot get resource "rayjobs" in API group "ray.io"' in line


def test_not_found(api, capsys) -> None:
    _, kc = api
    for verb in ("status", "suspend", "resume", "wait"):
        assert run(kc, verb) == 2
        assert f"rayjob/{JOB} not found in namespace ml" in one_error_line(capsys.readouterr().err)


def test_unreachable_api_server_and_bad_values(tmp_path: Path, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(str(kc), f"http://127.0.0.1:{port}")
    assert run(str(kc), "status") == 1
    line = one_error_line(capsys.readouterr().err)
    assert "cannot reach the Kubernetes API server" in line and "connection refused" in line
    assert run(str(kc), "submit", "--set", "job.backoffLimit=-2", "--set", "image.tag=v1") == 2
    assert "backoffLimit" in one_error_line(capsys.readouterr().err)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    sock.close()
    for conn in held:
        conn.close()


def test_a_silent_api_server_is_one_line_not_a_hang(cli: InProcess, silent_server: str, tmp_path: Path) -> None:
    """In this process on a thread (``within``): a call still running after 20 s fails the test as a hang."""
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(str(kc), silent_server)
    common = ["demo", "-n", "ml", "--kubeconfig", str(kc)]
    for verb in (["status"], ["suspend"], ["submit", "-f", VALUES], ["delete"]):
        proc = cli("k8s", *verb, *common, "--request-timeout", "1", within=20)
        assert proc.rc == 1, proc.stderr
        line = one_error_line(proc.stderr)
        assert f"the API server at {silent_server} did not answer within 1s" in line, line
    # wait: --timeout is the total, whatever one request may take (--request-timeout defaults to 30 s).
    proc = cli("k8s", "wait", *common, "--timeout", "2", within=20)
    assert proc.rc == 1, proc.stderr
    line = one_error_line(proc.stderr)
    assert "gave up after the 2s --timeout" in line, line
    waited = re.search(r"did not answer within ([\d.]+)s", line)
    assert waited and float(waited.group(1)) <= 2, f"the request was bounded by what was left of --timeout: {line}"


@pytest.mark.parametrize(
    ("content", "context", "expected"),
    [
        ("apiVersion: v1\nclusters: [\n  - {name: x\n", None, "not a valid kubeconfig (ParserError"),
        ("just a string\n", None, "not a valid kubeconfig"),
        ("apiVersion: v1\nclusters: 5\ncurrent-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n", None,
         "not a valid kubeconfig"),
        (b"\xff\xfe\x00binary", None, "not a valid kubeconfig (UnicodeDecodeError"),
        (None, "nope", "no context named 'nope' (it has: fake); pass an existing --context"),
        ("", None, "file is empty"),
        ("<dir>", None, "cannot read (Is a directory)"),
        ("<missing>", None, "No configuration found"),
    ],
    ids=["malformed-yaml", "not-a-mapping", "wrong-types", "not-utf8", "unknown-context", "empty", "directory",
         "missing"],
)
def test_unusable_kubeconfig_is_one_line_exit_2(tmp_path: Path, capsys, content, context, expected) -> None:
    kc = tmp_path / "kubeconfig"
    if content is None:
        write_kubeconfig(str(kc), "http://127.0.0.1:9")
    elif content == "<dir>":
        kc.mkdir()
    elif content != "<missing>":
        kc.write_bytes(content if isinstance(content, bytes) else content.encode())
    extra = ["--context", context] if context else []
    assert run(str(kc), "status", *extra) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"kubeconfig {kc}: " in line and expected in line, line


@pytest.mark.parametrize(
    "flags",
    [["status", "--request-timeout", "0"], ["wait", "--timeout", "-1"], ["wait", "--timeout", "nan"],
     ["wait", "--poll", "0"], ["delete", "--timeout", "inf"], ["status", "--events", "-2"]],
    ids=["request-timeout-0", "negative-timeout", "nan", "poll-0", "inf", "negative-events"],
)
def test_time_flags_must_be_positive_seconds(cli: InProcess, flags: list[str]) -> None:
    """0 would mean "no timeout" to urllib3: a time flag that means no limit must not be accepted."""
    proc = cli("k8s", flags[0], "demo", *flags[1:], env={"KUBECONFIG": "/nonexistent"})
    assert proc.rc == 2 and "Traceback" not in proc.out
    assert proc.stderr.count("error:") == 1 and f"argument {flags[1]}: " in proc.stderr, proc.stderr


def test_the_cli_module_loads_neither_kubernetes_nor_helm() -> None:
    """`sc-app` registers `k8s` for every command: its import must stay cheap. A fresh interpreter of its own: this
    process has imported kubernetes long ago."""
    code = ("import sys, sc_app.cli; sc_app.cli.build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'helm_python', 'urllib3')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------- status and wait
def _seed_running_job(server: FakeApiServer, preflight_log: str | None) -> None:
    server.add("rayjobs", {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": JOB, "labels": {"app.kubernetes.io/instance": "demo"}},
        "spec": {"backoffLimit": 5, "entrypoint": "sc-app run",
                 "rayClusterSpec": {"authOptions": {"mode": "token", "secretName": AUTH_SECRET}}},
        "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "failed": 2, "succeeded": 0,
                   "rayClusterName": CLUSTER, "jobId": f"{JOB}-x7k2p",
                   "dashboardURL": f"{HEAD_SVC}.ml.svc.cluster.local:8265"},
    })
    labels = {"ray.io/cluster": CLUSTER, "ray.io/node-type": "head"}
    # The head lost before this attempt lingers while it terminates; its preflight said something else.
    server.add("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{CLUSTER}-head-old", "labels": labels, "deletionTimestamp": "2026-01-01T00:30:00Z"}})
    server.logs[("ml", f"{CLUSTER}-head-old", "preflight")] = json.dumps({"decision": "fresh", "step": 0})
    head = f"{CLUSTER}-head-x1"
    server.add("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": head, "labels": labels},
                        "spec": {"containers": [{"name": "ray-head", "image": "x"}]}})
    if preflight_log is not None:
        server.logs[("ml", head, "preflight")] = preflight_log
    server.add("services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": HEAD_SVC, "labels": labels},
                            "spec": {"ports": [{"name": "dashboard", "port": 8265}, {"name": "gcs", "port": 6379}]}})
    server.add("secrets", auth_secret(AUTH_SECRET, RAY_TOKEN))


def test_status_shows_deployment_retries_and_resume_step(api, capsys) -> None:
    server, kc = api
    plan = {"decision": "resume", "reason": "newest verified bundle", "bundle": "/checkpoints/step_40", "step": 40,
            "checked": [], "quarantined": []}
    _seed_running_job(server, json.dumps(plan, indent=2))
    assert run(kc, "status") == 0
    out = capsys.readouterr().out
    assert f"rayjob/{JOB}: Running, job RUNNING" in out
    assert "retries used: 2 of backoffLimit 5" in out
    assert "step 40 [resume]" in out, "the live head's preflight, not the terminating one's"
    assert run(kc, "status", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["retriesUsed"], doc["backoffLimit"], doc["resumeStep"]) == (2, 5, 40)
    assert doc["headPod"] == f"{CLUSTER}-head-x1"


def test_status_after_a_fresh_start(api, capsys) -> None:
    server, kc = api
    _seed_running_job(server, json.dumps({"decision": "fresh", "reason": "no step_N bundle", "bundle": None,
                                          "step": 0, "checked": [], "quarantined": []}))
    assert run(kc, "status") == 0
    assert "none (fresh start) [fresh]" in capsys.readouterr().out


def test_status_without_preflight_log_says_unknown(api, capsys) -> None:
    server, kc = api
    _seed_running_job(server, None)
    assert run(kc, "status") == 0
    assert "unknown (no preflight log yet)" in capsys.readouterr().out


def test_live_status_through_the_service_proxy(api, ray_api, capsys) -> None:
    server, kc = api
    _seed_running_job(server, json.dumps({"decision": "resume", "step": 0}))
    server.endpoints[("ml", HEAD_SVC)] = ray_api.url
    ray_api.add_job(f"{JOB}-x7k2p", "RUNNING", DRIVER_LOG)
    assert run(kc, "status", "--events", "3") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"rayjob/{JOB}: Running, job RUNNING"
    i = out.index(f"live: ray job {JOB}-x7k2p RUNNING: step 12/150, newest bundle step_10 (saved by this attempt)")
    assert out[i + 1:] == ["last events:",
                           "  resuming from /checkpoints/step_0 (step 0): newest verified bundle",
                           "  step   10/150  saved step_10 (0.11s, training paused 2 ms, window 2 ms)",
                           "  step   12/150  SAVE FAILED: disk full"]
    # The token reached Ray in the header that survives the proxy; the kubeconfig's credentials did not.
    for path, headers in ray_api.seen:
        assert path.startswith(f"/api/jobs/{JOB}-x7k2p")
        assert headers.get("x-ray-authorization") == f"Bearer {RAY_TOKEN}" and "authorization" not in headers
    assert RAY_TOKEN not in "\n".join(out)
    proxied = [p for _, p, _ in server.requests if "/proxy/" in p]
    assert proxied == [f"/api/v1/namespaces/ml/services/{HEAD_SVC}:8265/proxy/api/jobs/{JOB}-x7k2p",
                       f"/api/v1/namespaces/ml/services/{HEAD_SVC}:8265/proxy/api/jobs/{JOB}-x7k2p/logs"]
    assert run(kc, "status", "--json") == 0
    live = json.loads(capsys.readouterr().out)["live"]
    assert (live["step"], live["maxSteps"], live["newestBundleStep"], live["rayStatus"]) == (12, 150, 10, "RUNNING")
    assert [e["kind"] for e in live["events"]] == ["started", "resumed", "saved", "save_failed"]


def _deny(server, verb, resource):
    server.denied.add((verb, resource))


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (lambda s, r: _deny(s, "get", "services/proxy"),
         'forbidden: services/proxy "demo-sc-app-abcde-head-svc" is forbidden: User "system:serviceaccount:ml:ci" '
         'cannot get resource "services/proxy"'),
        (lambda s, r: _deny(s, "get", "secrets"), "cannot read the Ray auth token from secret/demo-sc-app-ray-auth: "
                                                  "forbidden"),
        (lambda s, r: s.store.pop(("secrets", "ml", AUTH_SECRET)), "secret/demo-sc-app-ray-auth with the Ray auth "
                                                                   "token not found"),
        (lambda s, r: setattr(r, "token", "rotated"), "the Ray dashboard refused the token (Forbidden: Invalid "
                                                      "authentication token)"),
        (lambda s, r: s.endpoints.clear(), "the head is not reachable through service/demo-sc-app-abcde-head-svc"),
        (lambda s, r: r.stop(), "error trying to reach service: dial tcp"),
        (lambda s, r: s.store.pop(("services", "ml", HEAD_SVC)), "head service demo-sc-app-abcde-head-svc not found"),
        (lambda s, r: r.jobs.clear(), "Ray has no job demo-sc-app-x7k2p (yet)"),
        (lambda s, r: s.store[("rayjobs", "ml", JOB)]["status"].update(jobId="", rayClusterName="",
                                                                       jobDeploymentStatus="Suspended"),
         "no running attempt to ask (deployment status Suspended)"),
    ],
    ids=["proxy-forbidden", "secret-forbidden", "secret-missing", "wrong-token", "no-endpoints", "head-down",
         "no-service", "no-ray-job", "suspended"],
)
def test_live_status_problems_are_one_line_and_the_rest_still_shows(api, capsys, breakage, expected) -> None:
    server, kc = api
    ray = FakeRayJobsApi(token=RAY_TOKEN)
    url = ray.start()
    try:
        _seed_running_job(server, json.dumps({"decision": "resume", "step": 30}))
        server.endpoints[("ml", HEAD_SVC)] = url
        ray.add_job(f"{JOB}-x7k2p", "RUNNING", DRIVER_LOG)
        breakage(server, ray)
        assert run(kc, "status") == 0
    finally:
        ray.stop()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"rayjob/{JOB}: ") and out[1] == "retries used: 2 of backoffLimit 5"
    live = [ln for ln in out if ln.startswith("live")]
    assert len(live) == 1 and live[0].startswith("live: ") and expected in live[0], out
    assert RAY_TOKEN not in "\n".join(out)


def test_driver_log_patterns_read_every_driver_line() -> None:
    p = driver_log.parse(DRIVER_LOG, last_events=10)
    assert (p.step, p.max_steps, p.newest_bundle_step, p.newest_bundle_source) == (12, 150, 10, "saved")
    assert p.resumed_from_step == 0
    assert [e.kind for e in p.events] == ["started", "resumed", "saved", "save_failed"]
    extra = ("received SIGTERM: stopping after the current step and saving\n"
             "step   13/150  stop requested\n"
             "step   13/150  saved step_13 (0.20s, training paused 15 ms, window 3 ms)\n"
             "stopped: step 13 saved on request after 99.0s; a rerun resumes from it\n"
             "sc-app: error: superseded: another run took the lease\n")
    p = driver_log.parse(DRIVER_LOG + extra, last_events=5)
    assert (p.step, p.newest_bundle_step) == (13, 13)
    assert [e.kind for e in p.events] == ["signal", "stop_requested", "saved", "stopped", "error"]
    fresh = driver_log.parse("quarantined /checkpoints/quarantine/tmp_step_4\nstarting fresh: no step_N bundle\n")
    assert fresh.fresh_start and fresh.newest_bundle_step is None and fresh.step is None
    # Saves may be reported after later steps (background save): the newest bundle is the highest step saved.
    late = driver_log.parse("step    4/4  saved step_4 (0.07s, training paused 2 ms, window 0 ms)\n"
                            "step    2/4  saved step_2 (0.16s, training paused 4 ms, window 4 ms)\n")
    assert late.newest_bundle_step == 4


def test_suspend_and_resume_use_a_merge_patch(api, capsys) -> None:
    server, kc = api
    _seed_running_job(server, None)
    assert run(kc, "suspend") == 0
    assert server.store[("rayjobs", "ml", JOB)]["spec"]["suspend"] is True
    patches = [r for r in server.requests if r[0] == "PATCH"]
    assert patches and patches[-1][2].startswith("application/merge-patch+json")
    assert run(kc, "resume") == 0
    assert server.store[("rayjobs", "ml", JOB)]["spec"]["suspend"] is False
    assert server.store[("rayjobs", "ml", JOB)]["spec"]["backoffLimit"] == 5, "patch must not clobber the spec"


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ([{"jobDeploymentStatus": "Initializing"}, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
          {"jobDeploymentStatus": "Retrying", "failed": 1},
          {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "failed": 1},
          {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "failed": 1, "succeeded": 1}], 0),
        ([{"jobDeploymentStatus": "Running"}, {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "failed": 6,
                                               "message": "backoffLimit reached"}], 1),
    ],
    ids=["completes-after-a-retry", "fails"],
)
def test_wait_until_terminal(api, capsys, script, code) -> None:
    server, kc = api
    _seed_running_job(server, None)
    server.rayjob_status_script = list(script)
    assert run(kc, "wait", "--poll", "0.01", "--timeout", "30") == code
    out = capsys.readouterr().out
    assert out.startswith(f"rayjob/{JOB}: {script[-1]['jobDeploymentStatus']}")


def test_wait_times_out(api, capsys) -> None:
    server, kc = api
    _seed_running_job(server, None)
    assert run(kc, "wait", "--poll", "0.05", "--timeout", "1") == 1
    assert f"rayjob/{JOB} still Running after 1s" in one_error_line(capsys.readouterr().err)


# ---------------------------------------------------------------------------------------------- a real Ray head
@pytest.fixture
def ray_head_dir() -> Iterator[Path]:
    """A short temp dir for one ``ray start --head`` (Ray's socket paths have a length limit); every process that
    mentions it is SIGKILLed afterwards — never `ray stop`, other Ray clusters share this machine."""
    root = Path(tempfile.mkdtemp(prefix="sck", dir="/tmp"))
    yield root
    sigkill_until_gone(lambda: pids_with(str(root)), timeout=10)
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_live_status_of_a_real_ray_head_through_the_proxy(api, tmp_path: Path, ray_head_dir: Path) -> None:
    """The chart's RayJob, its head started as KubeRay starts it (token auth from the rendered Secret), the rendered
    entrypoint submitted as the K8sJobMode submitter does; `status` reaches that head's real Jobs API through the fake
    API server's proxy, which drops the caller's Authorization header like the real one. The driver's real output
    must parse: this is the test that breaks when sc_app/cli/run.py changes its progress lines."""
    from sc_app.k8s.release import load_values, render_release

    server, kc = api
    values = load_values([VALUES])
    ports = {k: free_port() for k in ("gcs", "dashboard", "client", "metrics", "nodeManager", "objectManager",
                                        "runtimeEnvAgent", "dashboardAgentGrpc", "dashboardAgentHttp")}
    base = random.randrange(30000, 60000, 200)  # Ray's worker ports: a range nobody else here is likely to use
    while any(base <= p <= base + 150 for p in ports.values()):  # Ray refuses a component port inside the range
        base = random.randrange(30000, 60000, 200)
    values["rayPorts"] = ports | {"minWorkerPort": base, "maxWorkerPort": base + 150}
    values["config"]["run"]["max_steps"] = 4
    release = render_release(values, name="demo", namespace="ml")
    job = release.ray_object
    (secret,) = [o for o in release.objects if o["kind"] == "Secret"]
    (configmap,) = [o for o in release.objects if o["kind"] == "ConfigMap"]
    token = base64.b64decode(secret["data"]["auth_token"]).decode()

    ckpt, home = tmp_path / "pvc", tmp_path / "home"
    ckpt.mkdir()
    home.mkdir()
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    config["checkpoint"]["dir"] = str(ckpt)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(home),
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    params = job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]
    argv = [str(bin_dir / "ray"), "start", "--head", "--block", "--disable-usage-stats", f"--temp-dir={ray_head_dir}"]
    with open(tmp_path / "head.log", "w") as head_log:
        subprocess.Popen([*argv, *(f"--{k}={v}" for k, v in params.items())], env=env, stdout=head_log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    dashboard = f"http://127.0.0.1:{ports['dashboard']}"
    submit = [str(bin_dir / "ray"), "job", "submit", "--address", dashboard, "--submission-id", "demo-attempt-1",
              "--no-wait", "--", *job["spec"]["entrypoint"].replace("/etc/sc-app/config.yaml", str(config_file))
              .split()]
    deadline = time.monotonic() + 180
    while subprocess.run(submit, env=env, capture_output=True, text=True, timeout=120).returncode != 0:
        assert time.monotonic() < deadline, (tmp_path / "head.log").read_text()[-3000:]
        time.sleep(2)

    # What KubeRay would have made of the RayJob by now: cluster name, job id, dashboard URL, head service.
    cluster = "demo-sc-app-r4nd0"
    server.add("rayjobs", job)
    server.add("secrets", secret)
    server.store[("rayjobs", "ml", JOB)]["status"] = {
        "jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": "demo-attempt-1",
        "rayClusterName": cluster, "dashboardURL": f"{cluster}-head-svc.ml.svc.cluster.local:{ports['dashboard']}"}
    server.add("services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{cluster}-head-svc"},
                            "spec": {"ports": [{"name": "dashboard", "port": ports["dashboard"]}]}})
    server.endpoints[("ml", f"{cluster}-head-svc")] = dashboard

    deadline = time.monotonic() + 300
    while True:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert run(kc, "status", "--json", "--events", "10") == 0
        live = json.loads(out.getvalue())["live"]
        if live and live["rayStatus"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        assert time.monotonic() < deadline, f"job not finished: {json.loads(out.getvalue())}"
        time.sleep(2)
    assert live["rayStatus"] == "SUCCEEDED", live
    assert (live["step"], live["maxSteps"]) == (4, 4)
    assert (live["newestBundleStep"], live["newestBundleSource"]) == (4, "saved")
    assert live["freshStart"] is True
    kinds = [e["kind"] for e in live["events"]]
    assert kinds[:2] == ["started", "fresh"] and kinds[-1] == "done" and kinds.count("saved") == 2, kinds

    # A token that does not match the cluster's: real Ray's refusal, one line, the rest of the status shown.
    server.store[("secrets", "ml", AUTH_SECRET)]["data"]["auth_token"] = base64.b64encode(b"wrong").decode()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run(kc, "status") == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == f"rayjob/{JOB}: Running, job RUNNING"
    assert [ln for ln in lines if ln.startswith("live")] == [
        "live: the Ray dashboard refused the token (Forbidden: Invalid authentication token); the auth Secret does "
        "not match the cluster's token"]


def test_the_attempts_goodput_line_is_kept_and_shown() -> None:
    from sc_app.k8s.live import LiveStatus
    from sc_app.observe.goodput import BUCKETS, FaultCosts, Ledger

    seconds = {**dict.fromkeys(BUCKETS, 0.0), "training": 36.8, "startup": 3.1, "saves": 0.3}
    line = Ledger([], seconds, FaultCosts(count=2), 0).line()  # what the driver prints (sc_app.observe.goodput)
    later = line.replace("goodput 91.5%", "goodput 92.0%")
    assert later != line
    p = driver_log.parse(DRIVER_LOG + line + "\n" + later + "\n", last_events=10)
    assert p.goodput_line == later and "goodput" not in [e.kind for e in p.events]
    assert p.as_dict()["goodputLine"] == later
    shown = LiveStatus("job-1", "RUNNING", "", p).lines()
    assert shown[1] == f"attempt {later}"
    assert driver_log.parse(DRIVER_LOG).goodput_line is None
