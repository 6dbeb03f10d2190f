"""``sc-app k8s ...`` against a local HTTP server that answers like the Kubernetes API server.

Real ``kubernetes`` client, real HTTP on 127.0.0.1; the server follows API conventions (Status bodies, codes).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fake_apiserver import FakeApiServer, write_kubeconfig
from k8s_helpers import CHART_DIR

pytest.importorskip("kubernetes", reason="kubernetes client (k8s extra) is not installed")
pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

from sc_app.k8s.cli import main

JOB = "demo-sc-app"
VALUES = str(CHART_DIR / "ci" / "cpu-values.yaml")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, str]]:
    server = FakeApiServer()
    url = server.start()
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(str(kubeconfig), url)
    yield server, str(kubeconfig)
    server.stop()


def run(kubeconfig: str, *argv: str) -> int:
    verb, rest = argv[0], list(argv[1:])
    return main(["k8s", verb, "demo", "-n", "ml", "--kubeconfig", kubeconfig, *rest])


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("sc-app k8s: error: ")
    return lines[0]


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

    posts_before = len(created)
    assert run(kc, "submit", "-f", VALUES) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"rayjob/{JOB} already exists in namespace ml" in line
    assert len([r for r in server.requests if r[0] == "POST"]) == posts_before, "nothing created on refusal"


def test_companions_that_exist_are_kept(api, capsys) -> None:
    server, kc = api
    server.store[("persistentvolumeclaims", "ml", f"{JOB}-ckpt")] = {"metadata": {"name": f"{JOB}-ckpt"}, "old": 1}
    assert run(kc, "submit", "-f", VALUES) == 0
    out = capsys.readouterr().out
    assert f"kept existing persistentvolumeclaim/{JOB}-ckpt" in out
    assert server.store[("persistentvolumeclaims", "ml", f"{JOB}-ckpt")]["old"] == 1


def test_crd_not_installed_is_one_clear_line_and_creates_nothing(api, capsys) -> None:
    server, kc = api
    server.serve_rayjobs = False
    assert run(kc, "submit", "-f", VALUES) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "not served by this cluster" in line and "KubeRay operator" in line
    assert not server.store
    assert run(kc, "status") == 2
    assert "not served by this cluster" in one_error_line(capsys.readouterr().err)


def test_forbidden_is_one_clear_line(api, capsys) -> None:
    server, kc = api
    server.forbidden_user = "system:serviceaccount:ci:deployer"
    assert run(kc, "status") == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("sc-app k8s: error: forbidden: ")
    assert 'cannot get resource "rayjobs" in API group "ray.io"' in line


def test_not_found(api, capsys) -> None:
    _, kc = api
    for verb in ("status", "suspend", "delete"):
        assert run(kc, verb) == 2
        assert f"rayjob/{JOB} not found in namespace ml" in one_error_line(capsys.readouterr().err)


def _seed_running_job(server: FakeApiServer, preflight_log: str | None) -> None:
    server.store[("rayjobs", "ml", JOB)] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": JOB, "namespace": "ml"},
        "spec": {"backoffLimit": 5, "entrypoint": "sc-app run"},
        "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "failed": 2, "succeeded": 0,
                   "rayClusterName": f"{JOB}-abcde"},
    }
    head = f"{JOB}-abcde-head-x1"
    server.store[("pods", "ml", head)] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": head, "namespace": "ml",
                     "labels": {"ray.io/cluster": f"{JOB}-abcde", "ray.io/node-type": "head"}},
        "spec": {"containers": [{"name": "ray-head", "image": "x"}]},
    }
    if preflight_log is not None:
        server.logs[("ml", head, "preflight")] = preflight_log


def test_status_shows_deployment_retries_and_resume_step(api, capsys) -> None:
    server, kc = api
    plan = {"decision": "resume", "reason": "newest verified bundle", "bundle": "/checkpoints/step_40", "step": 40,
            "checked": [], "quarantined": []}
    _seed_running_job(server, json.dumps(plan, indent=2))
    assert run(kc, "status") == 0
    out = capsys.readouterr().out
    assert f"rayjob/{JOB}: Running, job RUNNING" in out
    assert "retries used: 2 of backoffLimit 5" in out
    assert "step 40 [resume]" in out
    assert run(kc, "status", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["retriesUsed"], doc["backoffLimit"], doc["resumeStep"]) == (2, 5, 40)


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
    assert run(kc, "wait", "--poll", "0.01", "--timeout", "0.05") == 1
    assert "still Running after 0.05s" in one_error_line(capsys.readouterr().err)


def test_delete_keeps_the_checkpoint_claim(api, capsys) -> None:
    server, kc = api
    assert run(kc, "submit", "-f", VALUES) == 0
    assert run(kc, "delete") == 0
    assert "PVC and its bundles are kept" in capsys.readouterr().out
    assert ("rayjobs", "ml", JOB) not in server.store
    assert ("persistentvolumeclaims", "ml", f"{JOB}-ckpt") in server.store


def test_unreachable_api_server_and_bad_values(tmp_path: Path, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(str(kc), f"http://127.0.0.1:{port}")
    assert run(str(kc), "status") == 2
    assert "cannot reach the Kubernetes API server" in one_error_line(capsys.readouterr().err)
    assert run(str(kc), "submit", "--set", "job.backoffLimit=-2", "--set", "image.tag=v1") == 2
    assert "backoffLimit" in one_error_line(capsys.readouterr().err)
    assert run(str(tmp_path / "missing"), "status") == 2
    assert "kubeconfig" in one_error_line(capsys.readouterr().err)
