"""The HMAC keyring in the chart, rendered by the real Helm engine: a Secret mounted as files (no key in any
environment), in keyring order so the newest key signs; a missing Secret or key refused at render when the cluster
can be read (``lookup`` against the API-server stand-in), and nothing refused without a cluster (``helm template``,
where ``lookup`` finds nothing)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint.hmac_keys import HMAC_ENV, HMAC_FILE_ENV, ring_from_path
from tests.k8s.k8s_helpers import BASE_VALUES, by_kind, merged_values, objects, pod_templates, render, render_live
from tests.k8s.lookup_apiserver import LookupApiServer

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

RING = {"checkpoint": {"hmac": {"existingSecret": "ckpt-hmac", "keys": ["k-old", "k-new"]}}}
ROOT_CA = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt", "namespace": "ml"},
           "data": {"ca.crt": "..."}}  # fmt: skip


def _secret(**keys: bytes) -> dict[str, Any]:
    meta = {"name": "ckpt-hmac", "namespace": "ml"}
    data = {k: base64.b64encode(v).decode() for k, v in keys.items()}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "data": data}


@pytest.fixture
def api() -> Iterator[LookupApiServer]:
    server = LookupApiServer()
    server.url = server.start()
    yield server
    server.stop()


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    return template["spec"].get("initContainers", []) + template["spec"]["containers"]


def test_the_keyring_is_mounted_as_files_in_ring_order_and_no_key_is_in_any_environment(tmp_path: Path) -> None:
    rendered = render(merged_values(BASE_VALUES, RING))
    assert HMAC_ENV + "\n" not in "".join(rendered.values()) and f"name: {HMAC_ENV}\n" not in "".join(rendered.values())
    (job,) = by_kind(objects(rendered), "RayJob")
    for template in pod_templates(job)[:2]:  # head (with preflight) and the worker group
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "hmac-keys"]
        assert volume["secret"]["secretName"] == "ckpt-hmac" and volume["secret"]["defaultMode"] == 0o440
        items = volume["secret"]["items"]
        assert items == [{"key": "k-old", "path": "00-k-old"}, {"key": "k-new", "path": "01-k-new"}]
        for c in _containers(template):
            env = {e["name"]: e for e in c.get("env", [])}
            assert env[HMAC_FILE_ENV] == {"name": HMAC_FILE_ENV, "value": "/etc/sc-app-hmac"}, c["name"]
            assert HMAC_ENV not in env
            assert {"name": "hmac-keys", "mountPath": "/etc/sc-app-hmac", "readOnly": True} in c["volumeMounts"]
    # What the kubelet makes of those items is what sc-app reads: the last of `keys` (newest) signs.
    mount = tmp_path / "mount"
    mount.mkdir()
    for item, key in zip(items, (b"old key", b"new key"), strict=True):
        (mount / item["path"]).write_bytes(key)
    assert ring_from_path(mount).keys == (b"old key", b"new key")  # `keys` oldest first: the last one signs


def test_a_single_secret_key_is_a_ring_of_one_and_no_secret_mounts_nothing() -> None:
    one = objects(render(merged_values(BASE_VALUES, {"checkpoint": {"hmac": {"existingSecret": "s"}}})))
    (job,) = by_kind(one, "RayJob")
    (volume,) = [v for v in pod_templates(job)[0]["spec"]["volumes"] if v["name"] == "hmac-keys"]
    assert volume["secret"]["items"] == [{"key": "hmac-key", "path": "00-hmac-key"}]
    (job,) = by_kind(objects(render(BASE_VALUES)), "RayJob")
    assert not [v for t in pod_templates(job) for v in t["spec"]["volumes"] if v["name"] == "hmac-keys"]


@pytest.mark.parametrize(("live", "expected"), [
    ([ROOT_CA], r"checkpoint\.hmac\.existingSecret ckpt-hmac does not exist in namespace ml: every pod would wait "
                r"in ContainerCreating for it; create it first \(kubectl -n ml create secret generic ckpt-hmac "
                r"--from-file=k-old=<key file>\)"),
    ([ROOT_CA, _secret(**{"k-old": b"a"})], r'checkpoint\.hmac: secret/ckpt-hmac has no key "k-new" '
                                                r"\(it has: k-old\)"),
], ids=["missing-secret", "missing-key"])  # fmt: skip
def test_a_missing_secret_or_key_is_refused_at_render_on_a_cluster(api, live, expected) -> None:
    api.objects += live
    with pytest.raises(helm_python.HelmError) as info:
        render_live(api.url, merged_values(BASE_VALUES, RING))
    assert re.search(expected, str(info.value)), info.value
    assert "/api/v1/namespaces/ml/secrets/ckpt-hmac" in api.gets or "missing-secret" not in expected


def test_the_secret_present_renders_and_without_a_cluster_nothing_is_refused(api) -> None:
    api.objects += [ROOT_CA, _secret(**{"k-old": b"a", "k-new": b"b", "other": b"c"})]
    assert by_kind(objects(render_live(api.url, merged_values(BASE_VALUES, RING))), "RayJob")
    # helm template / Argo CD: lookup finds nothing, not even kube-root-ca.crt; `sc-app k8s submit` checks instead.
    assert by_kind(objects(render(merged_values(BASE_VALUES, RING))), "RayJob")


@pytest.mark.parametrize("path", ["/etc/sc-app/hmac", "/checkpoints", "/tmp/keys", "/dev/shm"])
def test_a_mount_path_over_another_mount_is_refused(path: str) -> None:
    values = merged_values(BASE_VALUES, RING, {"checkpoint": {"hmac": {"mountPath": path}}})
    with pytest.raises(helm_python.HelmError, match=rf"checkpoint\.hmac\.mountPath {path} overlaps"):
        render(values)
