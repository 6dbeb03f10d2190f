#!/usr/bin/env python3
"""Generate helm/sc-app/README.md from values.yaml, the way helm-docs does (helm-docs is a Go binary, not
available here, and no maintained PyPI package does this).

Conventions (helm-docs'): a value is documented by a comment block right above its key that starts with `# --`
(continuation lines start with `#`). Every documented key is one row of the values table, in file order, with
its default from values.yaml and its type from values.schema.json. The page around the table comes from
README.md.gotmpl beside the chart, with the helm-docs placeholders listed in TEMPLATES.

    python ops/chart_readme.py            # rewrite helm/sc-app/README.md
    python ops/chart_readme.py --check    # exit 1 (and say so) when README.md is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART_DIR = Path(__file__).resolve().parents[1] / "helm" / "sc-app"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<dash>- )?(?P<key>[A-Za-z0-9_][\w./-]*):(?P<rest>.*)$")
PASSTHROUGH_PROPERTIES = {"requests", "limits"}  # a Kubernetes `resources` block is one value


@dataclass(frozen=True)
class Key:
    """One key line of values.yaml: its path (list items as ints), whether it holds a leaf value, its doc."""

    path: tuple[str | int, ...]
    line: int
    leaf: bool
    doc: str | None  # the `# --` description, None when the key has none

    @property
    def name(self) -> str:
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out


def _comment_block(lines: list[str], i: int) -> list[str]:
    """The comment lines directly above line i (stripped), top to bottom."""
    block: list[str] = []
    j = i - 1
    while j >= 0 and lines[j].strip().startswith("#"):
        block.insert(0, lines[j].strip())
        j -= 1
    return block


def _doc(block: list[str]) -> str | None:
    """helm-docs: the description starts at the last `# --` line of the block and runs to the key."""
    starts = [n for n, text in enumerate(block) if text.startswith("# --")]
    if not starts:
        return None
    parts = [block[starts[-1]].removeprefix("# --").strip()]
    parts += [text.removeprefix("#").strip() for text in block[starts[-1] + 1:]]
    return " ".join(p for p in parts if p)


def parse(text: str) -> list[Key]:
    """Every key line of a values file with its path; block mappings are not leaves, everything else is."""
    lines = text.splitlines()
    stack: list[tuple[int, tuple[str | int, ...]]] = []  # (indent, path) of the enclosing keys and list items
    items: dict[tuple[str | int, ...], int] = {}
    keys: list[Key] = []
    for i, line in enumerate(lines):
        m = KEY_LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group("indent"))
        if m.group("dash"):
            while stack and stack[-1][0] >= indent + 1:
                stack.pop()
            parent = stack[-1][1] if stack else ()
            index = items[parent] = items.get(parent, -1) + 1
            stack.append((indent + 1, (*parent, index)))
            indent += 2
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(stack[-1][1] if stack else ()), m.group("key"))
        stack.append((indent, path))
        following = next((ln for ln in lines[i + 1:] if ln.strip() and not ln.lstrip().startswith("#")), "")
        deeper = len(following) - len(following.lstrip()) > indent
        item = following.lstrip().startswith("- ")
        nested = deeper and (not item or bool(KEY_LINE.match(following)))  # a mapping, or a list of mappings
        leaf = bool(m.group("rest").strip()) or not nested
        keys.append(Key(path=path, line=i + 1, leaf=leaf, doc=_doc(_comment_block(lines, i))))
    return keys


def _schema_node(schema: dict[str, Any], path: tuple[str | int, ...]) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in path:
        if node is None:
            return None
        node = node.get("items") if isinstance(part, int) else node.get("properties", {}).get(part)
    return node


def _passthrough(node: dict[str, Any] | None) -> bool:
    """An object the chart hands to Kubernetes or Ray as a whole (documented as one value)."""
    if node is None:
        return False
    node = node.get("items", node) if node.get("type") == "array" else node
    props = set(node.get("properties", {}))
    return not props or props <= PASSTHROUGH_PROPERTIES


def undocumented(text: str, schema: dict[str, Any]) -> list[str]:
    """Leaves without their own `# --` line, unless they are part of a documented pass-through object."""
    keys = parse(text)
    documented = {k.path for k in keys if k.doc is not None}
    missing = []
    for key in keys:
        if not key.leaf or key.doc is not None:
            continue
        ancestors = [key.path[:n] for n in range(1, len(key.path))]
        if any(a in documented and _passthrough(_schema_node(schema, a)) for a in ancestors):
            continue
        missing.append(f"line {key.line}: {key.name}")
    return missing


def _type(value: Any, node: dict[str, Any] | None) -> str:
    declared = (node or {}).get("type")
    if isinstance(declared, list):
        return " or ".join(declared)
    if declared:
        return str(declared)
    if node and "enum" in node:
        return "string"
    for py, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "list")):
        if isinstance(value, py):
            return name
    return "object" if isinstance(value, dict) else "string"


def _default(values: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        values = values[part]
    return values


def values_table(text: str, schema: dict[str, Any]) -> str:
    values = yaml.safe_load(text)
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for key in parse(text):
        if key.doc is None:
            continue
        default = json.dumps(_default(values, key.path), separators=(",", ":"))
        cells = [f"`{key.name}`", _type(_default(values, key.path), _schema_node(schema, key.path)),
                 f"`{default}`", key.doc.replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render_readme(chart_dir: Path = CHART_DIR) -> str:
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    text = (chart_dir / "values.yaml").read_text()
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    table = values_table(text, schema)
    templates = {
        "chart.header": f"# {meta['name']}",
        "chart.description": " ".join(str(meta.get("description", "")).split()),
        "chart.version": f"**Version:** {meta['version']}",
        "chart.appVersion": f"**App version:** {meta['appVersion']}",
        "chart.kubeVersion": f"**Kubernetes:** `{meta.get('kubeVersion', '')}`",
        "chart.valuesTable": table,
        "chart.valuesSection": f"## Values\n\n{table}",
    }

    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in templates:
            raise SystemExit(f"README.md.gotmpl: unknown placeholder {name!r}; known: {', '.join(sorted(templates))}")
        return templates[name]

    page = re.sub(r'\{\{\s*template\s+"([\w.]+)"\s+\.\s*\}\}', fill, (chart_dir / "README.md.gotmpl").read_text())
    return page.rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that README.md is up to date")
    parser.add_argument("--chart", type=Path, default=CHART_DIR, help="chart directory (default: helm/sc-app)")
    args = parser.parse_args(argv)
    readme = args.chart / "README.md"
    text = (args.chart / "values.yaml").read_text()
    missing = undocumented(text, json.loads((args.chart / "values.schema.json").read_text()))
    if missing:
        print(f"values.yaml: values without their own `# --` line: {'; '.join(missing)}", file=sys.stderr)
        return 1
    page = render_readme(args.chart)
    if args.check:
        if not readme.is_file() or readme.read_text() != page:
            print(f"{readme} is out of date; run: python ops/chart_readme.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
