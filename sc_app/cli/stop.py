"""``sc-app stop``: ask the run holding a checkpoint directory's lease to stop gracefully, through the volume."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sc_app.cli.options import add_checkpoint_dir, checkpoint_root
from sc_app.exits import EXIT_FAILED, EXIT_OK, fail


def register(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser(
        "stop",
        help="ask the run writing to a checkpoint dir to stop gracefully (preStop hook, operators)",
        description="Reach the run that holds DIR's writer lease through the checkpoint volume (no Kubernetes API, "
        "no Ray connection): it finishes its step, cuts a bundle of it within checkpoint.emergency_budget_s, "
        "releases the lease and exits 143. The same command stops an embedded `sc-app run` and a job on KubeRay.",
        epilog="exit codes: 0 the run stopped (or no run was writing); 1 it was still running when --wait ended; "
        "2 bad input",
    )
    add_checkpoint_dir(st)
    st.add_argument(
        "--wait",
        metavar="SECONDS",
        type=float,
        default=0.0,
        help="wait until the run released its lease (default 0: just ask)",
    )
    st.set_defaults(func=cmd_stop)


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask the run holding the directory's lease to stop gracefully; optionally wait until it did."""
    from sc_app.checkpoint.lease import read_lease
    from sc_app.checkpoint.stop_request import request_stop

    if args.wait < 0:
        return fail("--wait must be >= 0 seconds")
    root = checkpoint_root(args, must_exist=True)
    holder = read_lease(root)
    if holder is None or not holder.live():
        state = "no lease" if holder is None else ("released" if holder.released else "an expired lease")
        print(f"no run is writing to {root} ({state}): nothing to stop")
        return EXIT_OK
    try:
        request_stop(root, holder)
    except OSError as exc:
        return fail(f"cannot write the stop request to {root} ({exc.strerror or exc}); is the volume read-only?")
    print(
        f"asked run {holder.run_id} (epoch {holder.fencing_epoch}, {holder.host}) "
        f"to stop: it finishes its step, saves a "
        "bundle of it and exits",
        flush=True,
    )
    if args.wait == 0:
        return EXIT_OK
    return _wait_for_release(root, holder.run_id, holder.fencing_epoch, args.wait)


def _wait_for_release(root: Path, run_id: str, epoch: int, wait: float) -> int:
    """Until the run released its lease, was superseded, or its lease expired; ``EXIT_FAILED`` after ``wait`` s."""
    from sc_app.checkpoint.lease import read_lease

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        current = read_lease(root)
        if current is None or (current.run_id, current.fencing_epoch) != (run_id, epoch):
            print(f"run {run_id} was superseded by run {current.run_id if current else None}")
            return EXIT_OK
        if current.released is not None:
            rel = current.released
            print(
                f"stopped: run {run_id} ended ({rel.outcome}) at step {rel.final_step}; newest bundle "
                f"{rel.newest_bundle}"
            )
            return EXIT_OK
        if not current.live():
            print(f"run {run_id} is gone: its lease expired without a release (killed?)")
            return EXIT_OK
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    return fail(f"run {run_id} was still running after --wait {wait:g}s", EXIT_FAILED)
