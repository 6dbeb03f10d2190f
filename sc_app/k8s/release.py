"""Objects for a release, rendered from the chart with the embedded Helm engine (no helm binary, no cluster).

Invariant: the objects are exactly what ``helm template``/``helm install`` renders for the same values and release
name, so the CLI and the chart cannot drift apart. The RayJob is always last in ``Release.objects`` so that every
object it references exists before the operator sees it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sc_app.config.app import ConfigError, parse_override, set_path
from sc_app.config.input import MAX_CONFIG_BYTES, too_big
from sc_app.io.safe_files import FileProblem, read_regular

log = logging.getLogger(__name__)

# Creation order: things referenced by pods first; kinds not listed next (in render order); the RayJob/RayCluster
# always last, so that everything it references exists before the operator sees it.
KIND_ORDER = [
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "PersistentVolumeClaim",
    "NetworkPolicy",
]
RAY_API_VERSION = "ray.io/v1"


def _creation_rank(obj: dict[str, Any]) -> int:
    if obj.get("apiVersion") == RAY_API_VERSION:
        return len(KIND_ORDER) + 1
    return KIND_ORDER.index(obj["kind"]) if obj["kind"] in KIND_ORDER else len(KIND_ORDER)


class ReleaseError(ValueError):
    """The chart cannot be found or the values are refused; ``str()`` is one line."""


def find_chart(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``explicit``, else ``$SC_APP_CHART``, else ``helm/sc-app`` next to the source tree or the current directory."""
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    elif os.environ.get("SC_APP_CHART"):
        candidates.append(Path(os.environ["SC_APP_CHART"]))
    else:
        candidates += [Path(__file__).resolve().parents[2] / "helm" / "sc-app", Path.cwd() / "helm" / "sc-app"]
    for c in candidates:
        if (c / "Chart.yaml").is_file():
            return c
    raise ReleaseError(
        f"chart not found (looked in {', '.join(str(c) for c in candidates)}); pass --chart DIR or set SC_APP_CHART"
    )


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_merge(base[k], v)
        else:
            base[k] = v
    return base


def load_values(files: list[str] | tuple[str, ...] = (), sets: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Values like ``helm -f a.yaml -f b.yaml --set x.y=z``: later files win, ``--set`` wins over files.

    ``--set`` values are YAML-typed (``5`` is an int, ``true`` a bool), as with ``helm --set``'s common cases.
    """
    values: dict[str, Any] = {}
    for f in files:
        try:  # a regular file of at most 1 MiB: a FIFO or /dev/zero is one line, never a hang
            loaded = yaml.safe_load(read_regular(f, MAX_CONFIG_BYTES, follow=True).decode()) or {}
        except FileProblem as exc:
            raise ReleaseError(f"values file {exc}") from None
        except UnicodeDecodeError:
            raise ReleaseError(f"values file {f}: not UTF-8 text") from None
        except (yaml.YAMLError, RecursionError, ValueError):
            raise ReleaseError(f"values file {f}: not valid YAML") from None
        if problem := too_big(loaded):
            raise ReleaseError(f"values file {f}: {problem}")
        if not isinstance(loaded, dict):
            raise ReleaseError(f"values file {f}: top level must be a mapping")
        deep_merge(values, loaded)
    for item in sets:
        try:
            set_path(values, *parse_override(item))
        except ConfigError as exc:  # same --set syntax as sc-app's own config
            raise ReleaseError(str(exc)) from None
    return values


@dataclass
class Release:
    """Rendered objects of one release, in creation order."""

    name: str
    namespace: str
    objects: list[dict[str, Any]] = field(default_factory=list)
    notes: str = ""

    @property
    def ray_object(self) -> dict[str, Any]:
        """The RayJob (or RayCluster in RayCluster mode)."""
        for obj in self.objects:
            if obj.get("apiVersion") == RAY_API_VERSION:
                return obj
        raise ReleaseError("the rendered release has no RayJob/RayCluster")

    def to_yaml(self) -> str:
        return yaml.safe_dump_all(self.objects, sort_keys=False)


def render_release(
    values: dict[str, Any], *, name: str, namespace: str, chart: str | os.PathLike[str] | None = None
) -> Release:
    """Render the chart for ``values`` as release ``name`` in ``namespace``; refused values → ``ReleaseError``."""
    try:
        import helm_python
    except ImportError:  # pragma: no cover - depends on the install
        raise ReleaseError("helm-python-sdk is not installed: pip install 'sc-app[k8s]'") from None
    chart_dir = find_chart(chart)
    try:
        rendered = helm_python.Chart.load(chart_dir).render(values, name=name, namespace=namespace, is_install=True)
    except helm_python.HelmError as exc:
        raise ReleaseError(_one_line(str(exc))) from None
    objs: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    for obj in objs:
        obj.setdefault("metadata", {})["namespace"] = namespace
    objs.sort(key=_creation_rank)
    log.debug("rendered %d objects from %s", len(objs), chart_dir)
    return Release(name=name, namespace=namespace, objects=objs, notes=notes)


def _one_line(message: str) -> str:
    """Helm's multi-line schema report → one line; a template ``fail`` keeps only its own message."""
    if "execution error at" in message:
        return message.split("): ", 1)[-1].strip()
    lines = [ln.strip(" -") for ln in message.splitlines() if ln.strip()]
    detail = [ln for ln in lines if ln.startswith("at '")]
    return ("invalid values: " + "; ".join(detail)) if detail else " ".join(lines)
