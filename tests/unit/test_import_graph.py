"""The import graph of ``sc_app/``: no cycle between modules, and no package importing one on a floor above it.

Read from the source with ``ast`` (nothing is imported), counting every import: module level, inside functions
(deferred) and under ``TYPE_CHECKING`` — a deferred import is still a dependency. The floors are README's "What runs
where", top to bottom; a module may import its own package, anything on a lower floor, and on the ground floor its
neighbours. A new top-level module or package must be given its floor here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.proc import REPO

SRC = REPO / "sc_app"

FLOORS: list[set[str]] = [
    {"sc_app.__main__"},
    {"sc_app.cli"},  # the sc-app command and its families
    {"sc_app.k8s"},  # sc-app k8s
    {"sc_app.attempt"},  # one attempt: entry, set-up, poll loop, in-job restore, actor watch, cluster fit
    {"sc_app.controller"},  # SingleControllerActor: pumps, save coordination, recovery
    {"sc_app.rl", "sc_app.observe"},  # trainer / generation workers, backends, weight sync; watching a run
    {"sc_app.checkpoint"},  # the bundle
    {"sc_app.data_plane"},  # the data-plane client and adapters, the barrier, the replay buffer and its index
    {"sc_app.config"},  # the job's configuration (pure)
    {"sc_app.io"},  # files: safe reads, durable writes, digests, strict JSON, torch files
    {
        "sc_app",
        "sc_app.compile_marks",
        "sc_app.exits",
        "sc_app.faults",
        "sc_app.phases",
        "sc_app.progress",
        "sc_app.waits",
    },  # ground: pure records, exits, bounded waits, compile marks
]
GROUND = len(FLOORS) - 1


def modules() -> dict[str, Path]:
    """Dotted name → file, for every module of ``sc_app`` (a package is its ``__init__.py``)."""
    out: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _nearest(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The ``sc_app`` modules ``name`` imports (``from pkg import sub`` counts as ``pkg.sub`` when it is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_nearest(a.name, known) for a in node.names if a.name.split(".")[0] == "sc_app")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "sc_app":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else _nearest(base, known))
    found.discard(name)
    found.discard(None)
    return {m for m in found if m is not None}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def unit_of(module: str) -> str:
    """The top-level module or package a module belongs to (``sc_app.checkpoint.save`` → ``sc_app.checkpoint``)."""
    return ".".join(module.split(".")[:2])


def floor_of(unit: str) -> int | None:
    return next((i for i, floor in enumerate(FLOORS) if unit in floor), None)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_there_is_no_import_cycle() -> None:
    found = cycles(graph())
    assert not found, f"modules that import each other (directly or around a loop): {found}"


def test_every_top_level_module_has_a_floor() -> None:
    missing = sorted({unit_of(m) for m in modules()} - set().union(*FLOORS))
    assert not missing, f"give {missing} a floor in FLOORS (README 'What runs where')"


def test_no_package_imports_one_on_a_floor_above_it() -> None:
    upward = []
    for module, targets in sorted(graph().items()):
        src = floor_of(unit_of(module))
        for target in sorted(targets):
            dst = floor_of(unit_of(target))
            if src is None or dst is None or unit_of(module) == unit_of(target):
                continue
            if dst < src or (dst == src and src != GROUND):
                upward.append(f"{module} -> {target}")
    assert not upward, f"imports against the layering (floor above, or a neighbour off the ground floor): {upward}"


@pytest.mark.parametrize(
    ("source", "expect_cycle"),
    [
        ({"a.py": "import sc_app.b\n", "b.py": "def f():\n    from sc_app import a\n"}, True),
        ({"a.py": "from . import b\n", "b.py": ""}, False),
    ],
)
def test_the_graph_reader_sees_deferred_and_relative_imports(
    tmp_path: Path, source: dict[str, str], expect_cycle: bool
) -> None:
    """The checks can fail: a loop through a function-level import is a cycle; a relative import resolves."""
    pkg = tmp_path / "sc_app"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in source.items():
        (pkg / name).write_text(text)
    known = {"sc_app": pkg / "__init__.py", **{f"sc_app.{k[:-3]}": pkg / k for k in source}}
    edges = {name: imports_of(name, path, known) for name, path in known.items()}
    assert bool(cycles(edges)) is expect_cycle, edges
    assert "sc_app.b" in edges["sc_app.a"]


def test_the_registered_checks_resolve() -> None:
    """Checks registered by name (so ``checkpoint/`` imports nothing above it) name functions that exist."""
    from sc_app.checkpoint import contents, policy_formats

    for target in [contents.LOADER_CHECK, *policy_formats.CHECKERS.values()]:
        assert callable(policy_formats.resolve(target)), target
