"""Warm engine starts: vLLM's compile cache (``VLLM_CACHE_ROOT``: torch.compile and inductor artifacts, model
inspection results) kept on the checkpoint volume, so a resume, a retry or a replaced generation worker starts from
what the first engine compiled rather than from nothing.

Layout: ``<checkpoint.dir>/engine_cache/<fingerprint>/`` — the fingerprint hashes the model's ``config.json``, the
engine settings that shape compilation (dtype, max_model_len, tensor parallelism, eager or not), the vLLM and torch
versions and the device, so a cache written by another version, model or device is never loaded; its
``engine_cache.json`` holds the inputs and is checked against them. ``engine_cache/`` matches no bundle name
(``step_N``, ``tmp_step_N``: ``sc_app.checkpoint.layout``), so listing, verification, retention and tidying never see
it. A published directory is never written again:

* **start** (``prepare``): the engine works in a private directory of its own (local ``/tmp``), a copy of the
  published cache when there is a valid one (warm), empty otherwise (cold);
* **publish** (after a cold start): the private directory, if within ``max_bytes`` and if the volume keeps room
  for bundles after it (``room_to_keep``: twice the newest bundle beside the cache, and never less than the
  cache's own size), is copied to a temporary name
  under ``engine_cache/`` with its marker, then renamed to ``<fingerprint>/`` in one step — two engines that start
  at once both work privately and the first rename wins; the other's copy is dropped. The oldest other
  fingerprints are removed while the whole ``engine_cache/`` is over ``max_bytes``.

A cache that is missing, full, unwritable, corrupt or from elsewhere costs one log line and a cold start, never the
run. Pure: imports neither torch nor Ray nor vLLM (the caller passes the versions).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_app.checkpoint.layout import step_dirs

log = logging.getLogger(__name__)

CACHE_DIR = "engine_cache"  # under checkpoint.dir
MARKER = "engine_cache.json"
FORMAT = 1
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0  # a publish copy older than this was left by a process that died mid-copy


@dataclass(frozen=True)
class EngineCache:
    root: Path  # <checkpoint.dir>/engine_cache
    key: dict[str, Any]  # what the compiled artifacts depend on
    max_bytes: int

    @property
    def fingerprint(self) -> str:
        blob = json.dumps({"format": FORMAT, **self.key}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:20]

    @property
    def published(self) -> Path:
        return self.root / self.fingerprint


def cache_key(model_path: str | Path, engine: dict[str, Any], versions: dict[str, str], device: str) -> dict[str, Any]:
    """The fingerprint's inputs: the model's architecture (its ``config.json``, not its weights, which every version
    replaces), the engine settings, the library versions and the device."""
    try:
        config = hashlib.sha256((Path(model_path) / "config.json").read_bytes()).hexdigest()
    except OSError:
        config = f"unreadable:{Path(model_path).name}"
    return {"model_config": config, "engine": engine, "versions": versions, "device": device}


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _valid(cache: EngineCache, path: Path) -> str | None:
    """None when ``path`` is a complete cache for ``cache.key``; else why not (one phrase)."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError) as exc:
        return f"no readable {MARKER} ({type(exc).__name__})"
    if marker != {"format": FORMAT, **cache.key}:
        return f"its {MARKER} names another model, engine, version or device"
    return None


def prepare(cache: EngineCache) -> tuple[Path, bool]:
    """A private directory for this engine's ``VLLM_CACHE_ROOT`` and whether it starts warm (a copy of the valid
    published cache). Never raises for the cache: any problem is one line and a cold start."""
    private = Path(tempfile.mkdtemp(prefix="sc-app-engine-cache-"))
    published = cache.published
    if not published.is_dir():
        log.info("engine cache: none yet for %s under %s: cold start", cache.fingerprint, cache.root)
        return private, False
    why = _valid(cache, published)
    if why is not None:
        log.warning("engine cache %s ignored (%s): cold start", published, why)
        return private, False
    try:
        shutil.copytree(published, private, dirs_exist_ok=True, ignore=shutil.ignore_patterns(MARKER))
    except (OSError, shutil.Error) as exc:
        log.warning("engine cache %s could not be read (%s): cold start", published, exc)
        shutil.rmtree(private, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix="sc-app-engine-cache-")), False
    with contextlib.suppress(OSError):
        os.utime(published)  # eviction goes by last use
    return private, True


