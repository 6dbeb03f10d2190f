"""Canonical encoding and sha256 digest of a replay index. Pure: no Ray, no torch.

The digest ties the replay sidecar (``replay_buffer_metadata.pt``) to the data-plane snapshot
(``data_plane/``): both record it, and a resume refuses a pair whose digests differ.
Invariant: two indexes with the same groups (in any insertion order) have the same digest;
any change to a group id, its sample ids (including their order), its prompt, version or group size changes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_bytes(obj: Any) -> bytes:
    """JSON with sorted keys, no whitespace, UTF-8; floats refused so the encoding is exact."""

    def check(value: Any) -> None:
        if isinstance(value, float):
            raise TypeError("canonical encoding refuses floats; store integers or strings")
        if isinstance(value, Mapping):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(f"canonical encoding needs string keys, got {type(k).__name__}")
                check(v)
        elif isinstance(value, list | tuple):
            for v in value:
                check(v)

    check(obj)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def index_digest(groups: Mapping[str, Mapping[str, Any]], *, partition: str, group_size: int) -> str:
    """sha256 hex digest of a replay index: ``{group_id: {"sample_ids": [...], ...}}``."""
    payload = {
        "partition": partition,
        "group_size": group_size,
        "groups": [[gid, dict(groups[gid])] for gid in sorted(groups)],
    }
    return hashlib.sha256(canonical_bytes(payload)).hexdigest()


def sidecar_digest(sidecar: Mapping[str, Any]) -> str:
    """Digest recomputed from a replay sidecar's own groups (what its stored ``digest`` must equal)."""
    return index_digest(sidecar["groups"], partition=sidecar["partition"], group_size=sidecar["group_size"])
