"""The attempt's side of the remote tier (``checkpoint.remote``, ``docs/object-storage.md``), in the order
``run_job`` calls it:

* ``open_remote`` — before anything is taken or started (before Ray): the bucket's checks (credentials, bucket,
  write access, conditional writes, lineage); a refusal is one line, exit 2 (``RemoteRefused``);
* ``RemoteTier.bring_home`` — before the resume decision: the bucket's newest bundle is downloaded when the local
  directory has no verified bundle as new (then the decision verifies and resumes it like any local one);
* ``RemoteTier.take`` — once this attempt holds the local lease and knows its lineage, before its resume decision:
  take the bucket (epoch + 1), then ``bring_home`` again: a bundle the fenced attempt published after the first look
  comes home too, so the attempt resumes from the bucket's newest as it stays (as a local retry resumes its
  predecessor's newest bundle at the moment it took the lease);
* ``RemoteTier.start`` — start the uploader, which first catches the bucket up with the bundle the attempt resumes
  from;
* ``RemoteTier.progress`` — every bundle published locally is handed to the uploader (behind training); one the
  controller committed on the bucket itself (``checkpoint.remote.parts=direct``: ``link`` is what it needs for
  that) is only counted: nothing of it is local;
* ``RemoteTier.finish`` — at the end: wait up to ``checkpoint.remote.drain_s`` for a run that ended by itself, not
  at all for a stop request (the local bundle is complete; the next attempt catches the bucket up).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sc_app.checkpoint import BundleRules, choose_bundle, hmac_key_from_env
from sc_app.checkpoint.lease import Lease
from sc_app.checkpoint.lineage import read_lineage
from sc_app.checkpoint.remote.fence import RemoteLease, RemoteRefused, acquire, read_record
from sc_app.checkpoint.remote.parts import RemoteLink
from sc_app.checkpoint.remote.probe import open_bucket
from sc_app.checkpoint.remote.record import RemoteRecord
from sc_app.checkpoint.remote.store import RemoteError, Store
from sc_app.checkpoint.remote.sync import BroughtHome, bring_newer
from sc_app.checkpoint.remote.upload import UploadResult
from sc_app.checkpoint.remote.uploader import Uploader
from sc_app.checkpoint.retention import prune
from sc_app.config.app import AppConfig
from sc_app.progress import SaveRecord, UploadRecord

log = logging.getLogger(__name__)


class RemoteUnavailable(RuntimeError):
    """The bucket holds a bundle newer than anything local and it could not be downloaded now (exit 1: a rerun may
    succeed); resuming from something older would redo work and let retention count the bucket's bundle anyway."""


