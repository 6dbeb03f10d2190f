"""Exit codes, which error ends a command with which, and the one-line error report shared by every sc-app command
(``sc-app ...`` and ``sc-app k8s ...``).

Invariant: a command that fails prints exactly one line ``<prog>: error: <message>`` on stderr, naming the problem
and what to do, and returns one of these codes; it never prints a traceback, and it returns (``parse``: not even a
bad flag raises ``SystemExit``), so ``main(argv)`` can run in a caller's process. Pure: the errors are named by their
import path (``EXIT_OF``), so this module imports none of the modules that raise them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import NoReturn

EXIT_OK = 0
EXIT_FAILED = 1  # the job (or the operation it waited for) failed; a rerun may succeed
EXIT_BAD_INPUT = 2  # bad config, flags, bundles that must not be resumed, or a refused API request
EXIT_SUPERSEDED = 3  # a newer run took the checkpoint directory's lease
EXIT_STOPPED = 143  # 128 + SIGTERM: stopped on request after the emergency checkpoint; a retry resumes

# An error class (``module.QualName``) → the exit code it ends a command with; a subclass inherits its base's.
EXIT_OF: dict[str, int] = {
    # bad input: config, flags, model/data/reward, the checkpoint directory or bundles that must not be resumed
    "sc_app.config.input.ConfigError": EXIT_BAD_INPUT,  # HmacKeyError (a set but unusable key) too
    "sc_app.cli.options.BadDir": EXIT_BAD_INPUT,
    "sc_app.checkpoint.lease.LeaseError": EXIT_BAD_INPUT,
    "sc_app.checkpoint.lease.CheckpointDirNotShared": EXIT_BAD_INPUT,  # a bundle writer on a node without the dir
    "sc_app.checkpoint.lineage.LineageError": EXIT_BAD_INPUT,
    "sc_app.rl.hooks.InputError": EXIT_BAD_INPUT,
    "sc_app.attempt.run.CheckpointDirUnusable": EXIT_BAD_INPUT,
    "sc_app.attempt.errors.ResumeRefused": EXIT_BAD_INPUT,
    "sc_app.attempt.ray_start.RayTmpdirUnusable": EXIT_BAD_INPUT,  # RAY_TMPDIR missing, a file, unwritable
    "sc_app.checkpoint.remote.fence.RemoteRefused": EXIT_BAD_INPUT,  # the bucket: credentials, access, no CAS
    "sc_app.data_plane.tq_placement.StorageUnitsUnplaceable": EXIT_BAD_INPUT,  # no node offers a unit a CPU
    # a newer run took the lease (fencing)
    "sc_app.checkpoint.lease.LeaseLost": EXIT_SUPERSEDED,
    "sc_app.checkpoint.remote.fence.RemoteLeaseLost": EXIT_SUPERSEDED,  # parts=direct: another attempt took the bucket
    # the job failed; a rerun resumes from the newest complete bundle
    "sc_app.controller.saves.SaveFailed": EXIT_FAILED,
    "sc_app.controller.saves.InventoryMismatch": EXIT_FAILED,
    "sc_app.attempt.poll.EmergencyTimeout": EXIT_FAILED,
    "sc_app.progress.JobFailed": EXIT_FAILED,  # ActorsDied too; in-job restores spent or impossible
    "sc_app.progress.RecoveryExhausted": EXIT_FAILED,  # in-job recovery spent its bound (retries, restarts)
    "sc_app.attempt.ray_start.RayStartFailed": EXIT_FAILED,  # ray.init failed (timed out twice): rerun later
    "sc_app.rl.hooks.RewardFailed": EXIT_FAILED,  # a reward function failed at run time: one line naming it
    "sc_app.attempt.remote_tier.RemoteUnavailable": EXIT_FAILED,  # the bucket's newest could not be brought home
    "sc_app.checkpoint.node_parts.NodeCopyFailed": EXIT_FAILED,  # a bundle's policy/ sent to a node arrived broken
    "sc_app.data_plane.tq_placement.StorageUnitNodeGone": EXIT_FAILED,  # a unit's node left while it started
}
_PREFIX = {EXIT_SUPERSEDED: "superseded: "}


@dataclass(frozen=True)
class Exit:
    """How a command ends on an error: its exit code and its one error line."""

    code: int
    message: str


def exit_for(exc: BaseException) -> Exit | None:
    """The exit of ``exc`` (its class or the nearest base in ``EXIT_OF``); None for an error no table names (a
    defect: let it be seen)."""
    for cls in type(exc).__mro__:
        code = EXIT_OF.get(f"{cls.__module__}.{cls.__qualname__}")
        if code is not None:
            return Exit(code, f"{_PREFIX.get(code, '')}{exc}")
    return None


def fail(message: str, code: int = EXIT_BAD_INPUT, *, prog: str = "sc-app") -> int:
    """Print ``message`` as the command's one error line; returns ``code`` for ``main`` to exit with."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


class Parser(argparse.ArgumentParser):
    """An ``argparse`` parser whose bad flag is the one error line and exit 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"sc-app: error: {message} (see `{self.prog} --help`)\n")


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """``argv`` parsed, or the exit code argparse ended with (``--help``, ``--version``: 0; a bad flag, its line
    printed: 2): a command's ``main`` returns it instead of raising ``SystemExit`` into its caller's process."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else EXIT_BAD_INPUT
