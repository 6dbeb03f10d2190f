"""What a run's console may hold: sc-app's own lines only (issue 31, class K) — its prints and its ``sc_app.*``
log lines, one line per event; a library's log line (Ray's, TransferQueue's), a worker's forwarded output, a
traceback or the continuation of a multi-line message is foreign (it belongs in ``libraries.log``)."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its "(raylet)" prefix
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+\s+[A-Z]+\s+(\S+)")


def foreign_lines(out: str) -> list[str]:
    bad = []
    for line in map(lambda raw: _ANSI.sub("", raw), out.splitlines()):
        logged = _LOG_LINE.match(line)
        if logged is not None:
            if not logged.group(1).startswith("sc_app"):
                bad.append(line)
        elif line[:1].isspace() or line.startswith(("Traceback", "(", "[")):
            bad.append(line)
    return bad
