"""What each file of a bundle must hold: the parse half of verification, with the validators the restore uses.

Runs only on a bundle whose files all matched the manifest, reading through ``BundleFiles`` (listed, regular, inside
the bundle, bounded, re-hashed as read). Every check returns problems, each starting with the file it names:

=========================  =====================================================================================
``policy/``                the checker of the policy format the manifest records (``policy_formats``)
``train_dataloader.pt``    weights-only load → ``LOADER_CHECK`` (restore: ``PromptLoader.load_state_dict``)
``replay_buffer_...pt``    weights-only load → ``sc_app.data_plane.replay_buffer.check_sidecar`` (restore: the index)
``data_plane/``            ``sc_app.data_plane.schema``: ``metadata.json`` and every part header, checked in full
                           (restore: ``streamed_format``); the native format's pickles are digest-checked only
=========================  =====================================================================================

Across files: the sidecar's groups and sample ids are exactly the data plane's (the restore's inventory check), and
both record the manifest's replay digest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sc_app.checkpoint import layout
from sc_app.checkpoint.bundle_files import BundleFiles
from sc_app.checkpoint.manifest import Manifest
from sc_app.checkpoint.policy_formats import PolicyCheck, check_policy, resolve
from sc_app.data_plane import schema
from sc_app.data_plane.replay_index import SidecarError, check_sidecar
from sc_app.io.safe_files import FileProblem

MAX_LOADER_BYTES = 64 * 1024 * 1024
# The loader owns its place's schema and sits above checkpoint/ in the layering: its check is registered by name
# (imported when a bundle is verified), the way ``policy_formats.CHECKERS`` registers the policy checkers. It returns
# the state or raises ``ValueError`` naming the first defect.
LOADER_CHECK = "sc_app.rl.loader:check_loader_state"
MAX_SIDECAR_BYTES = 1024**3  # ~100 bytes per row of the replay index
DP = layout.DATA_PLANE_DIR
DP_METADATA = f"{DP}/{layout.DATA_PLANE_METADATA}"
NATIVE_NOTE = (
    "data plane in TransferQueue's native format: its pickles cannot be checked without unpickling them, only their "
    "digests stand behind them (set SC_APP_CHECKPOINT_HMAC_KEY so that only key holders can reseal a bundle)"
)

Groups = dict[str, set[str]]  # group id → its sample ids


def limit_for(rel: str) -> int | None:
    """The most bytes verification reads of ``rel`` to parse it (``None``: not parsed here, or the policy
    checker's own bound). Checked against the manifest's size before the file is hashed."""
    if rel == DP_METADATA:
        return schema.MAX_METADATA_BYTES
    if rel.startswith(f"{DP}/part-") and rel.endswith(".json"):
        return schema.MAX_HEADER_BYTES
    return {layout.LOADER_FILE: MAX_LOADER_BYTES, layout.SIDECAR_FILE: MAX_SIDECAR_BYTES}.get(rel)


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_contents(files: BundleFiles, manifest: Manifest) -> Findings:
    out = Findings()
    out.problems.extend(check_policy(PolicyCheck(files, manifest)))
    out.problems.extend(check_loader(files))
    sidecar_groups = check_sidecar_file(files, manifest, out)
    dp_groups = check_data_plane(files, manifest, out)
    if sidecar_groups is not None and dp_groups is not None and sidecar_groups != dp_groups:
        out.problems.append(f"{files.at(layout.SIDECAR_FILE)}: {_difference(sidecar_groups, dp_groups)}")
    return out


def _difference(index: Groups, stored: Groups) -> str:
    only_index, only_stored = sorted(set(index) - set(stored)), sorted(set(stored) - set(index))
    if only_index:
        return f"lists group {only_index[0]!r}, which {DP}/ does not hold ({len(only_index)} such)"
    if only_stored:
        return f"does not list group {only_stored[0]!r}, which {DP}/ holds ({len(only_stored)} such)"
    gid = next(g for g in sorted(index) if index[g] != stored[g])
    return f"group {gid!r} lists other sample ids than {DP}/ holds for it"


def check_loader(files: BundleFiles) -> list[str]:
    rel = layout.LOADER_FILE
    check_loader_state = resolve(LOADER_CHECK)
    try:
        check_loader_state(files.load_pt(rel, MAX_LOADER_BYTES))
    except FileProblem as exc:
        return [str(exc)]
    except ValueError as exc:  # LoaderStateError
        return [f"{files.at(rel)}: {exc}"]
    return []


def check_sidecar_file(files: BundleFiles, manifest: Manifest, out: Findings) -> Groups | None:
    rel = layout.SIDECAR_FILE
    try:
        sd = files.load_pt(rel, MAX_SIDECAR_BYTES)
        groups = check_sidecar(sd)
    except FileProblem as exc:
        out.problems.append(str(exc))
        return None
    except SidecarError as exc:
        out.problems.append(f"{files.at(rel)}: {exc}")
        return None
    if sd["digest"] != manifest.replay_digest:
        out.problems.append(f"{files.at(rel)}: sidecar digest != data-plane digest {manifest.replay_digest}")
    replay = manifest.doc["replay"]
    for key in ("partition", "group_size"):
        if replay.get(key) is not None and replay[key] != sd[key]:
            out.problems.append(f"{files.at(rel)}: {key} is {sd[key]!r}, the manifest records {replay[key]!r}")
    return {gid: set(g.sample_ids) for gid, g in groups.items()}


def check_data_plane(files: BundleFiles, manifest: Manifest, out: Findings) -> Groups | None:
    """``metadata.json`` and, for the streamed format, every part; the data plane's groups (``None`` when they
    cannot be known: a problem, or the native format)."""
    at = files.at(DP_METADATA)
    try:
        data = files.read(DP_METADATA, schema.MAX_METADATA_BYTES)
        fmt = schema.snapshot_format(data)
        if fmt in schema.READABLE_FORMATS:
            meta: schema.StreamedMetadata | schema.NativeMetadata = schema.parse_streamed_metadata(data)
        elif fmt is None:
            meta = schema.parse_native_metadata(data)
        else:
            raise schema.StreamedFormatError(f"format {fmt!r} is not a data-plane format this sc-app reads")
    except FileProblem as exc:
        out.problems.append(str(exc))
        return None
    except schema.StreamedFormatError as exc:
        out.problems.append(f"{at}: {exc}")
        return None
    digest = meta.user_metadata.get("digest")
    if digest != manifest.replay_digest:
        out.problems.append(f"{at}: data-plane digest {digest} != replay digest {manifest.replay_digest}")
    step = meta.user_metadata.get("step", manifest.step)
    if step != manifest.step or isinstance(step, bool):
        out.problems.append(f"{at}: records step {step!r}, the manifest step {manifest.step}")
    if isinstance(meta, schema.NativeMetadata):
        out.notes.append(f"{files.at(DP)}: {NATIVE_NOTE}")
        return None
    return _check_parts(files, meta, out)


def _check_parts(files: BundleFiles, meta: schema.StreamedMetadata, out: Findings) -> Groups | None:
    headers = []
    for name in meta.parts:
        rel = f"{DP}/{name}.json"
        try:
            data = files.read(rel, schema.MAX_HEADER_BYTES)
            headers.append(schema.parse_header(data, name=name, bin_size=files.size(f"{DP}/{name}.bin")))
        except FileProblem as exc:
            out.problems.append(str(exc))
        except schema.StreamedFormatError as exc:
            out.problems.append(f"{files.at(rel)}: {exc}")
    named = {DP_METADATA} | {f"{DP}/{n}.{ext}" for n in meta.parts for ext in ("json", "bin")}
    for rel in sorted(set(files.listed(f"{DP}/")) - named):
        out.problems.append(f"{files.at(rel)}: not a file of the snapshot {DP_METADATA} describes")
    if len(headers) != len(meta.parts):
        return None
    try:
        groups = schema.check_parts_agree(meta, headers)
    except schema.StreamedFormatError as exc:
        out.problems.append(f"{files.at(DP)}: {exc}")
        return None
    return {gid: set(ids) for gid, ids in groups.items()}
