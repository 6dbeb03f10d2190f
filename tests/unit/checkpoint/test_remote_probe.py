"""The start-up probe refuses a server that does not honour conditional writes (RGW does: this needs a stand-in
that ignores the headers, the behaviour of an S3 implementation without them), and learns which If-Match form a
server takes. Pure: a fake boto3 client, no network."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from sc_app.checkpoint.remote.fence import RemoteRefused
from sc_app.checkpoint.remote.probe import probe_conditional_writes
from sc_app.checkpoint.remote.store import Store
from sc_app.config.remote import RemoteConfig


def _error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


class FakeS3:
    """Objects in a dict; ``honours``: whether conditional PUTs are checked; ``bare_etag``: RGW 16.2's If-Match."""

    def __init__(self, *, honours: bool, bare_etag: bool = False) -> None:
        self.objects: dict[str, bytes] = {}
        self.honours, self.bare_etag, self.n = honours, bare_etag, 0

    def _etag(self, key: str) -> str:
        return f'"{hash(self.objects[key]) & 0xFFFF:032x}"'

    def put_object(self, *, Bucket: str, Key: str, Body: bytes, IfNoneMatch: str = "", IfMatch: str = "", **_: Any):
        if self.honours:
            if IfNoneMatch and Key in self.objects:
                raise _error("PreconditionFailed", 412)
            if IfMatch:
                want = self._etag(Key).strip('"') if self.bare_etag else self._etag(Key)
                if Key not in self.objects or IfMatch != want:
                    raise _error("PreconditionFailed", 412)
        self.objects[Key] = Body
        return {"ETag": self._etag(Key)}

    def delete_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        self.objects.pop(Key, None)
        return {}


def store(fake: FakeS3) -> Store:
    return Store(RemoteConfig(url="s3://bkt/p"), client=fake)


def test_a_server_that_ignores_conditional_writes_is_refused() -> None:
    fake = FakeS3(honours=False)
    with pytest.raises(RemoteRefused, match="overwrote an object despite If-None-Match") as err:
        probe_conditional_writes(store(fake))
    assert "docs/object-storage.md" in str(err.value) and "\n" not in str(err.value)
    assert fake.objects == {}, "the probe object is removed"


@pytest.mark.parametrize("bare", [False, True])
def test_the_probe_learns_the_if_match_form(bare: bool) -> None:
    s = store(FakeS3(honours=True, bare_etag=bare))
    probe_conditional_writes(s)
    assert s.bare_if_match is bare
