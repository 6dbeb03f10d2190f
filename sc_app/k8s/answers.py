"""The API server's answers and failures: ``Response``/``Resource``, the one-line ``K8sError`` family, a body read
within an overall deadline and a size bound, and the shape of a discovery answer checked before it is used (split
from ``api``, which re-exports the types, to keep each module small)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from sc_app.io import strict_json

MAX_BODY_BYTES = 64 * 1024 * 1024  # an answer larger than this is refused, not loaded


class K8sError(RuntimeError):
    """One clear line about a failed API call; ``transient``: a later try may succeed."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = "", transient: bool = False):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.transient = transient


class K8sTimeout(K8sError):
    """The API server did not answer in time, or ``Kube.deadline`` has passed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


class DeadlinePassed(K8sTimeout):
    """No request was sent: ``Kube.deadline`` had already passed."""


@dataclass(frozen=True)
class Response:
    """One HTTP answer, whatever its status."""

    status: int
    body: bytes
    content_type: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON: ``ValueError`` for anything else, whatever its depth or number sizes."""
        return strict_json.parse(self.body)

    def status_doc(self) -> dict[str, Any] | None:
        """The ``Status`` object when the API server itself answered (errors), else None."""
        try:
            doc = strict_json.parse(self.body)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) and doc.get("kind") == "Status" else None


@dataclass(frozen=True)
class Resource:
    """Where objects of one kind live, as discovery says."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def path(self, namespace: str, name: str = "") -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        scope = f"/namespaces/{quote(namespace, safe='')}" if self.namespaced else ""
        return f"{base}{scope}/{self.plural}" + (f"/{quote(name, safe='')}" if name else "")


def seconds(value: float) -> str:
    """``30``, ``1.5``, ``0.25``: seconds as a person writes them."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def transport_error(exc: BaseException, what: str, host: str, timeout: float) -> K8sError:
    """A request that got no HTTP answer (refused, timed out, TLS) as one line."""
    import urllib3.exceptions as ux

    cause: BaseException = exc
    if isinstance(exc, ux.MaxRetryError) and exc.reason is not None:
        cause = exc.reason
    # NewConnectionError (refused, no route) subclasses ConnectTimeoutError in urllib3 2: tell them apart first.
    if isinstance(cause, (ux.TimeoutError, TimeoutError)) and not isinstance(cause, ux.NewConnectionError):
        return K8sTimeout(
            f"{what}: the API server at {host} did not answer within {seconds(timeout)}s; check that it is up and that "
            "your kubeconfig/context points at it (raise --request-timeout for a slow link)"
        )
    if isinstance(cause, ux.SSLError):
        first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        return K8sError(f"{what}: TLS with the API server at {host} failed ({first}); check your kubeconfig's CA")
    text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    if "refused" in text.lower():
        text = "connection refused"
    return K8sError(
        f"{what}: cannot reach the Kubernetes API server at {host} ({text}); check your kubeconfig/context",
        transient=True,
    )




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
