"""TQReplayBuffer: the index of which rows form which group. TransferQueue holds the tensors; this holds ids.

Invariants:
* a group enters the index only after its rows were put, and leaves it only after they were cleared —
  both inside ``barrier.mutation()``, so a checkpoint window always sees index == stored rows;
* a drop and an advantage write (``write_fields``) of the same group never overlap: a drop waits for the writes
  in flight on its groups, and a write refuses a group being dropped — else the write's put, landing after the
  clear, would re-create the cleared rows outside the index;
* while a snapshot still reads captured rows (``freeze()`` .. ``thaw()``), those rows are immutable: a drop of a
  frozen group leaves the index at once but its rows are cleared by ``thaw()`` (which the saver awaits before
  its next window), and ``write_fields`` of a field a frozen group already had waits for ``thaw()``;
* a batch of groups (``commit_groups``, ``drop``) is one mutation: one data-plane call inside one
  ``barrier.mutation()``, and the index changes for all of its groups together after that call, so a window sees
  either none or all of a batch;
* every group has exactly ``group_size`` distinct sample ids, and no id belongs to two groups;
* a group's global indexes (what the data plane returned for its put) are kept from its commit until its rows are
  cleared, and used only in between: later calls on its rows skip the data plane's key lookup;
* ``metadata_state_dict()`` holds no tensors, and its ``digest`` equals ``sidecar_digest`` of itself;
* ``load_state_dict`` rebuilds the index only (no data-plane writes) and refuses a sidecar whose schema version,
  partition, group size, ids or digest are off; ``sc_app.data_plane.replay_index.check_sidecar`` is the whole check of a
  sidecar's shape, shared with verification, so a sidecar that verifies is one ``load_state_dict`` takes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
from sc_app.data_plane.replay_index import SIDECAR_SCHEMA_VERSION, Group, SidecarError, check_sidecar, sample_ids_for
from sc_app.io.digest import sidecar_digest

if TYPE_CHECKING:
    from tensordict import TensorDict

    from sc_app.data_plane.client import DataPlaneClient

@dataclass(frozen=True)
class GroupCommit:
    """One group of a batched commit (``TQReplayBuffer.commit_groups``)."""

    group_id: str
    prompt_index: int
    version: int


@dataclass
class BufferTimes:
    """Cumulative seconds the buffer spent in data-plane calls (including their barrier waits), by kind; a reader
    diffs two readings. ``*_wait`` is the part spent waiting for a barrier slot (or, for ``write``, for thaw)."""

    put: float = 0.0
    put_wait: float = 0.0
    clear: float = 0.0
    clear_wait: float = 0.0
    write: float = 0.0
    write_wait: float = 0.0
    thaw_clear: float = 0.0

    def copy(self) -> BufferTimes:
        return BufferTimes(**vars(self))


def _first_dup(items: list[str]) -> str:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return ""


class TQReplayBuffer:
    def __init__(
        self, client: DataPlaneClient, barrier: DataPlaneCheckpointBarrier, *, partition: str, group_size: int
    ) -> None:
        self.client = client
        self.barrier = barrier
        self.partition = partition
        self.group_size = group_size
        self._groups: dict[str, Group] = {}
        self._field_names: dict[str, frozenset[str] | None] = {}  # group id → field names its rows hold (None: unknown)
        self._frozen: dict[str, frozenset[str] | None] = {}  # group id → fields a snapshot is still reading
        self._deferred_clears: list[tuple[list[str], list[int] | None]] = []  # (ids, indexes) of dropped frozen groups
        self._indexes: dict[str, list[int]] = {}  # group id -> its rows' global indexes (when the data plane said)
        self._committing: set[str] = set()  # group ids of batches waiting for or inside their put
        self._dropping: set[str] = set()  # group ids a drop has started on (write_fields refuses them)
        self._writing: Counter[str] = Counter()  # group ids with an advantage write in flight
        self._writes_changed = asyncio.Condition()
        self._thawed = asyncio.Event()
        self._thawed.set()
        self.writes_waiting = 0  # write_fields calls parked until thaw() (they rewrite a field a snapshot reads)
        self.times = BufferTimes()

    # -- queries ------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._groups)

    @property
    def rows(self) -> int:
        return len(self._groups) * self.group_size

    def groups(self) -> list[Group]:
        """Committed groups, oldest commit first."""
        return list(self._groups.values())

    def sample_ids(self) -> set[str]:
        return {sid for group in self._groups.values() for sid in group.sample_ids}

    def prompt_indices(self) -> set[int]:
        return {group.prompt_index for group in self._groups.values()}

    # -- mutations (seed flow 3): inside the barrier ------------------------------------------------------
    async def commit(self, group_id: str, prompt_index: int, version: int, data: TensorDict) -> Group:
        """One group: ``commit_groups`` of a batch of one."""
        (group,) = await self.commit_groups([GroupCommit(group_id, prompt_index, version)], data)
        return group

    async def commit_groups(self, commits: Sequence[GroupCommit], data: TensorDict) -> list[Group]:
        """Put several groups with ONE data-plane call inside ONE barrier slot; ``data`` holds their rows in order
        (``group_size`` rows per group). All of them enter the index together once the put returned."""
        if not commits:
            return []
        g = self.group_size
        gids = [c.group_id for c in commits]
        if len(set(gids)) != len(gids):
            raise ValueError(f"a batch commits group {_first_dup(gids)} twice")
        taken = [gid for gid in gids if gid in self._groups or gid in self._committing]
        if taken:
            raise ValueError(f"group {taken[0]} is already committed")
        if data.batch_size[0] != g * len(commits):
            raise ValueError(
                f"groups {gids[0]}..: {data.batch_size[0]} rows for {len(commits)} groups, expected "
                f"{g * len(commits)} ({g} rows per group)"
            )
        groups = [Group(c.group_id, tuple(sample_ids_for(c.group_id, g)), c.prompt_index, c.version) for c in commits]
        ids = [sid for group in groups for sid in group.sample_ids]
        tags: list[dict[str, Any]] = []
        for group in groups:
            tags += [self._tag(group)] * g  # one shared dict per group, no per-row work
        names = frozenset(str(k) for k in data.keys())  # noqa: SIM118
        self._committing.update(gids)  # checked above with no await since: a concurrent batch cannot take them
        started = time.perf_counter()
        try:
            async with self.barrier.mutation():
                self.times.put_wait += time.perf_counter() - started
                indexes = await self.client.put_samples(self.partition, ids, data, tags)
                for k, group in enumerate(groups):
                    self._groups[group.group_id] = group
                    self._field_names[group.group_id] = names
                    if indexes is not None:
                        self._indexes[group.group_id] = indexes[k * g : (k + 1) * g]
        finally:
            self._committing.difference_update(gids)
            self.times.put += time.perf_counter() - started
        return groups

    async def drop(self, group_ids: Iterable[str]) -> None:
        """Remove groups from the index and clear their rows; rows of frozen groups are cleared by ``thaw()``."""
        groups = [self._groups[gid] for gid in group_ids]
        if not groups:
            return
        gids = {group.group_id for group in groups}
        busy = gids & self._dropping
        if busy:
            raise KeyError(f"group {sorted(busy)[0]} is already being dropped")
        self._dropping |= gids  # from here on write_fields refuses these groups
        started = time.perf_counter()
        try:
            # an advantage write still in flight would re-create cleared rows: let it land first
            async with self._writes_changed:
                await self._writes_changed.wait_for(lambda: not any(self._writing[gid] for gid in gids))
            async with self.barrier.mutation():
                self.times.clear_wait += time.perf_counter() - started
                # decided once, with no await before it is recorded: thaw() may run at any await
                now = [group for group in groups if group.group_id not in self._frozen]
                for group in groups:
                    if group.group_id in self._frozen:
                        self._deferred_clears.append((list(group.sample_ids), self._indexes.get(group.group_id)))
                if now:
                    ids = [sid for group in now for sid in group.sample_ids]
                    await self.client.clear_samples(self.partition, ids, global_indexes=self._indexes_of(now))
                for group in groups:
                    del self._groups[group.group_id]
                    self._field_names.pop(group.group_id, None)
                    self._indexes.pop(group.group_id, None)
        finally:
            self._dropping -= gids
            self.times.clear += time.perf_counter() - started

    # -- the advantage stage (seed flow 4): no barrier slot --------------------------------------------------
    async def write_fields(self, group_ids: list[str], data: TensorDict) -> None:
        """Put ``data``'s fields onto every row of these groups (rows in group order). Takes no barrier slot: it
        never changes which rows exist. Overwriting a field a snapshot is still reading waits for ``thaw()``."""
        groups = [self._groups[gid] for gid in group_ids]
        dropping = [gid for gid in group_ids if gid in self._dropping]
        if dropping:
            raise KeyError(f"group {dropping[0]} is being dropped")
        names = frozenset(str(k) for k in data.keys())  # noqa: SIM118
        self._writing.update(group_ids)  # a drop of these groups now waits for this write (no await since the check)
        started = time.perf_counter()
        try:
            while any(self._overlaps_frozen(group.group_id, names) for group in groups):
                self.writes_waiting += 1
                try:
                    await self._thawed.wait()
                finally:
                    self.writes_waiting -= 1
            self.times.write_wait += time.perf_counter() - started
            ids = [sid for group in groups for sid in group.sample_ids]
            indexes = self._indexes_of(groups)
            if indexes is None:
                await self.client.put_samples(self.partition, ids, data)
            else:  # by index: the put must carry the rows' tags (the data plane replaces them)
                tags: list[dict[str, Any]] = []
                for group in groups:
                    tags += [self._tag(group)] * self.group_size
                await self.client.put_samples(self.partition, ids, data, tags, global_indexes=indexes)
            for group in groups:
                held = self._field_names.get(group.group_id)
                self._field_names[group.group_id] = None if held is None else held | names
        finally:
            self.times.write += time.perf_counter() - started
            self._writing.subtract(group_ids)
            await asyncio.shield(self._notify_writes())

    async def _notify_writes(self) -> None:
        async with self._writes_changed:
            self._writes_changed.notify_all()

    def _overlaps_frozen(self, group_id: str, names: frozenset[str]) -> bool:
        if group_id not in self._frozen:
            return False
        held = self._frozen[group_id]
        return held is None or bool(held & names)

    def _indexes_of(self, groups: Sequence[Group]) -> list[int] | None:
        """The global indexes of these groups' rows in order, or None unless every one is known."""
        out: list[int] = []
        for group in groups:
            indexes = self._indexes.get(group.group_id)
            if indexes is None:
                return None
            out += indexes
        return out

    def global_indexes(self, group_ids: Sequence[str]) -> list[int] | None:
        """What the data plane calls these groups' rows (in group order), when it said for every one; valid until
        they are dropped — pass them to a read of exactly these rows to skip its key lookup."""
        return self._indexes_of([self._groups[gid] for gid in group_ids])

    @staticmethod
    def _tag(group: Group) -> dict[str, Any]:
        return {"group": group.group_id, "version": group.version}

    # -- checkpoint: while a snapshot reads the captured rows --------------------------------------------------
    def field_names_by_group(self) -> dict[str, list[str] | None]:
        """Field names each group's rows hold now (what a snapshot captured in this window must read);
        ``None`` for a group restored from a bundle, whose fields the index does not record."""
        out: dict[str, list[str] | None] = {}
        for gid in self._groups:
            held = self._field_names.get(gid)
            out[gid] = None if held is None else sorted(held)
        return out

    def freeze(self, sample_ids: Iterable[str]) -> None:
        """Until ``thaw()``, the rows of these groups and the fields they hold now stay exactly as they are (the
        freeze, as the module docstring states it)."""
        wanted = set(sample_ids)
        self._frozen = {
            gid: self._field_names.get(gid)
            for gid, group in self._groups.items()
            if wanted.intersection(group.sample_ids)
        }
        self._thawed.clear()

    async def thaw(self) -> None:
        """End the freeze: clear the rows of groups dropped meanwhile (inside the barrier), wake waiting writers.

        Post: TransferQueue holds exactly the index's rows again (what the next window checks)."""
        pending, self._deferred_clears = self._deferred_clears, []
        self._frozen = {}  # before any await: a drop from now on clears its rows itself
        self._thawed.set()
        if pending:
            ids = [sid for group_ids, _ in pending for sid in group_ids]
            known = all(indexes is not None for _, indexes in pending)
            indexes = [gi for _, group_indexes in pending for gi in group_indexes or ()] if known else None
            started = time.perf_counter()
            try:
                async with self.barrier.mutation():
                    await self.client.clear_samples(self.partition, ids, global_indexes=indexes)
            finally:
                self.times.thaw_clear += time.perf_counter() - started

    @property
    def frozen(self) -> bool:
        return bool(self._frozen)

    # -- checkpoint -----------------------------------------------------------------------------------------
    def metadata_state_dict(self) -> dict[str, Any]:
        groups = {gid: group.as_record() for gid, group in self._groups.items()}
        sd: dict[str, Any] = {
            "schema_version": SIDECAR_SCHEMA_VERSION,
            "partition": self.partition,
            "group_size": self.group_size,
            "groups": groups,
        }
        sd["digest"] = sidecar_digest(sd)
        return sd

    def load_state_dict(self, sd: dict[str, Any], *, expected_digest: str) -> None:
        """Rebuild the index from a sidecar; no data-plane calls. Pre: the index is empty."""
        if self._groups:
            raise SidecarError("load_state_dict needs an empty index (it only ever runs before the pumps start)")
        rebuilt = check_sidecar(sd)
        if sd["partition"] != self.partition:
            raise SidecarError(f"sidecar partition {sd['partition']!r} != data_plane.partition {self.partition!r}")
        if sd["group_size"] != self.group_size:
            raise SidecarError(
                f"sidecar group size {sd['group_size']} != grpo.group_size {self.group_size}"
            )
        if sd["digest"] != expected_digest:
            raise SidecarError(f"sidecar digest {sd['digest'][:12]}… != data-plane digest {expected_digest[:12]}…")
        self._groups = rebuilt
        self._field_names = dict.fromkeys(rebuilt)
