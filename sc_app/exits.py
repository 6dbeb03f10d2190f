"""Exit codes and the one-line error report shared by every sc-app command (``sc-app ...`` and ``sc-app k8s ...``).

Invariant: a command that fails prints exactly one line ``<prog>: error: <message>`` on stderr, naming the problem
and what to do, and returns one of these codes; it never prints a traceback.
"""

from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_FAILED = 1  # the job (or the operation it waited for) failed; a rerun may succeed
EXIT_BAD_INPUT = 2  # bad config, flags, bundles that must not be resumed, or a refused API request
EXIT_SUPERSEDED = 3  # a newer run took the checkpoint directory's lease
EXIT_STOPPED = 143  # 128 + SIGTERM: stopped on request after the emergency checkpoint; a retry resumes


def fail(message: str, code: int = EXIT_BAD_INPUT, *, prog: str = "sc-app") -> int:
    """Print ``message`` as the command's one error line; returns ``code`` for ``main`` to exit with."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code
