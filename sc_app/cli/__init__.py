"""``sc-app``: run the job, check checkpoints before a driver starts, operate on bundles, and plot a run's log.

Exit codes: 0 ok; 1 the job failed; 2 bad input (config, flags, bundles that must not be resumed);
3 superseded by a newer run on the same checkpoint dir; 143 stopped on SIGTERM after the emergency checkpoint.
Every error is one line on stderr that names the problem and what to do.

One module per command family (``run``, ``preflight``, ``stop``, ``ckpt``, ``export``, ``report``, ``config``; ``k8s``
is ``sc_app.k8s.cli``), each with ``register(subparsers)``; the options they share are ``options``; which error
ends a command with which exit code is ``sc_app.exits``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn

from sc_app import __version__
from sc_app.cli import ckpt, config, export, preflight, report, run, stop
from sc_app.exits import EXIT_FAILED, Parser, exit_for, fail, parse

FAMILIES = (run, preflight, stop, ckpt, export, report, config)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="sc-app", description=(__doc__ or "sc-app").splitlines()[0])
    p.add_argument("--version", action="version", version=f"sc-app {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for family in FAMILIES:
        family.register(sub)
    try:
        from sc_app.k8s.cli import register
    except ImportError:
        pass
    else:
        register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command (``argv``, else ``sys.argv[1:]``) in this process and return its exit code; the
    ``sc-app`` script and ``python -m sc_app`` exit with it. Every error is one line on stderr (``sc_app.exits``)."""
    args = parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_FAILED)
    except Exception as exc:
        ended = exit_for(exc)
        if ended is None:
            raise
        return fail(ended.message, ended.code)


def script() -> NoReturn:
    """The ``sc-app`` script and ``python -m sc_app``: ``main()``, then Python's exit less its last part.

    Everything an exit must do is done, in Python's order: ``threading._shutdown`` (its exit hooks — thread pools
    told to end —, then every non-daemon thread joined), ``atexit`` callbacks run (Ray's
    and TransferQueue's among them), log handlers flushed and closed, stdout/stderr flushed. What is skipped is the
    interpreter clearing every module's globals one by one: with torch, transformers and Ray loaded that took 4-13 s
    on 2 cores after the job had ended (its bundles already durable), paid by every run and every command."""
    code = main()
    threading._shutdown()  # type: ignore[attr-defined]  # what Python's exit does first: its hooks, then the joins
    # the command's output is complete: what libraries log while they shut down (torch's cache statistics at INFO)
    # is not the console's, warnings still are
    logging.getLogger().setLevel(max(logging.getLogger().level, logging.WARNING))
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone (a closed pipe): nothing left to say
            stream.flush()
    os._exit(code)
