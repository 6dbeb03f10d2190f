"""``ops/grafana-dashboard.json`` checked for structure: it imports, its panels fit, and every query names a metric
sc-app really exports (as Ray's exporter spells it) in a way PromQL can use.

What only a live Grafana + Prometheus can show — that the panels draw — is not claimed here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from sc_app.observe.metrics import CATALOGUE, RAY_NAMESPACE

DASHBOARD = Path(__file__).resolve().parents[3] / "ops" / "grafana-dashboard.json"
PANEL_TYPES = {"row", "timeseries", "stat"}
NAME_RE = re.compile(rf"\b{RAY_NAMESPACE}_sc_app_[a-z0-9_]+")
KIND_OF = {name: spec for spec in CATALOGUE for name in spec.series}


@pytest.fixture(scope="module")
def dash() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def all_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) of every panel target and annotation query."""
    out = [(f"panel {p['title']!r}", t["expr"]) for p in panels(dash) for t in p["targets"]]
    out += [(f"annotation {a['name']!r}", a["expr"]) for a in dash["annotations"]["list"] if "expr" in a]
    return out


def test_it_is_an_importable_dashboard_with_a_prometheus_datasource_variable(dash: dict[str, Any]) -> None:
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "ray_sc_app_step" in variables["run_id"]["definition"]
    for p in panels(dash):
        assert p["type"] in PANEL_TYPES, p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), f"{p['title']}: refIds {refs}"
        assert all(t["datasource"] == p["datasource"] for t in p["targets"])
        assert p.get("description"), f"{p['title']}: say what the panel shows"


def test_panels_have_unique_ids_and_do_not_overlap(dash: dict[str, Any]) -> None:
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in ("x", "y", "w", "h")), p["title"]
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, f"{p['title']}: {g}"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_every_query_names_an_exported_series_used_the_way_its_kind_allows(dash: dict[str, Any]) -> None:
    used: set[str] = set()
    for where, expr in all_queries(dash):
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), f"{where}: {expr}"
        assert expr.count("[") == expr.count("]"), f"{where}: {expr}"
        names = NAME_RE.findall(expr)
        assert names, f"{where}: queries no sc-app metric: {expr}"
        for name in names:
            assert name in KIND_OF, f"{where}: {name} is not exported (sc_app.observe.metrics.CATALOGUE)"
            spec = KIND_OF[name]
            used.add(spec.name)
            if spec.kind == "gauge":
                assert f"rate({name}" not in expr, f"{where}: rate() of the gauge {name}"
            if name.endswith("_bucket"):
                assert "histogram_quantile(" in expr and "by (le)" in expr, f"{where}: {name} without quantile"
        if "rate(" in expr:
            assert "[$__rate_interval]" in expr, f"{where}: rate window"
        assert 'run_id=~"$run_id"' in expr, f"{where}: does not follow the run selector"
    wanted = {
        "sc_app_reward",
        "sc_app_step_seconds",
        "sc_app_save_seconds",
        "sc_app_save_window_seconds",
        "sc_app_commit_wait_seconds",
        "sc_app_rows_in_tq",
        "sc_app_last_resume_timestamp_seconds",
        "sc_app_last_emergency_save_timestamp_seconds",
    }
    assert wanted <= used, f"no panel or annotation for {sorted(wanted - used)}"


def test_resumes_and_emergency_saves_are_annotations_at_their_moment(dash: dict[str, Any]) -> None:
    anns = {a["name"]: a for a in dash["annotations"]["list"]}
    for name, metric in (
        ("Resumes", "last_resume_timestamp_seconds"),
        ("Emergency saves", "last_emergency_save_timestamp_seconds"),
    ):
        a = anns[name]
        assert a["enable"] and a["useValueForTime"], name
        assert f"ray_sc_app_{metric}" in a["expr"] and a["expr"].endswith("* 1000"), f"{name}: ms for Grafana"


def test_the_panels_an_operator_needs_are_there(dash: dict[str, Any]) -> None:
    titles = " | ".join(p["title"].lower() for p in panels(dash))
    for needed in ("reward", "step time", "save duration", "window", "commit wait", "rows in transferqueue"):
        assert needed in titles, f"no panel for {needed}: {titles}"
