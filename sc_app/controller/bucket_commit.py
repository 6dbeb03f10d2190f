"""The controller's half of a save committed on the bucket (``checkpoint.remote.parts=direct``,
``sc_app.checkpoint.remote.parts``): the ranks that do not see the directory are told where to upload their part,
their uploads are noted, and the sealed bundle is published on the bucket, then the bucket's retention runs.

Invariant: one ``BucketCommit`` per controller, one save at a time through it (``SaveCoordinator``'s rule); the
files noted are those of the save in flight only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sc_app.checkpoint import hmac_key_from_env
from sc_app.checkpoint.layout import POLICY_DIR
from sc_app.checkpoint.node_parts import PolicyPart
from sc_app.checkpoint.remote.fence import RemoteLeaseLost
from sc_app.checkpoint.remote.parts import PartTarget, RemoteLink, commit_on_bucket, save_dir
from sc_app.checkpoint.remote.retention import prune_remote
from sc_app.checkpoint.remote.store import RemoteError
from sc_app.checkpoint.remote.upload import UploadResult
from sc_app.checkpoint.writer import BundleWriter, FileRecord
from sc_app.config.app import AppConfig

log = logging.getLogger(__name__)


class BucketCommit:
    def __init__(self, cfg: AppConfig, link: RemoteLink) -> None:
        self.cfg, self.link = cfg, link
        self.store = link.store(cfg.checkpoint.remote)
        self._uploaded: dict[str, FileRecord] = {}

    def target(self, writer: BundleWriter) -> PartTarget:
        return PartTarget(self.link, save_dir(self.link, writer), self.cfg.checkpoint.remote.bundle_deadline_s)

    def note(self, parts: Sequence[PolicyPart]) -> None:
        """The ranks' answers for the save in flight: the files they uploaded themselves (bundle-relative)."""
        self._uploaded = {f"{POLICY_DIR}/{rel}": rec for p in parts if p.uploaded for rel, rec in p.files.items()}

    def publish(
        self, writer: BundleWriter, record: dict[str, Any], prehashed: dict[str, dict[str, Any]]
    ) -> UploadResult:
        """Seal and publish the save in flight on the bucket; then the bucket's retention (a failure there is a
        warning: the bundle is published). The result counts the ranks' uploads in its bytes."""
        uploaded, self._uploaded = self._uploaded, {}
        remote = self.cfg.checkpoint.remote
        result = commit_on_bucket(self.store, writer, record, prehashed, uploaded, link=self.link,
                                  hmac_key=hmac_key_from_env(), deadline_s=remote.bundle_deadline_s)  # fmt: skip
        try:
            removed = prune_remote(self.store, self.cfg.checkpoint.keep, lineage=self.link.lease.lineage,
                                   hmac_key=hmac_key_from_env(), lease=self.link.lease)  # fmt: skip
        except (RemoteError, RemoteLeaseLost) as exc:
            log.warning("remote tier: retention did not prune the bucket: %s; older bundles stay", exc)
        else:
            if removed:
                log.info("remote tier: pruned %s from the bucket (checkpoint.keep=%d)", ", ".join(removed),
                         self.cfg.checkpoint.keep)  # fmt: skip
        return replace(result, bytes=result.bytes + sum(rec.size for rec in uploaded.values()))
