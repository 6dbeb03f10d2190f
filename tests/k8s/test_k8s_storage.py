"""The checkpoint claim on a live cluster (issue 19, finding 1) and KubeRay's own failure reasons (finding 2), through
``sc-app k8s submit|status|wait`` against the local API-server stand-in (fake_apiserver.py): a claim its StorageClass
cannot bind is refused before anything is written; a Pending claim and what it waits for is shown within one poll;
``JobStatusCheckTimeoutExceeded`` is named with what to do.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import yaml

from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.k8s_helpers import CHART_DIR

pytest.importorskip("kubernetes", reason="kubernetes client (k8s extra) is not installed")
pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

from sc_app.k8s.cli import main
from sc_app.k8s.storage import RWO_ONLY_PROVISIONERS, claim_state, class_problem

JOB = "demo-sc-app"
CLAIM = f"{JOB}-ckpt"
CLUSTER = f"{JOB}-abcde"


def run(kubeconfig: str, *argv: str) -> int:
    verb, rest = argv[0], list(argv[1:])
    return main(["k8s", verb, "demo", "-n", "ml", "--kubeconfig", kubeconfig, *rest])


def _rwx_values(tmp_path: Path, storage_class: str) -> str:
    """ci/cpu-values.yaml with a shared (ReadWriteMany) claim of ``storage_class``."""
    values = yaml.safe_load((CHART_DIR / "ci" / "cpu-values.yaml").read_text())
    values["checkpoint"]["persistence"].update(accessModes=["ReadWriteMany"], storageClassName=storage_class)
    path = tmp_path / "rwx.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _storage_class(name: str, provisioner: str) -> dict:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner}


@pytest.mark.parametrize(("classes", "expected"), [
    ([("gp3", "ebs.csi.aws.com")], r"StorageClass gp3 \(ebs.csi.aws.com\) gives ReadWriteOnce block volumes but the "
                                   r"claim needs ReadWriteMany.*efs-sc.*standard-rwx.*azurefile-csi"),
    ([], r"StorageClass gp3 does not exist on this cluster"),
], ids=["block-driver", "no-such-class"])
def test_submit_refuses_a_claim_its_class_cannot_bind_before_writing_anything(
        api, capsys, tmp_path: Path, classes, expected) -> None:
    server, kc = api
    for name, provisioner in classes:
        server.add("storageclasses", _storage_class(name, provisioner), ns="")
    assert run(kc, "submit", "-f", _rwx_values(tmp_path, "gp3")) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("sc-app k8s: error: persistentvolumeclaim/demo-sc-app-ckpt: "), err
    assert re.search(expected, err[0]), err[0]
    assert not [r for r in server.requests if r[0] != "GET"], "nothing may be written"


def test_submit_with_an_rwx_class_or_unreadable_classes_goes_ahead(api, capsys, tmp_path: Path) -> None:
    server, kc = api
    server.add("storageclasses", _storage_class("efs-sc", "efs.csi.aws.com"), ns="")
    assert run(kc, "submit", "-f", _rwx_values(tmp_path, "efs-sc")) == 0
    assert ("persistentvolumeclaims", "ml", CLAIM) in server.store
    assert "created rayjob/demo-sc-app" in capsys.readouterr().out
    # Cluster-scoped reads are often not granted to a namespace's deployer: say so, do not block.
    server.store.clear()
    server.denied.add(("get", "storageclasses"))
    assert run(kc, "submit", "-f", _rwx_values(tmp_path, "efs-sc")) == 0
    out = capsys.readouterr().out
    assert "note: StorageClass efs-sc not checked (forbidden" in out and "created rayjob/demo-sc-app" in out


def _seed_pending(server: FakeApiServer, *, event: bool = True) -> None:
    volumes = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}}]
    server.add("rayjobs", {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": JOB, "labels": {"app.kubernetes.io/instance": "demo"}},
        "spec": {"backoffLimit": 5, "rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"volumes": volumes}}},
                                                       "workerGroupSpecs": [{"template": {"spec": {
                                                           "volumes": volumes}}}]}},
        "status": {"jobDeploymentStatus": "Initializing", "rayClusterName": CLUSTER},
    })
    server.add("persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "annotations": {"volume.kubernetes.io/storage-provisioner": "ebs.csi.aws.com"}},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "gp2"}, "status": {"phase": "Pending"}})
    if event:
        for i, (reason, msg) in enumerate([
            ("ExternalProvisioning", "Waiting for a volume to be created by the external provisioner"),
            ("ProvisioningFailed", "failed to provision volume with StorageClass \"gp2\": rpc error: code = "
                                   "InvalidArgument desc = Volume capabilities MULTI_NODE_MULTI_WRITER not supported"),
        ]):
            server.add("events", {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{CLAIM}.{i}"},
                                  "involvedObject": {"kind": "PersistentVolumeClaim", "name": CLAIM},
                                  "reason": reason, "message": msg, "lastTimestamp": f"2026-01-01T00:0{i}:00Z"})
        server.add("events", {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "other.1"},
                              "involvedObject": {"kind": "Pod", "name": "x"}, "reason": "Scheduled",
                              "message": "not the claim's", "lastTimestamp": "2026-01-01T00:09:00Z"})


def test_status_shows_a_pending_claim_with_its_class_and_provisioner_event(api, capsys) -> None:
    server, kc = api
    _seed_pending(server)
    assert run(kc, "status", "--no-live") == 0
    lines = capsys.readouterr().out.splitlines()
    (claim,) = [ln for ln in lines if ln.startswith("claim ")]
    assert claim.startswith(f"claim persistentvolumeclaim/{CLAIM}: Pending (class gp2, provisioner ebs.csi.aws.com, "
                            "[ReadWriteMany]): ProvisioningFailed: failed to provision volume"), claim
    assert "ebs.csi.aws.com gives ReadWriteOnce only: use an RWX class" in claim
    assert run(kc, "status", "--no-live", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["phase"]) for c in doc["claims"]] == [(CLAIM, "Pending")]
    # A bound claim is not worth a line; a missing one is.
    server.store[("persistentvolumeclaims", "ml", CLAIM)]["status"]["phase"] = "Bound"
    assert run(kc, "status", "--no-live") == 0
    assert "claim " not in capsys.readouterr().out
    server.store.pop(("persistentvolumeclaims", "ml", CLAIM))
    assert run(kc, "status", "--no-live") == 0
    assert f"claim persistentvolumeclaim/{CLAIM}: does not exist" in capsys.readouterr().out


def test_wait_reports_a_pending_claim_on_its_first_poll(api, capsys, caplog) -> None:
    server, kc = api
    _seed_pending(server)
    with caplog.at_level(logging.WARNING):
        assert run(kc, "wait", "--poll", "0.05", "--timeout", "5") == 1
    pending = [r.getMessage() for r in caplog.records if r.getMessage().startswith("claim ")]
    assert len(pending) == 1, "once per new state, not once per poll"
    assert "ProvisioningFailed" in pending[0] and "class gp2" in pending[0]


def test_status_names_kuberays_status_check_timeout(api, capsys) -> None:
    server, kc = api
    _seed_pending(server, event=False)
    job = server.store[("rayjobs", "ml", JOB)]
    job["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": CLUSTER,
                     "jobStatusCheckFailureStartTime": "2026-01-01T00:00:00Z"}
    server.store[("persistentvolumeclaims", "ml", CLAIM)]["status"]["phase"] = "Bound"
    assert run(kc, "status", "--no-live") == 0
    out = capsys.readouterr().out
    assert "warning: KubeRay's status checks of the head fail since 2026-01-01T00:00:00Z" in out
    job["status"] = {"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING", "reason": "JobStatusCheckTimeoutExceeded",
                     "message": "Job status checks have been failing since 2026-01-01 00:00:00; exceeded timeout of "
                                "300s", "failed": 0, "rayClusterName": CLUSTER}
    assert run(kc, "status", "--no-live") == 0
    out = capsys.readouterr().out
    assert ("reason: JobStatusCheckTimeoutExceeded: KubeRay could not read the job's status from the head and "
            "failed it for good (not retried, whatever backoffLimit says); raise "
            "RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS") in out
    assert "warning:" not in out


def test_class_rules_are_as_wide_as_the_drivers() -> None:
    claim = {"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "x"}}
    for provisioner in sorted(RWO_ONLY_PROVISIONERS):
        assert class_problem(claim, _storage_class("x", provisioner)), provisioner
    for provisioner in ("efs.csi.aws.com", "filestore.csi.storage.gke.io", "file.csi.azure.com", "nfs.csi.k8s.io",
                        "cephfs.csi.ceph.com", "example.com/unknown"):
        assert class_problem(claim, _storage_class("x", provisioner)) is None, provisioner
    rwo = {"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "x"}}
    assert class_problem(rwo, _storage_class("x", "ebs.csi.aws.com")) is None
    newest = claim_state({"metadata": {"name": "c"}, "spec": {}, "status": {}},
                         [{"reason": "B", "message": "new", "lastTimestamp": "2026-01-02T00:00:00Z"},
                          {"reason": "A", "message": "old", "lastTimestamp": "2026-01-01T00:00:00Z"}])
    assert newest.event == "B: new" and newest.pending


def test_the_chart_and_sc_app_name_the_same_rwx_classes() -> None:
    from sc_app.k8s.storage import RWX_HINT

    text = (CHART_DIR / "templates" / "_validate.tpl").read_text()
    assert RWX_HINT in text


def test_a_pending_claim_shows_without_events_access(api, capsys) -> None:
    server, kc = api
    _seed_pending(server)
    server.denied.add(("list", "events"))
    assert run(kc, "status", "--no-live") == 0
    (claim,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("claim ")]
    assert claim.startswith(f"claim persistentvolumeclaim/{CLAIM}: Pending (class gp2, provisioner ebs.csi.aws.com")


def _hmac_values(tmp_path: Path) -> str:
    """ci/cpu-values.yaml signing with a keyring of two keys of secret/ckpt-hmac."""
    values = yaml.safe_load((CHART_DIR / "ci" / "cpu-values.yaml").read_text())
    values["checkpoint"]["hmac"] = {"existingSecret": "ckpt-hmac", "keys": ["k-old", "k-new"]}
    path = tmp_path / "hmac.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _secret(*keys: str) -> dict:
    data = dict.fromkeys(keys, "eA==")
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ckpt-hmac"}, "data": data}


@pytest.mark.parametrize(("keys", "expected"), [
    (None, r"secret/ckpt-hmac does not exist in namespace ml and the job's pods mount it \(checkpoint\.hmac\."
           r"existingSecret, rayAuth\.existingSecret or extraVolumes\): create it first; nothing written"),
    (["k-old"], r"secret/ckpt-hmac has no key k-new \(it has: k-old\); add it or fix checkpoint\.hmac\.keys"),
], ids=["missing-secret", "missing-key"])  # fmt: skip
def test_submit_refuses_a_missing_hmac_secret_or_key_before_writing_anything(
    api, capsys, tmp_path: Path, keys, expected
) -> None:
    """`helm template`/GitOps renders cannot see the Secret (lookup finds nothing): submit checks it itself."""
    server, kc = api
    if keys is not None:
        server.add("secrets", _secret(*keys))
    assert run(kc, "submit", "-f", _hmac_values(tmp_path)) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and re.search(expected, err[0]), err
    assert not [r for r in server.requests if r[0] != "GET"], "nothing may be written"


def test_submit_with_the_hmac_secret_goes_ahead(api, capsys, tmp_path: Path) -> None:
    server, kc = api
    server.add("secrets", _secret("k-old", "k-new", "unrelated"))
    assert run(kc, "submit", "-f", _hmac_values(tmp_path)) == 0
    assert "created rayjob/demo-sc-app" in capsys.readouterr().out
    job = server.store[("rayjobs", "ml", "demo-sc-app")]
    (vol,) = [v for v in job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]
              if v["name"] == "hmac-keys"]  # fmt: skip
    assert [i["key"] for i in vol["secret"]["items"]] == ["k-old", "k-new"]
