"""Fixtures shared by the ``sc-app k8s`` tests.

``api``: the API-server stand-in (``fake_apiserver.FakeApiServer``) started for one test, with a kubeconfig that
points at it; yields ``(server, kubeconfig path)``. A module that needs another stand-in defines its own ``api``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.fake_apiserver import FakeApiServer, write_kubeconfig


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, str]]:
    server = FakeApiServer()
    url = server.start()
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(str(kubeconfig), url)
    yield server, str(kubeconfig)
    server.stop()
