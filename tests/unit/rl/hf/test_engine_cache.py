"""The engines' compile cache on the checkpoint volume (``engine_cache``), on real files: a cold start publishes,
the next start of the same fingerprint is warm, and a cache from another model or version, a corrupt or tampered
one, one over the bound or an unusable volume costs one line and a cold start, never an exception; two engines
publishing at once leave one whole cache; no bundle listing sees the directory."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from sc_app.checkpoint.layout import step_entries, tmp_dirs
from sc_app.rl.hf.engine_cache import CACHE_DIR, MARKER, EngineCache, cache_key, prepare, publish

LOG = "sc_app.rl.hf.engine_cache"


def model_dir(tmp_path: Path, layers: int = 2) -> Path:
    d = tmp_path / f"model-{layers}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
    return d


def cache_for(root: Path, model: Path, vllm: str = "0.32.0", max_bytes: int = 2**20) -> EngineCache:
    key = cache_key(model, {"dtype": "float32", "max_model_len": 64}, {"vllm": vllm, "torch": "2.13.0"}, "cpu:x")
    return EngineCache(root / CACHE_DIR, key, max_bytes)


def compiled(private: Path, text: str = "kernel") -> None:
    (private / "torch_compile_cache" / "abc").mkdir(parents=True)
    (private / "torch_compile_cache" / "abc" / "graph.py").write_text(text)


def test_a_cold_start_publishes_and_the_next_start_of_the_same_fingerprint_is_warm(tmp_path: Path) -> None:
    cache = cache_for(tmp_path, model_dir(tmp_path))
    private, warm = prepare(cache)
    assert not warm and not any(private.iterdir())
    compiled(private)
    assert publish(cache, private)
    assert json.loads((cache.published / MARKER).read_text())["versions"]["vllm"] == "0.32.0"
    again, warm = prepare(cache)
    assert warm and again != private, "every engine works in a private copy"
    assert (again / "torch_compile_cache" / "abc" / "graph.py").read_text() == "kernel"
    assert not (again / MARKER).exists()
    assert [p.name for p in cache.root.iterdir()] == [cache.fingerprint], "no temporary copy left behind"


@pytest.mark.parametrize("other", ["version", "model"])
def test_a_cache_of_another_version_or_model_is_never_loaded(tmp_path: Path, other: str) -> None:
    first = cache_for(tmp_path, model_dir(tmp_path))
    private, _ = prepare(first)
    compiled(private)
    assert publish(first, private)
    second = (
        cache_for(tmp_path, model_dir(tmp_path, 3))
        if other == "model"
        else cache_for(tmp_path, model_dir(tmp_path), vllm="0.33.0")
    )
    assert second.fingerprint != first.fingerprint
    fresh, warm = prepare(second)
    assert not warm and not any(fresh.iterdir())
    assert (first.published / "torch_compile_cache").is_dir(), "the other one is left alone"


@pytest.mark.parametrize("damage", ["no marker", "garbage marker", "tampered marker"])
def test_a_corrupt_cache_is_ignored_in_one_line_and_replaced_by_the_next_publish(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = cache_for(tmp_path, model_dir(tmp_path))
    compiled(cache.published)  # the right name, but not a cache this code wrote
    if damage == "garbage marker":
        (cache.published / MARKER).write_text("{not json")
    elif damage == "tampered marker":
        (cache.published / MARKER).write_text(json.dumps({"format": 1, "model_config": "another"}))
    with caplog.at_level(logging.WARNING, logger=LOG):
        private, warm = prepare(cache)
    assert not warm and not any(private.iterdir())
    assert len(caplog.records) == 1 and "ignored" in caplog.records[0].getMessage()
    compiled(private, "fresh")
    assert publish(cache, private)
    assert prepare(cache)[1]
    assert (cache.published / "torch_compile_cache" / "abc" / "graph.py").read_text() == "fresh"


def test_two_engines_publishing_at_once_leave_one_whole_cache(tmp_path: Path) -> None:
    cache = cache_for(tmp_path, model_dir(tmp_path))
    privates = []
    for i in range(4):
        private, _ = prepare(cache)
        compiled(private, f"engine {i}")
        (private / "torch_compile_cache" / "abc" / "second.py").write_text(f"engine {i}")
        privates.append(private)
    gate = threading.Barrier(len(privates))
    won: list[bool] = [False] * len(privates)

    def run(i: int) -> None:
        gate.wait()
        won[i] = publish(cache, privates[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(privates))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(won) == 1
    base = cache.published / "torch_compile_cache" / "abc"
    winner = won.index(True)
    assert (base / "graph.py").read_text() == (base / "second.py").read_text() == f"engine {winner}"
    assert [p.name for p in cache.root.iterdir()] == [cache.fingerprint]


def test_a_cache_over_the_bound_or_an_unusable_volume_is_one_line_and_no_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    big = cache_for(tmp_path, model_dir(tmp_path), max_bytes=10)
    private, _ = prepare(big)
    compiled(private, "x" * 100)
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert not publish(big, private)
    assert "over the bound" in caplog.text and not big.published.exists()
    caplog.clear()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the checkpoint directory should be")
    cache = cache_for(blocked, model_dir(tmp_path))
    with caplog.at_level(logging.WARNING, logger=LOG):
        fresh, warm = prepare(cache)
        assert not warm
        compiled(fresh)
        assert not publish(cache, fresh)
    assert len(caplog.records) == 1 and "not kept" in caplog.records[0].getMessage()


def test_older_fingerprints_are_evicted_while_the_cache_is_over_its_bound(tmp_path: Path) -> None:
    import os

    from sc_app.rl.hf.engine_cache import _size

    published = []
    for i, n in enumerate((1, 2, 3)):
        bound = 10**9 if i < 2 else int(2.5 * _size(published[0]))  # room for two of them
        cache = cache_for(tmp_path, model_dir(tmp_path, n), max_bytes=bound)
        private, _ = prepare(cache)
        compiled(private, "y" * 100)
        assert publish(cache, private)
        published.append(cache.published)
        os.utime(cache.published, (1000 + i, 1000 + i))
    assert not published[0].exists(), "the oldest other fingerprint went"
    assert published[1].exists() and published[2].exists()


def test_no_bundle_listing_sees_the_engine_cache(tmp_path: Path) -> None:
    cache = cache_for(tmp_path, model_dir(tmp_path))
    private, _ = prepare(cache)
    compiled(private)
    assert publish(cache, private)
    (tmp_path / "step_3").mkdir()
    assert [p.name for _, p in step_entries(tmp_path)] == ["step_3"] and tmp_dirs(tmp_path) == []


def disk(monkeypatch: pytest.MonkeyPatch, total: int, free: int) -> None:
    """The volume's state is the test's, never the host's (CI's disk may be 90% full)."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(total, total - free, free))


