"""Where ``sc-app export --out`` may write: checked before anything is read or written. Pure: no torch.

Refused, each in one line: a path inside ``checkpoint.dir`` (``ck/step_2/policy/x`` would change the only bundle,
``ck/step_99`` would be a bogus newest one), a symbolic link, a path that names no new directory (``.``, ``..``,
``/``), a NUL byte, and names or paths too long for the export's temporary sibling to be created.
"""

from __future__ import annotations

import os
from pathlib import Path

from sc_app.config.input import NAME_MAX, PATH_MAX
from sc_app.io.safe_files import show

PARTIAL_SUFFIX_BYTES = 32  # ".<name>.partial-<pid>": the sibling the export is written into before its rename
PATH_MARGIN = 512  # the longest file the export writes under it (tokenizer files, shards)


class ExportTargetError(ValueError):
    """``--out`` cannot be written; ``str()`` is one line naming it and what to do."""


def check_export_out(out: str, checkpoint_dir: str | Path | None) -> Path:
    """``out`` as the path to write, or ``ExportTargetError`` (``checkpoint_dir`` None: the bundle is on a bucket)."""
    if not out or "\0" in out:
        raise ExportTargetError(f"--out {show(out)!r}: not a path; name a new directory")
    path = Path(os.path.abspath(out))
    name = path.name
    if not name or Path(out).name in ("", ".", ".."):
        raise ExportTargetError(f"--out {show(out)}: names no new directory; name one, e.g. --out ./exported")
    if len(name.encode("utf-8", "surrogateescape")) + PARTIAL_SUFFIX_BYTES > NAME_MAX:
        raise ExportTargetError(
            f"--out {show(name[:40])}...: a name of {len(name)} characters; keep it under "
            f"{NAME_MAX - PARTIAL_SUFFIX_BYTES} bytes"
        )
    if len(os.fsencode(path)) + PATH_MARGIN > PATH_MAX:
        raise ExportTargetError(
            f"--out {show(str(path)[:60])}...: a path of {len(str(path))} characters; the files under it would pass "
            f"the system's {PATH_MAX}-byte limit; choose a shorter path"
        )
    if os.path.islink(path):
        raise ExportTargetError(f"--out {show(out)}: is a symbolic link; name a new directory (links are not followed)")
    if checkpoint_dir is None:
        return path
    real = Path(os.path.realpath(path.parent)) / name
    ckpt = Path(os.path.realpath(checkpoint_dir))
    if real == ckpt or ckpt in real.parents:
        raise ExportTargetError(
            f"--out {show(out)}: is inside the checkpoint directory {show(ckpt)}, where it could break or fake a "
            "bundle; export outside it"
        )
    if real in ckpt.parents:
        raise ExportTargetError(f"--out {show(out)}: holds the checkpoint directory; export to a new directory")
    return path
