"""hf backend: the JSONL dataset — checked line by line, hashed by its bytes, and an exact index → row mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_app.rl.hf.dataset import DatasetError, file_sha256, load_jsonl
from sc_app.rl.loader import PromptLoader
from tests.support.hf import ARITHMETIC, write_jsonl


def refused(path: Path, text: str | bytes) -> str:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(DatasetError) as info:
        load_jsonl(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


def test_rows_prompts_answers_and_hash(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ARITHMETIC)
    ds = load_jsonl(path)
    assert len(ds) == len(ARITHMETIC)
    assert ds.examples[0].prompt == "what is 3 + 4 ?" and ds.examples[0].answer == "7"
    assert ds.examples[-1].answer == "0", "a numeric answer is kept as its text"
    assert ds.sha256 == file_sha256(path)
    path.write_text(path.read_text() + "\n")  # one more byte, same rows
    assert load_jsonl(path).sha256 != ds.sha256, "the hash is of the exact bytes"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"prompt": "a", "answer": "b"}\n{oops\n', "line 2: not valid JSON"),
        ('["a", "b"]\n', "line 1: a JSON list"),
        ('{"answer": "b"}\n', "line 1: 'prompt' missing"),
        ('{"prompt": "a"}\n', "line 1: 'answer' missing"),
        ('{"prompt": "a", "answer": true}\n', "line 1: 'answer' missing"),
        ("\n\n", "no examples"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, text: str, named: str) -> None:
    assert named in refused(tmp_path / "d.jsonl", text)


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_jsonl(tmp_path / "absent.jsonl")
    assert "not UTF-8" in refused(tmp_path / "latin1.jsonl", b'{"prompt": "\xe9", "answer": "1"}\n')


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_per_epoch_and_the_same_on_every_load(tmp_path: Path, shuffle: bool) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ARITHMETIC)
    n = len(ARITHMETIC)
    a, b = load_jsonl(path, shuffle=shuffle, seed=3), load_jsonl(path, shuffle=shuffle, seed=3)
    for epoch in range(3):
        rows = [a.row(epoch * n + i) for i in range(n)]
        assert sorted(rows) == list(range(n)), f"epoch {epoch}: {rows}"
        assert rows == [b.row(epoch * n + i) for i in range(n)], "the mapping is a pure function"
    orders = {tuple(a.row(e * n + i) for i in range(n)) for e in range(6)}
    assert (len(orders) > 1) == shuffle, "shuffle changes the order between epochs; no shuffle keeps file order"


def test_a_resumed_loader_continues_the_exact_prompt_stream(tmp_path: Path) -> None:
    """The loader place is an index; with the same file it names the same prompts after a resume."""
    ds = load_jsonl(write_jsonl(tmp_path / "d.jsonl", ARITHMETIC * 3), shuffle=True, seed=1)
    before = PromptLoader()
    taken = [before.take() for _ in range(7)]
    for idx in taken[:5]:
        before.settled(idx)
    state = before.state_dict()
    rest_original = [ds[before.take()].prompt for _ in range(10)]
    after = PromptLoader()
    after.load_state_dict(state, skip=set())
    reissued = [after.take() for _ in range(2)]
    assert reissued == taken[5:], "prompts taken but not committed are handed out again"
    rest_resumed = [ds[after.take()].prompt for _ in range(10)]
    assert rest_resumed == rest_original