def room_to_keep(cache: EngineCache, size: int) -> int:
    """Bytes a publish of ``size`` bytes must leave free on the volume: twice the newest ``step_N`` beside the cache
    (the save in flight and the next one), and at least ``size`` again (before the first bundle, the cache takes at
    most half of what is free). Measured from the bundles, not a share of the disk: a large shared volume that is
    90% full may still hold many bundles."""
    newest = step_dirs(cache.root.parent)
    return max(size, 2 * _size(newest[0][1]) if newest else 0)


def publish(cache: EngineCache, private: Path) -> bool:
    """After a cold start: ``private`` becomes ``cache.published`` (copy under a temporary name, rename); True if
    this call published it. Never raises for the cache."""
    tmp = cache.root / f"{_TMP_PREFIX}{cache.fingerprint}-{uuid.uuid4().hex[:8]}"
    try:
        size = _size(private)
        if size > cache.max_bytes:
            log.warning(
                "engine cache not kept: %.0f MiB over the bound of %.0f MiB (generation.engine_cache_gib)",
                size / 2**20,
                cache.max_bytes / 2**20,
            )
            return False
        cache.root.mkdir(parents=True, exist_ok=True)
        usage = shutil.disk_usage(cache.root)
        keep = room_to_keep(cache, size)
        if usage.free - size < keep:
            log.warning(
                "engine cache not kept: %.0f MiB would leave %.0f MiB free on %s, under the %.0f MiB kept for "
                "bundles (twice the newest): free space there or lower generation.engine_cache_gib",
                size / 2**20,
                (usage.free - size) / 2**20,
                cache.root,
                keep / 2**20,
            )
            return False
        _tidy(cache)
        shutil.copytree(private, tmp)
        (tmp / MARKER).write_text(json.dumps({"format": FORMAT, **cache.key}, sort_keys=True))
        published = cache.published
        if published.is_dir() and _valid(cache, published) is not None:
            aside = cache.root / f"{_TMP_PREFIX}invalid-{uuid.uuid4().hex[:8]}"
            os.rename(published, aside)  # an invalid one never blocks a good one; removed below
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(tmp, published)
        except OSError:  # another engine published first: its copy serves
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        _evict(cache)
        log.info("engine cache %s published (%.1f MiB)", published, size / 2**20)
        return True
    except (OSError, shutil.Error) as exc:
        log.warning("engine cache not kept (%s): the next start is cold too", exc)
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def _tidy(cache: EngineCache) -> None:
    """Publish copies left by processes that died mid-copy."""
    now = time.time()
    for entry in cache.root.iterdir():
        if entry.name.startswith(_TMP_PREFIX):
            try:
                if now - entry.lstat().st_mtime > _STALE_TMP_S:
                    shutil.rmtree(entry, ignore_errors=True)
            except OSError:
                pass


def _evict(cache: EngineCache) -> None:
    """The oldest other fingerprints go while ``engine_cache/`` is over ``max_bytes``."""
    others = []
    for entry in cache.root.iterdir():
        if entry.name.startswith(_TMP_PREFIX) or entry.name == cache.fingerprint or not entry.is_dir():
            continue
        with contextlib.suppress(OSError):
            others.append((entry.stat().st_mtime, entry))
    total = _size(cache.root)
    for _, entry in sorted(others):
        if total <= cache.max_bytes:
            break
        freed = _size(entry)
        shutil.rmtree(entry, ignore_errors=True)
        total -= freed
