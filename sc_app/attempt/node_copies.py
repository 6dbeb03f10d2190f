"""The driver's half of a restore with ``checkpoint.volume: local``: the verified bundle's ``policy/`` sent to the
trainer ranks whose node has a disk of its own at ``checkpoint.dir`` (``sc_app.checkpoint.node_parts``).

Each chunk is put into Ray's object store once and handed to every such rank; at most ``WINDOW`` chunks are in
flight. The ranks write what they receive under ``.node_parts/`` and check it against the manifest's digests
before they load it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from sc_app.checkpoint import node_parts

log = logging.getLogger(__name__)

WINDOW = 4


def send_policy(trainers: list[Any], policy_dir: Path, get: Callable[[list[Any]], list[Any]]) -> int:
    """Every file of ``policy_dir`` (a verified bundle's) to each of ``trainers``; returns the bytes sent to each."""
    files = node_parts.list_files(policy_dir)
    bundle = policy_dir.parent.name
    in_flight: list[list[Any]] = []
    sent = 0
    first = True
    for rel, size in files.items():
        for offset in range(0, max(size, 1), node_parts.CHUNK):
            chunk = ray.put(node_parts.read_chunk(policy_dir, rel, offset))
            in_flight.append([t.receive_policy.remote(bundle, rel, offset, chunk, first) for t in trainers])
            first = False
            sent += min(node_parts.CHUNK, size - offset)
            if len(in_flight) >= WINDOW:
                get(in_flight.pop(0))
    for calls in in_flight:
        get(calls)
    log.info("sent %s/policy (%d files, %.1f MiB) to %d trainer rank(s) without the checkpoint volume",
             bundle, len(files), sent / 2**20, len(trainers))  # fmt: skip
    return sent
