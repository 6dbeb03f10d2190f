"""Verification of one bundle: what verifies is what restores, and nothing found in a bundle crashes or hangs it.

Order matters: the manifest first (a regular file, bounded, strict schema, signature), then every entry of the
bundle's tree against it (links and special files are named, never followed or opened; sizes; the digest of every
listed file, by the manifest's ``hash_alg``), then — only when all of that passed — every file's *contents*, parsed
by the validators the restore uses (``sc_app.checkpoint.contents``). Every path read is a plain relative path
resolved inside the bundle without following a link (``sc_app.io.safe_files``). A bundle is *verified* only when every
check passed; ``problems`` names each failure with its file. ``notes`` say what verification could not check (the
native data plane's pickles).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sc_app.checkpoint import layout
from sc_app.checkpoint.bundle_files import BundleFiles
from sc_app.checkpoint.contents import MAX_SIDECAR_BYTES, check_contents, limit_for
from sc_app.checkpoint.hmac_keys import HmacKey
from sc_app.checkpoint.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestError, parse_manifest
from sc_app.data_plane import schema
from sc_app.data_plane.replay_index import check_sidecar
from sc_app.io.safe_files import FileProblem, Inventory, Tree, read_regular, show, unsafe_rel

log = logging.getLogger(__name__)

_REQUIRED_KIND = {
    layout.POLICY_DIR: "a directory",
    layout.LOADER_FILE: "a regular file",
    layout.DATA_PLANE_DIR: "a directory",
    layout.SIDECAR_FILE: "a regular file",
}


@dataclass
class BundleReport:
    path: Path
    step: int
    problems: list[str] = field(default_factory=list)  # why it does not verify (never the config's fault)
    manifest: Manifest | None = None
    notes: list[str] = field(default_factory=list)
    # where the running config differs from the one that wrote it (``compat_problems``): not a defect of the
    # bundle — it stays usable under that config — so never a reason to move it; a resume is refused instead
    incompatible: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Verified and, when a config was given, written by a compatible one: usable now."""
        return not self.problems and not self.incompatible

    @property
    def verified(self) -> bool:
        """Every check of the bundle itself passed (whatever the running config says)."""
        return not self.problems

    @property
    def name(self) -> str:
        return self.path.name

    def as_dict(self) -> dict[str, Any]:
        m = self.manifest.doc if self.manifest else {}
        return {
            "name": show(self.name),
            "step": self.step,
            "ok": self.ok,
            "problems": list(self.problems),
            "incompatible": list(self.incompatible),
            "notes": list(self.notes),
            "replay_digest": m.get("replay", {}).get("digest"),
            "groups": m.get("replay", {}).get("groups"),
            "bytes": sum(int(f.get("size", 0)) for f in m.get("files", {}).values()) if m else None,
            "created_at": m.get("created_at"),
            "lineage": m.get("lineage"),
            "hash_alg": self.manifest.hash_alg if self.manifest else None,
            "schema_version": m.get("schema_version"),
        }


_UNRECORDED = object()


def compat_problems(bundle_compat: dict[str, Any], expected: dict[str, Any], *, reroutes: bool = False) -> list[str]:
    """Each key where a bundle and the running config disagree, named as a config key. ``reroutes``: the bundle's
    data plane restores into any storage-unit count (``compat.REROUTABLE_KEYS`` do not bind it)."""
    from sc_app.checkpoint.compat import RECORDED_AS, RECORDED_SINCE, binding_keys

    out = []
    expected = binding_keys(expected, reroutes=reroutes)
    for key in sorted(expected):
        recorded = bundle_compat.get(key, bundle_compat.get(RECORDED_AS.get(key, key), _UNRECORDED))
        if recorded is _UNRECORDED:
            recorded = RECORDED_SINCE.get(key, _UNRECORDED)
        if recorded is _UNRECORDED:
            out.append(f"incompatible: bundle does not record '{key}'")
        elif recorded != expected[key] or type(recorded) is not type(expected[key]):  # 2.0 and true are not 2, 1
            out.append(f"incompatible: {key} is {recorded!r} in the bundle but {expected[key]!r} in the config")
    return out


