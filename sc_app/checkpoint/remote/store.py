"""The one place sc-app talks to an S3-compatible server (boto3): small conditional writes, reads, heads, lists,
a streamed multipart upload and a streamed download. Every failure leaves as ``RemoteError``: one line naming the
bucket or key and what to do, never the credentials (boto3 reads them the standard way; nothing here logs them).

Per request: ``connect_timeout`` / ``read_timeout`` of ``checkpoint.remote.request_timeout_s`` and botocore's
``standard`` retry mode (exponential backoff with jitter, 5 attempts), so a stalled or dead server costs a bounded
time. Multipart uploads go through s3transfer with a non-seekable source (``sc_app.io.hashing`` hashes exactly the
bytes sent, in order): memory is bounded by ``max_concurrency + 1`` parts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from sc_app.config.remote import RemoteConfig, S3Target

log = logging.getLogger(__name__)

DIGEST_META = "sc-app-digest"  # x-amz-meta-sc-app-digest: "<alg>:<hex>" of the object's bytes, as sent


class RemoteError(RuntimeError):
    """An S3 request failed; ``str()`` is one line naming the bucket/key, the server's error and what to do."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class PreconditionFailed(RemoteError):
    """A conditional write (If-Match / If-None-Match) was refused: someone else wrote the object first."""


class NotFound(RemoteError):
    """The object (or the bucket) does not exist."""


_HINTS = {
    "InvalidAccessKeyId": "the access key is not known to the server: check the credentials boto3 finds (AWS_* "
    "environment, shared config, IRSA / Workload Identity)",
    "SignatureDoesNotMatch": "the secret key does not match the access key: check the credentials",
    "AccessDenied": "the credentials may not do this on the bucket: grant s3:GetObject, s3:PutObject, "
    "s3:ListBucket (and multipart) on the prefix",
    "NoSuchBucket": "create the bucket or fix checkpoint.remote.url",
    "ExpiredToken": "the credentials expired: refresh them",
}


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")) or type(exc).__name__


def _status(exc: Exception) -> int:
    response = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def classify(exc: Exception, what: str) -> RemoteError:
    """``exc`` from botocore as one ``RemoteError`` line about ``what`` (``s3://bucket/key``)."""
    code, status = _code(exc), _status(exc)
    if code in ("PreconditionFailed", "412", "ConditionalRequestConflict") or status == 412:  # 409 CRC: lost a race
        return PreconditionFailed(f"{what}: written by someone else first (412 Precondition Failed)", code)
    if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound") or status == 404:
        hint = _HINTS["NoSuchBucket"] if code == "NoSuchBucket" else "it does not exist"
        return NotFound(f"{what}: {code or 404}: {hint}", code)
    hint = _HINTS.get(code)
    if hint is None and status == 403:
        hint = _HINTS["AccessDenied"]
    detail = hint or str(exc).splitlines()[0][:300]
    return RemoteError(f"{what}: {code}{f' (HTTP {status})' if status else ''}: {detail}", code)


@dataclass(frozen=True)
class Head:
    size: int
    etag: str
    digest: str | None  # our metadata, "<alg>:<hex>", when the object was written by sc-app


