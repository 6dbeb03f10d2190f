"""manifest.json: the last file of a bundle; lists the digest + size of every other file and what the bundle holds.

Schema 2 (written now) names its file hash algorithm (``hash_alg``: blake3 by default, ``sc_app.io.hashing``) and
lists ``{"digest", "size"}`` per file; schema 1 (bundles written before) lists ``{"sha256", "size"}`` and is still
read: ``Manifest.files`` gives both as ``{"digest", "size"}`` and ``Manifest.hash_alg`` says which algorithm.
The HMAC signature (``hmac-sha256-bytes``, written now) covers the file's *bytes*: everything before the
signature, which ``render`` appends as the document's last member in one fixed form, so what is signed is exactly
what every reader parses. Manifests signed before (``hmac-sha256``: the canonical form of the parsed document) still
verify — no valid bundle on disk becomes unverifiable — and a document with a key twice is refused before any
signature is looked at (``strict_json.parse``), so neither form can be read two ways. ``schema_version`` must be
the integer itself (``2.0``, ``2e0`` and ``true`` are refused: no numeric coercion where the schema says int).

Invariants: a manifest is written only after every file it lists is fsynced; a file is handed to any
deserialiser only after its digest matches the manifest; when an HMAC keyring is configured
(``sc_app.checkpoint.hmac_keys``: a mounted key file, or the deprecated env ``SC_APP_CHECKPOINT_HMAC_KEY``), unsigned
or mis-signed manifests are refused. A signature names its key's id (``key_id``): the ring's key of that id checks
it, and a manifest signed before key ids existed verifies with any key of the ring, so a rotated ring (a newer key
added, the old ones kept) verifies every bundle it verified before. A manifest is read only as a
regular file of at most ``MAX_MANIFEST_BYTES`` and accepted only with exactly the keys and types of
``ManifestDoc`` (every path it lists is checked by the verifier, ``sc_app.checkpoint.verify``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from sc_app.checkpoint.hmac_keys import HMAC_ENV as HMAC_ENV
from sc_app.checkpoint.hmac_keys import HMAC_FILE_ENV, HmacKey, Keyring, key_id, keyring_from_env
from sc_app.checkpoint.hmac_keys import HmacKeyError as HmacKeyError
from sc_app.checkpoint.layout import MANIFEST_FILE
from sc_app.io import hashing
from sc_app.io.digest import canonical_bytes
from sc_app.io.safe_files import FileProblem, read_regular
from sc_app.io.strict_json import Hex64, Name, NonNegInt, PosInt, Scalar, SchemaError, StrictModel, parse, validate

MANIFEST_FORMAT = "sc-app/bundle"
SCHEMA_VERSION = 2  # written now: names its file hash algorithm
READABLE_VERSIONS = (1, 2)  # 1: sha256 digests under "sha256", no hash_alg
MAX_MANIFEST_BYTES = 64 * 1024 * 1024  # ~150 bytes per listed file
KEY_ID = re.compile(r"[0-9a-f]{16}")


class ManifestError(ValueError):
    """The manifest is missing, unparsable, unsupported or mis-signed; the message names the file."""


def hmac_key_from_env() -> Keyring | None:
    """This process's HMAC keyring (``hmac_keys.keyring_from_env``); None only when no key source is set."""
    return keyring_from_env()


SIG_BYTES = "hmac-sha256-bytes"  # signs the manifest file's bytes (written now)
SIG_DOC = "hmac-sha256"  # signed the canonical form of the parsed document (bundles written before: still read)
_SIG_TAIL = ',\n  "signature": {{"alg": "{alg}", "value": "{value}"}}\n}}\n'  # before key ids
_SIG_TAIL_KID = ',\n  "signature": {{"alg": "{alg}", "key_id": "{kid}", "value": "{value}"}}\n}}\n'


def _signed_tail(value: str, kid: str | None = None) -> bytes:
    """The exact bytes ``render`` ends a signed manifest with (the signature member and the closing brace); the
    key id is a label outside the signed bytes: a changed id only picks another key, whose HMAC cannot match."""
    if kid is None:
        return _SIG_TAIL.format(alg=SIG_BYTES, value=value).encode()
    return _SIG_TAIL_KID.format(alg=SIG_BYTES, kid=kid, value=value).encode()


def _signable(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "signature"}
    return canonical_bytes(_ints_only(body))


