"""The bucket's fencing record, ``<prefix>/LEASE``: the remote twin of the local ``LEASE`` *and* ``LINEAGE``, and the
list of the bundles published to the bucket. Pure: no boto3, no Ray.

One JSON object, rewritten only with a conditional PUT (``If-None-Match: *`` when there is none, ``If-Match:
<the ETag read>`` otherwise), so every change is a compare-and-swap on one object:

* an attempt takes the bucket by writing ``epoch + 1`` with its run id (the newest attempt wins, as locally);
* it publishes a bundle by adding it to ``bundles`` *only while the record it read still names it* — an attempt
  that was superseded meanwhile gets 412 (the ETag changed), so its upload never becomes a bundle;
* ``lineage`` is written by the first attempt and never changed: a run of another lineage is refused;
* ``sc-app ckpt rollback --remote`` moves the bundles newer than its target from ``bundles`` to ``quarantined``
  (their objects stay where they are: nothing is deleted, nothing counts or resumes from there).

A bundle on the bucket counts only when this record lists it, its ``manifest.json`` is there with the digest the
record names, and every file the manifest lists has its size (and, verified, its digest).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sc_app.io import strict_json

RECORD_FORMAT = "sc-app/remote-lease"
MAX_RECORD_BYTES = 1024 * 1024
MAX_LISTED = 1000  # the newest bundles the record lists (a bundle dropped from it stays on the bucket, uncounted)


class RecordError(ValueError):
    """The bucket's LEASE object is not a record sc-app wrote; one line naming it and what to do."""


@dataclass(frozen=True)
class Published:
    """One bundle on the bucket: its step, its directory under ``<prefix>/bundles/``, the BLAKE3 digest of its
    manifest's bytes, and the attempt that published it."""

    step: int
    dir: str
    manifest: str
    run_id: str
    epoch: int
    at: str


@dataclass(frozen=True)
class Quarantined:
    """A bundle a rollback took out of the record's ``bundles``: its objects stay on the bucket, uncounted."""

    bundle: Published
    why: str
    moved_at: str


@dataclass(frozen=True)
class RemoteRecord:
    lineage: str
    run_id: str
    epoch: int
    acquired_at: str
    bundles: tuple[Published, ...] = ()
    previous: dict[str, Any] | None = field(default=None)
    quarantined: tuple[Quarantined, ...] = ()

    def newest_first(self) -> list[Published]:
        return sorted(self.bundles, key=lambda b: b.step, reverse=True)

    def published(self, step: int) -> Published | None:
        return next((b for b in self.bundles if b.step == step), None)

    def taken_by(self, run_id: str, at: str) -> RemoteRecord:
        """The record once ``run_id`` took the bucket: one epoch on, the bundles kept."""
        prev = {"run_id": self.run_id, "epoch": self.epoch}
        return replace(self, run_id=run_id, epoch=self.epoch + 1, acquired_at=at, previous=prev)

    def with_bundle(self, entry: Published) -> RemoteRecord:
        kept = [b for b in self.bundles if b.step != entry.step]
        listed = sorted([*kept, entry], key=lambda b: b.step)[-MAX_LISTED:]
        return replace(self, bundles=tuple(listed))

    def without(self, entries: list[Published]) -> RemoteRecord:
        return replace(self, bundles=tuple(b for b in self.bundles if b not in entries))

    def quarantine(self, entries: list[Published], why: str, at: str) -> RemoteRecord:
        """``entries`` out of ``bundles`` and into ``quarantined`` (the newest ``MAX_LISTED`` kept there)."""
        moved = [*self.quarantined, *(Quarantined(e, why, at) for e in entries)][-MAX_LISTED:]
        return replace(self.without(entries), quarantined=tuple(moved))

    def to_json(self) -> bytes:
        doc = {"format": RECORD_FORMAT, **asdict(self)}
        doc["bundles"] = [asdict(b) for b in self.bundles]
        if not self.quarantined:  # a record without a rollback reads as before (older sc-app ignores the key)
            del doc["quarantined"]
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, where: str, raw: bytes) -> RemoteRecord:
        def bad(why: str) -> RecordError:
            return RecordError(
                f"{where}: not an sc-app remote lease record ({why}); if no job writes to this prefix, move the "
                "object aside (copy it to LEASE.bad and delete it) or use another prefix"
            )

        if len(raw) > MAX_RECORD_BYTES:
            raise bad(f"{len(raw)} bytes")
        try:
            doc = strict_json.parse(raw)
        except ValueError as exc:
            raise bad(str(exc)) from None
        if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
            raise bad("no sc-app format")
        try:
            bundles = tuple(_published(b) for b in doc.get("bundles", []))
            quarantined = tuple(_quarantined(q) for q in doc.get("quarantined", []))
            record = cls(
                lineage=_typed(doc, "lineage", str),
                run_id=_typed(doc, "run_id", str),
                epoch=_typed(doc, "epoch", int),
                acquired_at=_typed(doc, "acquired_at", str),
                bundles=bundles,
                previous=doc.get("previous") if isinstance(doc.get("previous"), dict) else None,
                quarantined=quarantined,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(str(exc.args[0]) if exc.args else type(exc).__name__) from None
        if record.epoch < 1 or not record.lineage:
            raise bad("epoch must be >= 1 and lineage non-empty")
        return record


def _typed(doc: dict[str, Any], key: str, kind: type) -> Any:
    if key not in doc:
        raise KeyError(f"'{key}' missing")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"'{key}' is {value!r}")
    return value


def _published(doc: Any) -> Published:
    if not isinstance(doc, dict):
        raise TypeError("a bundle entry is not an object")
    entry = Published(
        step=_typed(doc, "step", int),
        dir=_typed(doc, "dir", str),
        manifest=_typed(doc, "manifest", str),
        run_id=_typed(doc, "run_id", str),
        epoch=_typed(doc, "epoch", int),
        at=_typed(doc, "at", str),
    )
    if "/" in entry.dir or entry.dir in ("", ".", "..") or len(entry.manifest) != 64:
        raise ValueError(f"bundle entry {entry.dir!r} is not a directory name with a 64-hex manifest digest")
    return entry


def _quarantined(doc: Any) -> Quarantined:
    if not isinstance(doc, dict):
        raise TypeError("a quarantined entry is not an object")
    return Quarantined(_published(doc.get("bundle")), _typed(doc, "why", str), _typed(doc, "moved_at", str))


def bundle_dir(step: int, run_id: str, epoch: int) -> str:
    """The directory of one attempt's upload of ``step``: a superseded attempt never writes into its successor's."""
    return f"step_{step}.{run_id}.e{epoch}"
