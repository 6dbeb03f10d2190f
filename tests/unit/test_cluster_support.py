"""``tests.support.cluster.retried``: a node start that timed out is tried once more; nothing else is retried."""

from __future__ import annotations

import pytest

from sc_app.attempt.ray_start import TIMEOUT_MARK
from tests.support.cluster import retried


def starts(*outcomes: object):
    calls = []

    def start() -> object:
        calls.append(1)
        out = outcomes[len(calls) - 1]
        if isinstance(out, Exception):
            raise out
        return out

    return start, calls


def test_a_timed_out_start_is_tried_once_more() -> None:
    start, calls = starts(Exception(f"The current node {TIMEOUT_MARK}. This could happen"), "node")
    assert retried(start, pause_s=0) == "node" and len(calls) == 2


def test_a_second_timeout_is_raised() -> None:
    start, calls = starts(Exception(TIMEOUT_MARK), Exception(TIMEOUT_MARK), "never")
    with pytest.raises(Exception, match=TIMEOUT_MARK):
        retried(start, pause_s=0)
    assert len(calls) == 2


def test_another_failure_is_not_retried() -> None:
    start, calls = starts(ValueError("bad resources"), "never")
    with pytest.raises(ValueError, match="bad resources"):
        retried(start, pause_s=0)
    assert len(calls) == 1
