"""A copy of a real bundle whose data plane is padded to a given size (section 5's resume of a large bundle)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.scbench.common import MiB


def pad_bundle(src: Path, dst_root: Path, data_plane_bytes: int) -> int:
    """Copy the newest bundle under ``src`` into ``dst_root`` with every segment given an extra ``pad`` field so
    its data plane holds ~``data_plane_bytes``; the manifest is re-rendered over the new files. Returns bytes."""
    import torch

    from sc_app.checkpoint import layout
    from sc_app.checkpoint.manifest import render
    from sc_app.data_plane.streamed_format import PartWriter, iter_groups, merged_metadata, read_metadata
    from sc_app.io.hashing import digest_file

    _, bundle = layout.step_dirs(src)[0]
    dst = dst_root / bundle.name
    shutil.copytree(bundle, dst)
    dp = dst / layout.DATA_PLANE_DIR
    doc = read_metadata(dp)
    groups = list(iter_groups(dp, doc))
    rows = sum(len(g.ids) for g in groups)
    per_row = max(1, data_plane_bytes // max(1, rows))
    for p in list(dp.iterdir()):
        if p.name != "metadata.json":
            p.unlink()
    writer = PartWriter(dp, 64 * MiB)
    for group in groups:
        data = group.data.clone()
        data["pad"] = torch.full((len(group.ids), per_row), 7, dtype=torch.uint8)
        writer.append(group.group, group.ids, group.tags, data)
    writer.finish()
    new_doc = merged_metadata([writer.summary()], partition=doc["partition"], user_metadata=doc["user_metadata"])
    (dp / "metadata.json").write_text(json.dumps(new_doc, indent=1))
    manifest = json.loads((dst / layout.MANIFEST_FILE).read_text())
    files = {}
    for p in sorted(dst.rglob("*")):
        if p.is_file() and p.name != layout.MANIFEST_FILE:
            got = digest_file(p, manifest["hash_alg"])
            files[p.relative_to(dst).as_posix()] = {"digest": got.digest, "size": got.size}
    manifest["files"] = files
    manifest.pop("signature", None)
    (dst / layout.MANIFEST_FILE).write_bytes(render(manifest, None))
    return writer.bytes
