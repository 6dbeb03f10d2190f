"""A ``helm`` stand-in for the runbook sequences: ``install``/``upgrade`` render the chart with the real Helm engine
(``sc_app.k8s.release.render_release``, the same engine ``helm`` embeds) and write the objects to the API-server
stand-in with Helm's ownership annotation; ``get values [--all] -o json|yaml``; ``uninstall``. The KubeRay operator's
own chart (``kuberay/kuberay-operator``) is not vendored: its ``--set env[i]...`` values are recorded, which
``kubectl get deploy kuberay-operator`` then shows.

``--set`` follows Helm's strvals where it matters here: ``a.b=v`` sets a key; ``a[0].b=v`` makes ``a`` a new list
whose element 0 is ``{b: v}`` — merged over reused values the list replaces the old one whole (Helm merges maps,
never lists), which is why the runbook edits the whole list instead. ``--reset-then-reuse-values`` reuses the values
given before under the new chart's defaults; ``--reuse-values`` (which keeps the old chart's defaults) is refused, as
is an operator install or upgrade without ``--version``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from sc_app.k8s.api import K8sError
from sc_app.k8s.release import ReleaseError, deep_merge, find_chart, render_release
from tests.k8s.standins.common import kube, log_call, namespace, state, unsupported

HELM_RELEASE = "meta.helm.sh/release-name"
KEY = re.compile(r"^([A-Za-z0-9_-]+)(?:\[(\d+)\])?$")


def _parse_set(item: str, *, string: bool = False) -> dict[str, Any]:
    """One ``--set path=value`` as the map strvals builds for it (a list index builds a fresh list)."""
    path, _, raw = item.partition("=")
    node: Any = raw if string else yaml.safe_load(raw)
    for part in reversed(path.split(".")):
        m = KEY.match(part)
        if not m:
            unsupported("helm", ["--set", item])
        name, index = m.groups()
        if index is not None:
            lst: list[Any] = [{} for _ in range(int(index) + 1)]
            lst[int(index)] = node
            node = lst
        node = {name: node}
    return node


def _merge_sets(a: Any, b: Any) -> Any:
    """The --set flags of one command parsed into one map (strvals): maps and list elements merge."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **{k: _merge_sets(a[k], v) if k in a else v for k, v in b.items()}}
    if isinstance(a, list) and isinstance(b, list):
        return [_merge_sets(x, y) if y != {} else x for x, y in zip(a + [{}] * (len(b) - len(a)),
                                                                  b + [{}] * (len(a) - len(b)), strict=True)]
    return b


def _sets(args: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in _options(args, "--set"):
        out = _merge_sets(out, _parse_set(s))
    for s in _options(args, "--set-string"):
        out = _merge_sets(out, _parse_set(s, string=True))
    return out


def _values_file(release: str) -> Path:
    return state() / f"helm-{release}.json"


def _options(args: list[str], *flags: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a in flags]


def _apply(release: str, ns: str, rendered: Any) -> None:
    k = kube(ns)
    for obj in rendered.objects:
        obj["metadata"].setdefault("annotations", {})[HELM_RELEASE] = release
        res = k.resource_of(obj)
        live = k.get(res, obj["metadata"]["name"])
        if live is None:
            k.create(res, obj)
        elif obj["kind"] != "PersistentVolumeClaim":
            obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
            if "status" in live:
                obj["status"] = live["status"]
            k.replace(res, obj)


def install(args: list[str]) -> None:
    verb, release, chart = args[0], args[1], args[2]
    ns = namespace(args)
    if chart.startswith("kuberay/"):  # the operator's chart from its repository: record what it would set
        if not _options(args, "--version"):
            sys.stderr.write(f"stand-in: {verb} of {chart} without --version would move the cluster-wide operator\n")
            sys.exit(4)
        chosen: dict[str, Any] = {}
        for f in _options(args, "-f", "--values"):
            chosen = deep_merge(chosen, json.loads(Path(f).read_text()) if f.endswith(".json")
                                else yaml.safe_load(Path(f).read_text()) or {})
        chosen = deep_merge(chosen, _sets(args))
        version = _options(args, "--version")[0]
        (state() / f"chart-{release}.json").write_text(json.dumps({**chosen, "version": version}))
        _values_file(release).write_text(json.dumps(chosen))
        print(f'Release "{release}" has been {"installed" if verb == "install" else "upgraded"}.')
        return
    if not (Path(chart) / "Chart.yaml").is_file():
        sys.stderr.write(f"Error: {verb.upper()} FAILED: path \"{chart}\" not found\n")
        sys.exit(1)
    values: dict[str, Any] = {}
    if "--reuse-values" in args:  # the runbooks never use it (tests/k8s/test_runbook_pins.py)
        unsupported("helm", args)
    # --reset-then-reuse-values: the values given before, under the new chart's defaults (render_release adds them)
    if "--reset-then-reuse-values" in args and _values_file(release).exists():
        values = json.loads(_values_file(release).read_text())
    for f in _options(args, "-f", "--values"):
        values = deep_merge(values, yaml.safe_load(Path(f).read_text()) or {})
    values = deep_merge(values, _sets(args))  # Helm coalesces: maps merge, a list replaces the old one whole
    try:
        rendered = render_release(values, name=release, namespace=ns, chart=chart)
        _apply(release, ns, rendered)
    except (ReleaseError, K8sError) as exc:
        sys.stderr.write(f"Error: {verb.upper()} FAILED: {exc}\n")
        sys.exit(1)
    _values_file(release).write_text(json.dumps(values))
    print(f'Release "{release}" has been {"installed" if verb == "install" else "upgraded"}.')


def get_values(args: list[str]) -> None:
    release = args[2]
    values = json.loads(_values_file(release).read_text())
    if "--all" in args:
        defaults = yaml.safe_load((find_chart() / "values.yaml").read_text())
        values = deep_merge(defaults, values)
    out = _options(args, "-o", "--output")
    print(json.dumps(values, indent=2) if out == ["json"] else yaml.safe_dump(values, sort_keys=False))


def uninstall(args: list[str]) -> None:
    release, ns = args[1], namespace(args)
    k = kube(ns)
    values = json.loads(_values_file(release).read_text())
    for obj in render_release(values, name=release, namespace=ns).objects:
        keep = (obj["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep"
        if not keep:
            k.delete(k.resource_of(obj), obj["metadata"]["name"])
    _values_file(release).unlink()
    print(f'release "{release}" uninstalled')


def main(args: list[str]) -> None:
    log_call("helm", args)
    if args[:1] in (["install"], ["upgrade"]):
        install(args)
    elif args[:2] == ["get", "values"]:
        get_values(args)
    elif args[:1] == ["uninstall"]:
        uninstall(args)
    else:
        unsupported("helm", args)


if __name__ == "__main__":
    main(sys.argv[1:])
