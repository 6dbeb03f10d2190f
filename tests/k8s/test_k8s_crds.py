"""The vendored CRDs (tests/k8s/crds/) are the upstream files named in SOURCE.txt, byte for byte."""

from __future__ import annotations

import hashlib

from tests.k8s.k8s_helpers import CRD_DIR, KUBERAY_VERSIONS, crd_path, load_crd


def test_vendored_crds_match_their_recorded_checksums() -> None:
    sums = {}
    for line in (CRD_DIR / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        sums[name] = digest
    on_disk = {p.relative_to(CRD_DIR).as_posix() for p in CRD_DIR.rglob("*.yaml")}
    assert on_disk == set(sums), "every vendored CRD is listed in SHA256SUMS and nothing else is"
    for name, digest in sums.items():
        assert hashlib.sha256((CRD_DIR / name).read_bytes()).hexdigest() == digest, f"{name} was modified"
    source = (CRD_DIR / "SOURCE.txt").read_text()
    for name in sums:
        assert name.split("/")[0] in source, f"{name}: SOURCE.txt must say where it comes from"


def test_every_kind_the_tests_validate_has_its_crd() -> None:
    for kuberay in KUBERAY_VERSIONS:
        for kind in ("RayJob", "RayCluster"):
            crd = load_crd(crd_path("ray.io/v1", kind, kuberay))
            assert crd["spec"]["names"]["kind"] == kind
            assert "v1" in {v["name"] for v in crd["spec"]["versions"]}
    monitor = load_crd(crd_path("monitoring.coreos.com/v1", "PodMonitor"))
    assert monitor["spec"]["names"]["kind"] == "PodMonitor"
