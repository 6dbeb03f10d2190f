"""The remote tier against the same client's raw transfers, side by side, on a real S3 server (Ceph's radosgw,
started here like the suite starts it: ``tests/support/rgw.py``; needs ``make test-sysdeps`` as root).

``.venv/bin/python bench/remote_s3.py [--mib 128] [--rounds 3] [--quick]`` from the repo root.

* upload: ``upload_bundle`` of a bundle holding one ``--mib`` file (hashed as it is sent, manifest with
  If-None-Match, sizes checked, the fencing record's compare-and-swap) vs boto3's ``upload_file`` of the same file
  with the same part size and concurrency (target: >= 0.8x);
* download: ``bundles.download`` (every file hashed as it streams, fsynced, manifest last, renamed) vs a raw
  ``get_object`` streamed into a file and fsynced (target: >= 0.8x).

Rounds alternate raw and sc-app so a shared machine's drift hits both alike; the medians are compared. Writes
``bench/results/remote_s3.json`` and ``.md``; the load average at start and end is recorded with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sc_app.checkpoint.remote.bundles import check, download  # noqa: E402
from sc_app.checkpoint.remote.fence import acquire, read_record  # noqa: E402
from sc_app.checkpoint.remote.probe import open_bucket  # noqa: E402
from sc_app.checkpoint.remote.upload import upload_bundle  # noqa: E402
from sc_app.config.remote import RemoteConfig  # noqa: E402
from tests.support.bundles import make_bundle, reseal  # noqa: E402
from tests.support.rgw import Rgw, skip_reason  # noqa: E402

LINEAGE = "bench"
PART_MIB = 16
CONCURRENCY = 4


def _bundle(work: Path, mib: int) -> Path:
    bundle = make_bundle(work / "local", 2, lineage=LINEAGE)
    with open(bundle / "policy" / "big.bin", "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    reseal(bundle)
    return bundle


def _raw_put(rgw: Rgw, src: Path, key: str) -> float:
    from boto3.s3.transfer import TransferConfig

    part = PART_MIB << 20
    config = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=CONCURRENCY)
    t0 = time.perf_counter()
    rgw.client().upload_file(str(src), rgw.bucket, key, Config=config)
    return time.perf_counter() - t0


def _raw_get(rgw: Rgw, key: str, dest: Path) -> float:
    t0 = time.perf_counter()
    body = rgw.client().get_object(Bucket=rgw.bucket, Key=key)["Body"]
    with open(dest, "wb") as f:
        for chunk in body.iter_chunks(8 << 20):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def _round(rgw: Rgw, cfg_of: Any, bundle: Path, work: Path, i: int) -> dict[str, float]:
    big = bundle / "policy" / "big.bin"
    raw_put = _raw_put(rgw, big, f"raw/{i}/big.bin")
    cfg = cfg_of(f"sc/{i}")
    store, _ = open_bucket(cfg, lineage=LINEAGE)
    lease = acquire(store, f"bench{i}", LINEAGE)  # once per attempt in a run, not per upload: not timed
    t0 = time.perf_counter()
    upload_bundle(store, bundle, lease, hmac_key=None, deadline_s=3600)
    sc_put = time.perf_counter() - t0
    raw_get = _raw_get(rgw, f"raw/{i}/big.bin", work / f"raw{i}.bin")
    record, _ = read_record(store)
    assert record is not None
    remote = check(store, record.bundles[0], lineage=LINEAGE, hmac_key=None, digests=False)
    t0 = time.perf_counter()
    download(store, remote, work / f"home{i}", concurrency=CONCURRENCY)
    sc_get = time.perf_counter() - t0
    for key, _ in list(store.list("")):  # memstore keeps objects in RAM: free this round's
        rgw.client().delete_object(Bucket=rgw.bucket, Key=key)
    shutil.rmtree(work / f"home{i}")
    (work / f"raw{i}.bin").unlink()
    return {"raw_put_s": raw_put, "sc_put_s": sc_put, "raw_get_s": raw_get, "sc_get_s": sc_get}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="32 MiB, one round")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    if why := skip_reason():
        print(why, file=sys.stderr)
        return 2
    mib, rounds = (32, 1) if args.quick else (args.mib, args.rounds)
    work = Path(tempfile.mkdtemp(prefix="sc-bench-s3-"))
    rgw = Rgw(work / "rgw").start()
    os.environ.update(rgw.env())
    load_start = os.getloadavg()
    try:
        bundle = _bundle(work, mib)
        total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())

        def cfg_of(prefix: str) -> RemoteConfig:
            url = f"s3://{rgw.bucket}/{prefix}"
            return RemoteConfig(url=url, endpoint=rgw.endpoint, region="us-east-1", addressing_style="path",
                                part_size_mib=PART_MIB, max_concurrency=CONCURRENCY)  # fmt: skip

        samples = [_round(rgw, cfg_of, bundle, work, i) for i in range(rounds)]
    finally:
        rgw.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    result = {
        "mib": mib,
        "bundle_bytes": total,
        "rounds": rounds,
        "part_mib": PART_MIB,
        "concurrency": CONCURRENCY,
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "samples": samples,
        "median": med,
        "upload_ratio": med["raw_put_s"] / med["sc_put_s"],
        "download_ratio": med["raw_get_s"] / med["sc_get_s"],
    }
    _write(result, Path(args.out))
    return 0


def _write(result: dict[str, Any], out: Path) -> None:
    med, mib, load_start = result["median"], result["mib"], result["load_start"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "remote_s3.json").write_text(json.dumps(result, indent=2) + "\n")
    mibs = mib / 1.0
    table = [
        f"# Remote tier vs raw boto3 ({mib} MiB file, {result['rounds']} rounds, load {load_start[0]:.1f} → "
        f"{result['load_end'][0]:.1f})",
        "",
        "| transfer | raw boto3 | sc-app | ratio (target >= 0.8) |",
        "|---|---|---|---|",
        f"| upload | {mibs / med['raw_put_s']:.0f} MiB/s | {mibs / med['sc_put_s']:.0f} MiB/s (whole bundle, "
        f"published) | {result['upload_ratio']:.2f}x |",
        f"| download | {mibs / med['raw_get_s']:.0f} MiB/s | {mibs / med['sc_get_s']:.0f} MiB/s (verified, "
        f"renamed) | {result['download_ratio']:.2f}x |",
    ]
    (out / "remote_s3.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    raise SystemExit(main())
