#!/usr/bin/env python3
"""Turn pip's resolution report into ops/image-constraints.txt and vendor the GPU wheels' metadata.

Called by ops/lock-image-deps.sh after `pip install --dry-run --report` resolved pyproject's pins for the image's
platform. Three jobs:

* write the lock: every resolved distribution as `name==version`, sorted (sc-app itself left out);
* refuse a silent downgrade: a package resolved LOWER than the lock it replaces is what an sdist-only dependency
  looks like under `--only-binary=:all:` (pip backtracks to an old release that has a wheel: hydra-core 0.11 for
  want of an antlr4 wheel). Build such a package into the script's wheel dir, or set LOCK_ALLOW_DOWNGRADE=1 when
  the downgrade is meant;
* vendor the core metadata (PEP 658 `.metadata` file, headers only) of torch, of every CUDA-family wheel it
  pulls in (`nvidia-*`, `cuda-*`, `triton`) and of the CUDA `vllm` into tests/k8s/fixtures/wheel-metadata/, so
  the default test suite checks offline that the lock pins each of them as their Requires-Dist demand. Where a
  `.metadata` file is not reachable (an index without PEP 658), the requirement lines come from pip's report,
  which read the same file.

    python ops/lock_report.py REPORT LOCK FIXTURE_DIR PLATFORM
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

GPU_PREFIXES = ("nvidia-", "cuda-")
GPU_NAMES = {"torch", "triton"}
ENGINE_NAMES = {"vllm"}  # the CUDA vLLM (vllm-cuda extra): its Requires-Dist are checked against the lock too
KEPT_HEADERS = ("Metadata-Version", "Name", "Version", "Requires-Python", "Requires-Dist", "Provides-Extra")


def is_gpu_family(name: str) -> bool:
    n = canonicalize_name(name)
    return n in GPU_NAMES or n.startswith(GPU_PREFIXES)


def read_lock(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    rows = (line.split("==", 1) for line in path.read_text().splitlines() if "==" in line and line[0] != "#")
    return {canonicalize_name(n): v for n, v in rows}


def downgrades(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return [f"{n} {old[n]} -> {v}" for n, v in sorted(new.items()) if n in old and Version(v) < Version(old[n])]


def _fetch_metadata(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url + ".metadata", timeout=60) as resp:
            return resp.read().decode()
    except OSError:
        return None


def _headers_only(text: str) -> str:
    msg = HeaderParser().parsestr(text, headersonly=True)
    return "".join(f"{k}: {v}\n" for k, v in msg.items() if k in KEPT_HEADERS)


def _from_report(meta: dict) -> str:
    lines = [f"Metadata-Version: {meta.get('metadata_version', '2.1')}", f"Name: {meta['name']}"]
    lines.append(f"Version: {meta['version']}")
    if meta.get("requires_python"):
        lines.append(f"Requires-Python: {meta['requires_python']}")
    lines += [f"Requires-Dist: {r}" for r in meta.get("requires_dist", [])]
    lines += [f"Provides-Extra: {e}" for e in meta.get("provides_extra", [])]
    return "\n".join(lines) + "\n"


def leads_to_gpu(install: list[dict]) -> set[str]:
    """Names of the resolved packages that are CUDA-family or depend (transitively, within the resolution) on one:
    vLLM pulls CUDA wheels through packages of other names (flashinfer-python, tilelang, ...), so the offline test
    can walk from torch and vllm to every CUDA wheel the lock pins only through vendored metadata."""
    resolved = {canonicalize_name(i["metadata"]["name"]) for i in install}
    deps = {
        canonicalize_name(i["metadata"]["name"]): {
            canonicalize_name(Requirement(r).name) for r in i["metadata"].get("requires_dist", [])
        }
        & resolved
        for i in install
    }
    hit = {n for n in resolved if is_gpu_family(n)}
    while True:
        more = {n for n, ds in deps.items() if n not in hit and ds & hit}
        if not more:
            return hit
        hit |= more


def vendor_metadata(install: list[dict], fixture_dir: Path, platform: str) -> list[str]:
    """Write <name>-<version>.metadata for every GPU-family wheel, the CUDA vllm and every package through which a
    CUDA wheel is pulled in; returns the names read from pip's report."""
    fixture_dir.mkdir(parents=True, exist_ok=True)
    for old in fixture_dir.glob("*.metadata"):
        old.unlink()
    sources, fallback = [], []
    wanted = leads_to_gpu(install) | ENGINE_NAMES
    for item in sorted(install, key=lambda i: canonicalize_name(i["metadata"]["name"])):
        meta = item["metadata"]
        if canonicalize_name(meta["name"]) not in wanted:
            continue
        url = item["download_info"]["url"]
        text = _fetch_metadata(url)
        if text is None:
            fallback.append(meta["name"])
            body = _from_report(meta)
        else:
            body = _headers_only(text)
        name = canonicalize_name(meta["name"])
        (fixture_dir / f"{name}-{meta['version']}.metadata").write_text(body)
        sources.append(f"{url}{'' if text else '  (from pip report: no .metadata)'}\n")
    (fixture_dir / "SOURCES.txt").write_text(
        f"# Core metadata (headers) of the CUDA-family wheels resolved for {platform} / CPython 3.11.\n"
        "# Written by ops/lock-image-deps.sh from each wheel's PEP 658 `.metadata` file:\n" + "".join(sources)
    )
    return fallback


def write_lock(install: list[dict], lock: Path, platform: str) -> dict[str, str]:
    rows = sorted((i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in install)
    rows = [(n, v) for n, v in rows if n != "sc-app"]
    lock.write_text(
        "# Exact versions of every Python package in the image, resolved from pyproject.toml's pins for\n"
        f"# {platform} / CPython 3.11: torch's CUDA build with its nvidia-*, cuda-* and triton wheels pinned as\n"
        "# torch's metadata requires, and the CUDA vllm (vllm-cuda extra) with its dependencies\n"
        "# (tests/k8s/fixtures/wheel-metadata/). Regenerate: ops/lock-image-deps.sh\n"
        + "".join(f"{n}=={v}\n" for n, v in rows)
    )
    return {canonicalize_name(n): v for n, v in rows}


def main(argv: list[str]) -> int:
    report, lock, fixture_dir, platform = Path(argv[0]), Path(argv[1]), Path(argv[2]), argv[3]
    install = json.loads(report.read_text())["install"]
    new = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in install}
    down = downgrades(read_lock(lock), new)
    if down and os.environ.get("LOCK_ALLOW_DOWNGRADE") != "1":
        print(
            "lock-image-deps: refusing to write a lock that downgrades " + ", ".join(down) + ": a dependency with "
            "no wheel for the platform makes pip backtrack; add it to LOCK_SDIST_ONLY (built into a wheel first) "
            "or set LOCK_ALLOW_DOWNGRADE=1 if the downgrade is meant",
            file=sys.stderr,
        )
        return 1
    if not any(is_gpu_family(n) and n != "torch" for n in new):
        print(
            f"lock-image-deps: torch resolved without CUDA wheels for {platform}: not the image's build",
            file=sys.stderr,
        )
        return 1
    write_lock(install, lock, platform)
    fallback = vendor_metadata(install, fixture_dir, platform)
    if fallback:
        print(
            "lock-image-deps: no .metadata file reachable for "
            + ", ".join(fallback)
            + "; their requirements were taken from pip's report",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
