"""Bundles committed on the bucket alone, each trainer rank uploading its own part (``checkpoint.remote.parts:
direct`` with ``checkpoint.volume: local``; ``docs/object-storage.md``).

Save: a rank that does not see the run's directory writes its part on its own disk (``node_parts.part_dir``), as
with ``via_head``, then uploads each file into the attempt's ``bundles/step_N.<run>.e<epoch>/policy/``
(``upload_part``): hashed as it is sent, refused (``PartMismatch``: the save fails, nothing is published) when a
byte differs from what the rank hashed as it wrote, the object tagged with its digest (``DIGEST_META``). No byte of
it passes through the head. The controller writes the rest of the bundle into ``tmp_step_N/``, seals it (its
manifest lists every file, the ranks' too) and publishes it on the bucket (``commit_on_bucket``: the ranks' objects
checked on the server by size and digest, the head's files uploaded, the manifest last, the record's
compare-and-swap as the commit point, under the writer's lock and lease like a rename); then the tmp dir goes.

Invariants: no ``step_N/`` appears locally for such a bundle; the bucket is the only tier that holds it, so a
resume or an in-job restore brings the bucket's newest home first (``RemoteTier.bring_home``). A part uploaded for
a save that is never published is an object no record names: never a bundle.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_app.checkpoint.layout import POLICY_DIR
from sc_app.checkpoint.node_parts import PartMismatch
from sc_app.checkpoint.remote.fence import BUNDLES, RemoteLease
from sc_app.checkpoint.remote.record import bundle_dir
from sc_app.checkpoint.remote.store import Store
from sc_app.checkpoint.remote.upload import HashingReader, UploadResult, upload_bundle
from sc_app.checkpoint.writer import BundleWriter, FileRecord
from sc_app.config.remote import RemoteConfig
from sc_app.io import hashing
from sc_app.io.safe_files import open_regular


@dataclass(frozen=True)
class RemoteLink:
    """What a process besides the driver needs to write into this attempt's bundles on the bucket (picklable):
    the attempt's hold on the bucket and the form of ``If-Match`` the server takes (found by the start-up probe)."""

    lease: RemoteLease
    bare_if_match: bool

    def store(self, cfg: RemoteConfig) -> Store:
        store = Store(cfg)
        store.bare_if_match = self.bare_if_match
        return store


@dataclass(frozen=True)
class PartTarget:
    """Where a rank uploads its part of one save (``TrainerWorker.write_captured``): ``bundles/<dir>/policy/``."""

    link: RemoteLink
    dir: str  # ``save_dir``: this save's own directory on the bucket
    deadline_s: float  # checkpoint.remote.bundle_deadline_s

    def prefix(self, store: Store) -> str:
        return store.key(BUNDLES, self.dir, POLICY_DIR)


def save_dir(link: RemoteLink, writer: BundleWriter) -> str:
    """The directory on the bucket of the save ``writer`` writes: the attempt's for the step, and the local fencing
    epoch, which an in-job restore advances — so a step redone after a restore to an older bundle is uploaded
    beside the published one, never over it (the ranks upload before the commit can ask the record)."""
    local = writer.lease.fencing_epoch if writer.lease is not None else 0
    return f"{bundle_dir(writer.step, link.lease.run_id, link.lease.epoch)}.f{local}"


def upload_part(
    store: Store, directory: Path, staged: Mapping[str, int], hashed: Mapping[str, FileRecord], target: PartTarget
) -> dict[str, FileRecord]:
    """Upload every file ``staged`` under ``directory`` (name → size) below ``target``; returns each one's record as
    sent. A file its writer hashed (``hashed``) must go out with exactly those bytes; one it did not (DCP's
    ``.metadata``) is hashed first, so that its object carries its digest too."""
    prefix, deadline = target.prefix(store), time.monotonic() + target.deadline_s
    sent: dict[str, FileRecord] = {}
    for rel in sorted(staged):
        want = hashed.get(rel) or hashing.digest_file(directory / rel, hashing.DEFAULT)
        fd = open_regular(directory / rel)
        try:
            reader = HashingReader(fd, want.alg, deadline, f"{directory / rel}")
            label = hashing.label(want.alg, want.digest)
            store.upload_stream(f"{prefix}/{rel}", reader, digest=label, size=want.size)  # type: ignore[arg-type]
        finally:
            os.close(fd)
        if (reader.hexdigest(), reader.size) != (want.digest, want.size):
            raise PartMismatch(
                f"{directory / rel}: the {reader.size} bytes uploaded differ from the {want.size} its writer hashed; "
                "the save is not published"
            )
        sent[rel] = want
    return sent


def commit_on_bucket(
    store: Store,
    writer: BundleWriter,
    record: dict[str, Any],
    prehashed: dict[str, dict[str, Any]],
    uploaded: Mapping[str, FileRecord],
    *,
    link: RemoteLink,
    hmac_key: bytes | None,
    deadline_s: float,
) -> UploadResult:
    """Seal ``writer``'s tmp dir (``uploaded``: bundle-relative names of the files the ranks uploaded, listed in
    its manifest though not there), publish it on the bucket (the module docstring), then remove the tmp dir."""
    writer.seal(record, prehashed, elsewhere=uploaded)
    result = upload_bundle(store, writer.tmp, link.lease, hmac_key=hmac_key, deadline_s=deadline_s,
                           already=set(uploaded), gate=writer.publishing, name=save_dir(link, writer))  # fmt: skip
    writer.abort()  # the bucket holds it now: the sealed tmp dir goes (under the lease, like any tmp dir)
    return result
