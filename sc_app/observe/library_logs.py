"""Library noise off the console: what Ray, TransferQueue, torch, transformers (any logger but sc-app's own) and
Python's warnings log in the driver goes to ``libraries.log`` beside the run log, whole — multi-line warnings and
tracebacks included — so the console (what ``sc-app run`` prints, a pod's log) stays sc-app's stream of one line
per event.

``LibraryLogs.install()`` (before anything runs) takes every record of a logger outside ``sc_app`` off the root's
console handlers and holds it in a queue; ``open(log_dir)`` (once the attempt's run-log directory is known: after
the lease) starts writing the queue to ``<log_dir>/libraries.log`` on a thread of its own (a slow log volume never
holds the driver); ``close()`` flushes it. Without a run log (``run.log_enabled=false``, or a run refused before
its attempt started) the held records are printed at ``close`` one line each (the first line, and how many more
there were). Ray's own ``ray`` logger does not propagate by default: the driver starts Ray with
``configure_logging=False`` and lets it propagate (``sc_app.attempt.run``).
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

LIBRARIES_LOG = "libraries.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def is_library(record: logging.LogRecord) -> bool:
    """Any record but one of sc-app's own loggers (``sc_app`` and below)."""
    return not (record.name == "sc_app" or record.name.startswith("sc_app."))


def _ours(record: logging.LogRecord) -> bool:
    return not is_library(record)


def one_line(record: logging.LogRecord) -> str:
    """The record's first line, and how many lines it had besides (a traceback's included)."""
    text = record.getMessage()
    if record.exc_info and not record.exc_text:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    lines = text.strip().splitlines() or [""]
    more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    return f"{lines[0]}{more}"


class LibraryLogs:
    """Routes every library record of this process (module docstring); one per ``sc-app run``."""

    def __init__(self, root: logging.Logger | None = None) -> None:
        self.root = root or logging.getLogger()
        self.queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self.held = logging.handlers.QueueHandler(self.queue)
        self.held.addFilter(is_library)
        self.path: Path | None = None
        self._listener: logging.handlers.QueueListener | None = None
        self._console: list[logging.Handler] = []
        self._undo: list[Callable[[], None]] = []

    def install(self) -> LibraryLogs:
        """Hold library records from now on; the root's own handlers keep only sc-app's."""
        self._console = [h for h in self.root.handlers if h is not self.held]
        for handler in self._console:
            handler.addFilter(_ours)
        self.root.addHandler(self.held)
        logging.captureWarnings(True)  # Python's warnings (torch, transformers) become py.warnings records
        return self

    def open(self, log_dir: Path) -> Path | None:
        """Write the held records, and every later one, to ``<log_dir>/libraries.log``; None (they stay held) when
        that directory cannot be made."""
        if self._listener is not None:
            return self.path
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(log_dir / LIBRARIES_LOG, delay=True, encoding="utf-8")
        except OSError:
            return None
        handler.setFormatter(logging.Formatter(FORMAT))
        self.path = log_dir / LIBRARIES_LOG
        self._listener = logging.handlers.QueueListener(self.queue, handler)
        self._listener.start()
        return self.path

    def route_ray_errors(self) -> None:
        """Ray's driver prints what its raylets publish (``(raylet) A worker died or was killed ...``) straight to
        stdout, whatever ``log_to_driver`` says: make those records of the ``ray.raylet`` logger instead (a library
        record like any other). Ray looks the printer up by name for each message, so this works once Ray is up.
        Ray prints those lines whatever the ``ray`` logger's level is (a ``ray.init(logging_level="ERROR")`` in the
        same process sets it), so ``ray.raylet`` keeps a level of its own: every such line is recorded."""
        from ray._private import worker

        original = worker.print_to_stdstream
        raylet = logging.getLogger("ray.raylet")
        level = raylet.level
        raylet.setLevel(logging.INFO)
        self._undo.append(lambda: raylet.setLevel(level))

        def to_log(data: dict[str, Any], ignore_prefix: bool) -> None:
            if data.get("pid") != "raylet":
                return original(data, ignore_prefix=ignore_prefix)
            for line in data.get("lines", []):
                raylet.warning("%s", line)
            return None

        worker.print_to_stdstream = to_log
        self._undo.append(lambda: setattr(worker, "print_to_stdstream", original))

    def close(self) -> None:
        """Flush to the file; without one, print what was held one line each. The root's handlers as before."""
        while self._undo:
            self._undo.pop()()
        self.root.removeHandler(self.held)
        logging.captureWarnings(False)
        if self._listener is not None:
            self._listener.stop()
            for handler in self._listener.handlers:
                handler.close()
        for handler in self._console:
            handler.removeFilter(_ours)
        while not self.queue.empty():
            record = self.queue.get_nowait()
            if record.levelno >= logging.WARNING:
                for handler in self._console:
                    line = {
                        "msg": one_line(record),
                        "args": None,
                        "exc_info": None,
                        "exc_text": None,
                        "stack_info": None,
                    }
                    handler.handle(logging.makeLogRecord({**record.__dict__, **line}))
