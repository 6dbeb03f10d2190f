"""sc_app.exits: every error the table names is a real exception class, and an error ends a command with the code
of its class or of its nearest named base (a subclass never needs its own line)."""

from __future__ import annotations

import importlib

import pytest

from sc_app.checkpoint.lease import LeaseError, LeaseLost
from sc_app.exits import EXIT_BAD_INPUT, EXIT_OF, EXIT_SUPERSEDED, exit_for


@pytest.mark.parametrize("name", sorted(EXIT_OF))
def test_every_named_error_exists(name: str) -> None:
    module, _, qualname = name.rpartition(".")
    cls = getattr(importlib.import_module(module), qualname)
    assert isinstance(cls, type) and issubclass(cls, Exception), name


def test_a_subclass_takes_its_bases_code_and_the_message_is_the_errors() -> None:
    from sc_app.rl.hf.dataset import DatasetError  # an InputError two levels down

    ended = exit_for(DatasetError("task.path x: no such file"))
    assert ended is not None and ended.code == EXIT_BAD_INPUT and ended.message == "task.path x: no such file"
    assert exit_for(LeaseError("LEASE: malformed")) == type(ended)(EXIT_BAD_INPUT, "LEASE: malformed")


def test_superseded_says_so_and_an_unnamed_error_is_not_mapped() -> None:
    ended = exit_for(LeaseLost("run b took the lease"))
    assert ended is not None and ended.code == EXIT_SUPERSEDED and ended.message == "superseded: run b took the lease"
    assert exit_for(RuntimeError("a defect")) is None
    assert exit_for(KeyError("x")) is None
