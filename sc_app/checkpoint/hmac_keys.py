"""The HMAC keyring of bundle manifests: where the keys come from, which one signs, and each key's id.

A keyring is every key a bundle on the volume may have been signed with; the newest signs, all of them verify.
Rotating a key is adding a newer one to the ring (and keeping the old ones while a bundle signed with them is kept),
never a refusal of the bundles already written. Each manifest names its signer's key id next to the signature
(``manifest.render``); a manifest without one (written before key ids) verifies with any key of the ring.

Sources, one of:

* ``SC_APP_CHECKPOINT_HMAC_KEY_FILE`` — a file (one key per line; the last line signs) or a directory (each regular
  file one key, its bytes without the trailing newline; files starting with "." are skipped — a mounted Secret's
  ``..data`` links; the name that sorts last signs). The chart mounts the Secret here, so no Ray process sees the key
  in its environment, only the path.
* ``SC_APP_CHECKPOINT_HMAC_KEY`` — one key as an environment variable: deprecated (every process of the job, the
  Ray workers and a debug shell see it), still honoured.

Both set is refused (which one is meant is unknowable); set but empty/unreadable is ``HmacKeyError``: signing is
never silently off. Pure: no Ray, no torch.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sc_app.config.input import ConfigError

log = logging.getLogger(__name__)

HMAC_ENV = "SC_APP_CHECKPOINT_HMAC_KEY"
HMAC_FILE_ENV = "SC_APP_CHECKPOINT_HMAC_KEY_FILE"
KEY_ID_HEX = 16  # 8 bytes of a digest: a label for a key, not a secret
MAX_KEY_FILE_BYTES = 64 * 1024


class HmacKeyError(ConfigError):
    """The HMAC key source is set but unusable (empty, not UTF-8, unreadable, both sources set): one line, exit 2."""


def key_id(key: bytes) -> str:
    """The id a manifest names its signing key by: the first bytes of a domain-separated SHA-256 of the key."""
    return hashlib.sha256(b"sc-app/hmac-key-id\0" + key).hexdigest()[:KEY_ID_HEX]


@dataclass(frozen=True)
class Keyring:
    """Keys oldest first; the last one signs. ``Keyring.of(b"k")`` is a ring of one."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a keyring holds at least one key")

    @classmethod
    def of(cls, key: bytes | Keyring) -> Keyring:
        return key if isinstance(key, Keyring) else cls((key,))

    @property
    def signing(self) -> bytes:
        return self.keys[-1]

    @property
    def ids(self) -> list[str]:
        return [key_id(k) for k in self.keys]

    def by_id(self, kid: str) -> bytes | None:
        return next((k for k in self.keys if key_id(k) == kid), None)


HmacKey = bytes | Keyring  # what signers and verifiers accept: one key (a ring of one) or a ring


def _decode(raw: bytes, where: str) -> bytes:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HmacKeyError(f"{where} is not UTF-8 text; write the signing key as text") from None
    return raw


def _read(path: Path, where: str) -> bytes:
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise HmacKeyError(f"{where}: cannot read the HMAC key ({exc.strerror}); mount the key Secret there") from None
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise HmacKeyError(f"{where} is over {MAX_KEY_FILE_BYTES} bytes: not a key file")
    return _decode(raw, where)


def ring_from_path(path: Path) -> Keyring:
    """The keyring at ``path``: a directory of key files or a file of key lines (see the module doc)."""
    where = f"{HMAC_FILE_ENV}={path}"
    if path.is_dir():
        names = sorted(p.name for p in path.iterdir() if not p.name.startswith(".") and (path / p.name).is_file())
        keys = [_read(path / n, f"{where}/{n}").rstrip(b"\r\n") for n in names]
        empty = [n for n, k in zip(names, keys, strict=True) if not k.strip()]
        if empty:
            raise HmacKeyError(f"{where}: key file(s) {', '.join(empty)} are empty; remove them or write the key")
    elif path.exists():
        keys = [line for line in _read(path, where).splitlines() if line.strip()]
    else:
        raise HmacKeyError(f"{where} does not exist; mount the key Secret there, or unset it to turn signing off")
    if not keys:
        raise HmacKeyError(f"{where} holds no key; write the signing key, or unset it to turn signing off")
    return Keyring(tuple(keys))


_warned = False


def keyring_from_env(environ: dict[str, str] | os._Environ[str] | None = None) -> Keyring | None:
    """This process's keyring; None only when neither source is set (manifests hashed, not signed)."""
    global _warned
    env = os.environ if environ is None else environ
    path, value = env.get(HMAC_FILE_ENV), env.get(HMAC_ENV)
    if path is not None and value is not None:
        raise HmacKeyError(
            f"both {HMAC_FILE_ENV} and {HMAC_ENV} are set; keep the file (put the old key in it as an older line) "
            f"and unset {HMAC_ENV}"
        )
    if path is not None:
        if not path.strip():
            raise HmacKeyError(f"{HMAC_FILE_ENV} is set but empty; set it to the key file, or unset it")
        return ring_from_path(Path(path))
    if value is None:
        return None
    try:
        key = value.encode("utf-8")
    except UnicodeEncodeError:
        raise HmacKeyError(
            f"{HMAC_ENV} is not UTF-8 text; set it to the signing key (or unset it to turn signing off)"
        ) from None
    if not key.strip():
        raise HmacKeyError(f"{HMAC_ENV} is set but empty; set it to the signing key, or unset it to turn signing off")
    if not _warned:
        _warned = True
        log.warning("%s is deprecated (every process sees it): mount the key as a file, %s", HMAC_ENV, HMAC_FILE_ENV)
    return Keyring((key,))
