"""The one base of every hf-backend input problem (model directory, dataset, reward): ``sc-app`` reports any of
them as one line and exits 2 (bad input), whether the driver found it before Ray started or a worker did."""

from __future__ import annotations

from sc_app.rl.hooks import InputError


class HFInputError(InputError):
    """A model directory, dataset or reward function that cannot be used; ``str()`` is one line."""
