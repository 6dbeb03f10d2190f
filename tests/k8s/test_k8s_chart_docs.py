"""The chart's documentation cannot fall behind its values: every value has its own `# --` line in values.yaml,
and helm/sc-app/README.md is exactly what ops/chart_readme.py generates from values.yaml and README.md.gotmpl."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.k8s.k8s_helpers import CHART_DIR, REPO_ROOT

GENERATOR = REPO_ROOT / "ops" / "chart_readme.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_readme", GENERATOR)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _check(chart: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GENERATOR), "--check", "--chart", str(chart)], capture_output=True,
                          text=True, timeout=120)


def test_every_value_has_its_own_doc_line() -> None:
    gen = _generator()
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    missing = gen.undocumented((CHART_DIR / "values.yaml").read_text(), schema)
    assert not missing, "values without their own `# --` line: " + "; ".join(missing)


def test_shared_comments_are_caught() -> None:
    """One comment over several chart-defined values (what rayPorts and config.generation had) is not enough;
    a documented pass-through object (a securityContext, a resources block) is one value."""
    gen = _generator()
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    shared = "rayPorts:\n  # -- Ray's ports.\n  gcs: 6379\n  dashboard: 8265\n"
    assert gen.undocumented(shared, schema) == ["line 4: rayPorts.dashboard"]
    passthrough = "# -- Pod securityContext.\npodSecurityContext:\n  runAsNonRoot: true\n  fsGroup: 10001\n"
    assert gen.undocumented(passthrough, schema) == []
    group = "workerGroups:\n  # -- Name.\n  - name: a\n    replicas: 1\n"
    assert gen.undocumented(group, schema) == ["line 4: workerGroups[0].replicas"]


def test_readme_is_generated_from_values() -> None:
    proc = _check(CHART_DIR)
    assert proc.returncode == 0, proc.stderr + "\nregenerate with: python ops/chart_readme.py"
    readme = (CHART_DIR / "README.md").read_text()
    gen = _generator()
    for key in gen.parse((CHART_DIR / "values.yaml").read_text()):
        if key.doc is not None:
            assert f"| `{key.name}` |" in readme, key.name


def test_a_changed_value_makes_the_readme_stale(tmp_path: Path) -> None:
    chart = tmp_path / "sc-app"
    shutil.copytree(CHART_DIR, chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("  waitSeconds: 90", "  waitSeconds: 95"))
    proc = _check(chart)
    assert proc.returncode == 1 and "README.md is out of date" in proc.stderr, proc.stderr
    subprocess.run([sys.executable, str(GENERATOR), "--chart", str(chart)], check=True, timeout=120)
    assert "| `preStop.waitSeconds` | integer | `95` |" in (chart / "README.md").read_text()
    assert _check(chart).returncode == 0
