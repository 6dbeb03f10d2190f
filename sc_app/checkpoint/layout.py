"""Names and paths of the bundle layout, drawn in docs/checkpoint.md ("The bundle"): ``step_<N>/`` (complete,
only ever created by renaming ``tmp_step_<N>[.<run>.e<epoch>]/``), ``quarantine/``, ``pins/``, and inside a bundle
``policy/``, ``train_dataloader.pt``, ``data_plane/``, ``replay_buffer_metadata.pt`` and ``manifest.json``. Pure.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from sc_app.data_plane.client import METADATA_FILE

STEP_PREFIX = "step_"
TMP_PREFIX = "tmp_step_"
QUARANTINE_DIR = "quarantine"
PINS_DIR = "pins"
POLICY_DIR = "policy"
LOADER_FILE = "train_dataloader.pt"
DATA_PLANE_DIR = "data_plane"
SIDECAR_FILE = "replay_buffer_metadata.pt"
MANIFEST_FILE = "manifest.json"
REQUIRED_ENTRIES = (POLICY_DIR, LOADER_FILE, DATA_PLANE_DIR, SIDECAR_FILE)
MODEL_FILE = "model.pt"  # inside policy/
OPTIMIZER_FILE = "optimizer.pt"  # inside policy/
DATA_PLANE_METADATA = METADATA_FILE  # inside data_plane/: the data-plane client's contract, whichever format wrote it

_STEP_RE = re.compile(r"^step_(\d+)$")
# tmp_step_N, tmp_step_N.<run> (written before the epoch was part of the name), tmp_step_N.<run>.e<epoch>
_TMP_RE = re.compile(r"^tmp_step_(\d+)(?:\.[0-9A-Za-z_-]+(?:\.e\d+)?)?$")


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def tmp_name(step: int, owner: str | None = None, epoch: int | None = None) -> str:
    """``tmp_step_N``, or ``tmp_step_N.<owner>.e<epoch>`` for a writer holding a lease (``owner``: its run id,
    ``epoch``: the lease's fencing epoch): a fenced-off writer's stale paths can then never land in the tmp dir of
    the writer that superseded it, even for the same step — also when the successor is the same run one epoch on
    (an in-job restore advances the epoch, ``Lease.advance``). ``tmp_step_N.<owner>`` alone is the name writers
    used before the epoch was part of it: still recognised (``parse_tmp``) so tidying moves such leftovers aside."""
    name = f"{TMP_PREFIX}{step}" + (f".{owner}" if owner else "")
    return name + (f".e{epoch}" if owner and epoch is not None else "")


def parse_step(name: str) -> int | None:
    """Step number of a complete bundle's directory name, else None."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def parse_tmp(name: str) -> int | None:
    m = _TMP_RE.match(name)
    return int(m.group(1)) if m else None


def is_real_dir(path: Path) -> bool:
    """A directory itself, not a link to one: the only kind of entry sc-app moves, prunes or resumes."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def step_entries(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every entry named ``step_N``, newest first — whatever it is: a link or a non-directory is
    listed too, so that verification reports it (and resume, retention and quarantine leave it alone).
    ``OSError`` when ``root`` is a directory that cannot be listed."""
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if (s := parse_step(p.name)) is not None]
    return sorted(found, key=lambda sp: sp[0], reverse=True)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_N`` that is a real directory (links are not followed), newest first."""
    return [(s, p) for s, p in step_entries(root) if is_real_dir(p)]


def tmp_dirs(root: Path) -> list[Path]:
    """Every ``tmp_step_N`` that is a real directory (links are not followed)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if parse_tmp(p.name) is not None and is_real_dir(p))
