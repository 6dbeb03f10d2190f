"""The one base of every hf-backend input problem (model directory, dataset, reward): ``sc-app`` reports any of
them as one line and exits 2 (bad input), whether the driver found it before Ray started or a worker did."""

from __future__ import annotations


class HFInputError(ValueError):
    """A model directory, dataset or reward function that cannot be used; ``str()`` is one line."""


class RewardFailed(RuntimeError):
    """The reward function failed while the job ran (raised, exited, returned a non-finite or non-numeric value):
    ``str()`` is one line naming the function. Not bad input found before the run — the job failed (exit 1) — and
    typed, so the name survives the worker → controller → driver path instead of a generic "rollout pump failed"."""
