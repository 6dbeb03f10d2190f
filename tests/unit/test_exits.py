"""sc_app.exits: every error the table names is a real exception class under its own name, and an error ends a
command with the code of its class or of its nearest named base (a subclass never needs its own line)."""

from __future__ import annotations

import importlib

import pytest

from sc_app.checkpoint.lease import LeaseError, LeaseLost
from sc_app.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OF, EXIT_SUPERSEDED, exit_for


@pytest.mark.parametrize("name", sorted(EXIT_OF))
def test_every_named_error_exists(name: str) -> None:
    module, _, qualname = name.rpartition(".")
    cls = getattr(importlib.import_module(module), qualname)
    assert isinstance(cls, type) and issubclass(cls, Exception), name
    # exit_for matches the class's own module and qualname: a re-export's name (sc_app.config.app.ConfigError after the
    # class moved to config_tree) imports fine but never matches, and the error would end in a traceback
    assert f"{cls.__module__}.{cls.__qualname__}" == name, f"{name} is a re-export; name {cls.__module__}"


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


def test_a_failed_reward_is_a_failed_job_and_a_bad_signing_key_is_bad_input() -> None:
    from sc_app.checkpoint.manifest import HmacKeyError
    from sc_app.rl.hf.errors import RewardFailed  # the hf backend raises the generic class (sc_app.rl.hooks)

    ended = exit_for(RewardFailed("task.reward mymod:score raised ValueError: boom"))
    assert ended is not None and ended.code == EXIT_FAILED and "mymod:score" in ended.message
    ended = exit_for(HmacKeyError("SC_APP_CHECKPOINT_HMAC_KEY is set but empty"))
    assert ended is not None and ended.code == EXIT_BAD_INPUT
