"""Bundles built by hand, for the checkpoint unit tests: no Ray, no TransferQueue.

``make_bundle`` writes what the controller writes (policy files, loader place, a data-plane ``metadata.json``
carrying the replay digest, the sidecar) through the real ``BundleWriter``, so the manifest and the layout are
the real ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from sc_app.checkpoint import BundleWriter
from sc_app.digest import sidecar_digest
from sc_app.replay_buffer import SIDECAR_SCHEMA_VERSION

COMPAT = {"run.seed": 0, "grpo.num_generations_per_prompt": 2}


def sidecar(step: int) -> dict[str, Any]:
    groups = {
        f"p{step}{i}": {
            "sample_ids": [f"p{step}{i}:0", f"p{step}{i}:1"],
            "prompt_index": step * 10 + i,
            "version": step,
        }
        for i in range(3)
    }
    sd: dict[str, Any] = {"schema_version": SIDECAR_SCHEMA_VERSION, "partition": "train", "group_size": 2}
    sd["groups"] = groups
    sd["digest"] = sidecar_digest(sd)
    return sd


def write_contents(w: BundleWriter, step: int, *, dp_digest: str | None = None) -> dict[str, Any]:
    """Fill a begun writer like the controller does; returns the manifest fields to commit with."""
    torch.save({"model": {"w": torch.full((4,), float(step))}, "version": step}, w.policy_dir / "model.pt")
    torch.save({"state": {}, "param_groups": []}, w.policy_dir / "optimizer.pt")
    torch.save({"schema_version": 1, "next_index": step * 10, "reissue": []}, w.loader_path)
    sd = sidecar(step)
    w.data_plane_dir.mkdir()
    (w.data_plane_dir / "metadata.json").write_text(
        json.dumps({"storage_saved": True, "user_metadata": {"digest": dp_digest or sd["digest"], "step": step}})
    )
    (w.data_plane_dir / "simple_storage").mkdir()
    (w.data_plane_dir / "simple_storage" / "su_0.pkl").write_bytes(os.urandom(2048))
    torch.save(sd, w.sidecar_path)
    return {
        "run_id": "test",
        "replay": {"digest": sd["digest"], "groups": len(sd["groups"]), "rows": 2 * len(sd["groups"])},
        "compat": dict(COMPAT),
    }


def make_bundle(root: Path, step: int, *, hmac_key: bytes | None = None, dp_digest: str | None = None) -> Path:
    w = BundleWriter(root, step, hmac_key=hmac_key).begin()
    return w.commit(write_contents(w, step, dp_digest=dp_digest))


def make_tmp_leftover(root: Path, step: int) -> Path:
    """A save that died before its rename: complete-looking files, maybe even a manifest."""
    w = BundleWriter(root, step).begin()
    write_contents(w, step)
    return w.tmp


def tree(root: Path) -> dict[str, str]:
    """relative path → sha256 of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def contents_only(t: dict[str, str]) -> list[str]:
    """The multiset of file contents (moving files around keeps it; deleting does not)."""
    return sorted(t.values())


def truncate(p: Path) -> None:
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)


def flip_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def edit_manifest(bundle: Path, edit: Any) -> None:
    doc = json.loads((bundle / "manifest.json").read_text())
    edit(doc)
    (bundle / "manifest.json").write_text(json.dumps(doc))
