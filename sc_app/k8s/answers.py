"""Reading the API server's answers: a body within an overall deadline and a size bound, and the shape of a
discovery answer checked before it is used (split from ``api`` to keep each module small)."""

from __future__ import annotations

import time
from typing import Any

from sc_app.k8s.api import MAX_BODY_BYTES, K8sError, K8sTimeout, Resource, Response, seconds
from sc_app.k8s.api import _transport_error as transport_error


def read_body(response: Any, what: str, host: str, timeout: float) -> bytes:
    """The whole body within ``timeout`` seconds overall (a server dripping it a byte at a time is cut off, not
    waited for per read) and at most ``MAX_BODY_BYTES``."""
    end = time.monotonic() + timeout
    chunks: list[bytes] = []
    got = 0
    try:
        while chunk := response.read1(1 << 16, decode_content=True):
            got += len(chunk)
            if got > MAX_BODY_BYTES:
                raise K8sError(f"{what}: answer larger than {MAX_BODY_BYTES // 2**20} MiB; refused")
            chunks.append(chunk)
            if time.monotonic() > end:
                raise K8sTimeout(
                    f"{what}: the API server at {host} did not finish its answer within {seconds(timeout)}s; check "
                    "the link to it (raise --request-timeout for a slow one)"
                )
    except K8sError:
        response.close()
        raise
    except Exception as exc:
        response.close()
        raise transport_error(exc, what, host, timeout) from None
    return b"".join(chunks)


def served_kinds(resp: Response, api_version: str) -> dict[str, Resource]:
    """Kind → where it lives, from a discovery answer (an ``APIResourceList``); ``K8sError`` for any other shape."""
    found: dict[str, Resource] = {}
    try:
        for r in resp.json().get("resources") or []:
            name, kind = r["name"], r["kind"]
            if not isinstance(name, str) or not isinstance(kind, str):
                raise TypeError("name/kind not strings")
            if "/" not in name:  # subresources (pods/log) are not kinds
                found[kind] = Resource(api_version, kind, name, r.get("namespaced") is True)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise K8sError(
            f"discovery of {api_version}: the answer is not an API resource list ({type(exc).__name__}); is "
            "--kubeconfig/--context pointing at a Kubernetes API server?"
        ) from None
    return found
