"""The live part of ``sc-app k8s status`` when the chart's NetworkPolicy drops the API server's proxy (issue 19,
finding 3): one line naming the policy and the value that fixes it, within seconds, not the request timeout.

The release is created by ``sc-app k8s submit`` (the chart's own RayJob and NetworkPolicy, rendered by the Helm
engine) in the API-server stand-in; a CNI dropping the proxy's connection is a backend that accepts and never answers.
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.k8s.fake_apiserver import FakeApiServer, FakeRayJobsApi
from tests.k8s.k8s_helpers import CHART_DIR

pytest.importorskip("kubernetes", reason="kubernetes client (k8s extra) is not installed")
pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

from sc_app.k8s import live
from sc_app.k8s.cli import main

JOB = "demo-sc-app"
CLUSTER = f"{JOB}-abcde"
HEAD_SVC = f"{CLUSTER}-head-svc"


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A backend that accepts connections and never answers: what the proxy meets behind a dropping policy."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def _submit_running(server: FakeApiServer, kc: str, tmp_path: Path, cidrs: list[str]) -> None:
    values = yaml.safe_load((CHART_DIR / "ci" / "cpu-values.yaml").read_text())
    values["networkPolicy"] = {"apiServerCIDRs": cidrs}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert main(["k8s", "submit", "demo", "-n", "ml", "--kubeconfig", kc, "-f", str(path)]) == 0
    job = server.store[("rayjobs", "ml", JOB)]
    job["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": CLUSTER,
                     "jobId": f"{JOB}-x7k2p", "dashboardURL": f"{HEAD_SVC}.ml.svc.cluster.local:8265"}
    server.add("services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": HEAD_SVC},
                            "spec": {"ports": [{"name": "dashboard", "port": 8265}]}})


def test_a_policy_dropping_the_proxy_is_named_in_one_line_within_seconds(api, capsys, tmp_path, blackhole,
                                                                         monkeypatch) -> None:
    server, kc = api
    monkeypatch.setattr(live, "BLOCKED_PROBE_S", 0.5)
    _submit_running(server, kc, tmp_path, cidrs=[])
    server.endpoints[("ml", HEAD_SVC)] = blackhole
    capsys.readouterr()
    started = time.monotonic()
    assert main(["k8s", "status", "demo", "-n", "ml", "--kubeconfig", kc]) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().out.splitlines()
    (line,) = [ln for ln in out if ln.startswith("live:")]
    assert line == ("live: the API server's proxy cannot reach the head: networkpolicy/demo-sc-app-ray admits the "
                    "dashboard port only from namespaces, not from the control plane; add its CIDR to "
                    "networkPolicy.apiServerCIDRs (ops/README.md, NetworkPolicy and the API server's proxy)")
    assert took < 10, f"{took:.1f}s: the policy line must not wait out the request timeout"


def test_with_the_control_plane_cidr_the_live_part_works(api, capsys, tmp_path) -> None:
    server, kc = api
    _submit_running(server, kc, tmp_path, cidrs=["172.16.0.0/28"])
    ray = FakeRayJobsApi(token=None)
    url = ray.start()
    try:
        secret = server.store[("secrets", "ml", f"{JOB}-ray-auth")]
        ray.token = base64.b64decode(secret["data"]["auth_token"]).decode()
        ray.add_job(f"{JOB}-x7k2p", "RUNNING",
                    "step    3/20  reward 0.1  loss 0.0  staleness 1.00  rows_in_tq 4  0.1s\n")
        server.endpoints[("ml", HEAD_SVC)] = url
        capsys.readouterr()
        assert main(["k8s", "status", "demo", "-n", "ml", "--kubeconfig", kc]) == 0
    finally:
        ray.stop()
    out = capsys.readouterr().out
    assert f"live: ray job {JOB}-x7k2p RUNNING: step 3/20" in out and "networkpolicy" not in out
