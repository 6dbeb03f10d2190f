"""The Ray token under GitOps (issue 27 part 7): a render without cluster access must not make a new token at every
sync. With ``rayAuth.gitops`` the chart refuses to render a token of its own and uses the existing Secret; NOTES.txt
says where the token lives and what changing it does. Rendered by the real Helm engine (no cluster: ``lookup`` finds
nothing, as under ``helm template`` / Argo CD)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.k8s.k8s_helpers import BASE_VALUES, CHART_DIR, by_kind, load_values, merged_values, objects, render

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")


def refused(override: dict[str, Any]) -> str:
    """The one-line refusal of a render of BASE_VALUES + ``override``."""
    with pytest.raises(helm_python.HelmError) as info:
        render(merged_values(BASE_VALUES, override))
    text = str(info.value)
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 4, text
    return text


def test_gitops_without_an_existing_secret_is_refused() -> None:
    text = refused({"rayAuth": {"gitops": True}})
    assert re.search(r"rayAuth\.gitops=true without rayAuth\.existingSecret", text), text
    assert "JobStatusCheckTimeoutExceeded" in text


def test_gitops_renders_the_same_objects_every_time_and_no_token() -> None:
    values = load_values(CHART_DIR / "ci" / "gitops-values.yaml")
    first, second = (objects(render(values)) for _ in range(2))
    assert first == second, "a GitOps render must be reproducible: nothing random in it"
    assert not by_kind(first, "Secret")
    (job,) = by_kind(first, "RayJob")
    assert job["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token", "secretName": "sc-app-ray-token"}


def test_gitops_without_auth_needs_no_secret() -> None:
    objs = objects(render(merged_values(BASE_VALUES, {"rayAuth": {"enabled": False, "gitops": True}})))
    assert not by_kind(objs, "Secret")


@pytest.mark.parametrize(("auth", "expected"), [
    pytest.param({}, r"made at the first install and kept on every\s+`helm upgrade`", id="chart-token"),
    pytest.param({"existingSecret": "team-token"}, r"from Secret team-token .*Change it only with the job stopped",
                 id="existing-secret"),
])
def test_notes_say_where_the_token_lives_and_what_a_new_one_does(auth: dict[str, Any], expected: str) -> None:
    notes = render(merged_values(BASE_VALUES, {"rayAuth": auth}))["sc-app/templates/NOTES.txt"]
    assert re.search(expected, notes, re.S), notes
    if not auth:
        assert "JobStatusCheckTimeoutExceeded" in notes and "rayAuth.existingSecret" in notes
