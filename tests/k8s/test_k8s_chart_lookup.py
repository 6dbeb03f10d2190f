"""What the chart reads from a live cluster through Helm's ``lookup``, rendered by the real Helm engine against a
local stand-in for the API server's read side (lookup_apiserver.py).

Covers: the generated Ray token survives upgrades (it is reused from the live Secret); a RayJob suspended on the
cluster stays suspended through ``helm upgrade``; live claims are checked for the access modes the pods need.
Without a cluster (``helm template``, GitOps) the same lookups find nothing: see test_k8s_chart.py for that side.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.k8s.k8s_helpers import BASE_VALUES, by_kind, objects, render, render_live
from tests.k8s.lookup_apiserver import LookupApiServer

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")


@pytest.fixture
def api() -> Iterator[tuple[LookupApiServer, str]]:
    server = LookupApiServer()
    url = server.start()
    yield server, url
    server.stop()


def _rayjob(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = by_kind(objs, "RayJob")
    return job


def _live_rayjob(suspend: bool) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "demo-sc-app", "namespace": "ml"},
            "spec": {"suspend": suspend}, "status": {"jobDeploymentStatus": "Suspended" if suspend else "Running"}}


def test_upgrade_reuses_the_live_ray_token(api: tuple[LookupApiServer, str]) -> None:
    server, url = api
    token = base64.b64encode(b"live-token-0123456789").decode()
    server.objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                           "metadata": {"name": "demo-sc-app-ray-auth", "namespace": "ml"},
                           "data": {"auth_token": token}})
    for _ in range(2):
        (secret,) = by_kind(objects(render_live(url, BASE_VALUES)), "Secret")
        assert secret["data"]["auth_token"] == token
    assert "/api/v1/namespaces/ml/secrets/demo-sc-app-ray-auth" in server.gets


def test_without_a_cluster_every_render_makes_a_new_token() -> None:
    """What `helm template` / Argo CD / Flux get: documented in values.yaml (use rayAuth.existingSecret there)."""
    first, second = (by_kind(objects(render(BASE_VALUES)), "Secret")[0] for _ in range(2))
    assert first["data"]["auth_token"] != second["data"]["auth_token"]
    referenced = objects(render({**BASE_VALUES, "rayAuth": {"enabled": True, "existingSecret": "team-token"}}))
    assert not by_kind(referenced, "Secret")


@pytest.mark.parametrize(("live_suspended", "value", "rendered"), [
    pytest.param(True, False, True, id="suspended-stays-suspended"),
    pytest.param(False, False, False, id="running-stays-running"),
    pytest.param(False, True, True, id="upgrade-may-suspend"),
])
def test_upgrade_never_resumes_a_suspended_job(api: tuple[LookupApiServer, str], live_suspended: bool,
                                               value: bool, rendered: bool) -> None:
    server, url = api
    server.objects.append(_live_rayjob(live_suspended))
    job = _rayjob(objects(render_live(url, {**BASE_VALUES, "job": {"suspend": value}})))
    assert job["spec"]["suspend"] is rendered
    assert "/apis/ray.io/v1/namespaces/ml/rayjobs/demo-sc-app" in server.gets


def test_first_install_renders_suspend_as_given(api: tuple[LookupApiServer, str]) -> None:
    _, url = api
    assert _rayjob(objects(render_live(url, BASE_VALUES, upgrade=False)))["spec"]["suspend"] is False


def _claim(name: str, modes: list[str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"accessModes": modes}}


def test_live_checkpoint_claim_modes_win_over_values(api: tuple[LookupApiServer, str]) -> None:
    server, url = api
    server.objects.append(_claim("ckpt", ["ReadWriteOnce"]))
    values = {**BASE_VALUES, "checkpoint": {"persistence": {"create": False, "existingClaim": "ckpt",
                                                            "accessModes": ["ReadWriteMany"]}}}
    with pytest.raises(helm_python.HelmError, match=r"\[ReadWriteOnce\]: 3 pods .* needs ReadWriteMany"):
        render_live(url, values)


@pytest.mark.parametrize(("modes", "ok"), [
    pytest.param(["ReadOnlyMany"], True, id="rox"),
    pytest.param(["ReadWriteMany"], True, id="rwx"),
    pytest.param(["ReadWriteOnce"], False, id="rwo"),
])
def test_live_model_claim_must_be_shareable(api: tuple[LookupApiServer, str], modes: list[str], ok: bool) -> None:
    server, url = api
    server.objects.append(_claim("models", modes))
    values = {**BASE_VALUES, "model": {"source": "claim", "existingClaim": "models", "path": "m"}}
    if ok:
        render_live(url, values)
        return
    with pytest.raises(helm_python.HelmError) as info:
        render_live(url, values)
    assert re.search(r"model\.existingClaim models is \[ReadWriteOnce\]: 3 pods mount the model, which needs "
                     r"ReadOnlyMany or ReadWriteMany", str(info.value)), info.value
