"""``sc-app export``: a verified bundle's policy, written in its backend's loadable layout (the hf backend: a
Hugging Face directory). The bundle is ``choose_bundle``'s: the newest verified one of the directory's lineage, or
the one ``--step`` names — a bundle copied in from another job is never exported as this run's. ``--remote
s3://bucket/prefix`` exports from the bucket instead (``export_remote.py``)."""

from __future__ import annotations

import argparse

from sc_app.checkpoint import BundleRules, choose_bundle, layout
from sc_app.cli.ckpt_remote import add_remote
from sc_app.cli.export_remote import cmd_export_remote
from sc_app.cli.options import add_checkpoint_dir, checkpoint_root
from sc_app.exits import EXIT_OK, fail


def register(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser(
        "export",
        help="write a bundle's policy in Hugging Face layout (model.backend=hf runs)",
        description="Verify a bundle and write its policy as safetensors + config + tokenizer into a new directory "
        "that AutoModelForCausalLM.from_pretrained loads.",
    )
    add_checkpoint_dir(ex, required=False)
    add_remote(ex)
    ex.add_argument("--step", metavar="N", type=int, help="the bundle step_N (default: the newest verified one)")
    ex.add_argument("--out", metavar="DIR", required=True, help="a new (or empty) directory")
    ex.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from sc_app.rl import hooks
    from sc_app.rl.export_target import ExportTargetError, check_export_out

    if (args.checkpoint_dir is None) == (args.remote is None):
        return fail("give exactly one of --checkpoint-dir DIR and --remote s3://bucket/prefix")
    if args.remote is not None:
        return cmd_export_remote(args)
    root = checkpoint_root(args, must_exist=True)
    try:
        check_export_out(args.out, root)  # never inside checkpoint.dir, never a link, a name that can be created
    except ExportTargetError as exc:
        return fail(str(exc))
    plan = choose_bundle(BundleRules.of_dir(root), step=args.step)
    if args.step is None:
        for skipped in (r for r in plan.reports if not r.ok):
            print(f"skipped {skipped.name}: {skipped.problems[0]}")
    if plan.decision != "resume" or plan.bundle is None or plan.manifest is None:
        if args.step is None:
            return fail(f"no verified step_N bundle in {root}; `sc-app ckpt verify` names the problems")
        return fail(f"{plan.reason}; export another --step" if plan.reports else plan.reason)
    bundle, manifest = plan.bundle, plan.manifest
    backend = manifest.compat.get("model.backend", "tiny")
    if not hooks.can_export(backend):
        return fail(
            f"{bundle.name} holds a model.backend={backend} policy: there is nothing to export "
            f"(export works on bundles of model.backend={'|'.join(sorted(hooks.EXPORTERS))} runs)"
        )
    try:
        result = hooks.export_policy(
            backend, bundle / layout.POLICY_DIR, manifest.hashes_under(layout.POLICY_DIR), args.out
        )
    except hooks.ExportFailed as exc:
        return fail(str(exc))
    print(
        f"exported {bundle.name} (step {plan.step}) to {result.out}: {result.parameters:,} parameters in "
        f"{result.dtype}, {len(result.files)} files; load it with {result.load_with}"
    )
    return EXIT_OK
