"""The driver's restore ordering is asserted in code: phases out of order raise, whatever the statement order."""

from __future__ import annotations

import pytest

from sc_app.attempt.setup import SetupOrder


def test_fresh_start_order_passes() -> None:
    order = SetupOrder()
    for phase in ("bootstrap_client", "sealed", "actor"):
        order.enter(phase)
    assert order.done == ["bootstrap_client", "sealed", "actor"]


def test_resume_order_passes() -> None:
    order = SetupOrder()
    for phase in SetupOrder.PHASES:
        order.enter(phase)
    assert order.done == list(SetupOrder.PHASES)


@pytest.mark.parametrize(
    "phases",
    [
        ("actor",),  # the actor before anything
        ("bootstrap_client", "actor"),  # the actor before the restore decision is sealed
        ("bootstrap_client", "sealed", "data_plane_restore"),  # a restore after the seal
        ("bootstrap_client", "data_plane_restore", "trainer_state"),  # trainer state after the data plane
        ("bootstrap_client", "bootstrap_client"),  # any phase twice
        ("sealed",),  # sealing without a bootstrap client
    ],
)
def test_out_of_order_phases_raise(phases: tuple[str, ...]) -> None:
    order = SetupOrder()
    with pytest.raises(AssertionError, match="out of order"):
        for phase in phases:
            order.enter(phase)