def _ints_only(obj: Any) -> Any:
    """Floats (e.g. timings) are rendered as strings for the canonical signed form."""
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, dict):
        return {k: _ints_only(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_ints_only(v) for v in obj]
    return obj


def sign(doc: dict[str, Any], key: bytes) -> dict[str, Any]:
    """``doc`` signed the way bundles were before ``render`` signed bytes (``SIG_DOC``): no longer written by
    sc-app; kept so the tests can make such manifests and prove they still verify."""
    out = dict(doc)
    out["signature"] = {"alg": SIG_DOC, "value": hmac.new(key, _signable(doc), hashlib.sha256).hexdigest()}
    return out


@dataclass(frozen=True)
class Manifest:
    doc: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.doc["step"])

    @property
    def hash_alg(self) -> str:
        """The algorithm of every file digest (``sc_app.io.hashing``): sha256 for schema 1, which names none."""
        return str(self.doc.get("hash_alg", hashing.LEGACY))

    @cached_property
    def files(self) -> dict[str, dict[str, Any]]:
        """bundle-relative path → ``{"digest", "size"}`` (of ``hash_alg``), whichever schema the file has."""
        files = self.doc["files"]
        if self.doc.get("schema_version") == 1:
            return {rel: {"digest": e["sha256"], "size": e["size"]} for rel, e in files.items()}
        return files

    def expected(self, rel: str) -> str:
        """The digest of ``rel`` labelled with its algorithm (``hashing.label``): what a reader checks bytes with."""
        return hashing.label(self.hash_alg, str(self.files[rel]["digest"]))

    @property
    def replay_digest(self) -> str:
        return str(self.doc["replay"]["digest"])

    @property
    def compat(self) -> dict[str, Any]:
        return self.doc.get("compat", {})

    @property
    def run_id(self) -> str | None:
        return self.doc.get("run_id")

    @property
    def lineage(self) -> str | None:
        """The training lineage that wrote the bundle; ``None`` for bundles written before lineages existed."""
        return self.doc.get("lineage")

    @property
    def policy_format(self) -> str | None:
        """The policy format recorded, ``None`` for the default (``sc_app.checkpoint.policy_formats``)."""
        return self.doc.get("policy_format")

    @property
    def dataset(self) -> dict[str, Any] | None:
        """The dataset the loader place points into (``task.name=jsonl``): path, sha256 of its bytes, rows."""
        value = self.doc.get("dataset")
        return value if isinstance(value, dict) else None

    def hashes_under(self, directory: str) -> dict[str, str]:
        """The labelled digest (``hashing.label``) of every listed file under ``directory/``, keyed by its path
        inside it: what a reader of that directory checks before it decodes a byte."""
        prefix = directory.rstrip("/") + "/"
        return {rel[len(prefix) :]: self.expected(rel) for rel in self.files if rel.startswith(prefix)}


class FileEntry(StrictModel):
    digest: Hex64
    size: NonNegInt


class FileEntryV1(StrictModel):
    sha256: Hex64
    size: NonNegInt


class ReplayRecord(StrictModel):
    digest: Hex64
    groups: NonNegInt | None = None
    rows: NonNegInt | None = None
    partition: Name | None = None
    group_size: PosInt | None = None


class LoaderRecord(StrictModel):
    next_index: NonNegInt
    reissue: NonNegInt


class KeptStep(StrictModel):
    """One train step the bundle covers, kept for the run log (``progress.step_summary``): null for non-finite."""

    step: PosInt
    reward: float | None = None
    loss: float | None = None
    staleness: float | None = None
    rows_held: NonNegInt | None = None
    step_seconds: float | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    weights_version: int | None = None


class DatasetEntry(StrictModel):
    """The ``task.name: jsonl`` file a bundle was cut with: a resume with other bytes is refused."""

    path: Name
    sha256: Hex64
    rows: PosInt


class Signature(StrictModel):
    alg: Literal["hmac-sha256-bytes", "hmac-sha256"]
    key_id: str | None = None  # the signing key's id (hmac_keys.key_id); absent in manifests signed before
    value: str


class _ManifestBody(StrictModel):
    """Every key a manifest may hold besides its schema version and files, with its type: anything else is refused (a
    newer layout bumps ``schema_version``). ``lineage`` (the directory's training lineage), ``policy_format`` (which
    policy checker applies, ``sc_app.checkpoint.policy_formats``), ``steps`` (the steps since the previous bundle,
    for the run log) and ``dataset`` (the file a ``task.name=jsonl`` loader place points into) are absent from
    bundles written before they existed, and ``dataset`` from bundles of tasks without a file."""

    format: Literal["sc-app/bundle"]
    step: NonNegInt
    replay: ReplayRecord
    compat: dict[str, Scalar | list[Scalar]] = {}
    versions: dict[str, str] = {}
    run_id: Name | None = None
    epoch: int | None = None
    created_at: str | None = None
    trainer_version: int | None = None
    loader: LoaderRecord | None = None
    lineage: Name | None = None
    policy_format: Name | None = None
    steps: list[KeptStep] = []  # the steps since the previous bundle (run-log recovery); absent in older bundles
    dataset: DatasetEntry | None = None
    signature: Signature | None = None


