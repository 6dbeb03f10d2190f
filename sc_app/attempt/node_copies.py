"""The driver's half of a restore with ``checkpoint.volume: local``: the verified bundle's ``policy/`` sent to each
node that has a disk of its own at ``checkpoint.dir``, through one trainer rank there
(``sc_app.checkpoint.node_parts``).

Each chunk is put into Ray's object store once and handed to every such rank; at most ``WINDOW`` chunks are in
flight. The ranks write what they receive under ``.node_parts/restore/``; the driver then has each check it against
the manifest's digests before any rank of its node loads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from sc_app.attempt.actor_watch import actor_id
from sc_app.checkpoint import node_parts
from sc_app.checkpoint.lease import Lease
from sc_app.checkpoint.node_parts import DirView, away_by_node

log = logging.getLogger(__name__)

WINDOW = 4
DROP_TIMEOUT_S = 60.0  # freeing the nodes' copies of a restored policy/ (a node that does not answer keeps its own)

Get = Callable[[list[Any]], list[Any]]


class NodeCopies:
    """The trainer ranks' answers to ``sees_checkpoint_dir`` (asked once per actor: a live rank's answer holds)
    and the copies of a bundle's ``policy/`` sent to the nodes that do not see the directory."""

    def __init__(self) -> None:
        self._pending: list[Any] = []
        self._asked: list[Any] = []
        self._seen: dict[str, DirView] = {}  # a rank's actor id -> its answer
        self.received: list[Any] = []  # one rank per node holding a sent copy of the bundle being loaded

    def ask(self, trainers: list[Any], lease: Lease) -> None:
        """Ask each of ``trainers`` not asked yet (not awaited: ``answers`` raises its errors)."""
        known = set(self._seen) | {actor_id(t) for t in self._asked}
        new = [t for t in trainers if actor_id(t) not in known]
        if new:
            self._pending += [t.sees_checkpoint_dir.remote(lease) for t in new]
            self._asked += new

    def answers(self, get: Get) -> dict[str, DirView]:
        if self._pending:
            got = get(self._pending)
            self._seen |= {actor_id(t): a for t, a in zip(self._asked, got, strict=True)}
            self._pending, self._asked = [], []
        return self._seen

    def send(self, trainers: list[Any], lease: Lease, policy_dir: Path, expected: dict[str, str], get: Get) -> None:
        """Each node of ``trainers`` that does not see the directory gets ``policy_dir`` (a verified bundle's)
        through its lowest rank, which checks the copy against ``expected`` before any rank there loads it."""
        self.ask(trainers, lease)  # a warm reset's successors, with the current lease
        seen = self.answers(get)
        away = away_by_node([seen[actor_id(t)] for t in trainers])
        if away:
            self.received = [trainers[ranks[0]] for ranks in away.values()]
            send_policy(self.received, policy_dir, get, ranks=sum(map(len, away.values())))
            get([r.check_received.remote(policy_dir.parent.name, expected) for r in self.received])

    def drop(self) -> None:
        """Free the nodes' copies (after every rank's load, or its failure); a node gone meanwhile keeps its copy
        until its next restore replaces it."""
        received, self.received = self.received, []
        if not received:  # a shared volume, or every rank saw the directory: nothing was sent
            return
        try:
            ray.get([r.drop_received.remote() for r in received], timeout=DROP_TIMEOUT_S)
        except ray.exceptions.RayError as exc:
            log.warning("a node's copy of the bundle's policy/ was not freed (%s: %s); its next restore replaces it",
                        type(exc).__name__, str(exc).strip().split("\n")[0])  # fmt: skip


def send_policy(receivers: list[Any], policy_dir: Path, get: Get, *, ranks: int | None = None) -> int:
    """Every file of ``policy_dir`` (a verified bundle's) to each of ``receivers`` (one trainer rank per node, for
    ``ranks`` ranks in all there); returns the bytes sent to each."""
    files = node_parts.list_files(policy_dir)
    bundle = policy_dir.parent.name
    in_flight: list[list[Any]] = []
    sent = 0
    first = True
    for rel, size in files.items():
        for offset in range(0, max(size, 1), node_parts.CHUNK):
            chunk = ray.put(node_parts.read_chunk(policy_dir, rel, offset))
            in_flight.append([t.receive_policy.remote(bundle, rel, offset, chunk, first) for t in receivers])
            first = False
            sent += min(node_parts.CHUNK, size - offset)
            if len(in_flight) >= WINDOW:
                get(in_flight.pop(0))
    for calls in in_flight:
        get(calls)
    log.info("sent %s/policy (%d files, %.1f MiB) to %d node(s) without the checkpoint volume (%d trainer rank(s))",
             bundle, len(files), sent / 2**20, len(receivers), ranks or len(receivers))  # fmt: skip
    return sent
