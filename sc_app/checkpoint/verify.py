"""Verification of one bundle, before anything in it is deserialised.

Order matters: the manifest (and its signature) first, then sizes and sha256 of every file, then — only on
files whose hashes matched — the JSON and ``weights_only`` reads that cross-check the replay digest.
A bundle is *verified* only when every check passed; ``problems`` names each failure with its file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from sc_app.checkpoint import layout
from sc_app.checkpoint.manifest import Manifest, ManifestError, read_manifest
from sc_app.digest import sidecar_digest
from sc_app.durable_io import sha256_file


@dataclass
class BundleReport:
    path: Path
    step: int
    problems: list[str] = field(default_factory=list)
    manifest: Manifest | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def name(self) -> str:
        return self.path.name

    def as_dict(self) -> dict[str, Any]:
        m = self.manifest.doc if self.manifest else {}
        return {
            "name": self.name,
            "step": self.step,
            "ok": self.ok,
            "problems": list(self.problems),
            "replay_digest": m.get("replay", {}).get("digest"),
            "groups": m.get("replay", {}).get("groups"),
            "bytes": sum(int(f.get("size", 0)) for f in m.get("files", {}).values()) if m else None,
            "created_at": m.get("created_at"),
        }


_UNRECORDED = object()


def compat_problems(bundle_compat: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """Each key where a bundle and the running config disagree, named as a config key."""
    from sc_app.checkpoint.compat import RECORDED_SINCE

    out = []
    for key in sorted(expected):
        recorded = bundle_compat.get(key, RECORDED_SINCE.get(key, _UNRECORDED))
        if recorded is _UNRECORDED:
            out.append(f"incompatible: bundle does not record '{key}'")
        elif recorded != expected[key]:
            out.append(f"incompatible: {key} is {recorded!r} in the bundle but {expected[key]!r} in the config")
    return out


def data_plane_digest(bundle: Path) -> str | None:
    meta = bundle / layout.DATA_PLANE_DIR / layout.DATA_PLANE_METADATA
    doc = json.loads(meta.read_text())
    user = doc.get("user_metadata") if isinstance(doc, dict) else None
    if not isinstance(user, dict):
        raise ValueError("not a JSON object with a 'user_metadata' mapping")
    return user.get("digest")


def read_sidecar(path: Path) -> dict[str, Any]:
    """Load the replay sidecar with ``weights_only=True`` (plain containers only)."""
    from sc_app import torch_io  # deferred: the rest of this module stays torch-free

    obj = torch_io.load(path)
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: sidecar is not a mapping")
    return obj


def verify_bundle(
    path: Path,
    *,
    deep: bool = True,
    hmac_key: bytes | None = None,
    expected_compat: dict[str, Any] | None = None,
) -> BundleReport:
    """Check one ``step_N/``. ``deep=False`` skips hashing (sizes and structure only)."""
    step = layout.parse_step(path.name)
    report = BundleReport(path=path, step=step if step is not None else -1)
    try:
        manifest = read_manifest(path, hmac_key=hmac_key)
    except ManifestError as exc:
        report.problems.append(str(exc))
        return report
    report.manifest = manifest
    if manifest.step != step:
        report.problems.append(f"{path / layout.MANIFEST_FILE}: records step {manifest.step}, directory says {step}")
    for entry in layout.REQUIRED_ENTRIES:
        if not (path / entry).exists():
            report.problems.append(f"{path / entry}: missing")
    listed = manifest.files
    present = set()
    for dirpath, _, names in os.walk(path):
        for name in names:
            rel = (Path(dirpath) / name).relative_to(path).as_posix()
            if rel != layout.MANIFEST_FILE:
                present.add(rel)
    for rel in sorted(present - set(listed)):
        report.problems.append(f"{path / rel}: not listed in the manifest (added after the bundle was sealed)")
    hashed_ok: set[str] = set()
    for rel, info in listed.items():
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            report.problems.append(f"{path / layout.MANIFEST_FILE}: lists '{rel}', a path outside the bundle")
            continue
        p = path / rel
        if rel not in present:
            if not any(p.is_relative_to(path / e) for e in layout.REQUIRED_ENTRIES if not (path / e).exists()):
                report.problems.append(f"{p}: missing")
            continue
        size = p.stat().st_size
        if size != info.get("size"):
            report.problems.append(f"{p}: size {size} != {info.get('size')} in the manifest (truncated or grown)")
            continue
        if deep:
            digest, _ = sha256_file(p)
            if digest != info.get("sha256"):
                report.problems.append(f"{p}: sha256 does not match the manifest (corrupted or tampered)")
                continue
        hashed_ok.add(rel)
    if expected_compat is not None:
        report.problems.extend(compat_problems(manifest.compat, expected_compat))
    if not deep or report.problems:
        return report
    dp_meta = f"{layout.DATA_PLANE_DIR}/{layout.DATA_PLANE_METADATA}"
    if dp_meta in hashed_ok:
        try:
            dp_digest = data_plane_digest(path)
        except (ValueError, OSError) as exc:
            report.problems.append(f"{path / dp_meta}: unreadable ({exc})")
            dp_digest = None
        if dp_digest != manifest.replay_digest:
            report.problems.append(
                f"{path / dp_meta}: data-plane digest {dp_digest} != replay digest {manifest.replay_digest}"
            )
    else:
        report.problems.append(f"{path / dp_meta}: missing from the bundle")
    if layout.SIDECAR_FILE in hashed_ok:
        try:
            sidecar = read_sidecar(path / layout.SIDECAR_FILE)
            recorded, recomputed = sidecar.get("digest"), sidecar_digest(sidecar)
        except Exception as exc:  # any unreadable sidecar is a problem to report, not a crash
            report.problems.append(f"{path / layout.SIDECAR_FILE}: unreadable ({exc.__class__.__name__}: {exc})")
        else:
            if recorded != recomputed:
                report.problems.append(f"{path / layout.SIDECAR_FILE}: digest does not match its own index")
            elif recorded != manifest.replay_digest:
                report.problems.append(
                    f"{path / layout.SIDECAR_FILE}: sidecar digest != data-plane digest {manifest.replay_digest}"
                )
    return report
