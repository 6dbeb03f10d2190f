"""The remote tier's part of ``sc-app k8s status``: when the release's values set ``config.checkpoint.remote.url``,
the bucket's newest bundle that counts (``remote/sync.newest_counting``: listed by the fencing record, manifest as
published, of the record's lineage, every file there with its size — no bytes hashed) and who holds the bucket.

Invariants: only reads the bucket; asked from where ``status`` runs, with boto3's standard credentials there; every
request bounded by ``--request-timeout`` and tried once (a bucket that cannot be reached costs one timeout, not
botocore's five attempts); a bucket that cannot be read is one line in the status, never hiding the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RemoteState:
    url: str
    newest: int | None = None  # the newest bundle that counts (its step)
    newest_dir: str = ""  # its upload directory on the bucket
    published_by: str = ""  # "run R (epoch E) at T"
    holder: str = ""  # "run R (epoch E)": the attempt that holds the bucket
    passed_over: tuple[str, ...] = ()  # newer listed bundles that do not count, with why
    error: str = ""

    def line(self) -> str:
        if self.error:
            return f"bucket {self.url}: {self.error}"
        if self.newest is None:
            why = f" ({len(self.passed_over)} listed, none counts)" if self.passed_over else ""
            held = f"; held by {self.holder}" if self.holder else ""
            return f"newest bundle on {self.url}: none{why}{held}"
        skipped = f"; {len(self.passed_over)} newer do not count" if self.passed_over else ""
        return (f"newest bundle on {self.url}: step {self.newest} ({self.newest_dir}, published by "
                f"{self.published_by}){skipped}; held by {self.holder}")  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "newestStep": self.newest, "newestDir": self.newest_dir or None,
                "publishedBy": self.published_by or None, "holder": self.holder or None,
                "passedOver": list(self.passed_over), "error": self.error or None}  # fmt: skip


def remote_doc(values: dict[str, Any]) -> dict[str, Any] | None:
    """``config.checkpoint.remote`` of the release's values, when it names a bucket."""
    config = values.get("config")
    checkpoint = config.get("checkpoint") if isinstance(config, dict) else None
    remote = checkpoint.get("remote") if isinstance(checkpoint, dict) else None
    return remote if isinstance(remote, dict) and remote.get("url") else None


def remote_state(doc: dict[str, Any], *, request_timeout: float) -> RemoteState:
    """The bucket's newest bundle as ``status`` shows it; problems as ``RemoteState.error`` (one line)."""
    from pydantic import ValidationError

    from sc_app.checkpoint import hmac_key_from_env
    from sc_app.checkpoint.remote.fence import read_record
    from sc_app.checkpoint.remote.record import RecordError
    from sc_app.checkpoint.remote.store import RemoteError, Store, make_client
    from sc_app.checkpoint.remote.sync import newest_counting
    from sc_app.config.remote import RemoteConfig

    url = str(doc.get("url"))
    try:
        cfg = RemoteConfig(**doc)
        cfg = cfg.model_copy(update={"request_timeout_s": min(cfg.request_timeout_s, request_timeout)})
        store = Store(cfg, client=make_client(cfg, attempts=1))
        record, _ = read_record(store)
        if record is None:
            return RemoteState(url, error="no bundle published yet (no fencing record there)")
        bundle, passed = newest_counting(store, record, lineage=record.lineage, hmac_key=hmac_key_from_env())
    except ValidationError as exc:
        return RemoteState(url, error=f"config.checkpoint.remote: {exc.errors()[0]['msg']}")
    except (RemoteError, RecordError, ValueError) as exc:
        return RemoteState(url, error=str(exc))
    holder = f"run {record.run_id} (epoch {record.epoch})"
    if bundle is None:
        return RemoteState(url, holder=holder, passed_over=tuple(passed))
    e = bundle.entry
    return RemoteState(url, e.step, e.dir, f"run {e.run_id} (epoch {e.epoch}) at {e.at}", holder, tuple(passed))
