"""Epoch fencing of the workers a warm in-job restore keeps (``docs/recovery.md``): ``EpochFence``. Pure.

A warm restore resets live trainer ranks and generation engines in place instead of starting new ones, so a call
issued before the reset (by the controller's cancelled pumps) can still reach a worker after it: Ray orders calls
per caller only. Every mutating call carries the epoch of the job that issued it (the lease's fencing epoch, moved
one on per restore); a worker refuses — and counts — a call from an older epoch, and a rollout carries the epoch
that produced it, so the controller never commits one from before its own reset.
"""

from __future__ import annotations

from dataclasses import dataclass


class StaleEpoch(RuntimeError):
    """A call (or its reply) from before the worker's last reset: refused, never acted on."""


@dataclass
class EpochFence:
    """The epoch a worker (or the controller) is at, and how many calls from an older one it refused."""

    epoch: int = 0
    refused: int = 0

    def advance(self, epoch: int) -> None:
        """A reset to ``epoch``; never backwards (a late reset call from an older driver step is refused)."""
        self.admit(epoch, "reset")
        self.epoch = epoch

    def admit(self, epoch: int | None, what: str) -> None:
        """Raise ``StaleEpoch`` (counted) for a call issued at an ``epoch`` older than this one; None: an
        unfenced caller (a test, the first set-up), admitted."""
        if epoch is not None and epoch < self.epoch:
            self.refused += 1
            raise StaleEpoch(f"{what} from epoch {epoch} refused: reset to epoch {self.epoch}")
