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


@pytest.mark.parametrize("cut", ["stop", "hang"])
def test_a_stop_or_a_hang_during_setup_tears_it_down_and_is_no_fault_of_the_bundle(
    monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """A stop request (``StopCut``) or a hung process (``ProcessHung``) while a resume is being set up: everything
    built is torn down and the error is raised as itself — never ``RestoreFailed``, which would move a healthy
    bundle aside and fall back to an older one."""
    from pathlib import Path
    from types import SimpleNamespace

    from sc_app.attempt import setup as setup_mod
    from sc_app.config.app import AppConfig
    from sc_app.waits import ProcessHung, StopCut

    error = (
        StopCut("a stop was requested while waiting for trainer rank 0")
        if cut == "stop"
        else (ProcessHung("trainer.worker", "trainer rank 0", 1800.0, "set-up past run.setup_timeout_s=1800s"))
    )

    def build(*_: object, **__: object) -> None:
        raise error

    torn: list[str] = []
    monkeypatch.setattr(setup_mod, "_build", build)
    monkeypatch.setattr(setup_mod.Setup, "teardown", lambda self: torn.append(self.namespace))
    plan = SimpleNamespace(decision="resume", bundle=Path("/ckpt/step_4"), step=4)
    with pytest.raises(type(error)) as raised:
        setup_mod.setup_single_controller(AppConfig(), plan, run_id="r")  # type: ignore[arg-type]
    assert raised.value is error and torn == [AppConfig().ray.namespace]


def test_teardown_kills_the_workers_a_failed_warm_reset_started_too() -> None:
    """A warm reset replaces a dead worker in the policy's lists and lists the job's handles only once it
    succeeded; failing in between, the full rebuild's teardown must still kill the replacement (left alive, it
    held the node's resources the rebuild's rank waited for)."""
    from types import SimpleNamespace

    from sc_app.attempt.setup import Setup

    old_trainer, replacement, generator, actor = object(), object(), object(), object()
    setup = Setup("ns", actor=actor, handles=[old_trainer, generator, actor])
    setup.policy = SimpleNamespace(trainers=[replacement], generators=[generator])  # type: ignore[assignment]
    assert setup.actors() == [old_trainer, generator, actor, replacement], "each once, the replacement too"
    setup.policy = None
    assert setup.actors() == [old_trainer, generator, actor]


@pytest.mark.parametrize("read", [False, True])
def test_only_a_failure_after_the_bundle_was_read_is_the_bundles(monkeypatch: pytest.MonkeyPatch, read: bool) -> None:
    """A failure before the restore read anything of the bundle (the workers' or TransferQueue's start: a storage
    unit Ray cannot place) is raised as itself; only one after it may be the bundle's (``RestoreFailed``)."""
    from pathlib import Path
    from types import SimpleNamespace

    from sc_app.attempt import setup as setup_mod
    from sc_app.attempt.errors import RestoreFailed
    from sc_app.config.app import AppConfig

    error = RuntimeError("The actor is not schedulable")

    def build(setup: object, *_: object, **__: object) -> None:
        setup.read_bundle = read  # type: ignore[attr-defined]
        raise error

    monkeypatch.setattr(setup_mod, "_build", build)
    monkeypatch.setattr(setup_mod.Setup, "teardown", lambda self: None)
    plan = SimpleNamespace(decision="resume", bundle=Path("/ckpt/step_4"), step=4)
    with pytest.raises(RestoreFailed if read else RuntimeError) as raised:
        setup_mod.setup_single_controller(AppConfig(), plan, run_id="r")  # type: ignore[arg-type]
    assert (raised.value is error) is not read
