"""``checkpoint.remote``: the S3-compatible object-storage tier bundles are uploaded to behind training and resumed
from when the local directory has nothing newer (``docs/object-storage.md``). Pure: no Ray, no torch, no boto3.

Credentials are never part of the config: boto3 finds them the standard way (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE``, the shared config files, IRSA's web identity token, an instance or
pod identity). The URL names a bucket and a key prefix; the endpoint names a non-AWS server (Ceph RGW, MinIO,
GCS's XML API).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sc_app.config.input import MAX_SECONDS, check_section

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_PREFIX_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")
MIB = 1024 * 1024


@dataclass(frozen=True)
class S3Target:
    """Where bundles go: a bucket and a key prefix (no leading or trailing slash; may be empty)."""

    bucket: str
    prefix: str

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_s3_url(url: str) -> S3Target:
    """``s3://bucket[/prefix]`` → ``S3Target``; ``ValueError`` naming what is wrong."""
    if not url.startswith("s3://"):
        raise ValueError(f"checkpoint.remote.url must be s3://bucket/prefix, got {url!r}")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(f"checkpoint.remote.url: {bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)")
    prefix = prefix.strip("/")
    parts = prefix.split("/") if prefix else []
    if any(not _PREFIX_PART.match(p) or p in (".", "..") for p in parts):
        raise ValueError(
            f"checkpoint.remote.url: prefix {prefix!r} may hold only A-Z a-z 0-9 _ . - between slashes (no . or ..)"
        )
    return S3Target(bucket, "/".join(parts))


class RemoteConfig(BaseModel):
    """``checkpoint.remote``: off unless ``url`` is set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    url: str | None = Field(None, description="s3://bucket/prefix: upload every bundle there; resume from it.")
    endpoint: str | None = Field(None, description="The S3 endpoint URL of a non-AWS server (RGW, MinIO, GCS).")
    region: str | None = Field(None, description="The bucket's region (default: boto3's, e.g. AWS_REGION).")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="path for most self-hosted servers; virtual for AWS and GCS."
    )
    part_size_mib: int = Field(64, ge=5, le=5120, description="Multipart part size (S3: 5 MiB to 5 GiB).")
    max_concurrency: int = Field(4, ge=1, le=64, description="Parts in flight per upload or download.")
    request_timeout_s: float = Field(60.0, gt=0, le=3600, description="Deadline of one request (connect, read).")
    bundle_deadline_s: float = Field(
        1800.0, gt=0, le=MAX_SECONDS, description="An upload of one bundle abandoned (and retried) after this."
    )
    parts: Literal["via_head", "direct"] = Field(
        "via_head",
        description="With checkpoint.volume=local: how a trainer rank's part of a bundle reaches the bucket. "
        "via_head: gathered into the head's bundle, uploaded from there; direct: uploaded by the rank itself, the "
        "bundle committed on the bucket only (docs/object-storage.md).",
    )
    drain_s: float = Field(
        120.0,
        ge=0,
        le=MAX_SECONDS,
        description="At the end of a run, wait this long for the newest bundle's upload; a stop request does not "
        "wait (the next attempt catches the bucket up).",
    )

    @model_validator(mode="after")
    def _bounded(self) -> RemoteConfig:
        check_section("RemoteConfig", self.__dict__)
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_s3_url(value)
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+(/\S*)?$", value):
            raise ValueError(f"checkpoint.remote.endpoint must be an http(s):// URL, got {value!r}")
        return value

    @property
    def enabled(self) -> bool:
        return self.url is not None

    @property
    def target(self) -> S3Target:
        if self.url is None:
            raise ValueError("checkpoint.remote.url is not set")
        return parse_s3_url(self.url)

    @property
    def part_size(self) -> int:
        return self.part_size_mib * MIB


def check_volume(volume: str, remote: RemoteConfig, snapshot: str) -> None:
    """``checkpoint.volume=local`` (a disk of its own per node): the bucket is what outlives a node's disk, and
    every part of a bundle that is not a trainer's passes through the controller's process."""
    if volume != "local":
        if remote.parts == "direct":
            raise ValueError(
                "checkpoint.remote.parts=direct is for checkpoint.volume=local (every node with a disk of its own); "
                "on a shared volume the bundle is committed there and uploaded from the head"
            )
        return
    if not remote.enabled:
        raise ValueError(
            "checkpoint.volume=local needs checkpoint.remote.url: with no shared volume, the bucket is what outlives "
            "a node's disk"
        )
    if snapshot != "streamed":
        raise ValueError(
            "checkpoint.volume=local needs data_plane.snapshot=streamed: with native, each storage unit writes its "
            "own file and must see checkpoint.dir"
        )
