"""Bundles built by hand, for the checkpoint unit tests: no Ray, no TransferQueue — but real contents.

``make_bundle`` writes what a save writes, with the code a save uses: the policy of a real (tiny) ``TinyCausalLM``
and its optimizer after one step, a loader place, the replay sidecar, and a streamed data plane written by the real
``PartWriter`` (several parts, dense and jagged fields) — all through the real ``BundleWriter``, so the manifest and
layout are the real ones and a fresh bundle verifies exactly like a production bundle. ``data_plane="native"`` writes
TransferQueue's native layout instead (``metadata.json`` + opaque pickles).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import torch
from tensordict import TensorDict

from sc_app.checkpoint import BundleWriter
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.manifest import render
from sc_app.config.app import AppConfig, GRPOConfig, ModelConfig, TaskConfig
from sc_app.data_plane.replay_index import SIDECAR_SCHEMA_VERSION
from sc_app.data_plane.streamed_format import PartWriter, write_metadata
from sc_app.io.digest import sidecar_digest
from sc_app.io.hashing import digest_file
from sc_app.rl.loader import LOADER_SCHEMA_VERSION
from sc_app.rl.model import TinyCausalLM
from sc_app.rl.state_schema import new_optimizer

CFG = AppConfig(
    model=ModelConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, max_seq_len=8),
    task=TaskConfig(prompt_len=2, response_len=2),
    grpo=GRPOConfig(group_size=2),
)
COMPAT = compat_of(CFG)
GROUP_SIZE = CFG.grpo.group_size
PARTITION = CFG.data_plane.partition
PART_BYTES = 200  # tiny parts: every bundle's data plane spans several part files

DataPlane = Literal["streamed", "native"]


def sidecar(step: int) -> dict[str, Any]:
    groups = {
        f"p{step}{i}": {
            "sample_ids": [f"p{step}{i}:{r}" for r in range(GROUP_SIZE)],
            "prompt_index": step * 10 + i,
            "version": step,
        }
        for i in range(3)
    }
    sd: dict[str, Any] = {"schema_version": SIDECAR_SCHEMA_VERSION, "partition": PARTITION, "group_size": GROUP_SIZE}
    sd["groups"] = groups
    sd["digest"] = sidecar_digest(sd)
    return sd


@functools.cache
def policy_state(step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model.pt, optimizer.pt)`` contents of a real model after one optimizer step, as the trainer saves them."""
    torch.manual_seed(step)
    model = TinyCausalLM(CFG.model)
    optimizer = new_optimizer(model.parameters(), lr=CFG.grpo.learning_rate)
    tokens = torch.randint(0, CFG.model.vocab_size, (2, CFG.task.prompt_len + CFG.task.response_len))
    model(tokens).float().mean().backward()
    optimizer.step()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"model": weights, "version": step}, optimizer.state_dict()


def loader_state(step: int) -> dict[str, Any]:
    return {"schema_version": LOADER_SCHEMA_VERSION, "next_index": step * 10 + 3, "reissue": [step * 10 + 1]}


def group_rows(step: int, i: int) -> TensorDict:
    seq = CFG.task.prompt_len + CFG.task.response_len
    jagged = torch.nested.nested_tensor([torch.arange(n + 1, dtype=torch.int32) for n in range(2)], layout=torch.jagged)
    return TensorDict(
        {
            "tokens": torch.arange(GROUP_SIZE * seq, dtype=torch.int64).reshape(GROUP_SIZE, seq) + step + i,
            "logprobs": torch.full((GROUP_SIZE, CFG.task.response_len), -float(i + 1)),
            "ragged": jagged,
        },
        batch_size=GROUP_SIZE,
    )


def user_metadata(step: int, digest: str) -> dict[str, Any]:
    """What ``CapturedSave.data_plane_metadata`` records."""
    return {
        "step": step,
        "epoch": 1,
        "trainer_version": step,
        "loader": {"next_index": step * 10 + 3, "reissue": 1},
        "digest": digest,
        "groups": 3,
        "mode": "authoritative",
        "run_id": "test",
    }


