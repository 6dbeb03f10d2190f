"""Small modules with one job: no module over 400 lines and no function over 60 in ``sc_app/`` and ``bench/``.

A function's lines run from its ``def`` (decorators excluded) to its last line, nested functions included in their
parent's count and counted on their own as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.proc import REPO

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
ROOTS = ("sc_app", "bench")



def sources() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py"))


def long_functions(path: Path) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function or method of ``path`` longer than the limit."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found.append((name, lines))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def test_no_module_is_over_the_limit() -> None:
    over = []
    for path in sources():
        rel = path.relative_to(REPO).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            over.append(f"{rel} ({lines} lines)")
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_is_over_the_limit() -> None:
    over = []
    for path in sources():
        rel = path.relative_to(REPO).as_posix()
        over += [f"{rel}:{name} ({lines} lines)" for name, lines in long_functions(path)]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def test_the_counter_counts_nested_functions_and_methods(tmp_path: Path) -> None:
    def body(indent: int) -> str:
        return "".join(f"{' ' * indent}x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))

    src = tmp_path / "m.py"
    src.write_text(f"class C:\n    async def m(self):\n{body(8)}\ndef f():\n    def g():\n{body(8)}    return g\n")
    assert long_functions(src) == [
        ("C.m", MAX_FUNCTION_LINES + 1),
        ("f", MAX_FUNCTION_LINES + 3),
        ("f.g", MAX_FUNCTION_LINES + 1),
    ]
