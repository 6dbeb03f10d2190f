"""``sc-app export --remote s3://bucket/prefix``: a bundle's policy exported straight from the bucket.

The bundle is the newest one the bucket's fencing record lists that counts (manifest as the record published it,
of the record's lineage, signed when ``SC_APP_CHECKPOINT_HMAC_KEY`` is set, every file there with its size), or the
one ``--step`` names; a bundle the record does not list (an unpublished or quarantined upload) is never exported.
Only the policy's files are downloaded, each hashed as it streams into a temporary directory next to ``--out``
(removed afterwards) and refused at the first byte that differs from the manifest; the exporter checks them again
before it decodes a byte. Without ``--step``, a bundle that does not count or whose bytes differ is passed over,
with one line, for the next older one — as the local export passes over a bundle that does not verify.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sc_app.exits import EXIT_OK, fail


def _scratch_parent(out: Path) -> Path:
    """The nearest existing directory above ``out``: the policy is downloaded next to where it is exported (the
    same file system, not a small /tmp)."""
    parent = out.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    return parent


def _fetch_and_export(store: Any, bundle: Any, backend: str, out: Path) -> Any:
    """The policy files of ``bundle`` downloaded (digests checked as they stream: ``Corrupt``) into a scratch
    directory next to ``out``, exported from there, the scratch removed."""
    from sc_app.checkpoint import layout
    from sc_app.checkpoint.remote.bundles import fetch_files
    from sc_app.rl import hooks

    assert bundle.manifest is not None
    prefix = layout.POLICY_DIR + "/"
    scratch = Path(tempfile.mkdtemp(prefix=".sc-app-export-", dir=_scratch_parent(out)))
    try:
        fetch_files(store, bundle, [r for r in sorted(bundle.manifest.files) if r.startswith(prefix)], scratch,
                    concurrency=store.cfg.max_concurrency)  # fmt: skip
        return hooks.export_policy(
            backend, scratch / layout.POLICY_DIR, bundle.manifest.hashes_under(layout.POLICY_DIR), out
        )
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch)


def cmd_export_remote(args: argparse.Namespace) -> int:
    from sc_app.checkpoint import hmac_key_from_env, layout
    from sc_app.checkpoint.remote.bundles import Corrupt, check
    from sc_app.checkpoint.remote.record import RecordError
    from sc_app.checkpoint.remote.store import RemoteError
    from sc_app.cli.ckpt_remote import open_bucket_of
    from sc_app.rl import hooks
    from sc_app.rl.export_target import ExportTargetError, check_export_out

    try:
        out = check_export_out(args.out, None)
    except ExportTargetError as exc:
        return fail(str(exc))
    try:
        store, record = open_bucket_of(args)
        if record is None:
            return fail(f"no sc-app bundles at {args.remote} (no fencing record there)")
        entries = record.newest_first()
        if args.step is not None:
            entries = [e for e in entries if e.step == args.step]
            if not entries:
                return fail(f"{layout.step_name(args.step)} is not a bundle on {args.remote} (see `sc-app ckpt list "
                            "--remote`); export another --step")  # fmt: skip
        key = hmac_key_from_env()
        for entry in entries:
            bundle = check(store, entry, lineage=record.lineage, hmac_key=key, digests=False)
            if not bundle.ok or bundle.manifest is None:
                if args.step is not None:
                    return fail(f"{bundle.name} on the bucket does not count ({bundle.problems[0]}); export another "
                                "--step")  # fmt: skip
                print(f"skipped {bundle.name}: {bundle.problems[0]}")
                continue
            backend = bundle.manifest.compat.get("model.backend", "tiny")
            if not hooks.can_export(backend):
                return fail(
                    f"{bundle.name} holds a model.backend={backend} policy: there is nothing to export "
                    f"(export works on bundles of model.backend={'|'.join(sorted(hooks.EXPORTERS))} runs)"
                )
            try:
                result = _fetch_and_export(store, bundle, backend, out)
            except Corrupt as exc:
                if args.step is not None:
                    return fail(f"{exc}; export another --step")
                print(f"skipped {bundle.name}: {exc}")
                continue
            print(
                f"exported {bundle.name} (step {entry.step}, {args.remote}) to {result.out}: {result.parameters:,} "
                f"parameters in {result.dtype}, {len(result.files)} files; load it with {result.load_with}"
            )
            return EXIT_OK
    except hooks.ExportFailed as exc:
        return fail(str(exc))
    except (RemoteError, RecordError, ValueError, OSError) as exc:
        return fail(str(exc))
    return fail(f"no bundle on {args.remote} counts; `sc-app ckpt verify --remote` names the problems")
