"""Start-up checks of the bucket, before Ray starts: each refusal is one line (``RemoteRefused``, exit 2).

Refused: credentials boto3 cannot find or the server does not accept, a bucket that does not exist, one this run
may not write, a server that does not honour conditional writes (a second ``PUT If-None-Match: *`` of one key must
get 412, and so must a ``PUT If-Match`` with an ETag the object does not have: the fencing record relies on both),
a prefix whose fencing record is not sc-app's or is another lineage's than the local directory's.
"""

from __future__ import annotations

import contextlib
import uuid

from sc_app.checkpoint.remote.fence import RemoteRefused, read_record
from sc_app.checkpoint.remote.record import RecordError, RemoteRecord
from sc_app.checkpoint.remote.store import PreconditionFailed, RemoteError, Store
from sc_app.config.remote import RemoteConfig

PROBE_DIR = ".sc-app-probe"


def open_bucket(cfg: RemoteConfig, *, lineage: str | None) -> tuple[Store, RemoteRecord | None]:
    """The bucket's store and its fencing record (None: a fresh prefix), once every check passed."""
    where = cfg.target.url
    try:
        store = Store(cfg)
        record, _ = read_record(store)  # credentials, bucket, read access: the first request says
        if record is not None and lineage is not None and record.lineage != lineage:
            raise RemoteRefused(
                f"{where} holds training lineage {record.lineage}, the checkpoint dir {lineage}: another job writes "
                "there; use another checkpoint.remote.url prefix"
            )
        probe_conditional_writes(store)
    except (RemoteError, RecordError) as exc:
        raise RemoteRefused(f"checkpoint.remote.url={where}: {exc}") from None
    except ValueError as exc:  # e.g. botocore refusing the endpoint or region
        if isinstance(exc, RemoteRefused):
            raise
        raise RemoteRefused(f"checkpoint.remote.url={where}: {exc}") from None
    return store, record


def probe_conditional_writes(store: Store) -> None:
    """Write a probe object, then check that the server refuses to overwrite it under both conditions."""
    key = store.key(PROBE_DIR, uuid.uuid4().hex)
    etag = store.put_small(key, b"probe\n", if_none_match=True)  # AccessDenied: a read-only bucket or credentials
    try:
        etag = _if_match_form(store, key, etag)
        for how, kwargs in (
            ("If-None-Match: *", {"if_none_match": True}),
            ("If-Match with a wrong ETag", {"if_match": '"00000000000000000000000000000000"'}),
        ):
            try:
                store.put_small(key, b"overwritten\n", **kwargs)  # type: ignore[arg-type]
            except PreconditionFailed:
                continue
            raise RemoteRefused(
                f"{store.where(key)}: the server overwrote an object despite {how}; sc-app's fencing on the bucket "
                "needs conditional writes (docs/object-storage.md lists servers that honour them)"
            )
        del etag
    finally:
        with contextlib.suppress(RemoteError):
            store.delete(key)  # the probe's own object; a bucket that forbids deletes keeps a 6-byte file


def _if_match_form(store: Store, key: str, etag: str) -> str:
    """Find the form of ``If-Match`` the server takes with the object's own ETag (quoted as HTTP writes it, else
    bare); refuse a server that takes neither: no compare-and-swap, no fencing."""
    for bare in (False, True):
        store.bare_if_match = bare
        try:
            return store.put_small(key, b"probe 2\n", if_match=etag)
        except PreconditionFailed:
            continue
    store.bare_if_match = False
    raise RemoteRefused(
        f"{store.where(key)}: the server refused a PUT with If-Match of the object's own ETag; sc-app's fencing on "
        "the bucket needs conditional writes (docs/object-storage.md)"
    )