class ManifestDoc(_ManifestBody):
    """Schema 2 (written now): the file hash algorithm named, ``{"digest", "size"}`` per file."""

    schema_version: Literal[2]
    hash_alg: Literal["blake3", "sha256"]
    files: dict[str, FileEntry]


class ManifestDocV1(_ManifestBody):
    """Schema 1 (bundles written before the algorithm was named): sha256, ``{"sha256", "size"}`` per file."""

    schema_version: Literal[1]
    files: dict[str, FileEntryV1]


def read_manifest(bundle: Path, *, hmac_key: HmacKey | None = None) -> Manifest:
    """The manifest of ``bundle`` (read as a regular file, never through a link), checked in full."""
    path = bundle / MANIFEST_FILE
    try:
        raw = read_regular(path, MAX_MANIFEST_BYTES)
    except FileProblem as exc:
        if str(exc).endswith(": missing"):
            raise ManifestError(f"{path}: manifest missing (bundle never completed or was tampered with)") from None
        raise ManifestError(str(exc)) from None
    return parse_manifest(raw, path, hmac_key=hmac_key)


def parse_manifest(raw: bytes, path: Path, *, hmac_key: HmacKey | None = None) -> Manifest:
    """``raw`` (the bytes of ``path``) as a manifest: JSON, then format and version, then the full schema, then the
    signature when a key is configured. Any failure is a ``ManifestError`` naming ``path``."""
    try:
        doc = parse(raw)
    except ValueError as exc:
        raise ManifestError(f"{path}: manifest is {exc} (truncated or corrupted)") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path}: not an sc-app bundle manifest")
    version = doc.get("schema_version")
    if type(version) is not int or version not in READABLE_VERSIONS:  # not 2.0, 2e0 or true
        raise ManifestError(
            f"{path}: unknown schema_version {version!r} (this sc-app reads {', '.join(map(str, READABLE_VERSIONS))}); "
            "resume it with the sc-app version that wrote it"
        )
    for key in ("step", "files", "replay"):
        if key not in doc:
            raise ManifestError(f"{path}: manifest lacks '{key}'")
    try:
        validate(ManifestDocV1 if version == 1 else ManifestDoc, doc)
    except SchemaError as exc:
        raise ManifestError(f"{path}: manifest does not have the schema of an sc-app bundle ({exc})") from None
    if hmac_key is not None:
        _check_signature(raw, doc, path, Keyring.of(hmac_key))
    return Manifest(doc)


def _check_signature(raw: bytes, doc: dict[str, Any], path: Path, ring: Keyring) -> None:
    sig = doc.get("signature")
    if not isinstance(sig, dict) or sig.get("alg") not in (SIG_BYTES, SIG_DOC):
        raise ManifestError(f"{path}: unsigned manifest but an HMAC key is configured ({HMAC_FILE_ENV}); refusing")
    value = str(sig.get("value", ""))
    kid = sig.get("key_id")
    if kid is not None and not KEY_ID.fullmatch(str(kid)):
        raise ManifestError(f"{path}: manifest signature has a malformed key_id {kid!r}; refusing")
    if sig["alg"] == SIG_BYTES:
        tail = _signed_tail(value, kid)
        # the signature must be the last member in render's exact form; everything before it is what was signed
        signed = raw[: -len(tail)] + b"\n}" if raw.endswith(tail) else None
    else:
        signed = _signable(doc)
    if kid is not None:
        key = ring.by_id(kid)
        if key is None:
            raise ManifestError(
                f"{path}: manifest signature is by key id {kid}, which is not in the keyring "
                f"(ids {', '.join(ring.ids)}); add that key to the ring as an older key ({HMAC_FILE_ENV}): "
                "rotating keeps the old ones"
            )
        candidates: tuple[bytes, ...] = (key,)
    else:
        candidates = ring.keys  # signed before key ids: any key of the ring
    ok = signed is not None and any(
        hmac.compare_digest(hmac.new(k, signed, hashlib.sha256).hexdigest(), value) for k in candidates
    )
    if not ok:
        raise ManifestError(
            f"{path}: manifest signature does not match the configured key (or the signed bytes were changed); refusing"
        )


def render(doc: dict[str, Any], hmac_key: HmacKey | None) -> bytes:
    """The manifest file's bytes; ``doc`` holds ``hash_alg`` and ``files`` as ``{"digest", "size"}``. With a key
    (or a ring: its newest key signs), the HMAC of the unsigned rendering (up to its closing brace) is appended as
    the last member, ``signature``, with the signing key's id."""
    full = {"format": MANIFEST_FORMAT, "schema_version": SCHEMA_VERSION, **doc}
    full.pop("signature", None)
    body = json.dumps(full, indent=2, sort_keys=True)  # ends with "\n}"
    if hmac_key is None:
        return (body + "\n").encode()
    key = Keyring.of(hmac_key).signing
    value = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    return body[: -len("\n}")].encode() + _signed_tail(value, key_id(key))
