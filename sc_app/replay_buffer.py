"""TQReplayBuffer: the index of which rows form which group. TransferQueue holds the tensors; this holds ids.

Invariants:
* a group enters the index only after its rows were put, and leaves it only after they were cleared —
  both inside ``barrier.mutation()``, so a checkpoint window always sees index == stored rows;
* every group has exactly ``group_size`` distinct sample ids, and no id belongs to two groups;
* ``metadata_state_dict()`` holds no tensors, and its ``digest`` equals ``sidecar_digest`` of itself;
* ``load_state_dict`` rebuilds the index only (no data-plane writes) and refuses a sidecar whose schema version,
  partition, group size, ids or digest are off.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sc_app.barrier import DataPlaneCheckpointBarrier
from sc_app.digest import index_digest

if TYPE_CHECKING:
    from tensordict import TensorDict

    from sc_app.data_plane.client import DataPlaneClient

SIDECAR_SCHEMA_VERSION = 1


class SidecarError(ValueError):
    """The replay sidecar does not fit this run or does not match the data plane."""


@dataclass(frozen=True)
class Group:
    group_id: str
    sample_ids: tuple[str, ...]
    prompt_index: int
    version: int

    def as_record(self) -> dict[str, Any]:
        return {"sample_ids": list(self.sample_ids), "prompt_index": self.prompt_index, "version": self.version}


def sample_ids_for(group_id: str, group_size: int) -> list[str]:
    return [f"{group_id}:{i}" for i in range(group_size)]


def sidecar_digest(sidecar: dict[str, Any]) -> str:
    """Digest recomputed from a sidecar's own groups (what the stored ``digest`` must equal)."""
    return index_digest(sidecar["groups"], partition=sidecar["partition"], group_size=sidecar["group_size"])


def _check_record(gid: Any, rec: Any) -> None:
    """One sidecar group record has the shape ``Group.as_record()`` writes, or the sidecar is refused."""
    if not isinstance(gid, str):
        raise SidecarError(f"sidecar group id {gid!r} is not a string")
    if not isinstance(rec, dict) or not {"sample_ids", "prompt_index", "version"} <= set(rec):
        raise SidecarError(f"sidecar group {gid} is not a {{sample_ids, prompt_index, version}} record")
    ids = rec["sample_ids"]
    if not isinstance(ids, list | tuple) or not all(isinstance(s, str) for s in ids):
        raise SidecarError(f"sidecar group {gid}: sample_ids must be a list of strings")
    for key in ("prompt_index", "version"):
        if not isinstance(rec[key], int) or isinstance(rec[key], bool):
            raise SidecarError(f"sidecar group {gid}: {key} must be an integer, got {rec[key]!r}")


class TQReplayBuffer:
    def __init__(
        self, client: DataPlaneClient, barrier: DataPlaneCheckpointBarrier, *, partition: str, group_size: int
    ) -> None:
        self.client = client
        self.barrier = barrier
        self.partition = partition
        self.group_size = group_size
        self._groups: dict[str, Group] = {}
        self._frozen: frozenset[str] = frozenset()

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
        return {sid for g in self._groups.values() for sid in g.sample_ids}

    def prompt_indices(self) -> set[int]:
        return {g.prompt_index for g in self._groups.values()}

    # -- mutations (seed flow 3): inside the barrier ------------------------------------------------------
    async def commit(self, group_id: str, prompt_index: int, version: int, fields: TensorDict) -> Group:
        if group_id in self._groups:
            raise ValueError(f"group {group_id} is already committed")
        if fields.batch_size[0] != self.group_size:
            raise ValueError(f"group {group_id} has {fields.batch_size[0]} rows, expected {self.group_size}")
        group = Group(group_id, tuple(sample_ids_for(group_id, self.group_size)), prompt_index, version)
        tags = [{"group": group_id, "version": version}] * self.group_size
        async with self.barrier.mutation():
            await self.client.put_samples(self.partition, list(group.sample_ids), fields, tags)
            self._groups[group_id] = group
        return group

    def freeze(self, sample_ids: Iterable[str]) -> None:
        """Until ``thaw()``, dropping any of these rows is an error (a snapshot is still reading them)."""
        self._frozen = frozenset(sample_ids)

    def thaw(self) -> None:
        self._frozen = frozenset()

    async def drop(self, group_ids: Iterable[str]) -> None:
        groups = [self._groups[gid] for gid in group_ids]
        if not groups:
            return
        ids = [sid for g in groups for sid in g.sample_ids]
        if self._frozen.intersection(ids):
            raise RuntimeError("drop of rows a data-plane snapshot is still writing; the save must finish first")
        async with self.barrier.mutation():
            await self.client.clear_samples(self.partition, ids)
            for g in groups:
                del self._groups[g.group_id]

    # -- checkpoint -----------------------------------------------------------------------------------------
    def metadata_state_dict(self) -> dict[str, Any]:
        groups = {gid: g.as_record() for gid, g in self._groups.items()}
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
        version = sd.get("schema_version")
        if version != SIDECAR_SCHEMA_VERSION:
            raise SidecarError(f"sidecar schema_version {version!r} is not {SIDECAR_SCHEMA_VERSION}")
        if sd.get("partition") != self.partition:
            raise SidecarError(f"sidecar partition {sd.get('partition')!r} != data_plane.partition {self.partition!r}")
        if sd.get("group_size") != self.group_size:
            raise SidecarError(
                f"sidecar group size {sd.get('group_size')} != grpo.num_generations_per_prompt {self.group_size}"
            )
        groups = sd.get("groups")
        if not isinstance(groups, dict):
            raise SidecarError("sidecar has no groups mapping")
        seen: set[str] = set()
        rebuilt: dict[str, Group] = {}
        for gid, rec in groups.items():
            _check_record(gid, rec)
            ids = tuple(rec["sample_ids"])
            if len(ids) != self.group_size or len(set(ids)) != len(ids):
                raise SidecarError(f"sidecar group {gid} has {len(ids)} ids (need {self.group_size} distinct)")
            dup = seen.intersection(ids)
            if dup:
                raise SidecarError(f"sidecar lists sample id {sorted(dup)[0]} in more than one group")
            seen.update(ids)
            rebuilt[gid] = Group(gid, ids, int(rec["prompt_index"]), int(rec["version"]))
        recomputed = sidecar_digest(sd)
        if sd.get("digest") != recomputed:
            raise SidecarError("sidecar digest does not match its own index (edited or corrupted)")
        if recomputed != expected_digest:
            raise SidecarError(f"sidecar digest {recomputed[:12]}… != data-plane digest {expected_digest[:12]}…")
        self._groups = rebuilt