def lineage_problem(manifest: Manifest, expected: str | None) -> str | None:
    """Why a bundle does not belong to the directory's lineage (``None``: it does, or predates lineages)."""
    if expected is None or manifest.lineage is None or manifest.lineage == expected:
        return None
    return (
        f"belongs to lineage {manifest.lineage}, this directory is lineage {expected}; never resumed or pruned here "
        "(copied in from another run? move it elsewhere)"
    )


def data_plane_digest(bundle: Path) -> str | None:
    """The replay digest ``data_plane/metadata.json`` records (either format), read as a bounded regular file."""
    data = read_regular(bundle / layout.DATA_PLANE_DIR / layout.DATA_PLANE_METADATA, schema.MAX_METADATA_BYTES)
    fmt = schema.snapshot_format(data)
    streamed = fmt in schema.READABLE_FORMATS
    meta = schema.parse_streamed_metadata(data) if streamed else schema.parse_native_metadata(data)
    return meta.user_metadata.get("digest")


def read_sidecar(path: Path) -> dict[str, Any]:
    """The replay sidecar, loaded ``weights_only`` from a bounded regular file and checked by ``check_sidecar``."""
    from sc_app.io import torch_files  # deferred: the rest of this module stays torch-free

    sd = torch_files.load(read_regular(path, MAX_SIDECAR_BYTES))
    check_sidecar(sd)
    return sd


def verify_bundle(
    path: Path,
    *,
    deep: bool = True,
    hmac_key: HmacKey | None = None,
    expected_compat: dict[str, Any] | None = None,
    expected_lineage: str | None = None,
) -> BundleReport:
    """Check one ``step_N/``. ``deep=False`` skips hashing and parsing (manifest, structure and sizes only).
    ``expected_lineage``: the directory's lineage; a bundle recording another one is a problem. Never raises."""
    path = Path(path)
    step = layout.parse_step(path.name)
    report = BundleReport(path=path, step=step if step is not None else -1)
    try:
        with Tree.open(path) as tree:
            _verify(tree, report, deep, hmac_key, expected_compat, expected_lineage)
    except FileProblem as exc:
        report.problems.append(str(exc))
    except Exception as exc:  # a defect of ours must still leave a report, never a traceback out of `ckpt verify`
        log.debug("verification of %s failed unexpectedly", path, exc_info=True)
        report.problems.append(f"{show(path)}: verification failed unexpectedly ({type(exc).__name__}: {exc})")
    return report


def _read_manifest(tree: Tree, hmac_key: HmacKey | None) -> Manifest:
    try:
        raw = tree.read(layout.MANIFEST_FILE, MAX_MANIFEST_BYTES)
    except FileProblem as exc:
        if str(exc).endswith(": missing"):
            raise ManifestError(
                f"{tree.at(layout.MANIFEST_FILE)}: manifest missing (bundle never completed or was tampered with)"
            ) from None
        raise ManifestError(str(exc)) from None
    return parse_manifest(raw, tree.path / layout.MANIFEST_FILE, hmac_key=hmac_key)


def _verify(
    tree: Tree,
    report: BundleReport,
    deep: bool,
    hmac_key: HmacKey | None,
    expected_compat: dict[str, Any] | None,
    expected_lineage: str | None,
) -> None:
    try:
        manifest = _read_manifest(tree, hmac_key)
    except ManifestError as exc:
        report.problems.append(str(exc))
        return
    report.manifest = manifest
    problems = report.problems
    if manifest.step != report.step:
        problems.append(f"{tree.at(layout.MANIFEST_FILE)}: records step {manifest.step}, directory says {report.step}")
    foreign = lineage_problem(manifest, expected_lineage)
    if foreign:
        problems.append(f"{tree.at(layout.MANIFEST_FILE)}: {foreign}")
    inv = tree.scan()
    problems.extend(_tree_problems(tree, inv))
    _check_listed(tree, inv, manifest, deep, problems)
    if expected_compat is not None:
        report.incompatible.extend(compat_problems(manifest.compat, expected_compat, reroutes=_reroutes(tree)))
    if not deep or problems:
        return
    findings = check_contents(BundleFiles(tree, manifest), manifest)
    problems.extend(findings.problems)
    report.notes.extend(findings.notes)


