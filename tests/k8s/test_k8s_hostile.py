"""Issue 22 on ``sc-app k8s``: an API server that drips its answer a byte at a time is cut off at
``--request-timeout`` overall (not per read), discovery answers of the wrong shape or JSON of any depth are one
line, and a kubeconfig or values file that is a FIFO or ``/dev/zero`` is refused before anything reads it. Real
sockets and files; the CLI runs in-process (the ``cli`` fixture), each case bounded by a thread join."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.fake_apiserver import write_kubeconfig
from tests.support.cli import InProcess


class OddServer:
    """Answers every request with ``body`` (200, JSON), sent ``drip`` bytes at a time every ``pause`` seconds."""

    def __init__(self, body: bytes, drip: int = 0, pause: float = 0.0) -> None:
        self.body, self.drip, self.pause = body, drip, pause
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(self.body)}\r\n\r\n"
                conn.sendall(head.encode())
                step = self.drip or len(self.body)
                for i in range(0, len(self.body), step):
                    if self.stopped.is_set():
                        return
                    conn.sendall(self.body[i : i + step])
                    time.sleep(self.pause)
            except OSError:
                return

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    server = OddServer(*request.param)
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(str(kubeconfig), server.url)
    yield str(kubeconfig)
    server.stop()


def bounded_main(argv: list[str], cli: InProcess, limit: float = 30.0) -> tuple[int, str, float]:
    started = time.monotonic()
    ran = cli(*argv, within=limit)
    lines = [ln for ln in ran.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in ran.out, ran.stderr
    return ran.rc, lines[0], time.monotonic() - started


@pytest.mark.parametrize(
    "served", [(b'{"kind": "APIResourceList", "resources": []}' + b" " * 400, 1, 0.2)], indirect=True
)
def test_a_dripping_answer_is_cut_off_at_the_request_timeout(served: str, cli: InProcess) -> None:
    rc, line, took = bounded_main(
        ["k8s", "status", "demo", "-n", "ml", "--kubeconfig", served, "--request-timeout", "2"], cli
    )
    assert rc != 0 and "did not finish its answer within 2s" in line, line
    assert took < 20


@pytest.mark.parametrize(
    "served",
    [(b"[1, 2]",), (b'{"resources": [{"name": 5, "kind": []}]}',), (b'{"resources": 7}',), (b"[" * 100_000,)],
    indirect=True,
    ids=["a list", "wrong types", "resources not a list", "nested 100000 deep"],
)
def test_a_discovery_answer_of_the_wrong_shape_is_one_line(served: str, cli: InProcess) -> None:
    rc, line, _ = bounded_main(["k8s", "status", "demo", "-n", "ml", "--kubeconfig", served], cli)
    assert rc != 0 and line.startswith("sc-app k8s: error:") and "discovery" in line, line


@pytest.mark.parametrize("kind", ["fifo", "zero"])
@pytest.mark.parametrize("which", ["--kubeconfig", "-f"])
def test_a_kubeconfig_or_values_file_that_is_not_a_file_is_one_line(
    tmp_path: Path, cli: InProcess, which: str, kind: str
) -> None:
    odd = tmp_path / "odd"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to("/dev/zero")
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(str(kubeconfig), "http://127.0.0.1:9")
    if which == "--kubeconfig":
        argv = ["k8s", "status", "demo", "-n", "ml", "--kubeconfig", str(odd)]
    else:
        argv = ["k8s", "submit", "demo", "-n", "ml", "--kubeconfig", str(kubeconfig), "-f", str(odd)]
    rc, line, _ = bounded_main(argv, cli)
    assert rc == 2 and str(odd) in line, line
