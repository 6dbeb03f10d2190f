"""The background uploader: bundles committed locally are uploaded and published on the bucket behind training.

One daemon thread per attempt, at the save I/O's lower priority (``sc_app.io.background``), as are the transfer
threads it starts. ``submit(bundle)`` hands it the newest committed bundle; a newer submission supersedes an older
one not yet started (only the newest matters for a resume). A failed upload is logged as one
line and retried with exponential backoff (2 s doubling to 60 s) until it succeeds or a newer bundle supersedes
it. ``RemoteLeaseLost`` (another attempt took the bucket) ends the uploads for this attempt, with one line. After each
bundle published, the bucket's retention runs (``keep``: ``remote/retention.py``). The uploader only ever reads local
bundles.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sc_app.checkpoint.manifest import ManifestError
from sc_app.checkpoint.remote.fence import RemoteLease, RemoteLeaseLost
from sc_app.checkpoint.remote.retention import prune_remote
from sc_app.checkpoint.remote.store import RemoteError, Store
from sc_app.checkpoint.remote.upload import UploadResult, upload_bundle
from sc_app.io.background import lower_current_thread_priority

log = logging.getLogger(__name__)

BACKOFF_S = (2.0, 60.0)


class Uploader:
    def __init__(
        self,
        store: Store,
        lease: RemoteLease,
        *,
        hmac_key: bytes | None,
        deadline_s: float,
        on_result: Callable[[UploadResult], None] = lambda r: None,
        on_failure: Callable[[Path, str], None] = lambda b, why: None,
        backoff_s: tuple[float, float] = BACKOFF_S,
        keep: int | None = None,
    ) -> None:
        self.store, self.lease, self.hmac_key, self.deadline_s = store, lease, hmac_key, deadline_s
        self.on_result, self.on_failure, self.backoff_s = on_result, on_failure, backoff_s
        self.keep = keep  # checkpoint.keep: the bucket's retention after each bundle published (None: none)
        self.results: list[UploadResult] = []
        self.lost: str | None = None
        self.failures = 0
        self._pending: Path | None = None
        self._busy: Path | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="s3-upload")
        self._thread.start()

    def submit(self, bundle: Path) -> None:
        with self._cond:
            self._pending = bundle
            self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return self._pending is None and self._busy is None

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the submitted bundles to be published; True when nothing is left."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._pending is not None or self._busy is not None) and self.lost is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self.lost is None

    def _prune(self) -> None:
        try:
            removed = prune_remote(self.store, self.keep or 1, lineage=self.lease.lineage, hmac_key=self.hmac_key,
                                   lease=self.lease)  # fmt: skip
        except (RemoteError, RemoteLeaseLost) as exc:  # the bundle is published; an old one left is no failure
            log.warning("remote tier: retention did not prune the bucket: %s; older bundles stay", exc)
            return
        if removed:
            log.info("remote tier: pruned %s from the bucket (checkpoint.keep=%d)", ", ".join(removed), self.keep)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)  # an upload in flight is abandoned (daemon thread): never a bundle

    def _run(self) -> None:
        lower_current_thread_priority()  # and the transfer threads it starts: processes that train get the CPU first
        failures = 0
        while True:
            with self._cond:
                while self._pending is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                bundle, self._pending, self._busy = self._pending, None, self._pending
            assert bundle is not None
            try:
                result = upload_bundle(self.store, bundle, self.lease, hmac_key=self.hmac_key,
                                       deadline_s=self.deadline_s)  # fmt: skip
            except RemoteLeaseLost as exc:
                log.error("remote tier: %s", exc)
                with self._cond:
                    self.lost, self._busy = str(exc), None
                    self._cond.notify_all()
                return
            except (RemoteError, ManifestError, OSError) as exc:
                failures += 1
                self.failures += 1
                wait = min(self.backoff_s[0] * 2 ** (failures - 1), self.backoff_s[1])
                log.warning("remote tier: upload of %s failed (%s); retrying in %.0f s", bundle.name, exc, wait)
                self.on_failure(bundle, str(exc))
                with self._cond:
                    if self._pending is None and bundle.exists():  # (local retention may have removed it)
                        self._pending = bundle  # retried unless a newer bundle supersedes it meanwhile
                    self._busy = None
                    self._cond.notify_all()
                    self._cond.wait_for(lambda b=bundle: self._stop or self._pending is not b, timeout=wait)
                continue
            failures = 0
            if result.published and self.keep is not None:
                self._prune()
            self.results.append(result)
            with self._cond:
                self._busy = None
                self._cond.notify_all()
            self.on_result(result)
