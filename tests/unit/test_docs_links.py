"""README.md and docs/ point at what exists: every relative link resolves, every ``sc_app/...`` path the README names
is a file or directory, and the README's "What runs where" table names every package of ``sc_app``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.proc import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")
CODE_PATH = re.compile(r"`(sc_app/[\w/.]+)`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    targets = [t for t in LINK.findall(doc.read_text()) if "://" not in t]
    assert targets, f"{doc.name} links nothing"
    missing = [t for t in targets if not (doc.parent / t).exists()]
    assert missing == [], f"{doc.name} links to what does not exist"


def test_every_path_the_readme_names_exists() -> None:
    named = CODE_PATH.findall((REPO / "README.md").read_text())
    assert named
    assert [p for p in named if not (REPO / p).exists()] == []


def test_what_runs_where_names_every_package() -> None:
    text = (REPO / "README.md").read_text()
    table = text[text.index("## What runs where") : text.index("\n## ", text.index("## What runs where") + 1)]
    packages = sorted(p.name for p in (REPO / "sc_app").iterdir() if (p / "__init__.py").is_file())
    assert len(packages) >= 5
    assert [p for p in packages if f"sc_app/{p}/" not in table] == []


def test_the_bundle_layout_is_drawn_once() -> None:
    drawings = [d.name for d in DOCS if "replay_buffer_metadata.pt  " in d.read_text()]
    assert drawings == ["checkpoint.md"], "draw the layout in docs/checkpoint.md only; link it from elsewhere"