def _reroutes(tree: Tree) -> bool:
    """The bundle's data plane is a streamed snapshot (restores into any storage-unit count); False when it is
    TransferQueue's native one or its ``metadata.json`` cannot be read (then every compat key binds)."""
    try:
        data = tree.read(f"{layout.DATA_PLANE_DIR}/{layout.DATA_PLANE_METADATA}", schema.MAX_METADATA_BYTES)
        return schema.snapshot_format(data) in schema.READABLE_FORMATS
    except Exception:  # unreadable: reported by the file checks; strict here
        return False


def _tree_problems(tree: Tree, inv: Inventory) -> list[str]:
    """What the tree holds that no bundle may: links, special files, what cannot be listed, wrong kinds."""
    out = [f"{tree.at(rel)}: {why}" for rel, why in sorted({**inv.odd, **inv.unlisted}.items()) if rel != "."]
    if "." in inv.unlisted:
        out.append(f"{show(tree.path)}: {inv.unlisted['.']}")
    for entry, want in _REQUIRED_KIND.items():
        have = inv.kind_of(entry)
        if have is None and not inv.hidden(entry):
            out.append(f"{tree.at(entry)}: missing")
        elif have not in (None, "odd", want):
            out.append(f"{tree.at(entry)}: is {have}, expected {want}")
    return out


def _broken_required(inv: Inventory, rel: str) -> bool:
    """``rel`` lies under a required entry that is missing or not what it must be (already reported)."""
    top = rel.split("/", 1)[0]
    return top in _REQUIRED_KIND and "/" in rel and inv.kind_of(top) != "a directory"


def _check_listed(tree: Tree, inv: Inventory, manifest: Manifest, deep: bool, problems: list[str]) -> None:
    manifest_at = tree.at(layout.MANIFEST_FILE)
    for rel in sorted(set(inv.files) - set(manifest.files) - {layout.MANIFEST_FILE}):
        problems.append(f"{tree.at(rel)}: not listed in the manifest (added after the bundle was sealed)")
    for rel, info in manifest.files.items():
        why = unsafe_rel(rel)
        if why is not None:
            problems.append(f"{manifest_at}: lists '{show(rel)}', which {why}")
            continue
        if rel == layout.MANIFEST_FILE:
            problems.append(f"{manifest_at}: lists itself")
            continue
        have = inv.kind_of(rel)
        if have is None:
            if not inv.hidden(rel) and not _broken_required(inv, rel):
                problems.append(f"{tree.at(rel)}: missing")
            continue
        if have == "a directory":
            problems.append(f"{tree.at(rel)}: is a directory, the manifest lists a file")
            continue
        if have == "odd":
            continue  # named by _tree_problems
        size = inv.files[rel]
        if size != info["size"]:
            problems.append(f"{tree.at(rel)}: size {size} != {info['size']} in the manifest (truncated or grown)")
            continue
        limit = limit_for(rel)
        if limit is not None and size > limit:
            problems.append(f"{tree.at(rel)}: {size} bytes, more than the {limit} this file may hold")
            continue
        if deep:
            try:
                digest, _ = tree.digest(rel, manifest.hash_alg)
            except FileProblem as exc:
                problems.append(str(exc))
                continue
            if digest != info["digest"]:
                problems.append(
                    f"{tree.at(rel)}: {manifest.hash_alg} does not match the manifest (corrupted or tampered)"
                )
