"""JSONL prompts and answers: one JSON object per line with a ``prompt`` and an ``answer``.

The loader hands out integer prompt indices (``PromptLoader``); this module maps an index to a row with a pure
function of (file content, seed, index): epoch ``index // rows``, then the row at ``index % rows`` of that epoch's
order (the file order, or a shuffle keyed by seed and epoch). So a bundle's loader place (an index) names the
same prompt on every resume — as long as the file is the same, which ``sha256`` (of the exact bytes) lets a
resume check (``sc_app.checkpoint.dataset.DatasetRecord``). Pure: no torch, no transformers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sc_app.io import strict_json
from sc_app.io.safe_files import FileMissing, FileProblem, read_regular
from sc_app.rl.hf.errors import HFInputError

MAX_DATASET_BYTES = 1 << 30  # every worker holds the whole file in memory; larger is refused, not read
MAX_ROWS = 5_000_000  # ... and every row as an object: a file of a billion tiny lines is refused too


class DatasetError(HFInputError):
    """A dataset file that cannot be used; ``str()`` is one line naming the file, the line and what to do."""


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    line: int  # 1-based line number in the file


@dataclass(frozen=True)
class JsonlDataset:
    path: Path
    sha256: str
    examples: tuple[Example, ...]
    shuffle: bool = False
    seed: int = 0

    def __len__(self) -> int:
        return len(self.examples)

    def row(self, index: int) -> int:
        """Row (0-based, file order) that prompt ``index`` of the stream names."""
        if index < 0:
            raise IndexError(f"prompt index {index} < 0")
        n = len(self.examples)
        epoch, pos = divmod(index, n)
        return _epoch_order(n, self.seed, epoch)[pos] if self.shuffle else pos

    def __getitem__(self, index: int) -> Example:
        return self.examples[self.row(index)]


def read_dataset_bytes(p: Path) -> bytes:
    """The file's bytes: a regular file (a link to one is followed) of at most ``MAX_DATASET_BYTES``; a FIFO or a
    device is refused before it is opened, so nothing blocks or reads forever."""
    try:
        return read_regular(p, MAX_DATASET_BYTES, follow=True)
    except FileMissing:
        raise DatasetError(f"task.path {p}: no such file; point task.path at a JSONL file") from None
    except FileProblem as exc:
        raise DatasetError(f"task.path {exc}; point task.path at a JSONL file") from None


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(read_dataset_bytes(Path(path))).hexdigest()


def jsonl_lines(text: str) -> list[str]:
    """JSONL lines: split at "\\n" only (U+2028, U+0085, form feeds and lone "\\r" are text inside a line)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def load_jsonl(path: str | Path, *, shuffle: bool = False, seed: int = 0) -> JsonlDataset:
    """Read and check every line; ``DatasetError`` names the first bad one."""
    p = Path(path)
    data = read_dataset_bytes(p)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"task.path {p}: not UTF-8 (byte {exc.start}); save the file as UTF-8") from None
    lines = jsonl_lines(text)
    if len(lines) > MAX_ROWS + 1:
        raise DatasetError(f"task.path {p}: {len(lines):,} lines, more than the {MAX_ROWS:,} rows a dataset may have")
    examples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        examples.append(_parse(p, number, line))
    if not examples:
        raise DatasetError(f"task.path {p}: no examples; write one JSON object per line with 'prompt' and 'answer'")
    return JsonlDataset(p, hashlib.sha256(data).hexdigest(), tuple(examples), shuffle, seed)


def _parse(p: Path, number: int, line: str) -> Example:
    where = f"task.path {p} line {number}"
    try:
        obj = strict_json.parse(line.encode("utf-8", "surrogatepass"))
    except ValueError as exc:  # any depth, any number size: strict_json raises only ValueError
        raise DatasetError(f"{where}: {exc}; one JSON object per line") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: a JSON {type(obj).__name__}, expected an object with 'prompt' and 'answer'")
    prompt, answer = obj.get("prompt"), obj.get("answer")
    if not isinstance(prompt, str) or not prompt.strip():
        raise DatasetError(f"{where}: 'prompt' missing or not a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DatasetError(f"{where}: 'answer' missing or not a string or number")
    return Example(prompt=prompt, answer=str(answer), line=number)


_ORDER_CACHE: dict[tuple[int, int, int], tuple[int, ...]] = {}


def _epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """A permutation of ``range(n)`` keyed by (seed, epoch): rows sorted by a hash, the same on every machine."""
    key = (n, seed, epoch)
    order = _ORDER_CACHE.get(key)
    if order is None:
        salt = f"{seed}:{epoch}:".encode()
        order = tuple(sorted(range(n), key=lambda i: hashlib.sha256(salt + str(i).encode()).digest()))
        _ORDER_CACHE.clear()  # one epoch at a time is all the stream needs
        _ORDER_CACHE[key] = order
    return order