class Store:
    """A bucket + prefix on one server, with the config's timeouts, retries, part size and concurrency."""

    def __init__(self, cfg: RemoteConfig, *, client: Any = None) -> None:
        self.cfg = cfg
        self.target: S3Target = cfg.target
        self.client = client if client is not None else make_client(cfg)
        # Ceph RGW 16.2 matches If-Match against the bare ETag (a quoted one, as HTTP writes it, gets 412); the
        # start-up probe (``probe.py``) finds which form the server takes and sets this.
        self.bare_if_match = False

    def where(self, key: str) -> str:
        return f"s3://{self.target.bucket}/{key}"

    def key(self, *parts: str) -> str:
        return self.target.key(*parts)

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.target.bucket, **kwargs)
        except ClientError as exc:
            raise classify(exc, what) from None
        except BotoCoreError as exc:  # connection refused/reset, timeouts, no credentials
            name = type(exc).__name__
            raise RemoteError(f"{what}: {name}: {str(exc).splitlines()[0][:300]}", name) from None

    # ---------------------------------------------------------------- small objects
    def put_small(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None, digest: str = ""
    ) -> str:
        """One PUT (never multipart: conditional headers are honoured on PUT by every server sc-app supports, not
        by every server on CompleteMultipartUpload); returns the new ETag."""
        kwargs: dict[str, Any] = {"Key": key, "Body": body}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match.strip('"') if self.bare_if_match else if_match
        if digest:
            kwargs["Metadata"] = {DIGEST_META: digest}
        return str(self._call(self.where(key), self.client.put_object, **kwargs)["ETag"])

    def get_small(self, key: str, limit: int) -> tuple[bytes, str]:
        """The bytes (at most ``limit``: a bigger object is refused) and ETag of ``key``; ``NotFound`` if absent."""
        head = self._call(self.where(key), self.client.get_object, Key=key)
        if int(head["ContentLength"]) > limit:
            head["Body"].close()
            raise RemoteError(f"{self.where(key)}: {head['ContentLength']} bytes, more than the {limit} expected")
        try:
            return head["Body"].read(limit + 1), str(head["ETag"])
        except Exception as exc:  # a connection dropped mid-body
            raise RemoteError(f"{self.where(key)}: read failed: {exc}") from None

    def head(self, key: str) -> Head:
        out = self._call(self.where(key), self.client.head_object, Key=key)
        meta = {k.lower(): v for k, v in (out.get("Metadata") or {}).items()}
        return Head(int(out["ContentLength"]), str(out["ETag"]), meta.get(DIGEST_META))

    def delete(self, key: str) -> None:
        self._call(self.where(key), self.client.delete_object, Key=key)

    def delete_many(self, keys: list[str]) -> None:
        """Delete ``keys``, up to 1,000 per request (DeleteObjects); ``RemoteError`` names the first key the server
        did not delete."""
        for at in range(0, len(keys), 1000):
            batch = keys[at : at + 1000]
            out = self._call(self.where(batch[0]), self.client.delete_objects,
                             Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})  # fmt: skip
            for err in out.get("Errors", []):
                raise RemoteError(f"{self.where(str(err.get('Key')))}: {err.get('Code')}: {err.get('Message', '')}")

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """``(key, size)`` of every object under ``prefix`` (ListObjectsV2, following continuation tokens)."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(self.where(prefix), self.client.list_objects_v2, **kwargs)
            for item in page.get("Contents", []):
                yield str(item["Key"]), int(item["Size"])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    # ---------------------------------------------------------------- big objects
    def upload_stream(self, key: str, source: BinaryIO, *, digest: str = "", size: int | None = None) -> None:
        """Upload what ``source.read()`` gives, in order (multipart above one part size, ``max_concurrency`` parts
        in flight, at most ``max_concurrency + 1`` parts in memory); ``digest``: recorded as the object's
        ``DIGEST_META`` (known before the upload: a part its writer hashed). ``size`` (expected) up to one part:
        read whole and sent in one PUT, without a transfer manager's threads. Raises ``RemoteError``."""
        if size is not None and size <= self.cfg.part_size:
            data, chunk = bytearray(), b"-"
            while chunk and len(data) < size:
                chunk = source.read(size - len(data))
                data += chunk
            self.put_small(key, bytes(data), digest=digest)
            return
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError
        from s3transfer.exceptions import S3UploadFailedError

        config = TransferConfig(
            multipart_threshold=self.cfg.part_size,
            multipart_chunksize=self.cfg.part_size,
            max_concurrency=self.cfg.max_concurrency,
            use_threads=True,
        )
        config.max_in_memory_upload_chunks = self.cfg.max_concurrency + 1  # s3transfer's bound on a stream's memory
        try:
            extra = {"Metadata": {DIGEST_META: digest}} if digest else None
            self.client.upload_fileobj(source, self.target.bucket, key, ExtraArgs=extra, Config=config)
        except ClientError as exc:
            raise classify(exc, self.where(key)) from None
        except (BotoCoreError, S3UploadFailedError) as exc:
            raise RemoteError(f"{self.where(key)}: upload failed: {str(exc).splitlines()[0][:300]}") from None

    def open_read(self, key: str) -> tuple[Any, int]:
        """A streaming body of ``key`` and its length."""
        out = self._call(self.where(key), self.client.get_object, Key=key)
        return out["Body"], int(out["ContentLength"])


def make_client(cfg: RemoteConfig, *, attempts: int = 5) -> Any:
    """A boto3 S3 client with the config's endpoint, region, addressing style and timeouts, ``attempts`` tries per
    request (backoff between); credentials from boto3's standard chain only."""
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": cfg.addressing_style},
        retries={"mode": "standard", "max_attempts": attempts},
        connect_timeout=min(cfg.request_timeout_s, 30.0),
        read_timeout=cfg.request_timeout_s,
        max_pool_connections=max(10, cfg.max_concurrency * 2),
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", endpoint_url=cfg.endpoint, region_name=cfg.region, config=config)