@dataclass
class RemoteTier:
    cfg: AppConfig
    root: Path
    store: Store
    record: RemoteRecord | None
    uploader: Uploader | None = None
    shown: Callable[[Any], None] = field(default=lambda r: None)  # the run's own on_progress
    newest_local: int = 0  # the newest bundle published locally (or resumed from)
    newest_remote: int = 0  # the newest published on the bucket
    lease: RemoteLease | None = None  # once this attempt took the bucket
    _done: queue.SimpleQueue[UploadRecord] = field(default_factory=queue.SimpleQueue)

    def watch(self, calls: Any) -> Any:
        """``calls`` (``JobCallbacks``) whose ``on_progress`` also feeds the uploader and reports its uploads
        (``UploadRecord``, from the caller's thread: the uploader thread only queues them)."""
        self.shown = calls.on_progress
        return replace(calls, on_progress=self.progress)

    def link(self) -> RemoteLink | None:
        """What the controller and the trainer ranks need to commit bundles on the bucket themselves; None unless
        ``checkpoint.remote.parts=direct`` (or before this attempt took the bucket)."""
        if self.cfg.checkpoint.remote.parts != "direct" or self.lease is None:
            return None
        return RemoteLink(self.lease, self.store.bare_if_match)

    def lineage(self) -> str | None:
        """The bucket's lineage: what a checkpoint dir without one (an emptyDir whose predecessor took the bucket
        but never published) adopts, so the job can take the bucket again."""
        return self.record.lineage if self.record is not None else None

    def bring_home(self, rules: BundleRules) -> BroughtHome | None:
        def local_newest() -> int | None:
            plan = choose_bundle(rules, tidy=False)
            return plan.step if plan.decision == "resume" else None

        lineage = read_lineage(self.root) if self.root.is_dir() else None
        try:
            return bring_newer(self.store, self.record, self.root, local_newest=local_newest,
                               lineage=lineage or (self.record.lineage if self.record else None),
                               hmac_key=hmac_key_from_env(),
                               concurrency=self.cfg.checkpoint.remote.max_concurrency)  # fmt: skip
        except (RemoteError, OSError) as exc:  # never resume from something older than the bucket holds
            raise RemoteUnavailable(
                f"checkpoint.remote.url={self.cfg.checkpoint.remote.url}: could not bring the bucket's newest bundle "
                f"home ({exc}); nothing was started: rerun when the bucket (and the disk) can be used"
            ) from None

    def bring_newest_home(self, rules: BundleRules, lease: Lease | None) -> None:
        """``checkpoint.remote.parts=direct``, before an in-job restore: the bucket's newest bundle (this attempt
        commits its bundles there alone) brought home; then the local directory's retention, by the bucket's rule
        (``checkpoint.keep``): the head's disk holds at most that many bundles brought home, not one per restore."""
        try:
            self.record = read_record(self.store)[0]
        except RemoteError as exc:
            raise RemoteUnavailable(
                f"checkpoint.remote.url={self.cfg.checkpoint.remote.url}: an in-job restore could not read the "
                f"bucket's record ({exc}); the attempt ends: rerun to resume from the bucket's newest bundle"
            ) from None
        brought = self.bring_home(rules)
        if brought is not None and lease is not None:
            with lease.held():
                prune(self.root, self.cfg.checkpoint.keep, newest_verified=brought.path, expected_lineage=rules.lineage)

    def take(self, run_id: str, lineage: str) -> bool:
        """Take the bucket (epoch + 1): the attempt that held it publishes nothing more. Then re-read its record;
        True when it lists a bundle newer than at the first look (published by the attempt just fenced, after
        ``bring_home`` looked): the caller brings it home before its resume decision."""
        remote = self.cfg.checkpoint.remote
        before = max((b.step for b in self.record.bundles), default=-1) if self.record else -1
        try:
            self.lease = acquire(self.store, run_id, lineage)
            self.record = read_record(self.store)[0]
        except RemoteError as exc:
            raise RemoteRefused(f"checkpoint.remote.url={remote.url}: cannot take the bucket ({exc})") from None
        return max((b.step for b in self.record.bundles), default=-1) > before if self.record else False

    def start(self, run_id: str, lineage: str, resumed: Path | None) -> None:
        """Start the uploader (taking the bucket first, unless ``take`` did), catching the bucket up with
        ``resumed``."""
        remote = self.cfg.checkpoint.remote
        if self.lease is None:
            self.take(run_id, lineage)
        lease = self.lease
        assert lease is not None
        published = [b.step for b in self.record.bundles] if self.record else []
        self.newest_remote = max(published, default=0)
        self.uploader = Uploader(
            self.store,
            lease,
            hmac_key=hmac_key_from_env(),
            deadline_s=remote.bundle_deadline_s,
            on_result=self._uploaded,
            on_failure=self._failed,
            keep=self.cfg.checkpoint.keep,  # the bucket's retention, by the local tier's rules
        )
        if resumed is not None:
            self.newest_local = max(self.newest_local, int(resumed.name.removeprefix("step_")))
            self.uploader.submit(resumed)  # catch the bucket up (nothing is uploaded when it lists the step)

    def _uploaded(self, result: UploadResult) -> None:  # the uploader's thread
        self.newest_remote = max(self.newest_remote, result.step)
        if result.published:
            lag = max(0, self.newest_local - self.newest_remote)
            self._done.put(UploadRecord(result.step, f"step_{result.step}", result.bytes, result.seconds, lag))

    def _failed(self, bundle: Path, why: str) -> None:  # the uploader's thread
        lag = max(0, self.newest_local - self.newest_remote)
        step = int(bundle.name.removeprefix("step_")) if bundle.name.startswith("step_") else 0
        self._done.put(UploadRecord(step, bundle.name, 0, 0.0, lag, error=why))

    def progress(self, record: Any) -> None:
        """Every progress record of the run: a published bundle (``SaveRecord``) goes to the uploader; then the
        record, then the uploads that ended since, are shown."""
        if isinstance(record, SaveRecord) and record.on_bucket:
            self.newest_local = self.newest_remote = max(self.newest_remote, record.step)
            self._done.put(UploadRecord(record.step, record.bundle, record.uploaded_bytes, record.seconds, 0))
        elif isinstance(record, SaveRecord) and self.uploader is not None:
            self.newest_local = max(self.newest_local, record.step)
            self.uploader.submit(self.root / record.bundle)
        self.shown(record)
        self._flush()

    def _flush(self) -> None:
        while True:
            try:
                self.shown(self._done.get_nowait())
            except queue.Empty:
                return

    def finish(self, *, wait: bool) -> None:
        if self.uploader is None:
            return
        # a fenced uploader (another attempt took the bucket) said so in its one line: nothing is left to wait for
        if wait and not self.uploader.drain(self.cfg.checkpoint.remote.drain_s) and self.uploader.lost is None:
            log.warning("remote tier: the newest bundle is not on the bucket yet (checkpoint.remote.drain_s=%g); the "
                        "next attempt uploads it", self.cfg.checkpoint.remote.drain_s)  # fmt: skip
        self.uploader.stop()
        self._flush()


def open_remote(cfg: AppConfig, root: Path) -> RemoteTier | None:
    """The bucket checked and opened, or None when the run has no remote tier. ``RemoteRefused``: one line."""
    if not cfg.checkpoint.enabled or not cfg.checkpoint.remote.enabled:
        return None
    lineage = read_lineage(root) if root.is_dir() else None
    store, record = open_bucket(cfg.checkpoint.remote, lineage=lineage)
    return RemoteTier(cfg, root, store, record)