def test_a_cache_that_would_crowd_out_the_next_bundles_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The volume is the bundles' first: a publish must leave room for twice the newest bundle beside the cache."""
    (tmp_path / "step_2").mkdir()
    (tmp_path / "step_2" / "policy.bin").write_bytes(b"w" * 300)
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "policy.bin").write_bytes(b"w" * 10)  # an older, smaller bundle does not set the room
    cache = cache_for(tmp_path, model_dir(tmp_path))
    private, _ = prepare(cache)
    compiled(private)  # 6 bytes
    disk(monkeypatch, total=10_000, free=600)  # 594 left after it < 2 x 300
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert not publish(cache, private)
    assert "kept for bundles" in caplog.text and not cache.published.exists()
    disk(monkeypatch, total=10_000, free=606)  # exactly 600 left: kept
    assert publish(cache, private)


def test_before_the_first_bundle_a_cache_takes_at_most_half_of_what_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = cache_for(tmp_path, model_dir(tmp_path))
    private, _ = prepare(cache)
    compiled(private, "z" * 100)
    disk(monkeypatch, total=10**12, free=199)
    assert not publish(cache, private)
    disk(monkeypatch, total=10**12, free=200)
    assert publish(cache, private)


def test_a_large_volume_mostly_full_still_keeps_a_small_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room is measured from the bundles, not as a share of the disk: 22 GiB free of 250 GiB (9%) holds a 1 MiB
    cache beside 100 MiB bundles (what failed on CI when the rule was a tenth of the volume)."""
    cache = cache_for(tmp_path, model_dir(tmp_path))
    private, _ = prepare(cache)
    compiled(private)
    disk(monkeypatch, total=250 * 2**30, free=22 * 2**30)
    assert publish(cache, private)
