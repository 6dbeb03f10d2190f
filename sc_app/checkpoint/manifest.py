"""manifest.json: the last file of a bundle; lists sha256 + size of every other file and what the bundle holds.

Invariants: a manifest is written only after every file it lists is fsynced; a file is handed to any
deserialiser only after its sha256 matches the manifest; when an HMAC key is configured
(env ``SC_APP_CHECKPOINT_HMAC_KEY``), unsigned or mis-signed manifests are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_app.checkpoint.layout import MANIFEST_FILE
from sc_app.digest import canonical_bytes

FORMAT = "sc-app/bundle"
SCHEMA_VERSION = 1
HMAC_ENV = "SC_APP_CHECKPOINT_HMAC_KEY"


class ManifestError(ValueError):
    """The manifest is missing, unparsable, unsupported or mis-signed; the message names the file."""


def hmac_key_from_env() -> bytes | None:
    value = os.environ.get(HMAC_ENV)
    return value.encode() if value else None


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
    out = dict(doc)
    out["signature"] = {"alg": "hmac-sha256", "value": hmac.new(key, _signable(doc), hashlib.sha256).hexdigest()}
    return out


@dataclass(frozen=True)
class Manifest:
    doc: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.doc["step"])

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return self.doc["files"]

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
    def dataset(self) -> dict[str, Any] | None:
        """The dataset the loader place points into (``task.name=jsonl``): path, sha256 of its bytes, rows."""
        value = self.doc.get("dataset")
        return value if isinstance(value, dict) else None

    def hashes_under(self, directory: str) -> dict[str, str]:
        """sha256 of every listed file under ``directory/``, keyed by its path inside it: what a reader of that
        directory checks before it decodes a byte."""
        prefix = directory.rstrip("/") + "/"
        return {rel[len(prefix) :]: str(info["sha256"]) for rel, info in self.files.items() if rel.startswith(prefix)}


def read_manifest(bundle: Path, *, hmac_key: bytes | None = None) -> Manifest:
    path = bundle / MANIFEST_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest missing (bundle never completed or was tampered with)") from None
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ManifestError(f"{path}: manifest is not valid JSON (truncated or corrupted)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(f"{path}: not an sc-app bundle manifest")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{path}: unknown schema_version {version!r} (this sc-app reads {SCHEMA_VERSION}); "
            "resume it with the sc-app version that wrote it"
        )
    for key in ("step", "files", "replay"):
        if key not in doc:
            raise ManifestError(f"{path}: manifest lacks '{key}'")
    _check_shapes(path, doc)
    if hmac_key is not None:
        sig = doc.get("signature")
        if not isinstance(sig, dict) or sig.get("alg") != "hmac-sha256":
            raise ManifestError(f"{path}: unsigned manifest but an HMAC key is configured ({HMAC_ENV}); refusing")
        want = hmac.new(hmac_key, _signable(doc), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, str(sig.get("value", ""))):
            raise ManifestError(f"{path}: manifest signature does not match the configured key; refusing")
    return Manifest(doc)


def _check_shapes(path: Path, doc: dict[str, Any]) -> None:
    """Valid JSON of the wrong shape (hand-edited, or a flip that kept it parseable) is a ManifestError too."""
    step = doc["step"]
    if not isinstance(step, int) or isinstance(step, bool):
        raise ManifestError(f"{path}: 'step' is {step!r}, not an integer")
    files = doc["files"]
    if not isinstance(files, dict):
        raise ManifestError(f"{path}: 'files' is not a mapping of path -> {{sha256, size}}")
    for rel, info in files.items():
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("sha256"), str)
            or not isinstance(info.get("size"), int)
            or isinstance(info.get("size"), bool)
        ):
            raise ManifestError(f"{path}: entry for '{rel}' is not a {{sha256, size}} record")
    replay = doc["replay"]
    if not isinstance(replay, dict) or not isinstance(replay.get("digest"), str):
        raise ManifestError(f"{path}: 'replay' lacks a digest string")
    if not isinstance(doc.get("compat", {}), dict):
        raise ManifestError(f"{path}: 'compat' is not a mapping")


def render(doc: dict[str, Any], hmac_key: bytes | None) -> bytes:
    full = {"format": FORMAT, "schema_version": SCHEMA_VERSION, **doc}
    if hmac_key is not None:
        full = sign(full, hmac_key)
    return (json.dumps(full, indent=2, sort_keys=True) + "\n").encode()