def write_streamed(directory: Path, sd: dict[str, Any], meta: dict[str, Any]) -> None:
    directory.mkdir()
    writer = PartWriter(directory, PART_BYTES)
    for i, (gid, rec) in enumerate(sd["groups"].items()):
        tags = [{"group": gid, "version": rec["version"]}] * GROUP_SIZE
        writer.append(gid, rec["sample_ids"], tags, group_rows(rec["version"], i))
    writer.finish()
    write_metadata(directory, writer.metadata(partition=PARTITION, user_metadata=meta))


def write_native(directory: Path, meta: dict[str, Any]) -> None:
    (directory / "simple_storage").mkdir(parents=True)
    (directory / "simple_storage" / "su_0.pkl").write_bytes(b"\x80\x04opaque pickle bytes" * 50)
    (directory / "controller_state.pkl").write_bytes(b"\x80\x04opaque controller state" * 20)
    (directory / "metadata.json").write_text(json.dumps({"storage_saved": True, "user_metadata": meta}, indent=2))


def write_contents(
    w: BundleWriter,
    step: int,
    *,
    dp_digest: str | None = None,
    data_plane: DataPlane = "streamed",
    lineage: str | None = None,
) -> dict[str, Any]:
    """Fill a begun writer like the controller does; returns the manifest fields to commit with."""
    model, optimizer = policy_state(step)
    torch.save(model, w.policy_dir / "model.pt")
    torch.save(optimizer, w.policy_dir / "optimizer.pt")
    torch.save(loader_state(step), w.loader_path)
    sd = sidecar(step)
    meta = user_metadata(step, dp_digest or sd["digest"])
    if data_plane == "streamed":
        write_streamed(w.data_plane_dir, sd, meta)
    else:
        write_native(w.data_plane_dir, meta)
    torch.save(sd, w.sidecar_path)
    record: dict[str, Any] = {
        "run_id": "test",
        "epoch": 1,
        "trainer_version": step,
        "loader": {"next_index": step * 10 + 3, "reissue": 1},
        "replay": {
            "digest": sd["digest"],
            "groups": len(sd["groups"]),
            "rows": GROUP_SIZE * len(sd["groups"]),
            "partition": PARTITION,
            "group_size": GROUP_SIZE,
        },
        "compat": dict(COMPAT),
        "versions": {"sc_app": "test"},
    }
    if lineage is not None:
        record["lineage"] = lineage
    return record


def make_bundle(
    root: Path,
    step: int,
    *,
    hmac_key: bytes | None = None,
    dp_digest: str | None = None,
    data_plane: DataPlane = "streamed",
    lineage: str | None = None,
) -> Path:
    w = BundleWriter(root, step, hmac_key=hmac_key).begin()
    return w.commit(write_contents(w, step, dp_digest=dp_digest, data_plane=data_plane, lineage=lineage))


def make_tmp_leftover(root: Path, step: int) -> Path:
    """A save that died before its rename: complete-looking files, maybe even a manifest."""
    w = BundleWriter(root, step).begin()
    write_contents(w, step)
    return w.tmp


def reseal(bundle: Path, mutate_doc: Any = None, *, hmac_key: bytes | None = None) -> None:
    """Recompute the manifest's hashes over the (tampered) files, as someone with volume access but without the
    HMAC key would (or a buggy writer): only parsing the files can catch what changed."""
    doc = json.loads((bundle / "manifest.json").read_text())
    files = {}
    for p in sorted(bundle.rglob("*")):
        rel = p.relative_to(bundle).as_posix()
        if p.is_file() and not p.is_symlink() and rel != "manifest.json":
            got = digest_file(p, doc["hash_alg"])
            files[rel] = {"digest": got.digest, "size": got.size}
    doc["files"] = files
    if mutate_doc:
        mutate_doc(doc)
    doc.pop("signature", None)
    body = {k: v for k, v in doc.items() if k not in ("format", "schema_version")}
    (bundle / "manifest.json").write_bytes(render(body, hmac_key))


def tree(root: Path) -> dict[str, str]:
    """relative path → sha256 of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
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
