"""``tests.support.durations``: the suite's order by recorded seconds, and the record itself (``tests/durations.json``)
naming only test files that exist, so a renamed module does not silently fall back to the end of the queue."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.support import durations
from tests.support.proc import REPO


def items(*nodeids: str) -> list[Any]:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_known_files_go_longest_first_and_the_rest_keep_their_order() -> None:
    got = durations.order(
        items("t/a.py::x", "t/b.py::x", "t/c.py::x", "t/b.py::y", "t/d.py::x", "t/a.py::y"),  # type: ignore[arg-type]
        {"t/c.py": 30.0, "t/b.py": 200.0},
    )
    assert [i.nodeid for i in got] == ["t/b.py::x", "t/b.py::y", "t/c.py::x", "t/a.py::x", "t/d.py::x", "t/a.py::y"]


def test_the_two_first_files_never_both_wait_on_one_shared_build() -> None:
    """a.py and b.py, the longest, both need the shared run: b.py moves behind c.py (which does not), so the
    second worker starts on c.py while the first builds the run; the rest keep the record's order."""

    def item(nodeid: str, *fixtures: str) -> Any:
        return SimpleNamespace(nodeid=nodeid, fixturenames=[*fixtures, "tmp_path"])

    got = durations.order(
        [item("t/d.py::x"), item("t/c.py::x"), item("t/b.py::x", "shared"), item("t/a.py::x", "shared")],
        {"t/a.py": 90.0, "t/b.py": 80.0, "t/c.py": 70.0, "t/d.py": 60.0},
        built_once=("shared",),
    )
    assert [i.nodeid for i in got] == ["t/a.py::x", "t/c.py::x", "t/b.py::x", "t/d.py::x"]
    unshared = durations.order(got, {"t/a.py": 90.0, "t/b.py": 80.0, "t/c.py": 70.0, "t/d.py": 60.0})
    assert [i.nodeid for i in unshared][:2] == ["t/a.py::x", "t/b.py::x"], "without built_once: the record's order"


def test_with_three_workers_no_two_starting_files_wait_on_one_shared_build() -> None:
    """a.py, b.py and c.py, the longest, all need the shared run: with three workers the first starts on a.py, the
    other two on d.py and e.py (which do not); b.py and c.py follow. With two workers only b.py moves."""

    def item(nodeid: str, *fixtures: str) -> Any:
        return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures))

    files = [item("t/a.py::x", "shared"), item("t/b.py::x", "shared"), item("t/c.py::x", "shared")]
    files += [item("t/d.py::x"), item("t/e.py::x"), item("t/f.py::x")]
    record = {"t/a.py": 90.0, "t/b.py": 80.0, "t/c.py": 70.0, "t/d.py": 60.0, "t/e.py": 50.0, "t/f.py": 40.0}
    three = [i.nodeid[2:3] for i in durations.order(files, record, built_once=("shared",), workers=3)]
    assert three[:3] == ["a", "d", "e"], three
    assert sorted(three) == ["a", "b", "c", "d", "e", "f"], "every file still runs"
    two = [i.nodeid[2:3] for i in durations.order(files, record, built_once=("shared",), workers=2)]
    assert two[:2] == ["a", "d"], two
    one = [i.nodeid[2:3] for i in durations.order(files, record, built_once=("shared",), workers=1)]
    assert one == ["a", "b", "c", "d", "e", "f"], "one process builds it once and waits on nobody"


def test_a_new_record_overrides_the_old_and_drops_files_that_are_gone(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    for name in ("a.py", "b.py"):
        (tmp_path / "t" / name).touch()
    old = {"t/a.py": 10.0, "t/b.py": 20.0, "t/gone.py": 99.0}
    assert durations.merge(old, {"t/b.py": 3.14159, "t/a.py": 0.001}, tmp_path) == {"t/a.py": 0.1, "t/b.py": 3.1}


def test_a_missing_or_malformed_record_orders_nothing(tmp_path: Path) -> None:
    assert durations.load(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2")
    assert durations.load(tmp_path / "bad.json") == {}
    (tmp_path / "odd.json").write_text(json.dumps({"t/a.py": "slow", "t/b.py": 4}))
    assert durations.load(tmp_path / "odd.json") == {"t/b.py": 4.0}


def test_the_committed_record_names_existing_test_files_with_positive_seconds() -> None:
    record = json.loads(durations.FILE.read_text())
    assert record, "tests/durations.json is empty: refresh it with `make test-durations`"
    for path, seconds in record.items():
        assert (REPO / path).is_file() and Path(path).name.startswith("test_"), f"{path}: no such test file"
        assert isinstance(seconds, int | float) and seconds > 0, (path, seconds)
