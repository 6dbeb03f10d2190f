"""Save I/O threads run at a lower CPU priority than training; only they do."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from sc_app.io.background import BACKGROUND_NICE, background_executor, lower_current_thread_priority

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are a Linux feature")


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_executor_threads_are_lowered_and_the_caller_is_not() -> None:
    before = _nice_of_this_thread()
    pool = background_executor("test-io")
    try:
        assert pool.submit(_nice_of_this_thread).result(timeout=10) >= BACKGROUND_NICE
    finally:
        pool.shutdown()
    assert _nice_of_this_thread() == before


def test_lowering_is_idempotent_and_never_raises_a_priority() -> None:
    seen: list[int] = []

    def body() -> None:
        lower_current_thread_priority(BACKGROUND_NICE + 2)
        lower_current_thread_priority(BACKGROUND_NICE)  # asks for less: keeps the lower priority
        seen.append(_nice_of_this_thread())

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    assert seen == [max(BACKGROUND_NICE + 2, os.getpriority(os.PRIO_PROCESS, 0))]
