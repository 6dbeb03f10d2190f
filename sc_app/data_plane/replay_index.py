"""The replay index file (``replay_buffer_metadata.pt``, the "sidecar"): its schema and the whole check of it.

Pure (no Ray, no torch, no data plane): ``TQReplayBuffer.load_state_dict`` (the restore) and verification
(``sc_app.checkpoint.contents``) both call ``check_sidecar``, so an index file that verifies is one the restore
takes. What the buffer does with the groups (commit, drop, freeze) is ``sc_app.data_plane.replay_buffer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sc_app.io.digest import sidecar_digest

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


SIDECAR_KEYS = frozenset({"schema_version", "partition", "group_size", "groups", "digest"})
_RECORD_KEYS = frozenset({"sample_ids", "prompt_index", "version"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_record(gid: Any, rec: Any, group_size: int) -> Group:
    """One sidecar group record has the shape ``Group.as_record()`` writes, or the sidecar is refused."""
    if not isinstance(gid, str) or not gid:
        raise SidecarError(f"sidecar group id {gid!r} is not a non-empty string")
    if not isinstance(rec, dict) or set(rec) != _RECORD_KEYS:
        raise SidecarError(f"sidecar group {gid} is not a {{sample_ids, prompt_index, version}} record")
    ids = rec["sample_ids"]
    if not isinstance(ids, list | tuple) or not all(isinstance(s, str) for s in ids):
        raise SidecarError(f"sidecar group {gid}: sample_ids must be a list of strings")
    for key in ("prompt_index", "version"):
        if not _is_int(rec[key]) or rec[key] < 0:
            raise SidecarError(f"sidecar group {gid}: {key} must be a non-negative integer, got {rec[key]!r}")
    if len(ids) != group_size or len(set(ids)) != len(ids):
        raise SidecarError(f"sidecar group {gid} has {len(ids)} ids, its group size is {group_size} (need distinct)")
    return Group(gid, tuple(ids), rec["prompt_index"], rec["version"])


def check_sidecar(sd: Any) -> dict[str, Group]:
    """The groups of a replay sidecar (``metadata_state_dict()`` as loaded back), or ``SidecarError`` naming the
    first defect: not exactly its keys, an unknown schema version, a malformed or duplicated group or sample id, a
    ``digest`` that is not the digest of its own index. Pure: the restore and verification both call it."""
    if not isinstance(sd, dict):
        raise SidecarError(f"sidecar is {type(sd).__name__}, not a mapping")
    version = sd.get("schema_version")
    if version != SIDECAR_SCHEMA_VERSION or not _is_int(version):
        raise SidecarError(f"sidecar schema_version {version!r} is not {SIDECAR_SCHEMA_VERSION}")
    if set(sd) != SIDECAR_KEYS:
        raise SidecarError(f"sidecar holds keys {sorted(map(str, sd))}, expected {sorted(SIDECAR_KEYS)}")
    if not isinstance(sd["partition"], str) or not sd["partition"]:
        raise SidecarError(f"sidecar partition {sd['partition']!r} is not a non-empty string")
    group_size = sd["group_size"]
    if not _is_int(group_size) or group_size < 1:
        raise SidecarError(f"sidecar group size {group_size!r} is not a positive integer")
    groups = sd["groups"]
    if not isinstance(groups, dict):
        raise SidecarError("sidecar has no groups mapping")
    seen: set[str] = set()
    rebuilt: dict[str, Group] = {}
    for gid, rec in groups.items():
        group = _check_record(gid, rec, group_size)
        dup = seen.intersection(group.sample_ids)
        if dup:
            raise SidecarError(f"sidecar lists sample id {sorted(dup)[0]} in more than one group")
        for sid in group.sample_ids:  # the data plane groups rows by this (``data_plane.schema.group_of``)
            if sid.rpartition(":")[0] != gid:
                raise SidecarError(f"sidecar group {gid}: sample id {sid!r} does not belong to it ('<group>:<row>')")
        seen.update(group.sample_ids)
        rebuilt[gid] = group
    if sd["digest"] != sidecar_digest(sd):
        raise SidecarError("sidecar digest does not match its own index (edited or corrupted)")
    return rebuilt
