"""``sc-app k8s submit|name|status|wait|suspend|resume|delete``: a RayJob from the chart's values, without Helm.

Exit codes (``sc_app/exits.py``): 0 ok; 1 the job failed, ``wait``/``delete`` ran out of ``--timeout``, or the API
server did not answer / could not be reached (a rerun may succeed); 2 bad input (values, flags, kubeconfig, context)
or a refused API request. Every error is one line on stderr.
Invariants: ``delete`` removes what ``submit`` wrote and never the checkpoint PVC; every request is bounded by
``--request-timeout`` and, for ``wait``/``delete``, by what is left of ``--timeout``. Importing this module imports
neither ``kubernetes`` nor the Helm engine (``sc-app`` loads it for every command).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections.abc import Callable

from sc_app.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, Parser, fail, parse
from sc_app.k8s import install, kueue
from sc_app.k8s.api import DEFAULT_REQUEST_TIMEOUT, K8sError, Kube, load_client
from sc_app.k8s.rayjob import JobStatus, RayJobs, job_pod_selector
from sc_app.k8s.release import Release, ReleaseError, deep_merge, load_values, render_release

log = logging.getLogger(__name__)

PROG = "sc-app k8s"
# The image tag that lets the chart render when the caller needs names, not an installable release.
NAME_PROBE_TAG = "name-probe"


def _seconds(text: str) -> float:
    """A positive number of seconds (argparse type): 0 would mean "no timeout" to urllib3."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more")
    return value


def _command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a verb; its errors become the one error line and exit code of ``sc_app.exits``."""

    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except ReleaseError as exc:
            return fail(str(exc), EXIT_BAD_INPUT, prog=PROG)
        except K8sError as exc:
            return fail(str(exc), EXIT_FAILED if exc.transient else EXIT_BAD_INPUT, prog=PROG)
        except TimeoutError as exc:
            return fail(str(exc), EXIT_FAILED, prog=PROG)

    return run


def _kube(args: argparse.Namespace) -> Kube:
    return Kube(load_client(args.kubeconfig, args.context), args.namespace, args.request_timeout)


def _release(args: argparse.Namespace, *, installable: bool = False) -> Release:
    """The release as the chart renders it for ``-f``/``--set``; for naming only, a missing image tag is filled in."""
    values = load_values(args.values, args.set)
    if not installable:  # names do not depend on what the chart requires only of an install
        image = values.get("image")
        if not isinstance(image, dict) or not (image.get("tag") or image.get("digest")):
            values = deep_merge(values, {"image": {"tag": NAME_PROBE_TAG}})
        persistence = (values.get("checkpoint") or {}).get("persistence") if isinstance(
            values.get("checkpoint"), dict) else None
        if not isinstance(persistence, dict) or not persistence.get("storageClassName"):
            values = deep_merge(values, {"checkpoint": {"persistence": {"storageClassName": NAME_PROBE_TAG}}})
    return render_release(values, name=args.release, namespace=args.namespace, chart=args.chart)


def _name(args: argparse.Namespace) -> str:
    """The RayJob's name: RELEASE itself with --raw-name, else what the chart names it for these values."""
    return args.release if args.raw_name else _release(args).ray_object["metadata"]["name"]


@_command
def cmd_name(args: argparse.Namespace) -> int:
    """The RayJob's name as the chart's fullname helper makes it (not always ``<release>-sc-app``): for scripts."""
    print(_name(args))
    return EXIT_OK


@_command
def cmd_submit(args: argparse.Namespace) -> int:
    release = _release(args, installable=True)
    if args.dry_run:
        sys.stdout.write(release.to_yaml())
        return EXIT_OK
    for line in install.submit(_kube(args), release):
        print(line)
    print(f"watch: sc-app k8s status {args.release} -n {args.namespace}")
    return EXIT_OK


@_command
def cmd_status(args: argparse.Namespace) -> int:
    st = RayJobs(_kube(args)).status(_name(args), live=not args.no_live, last_events=args.events)
    if not args.no_remote:
        from sc_app.k8s.remote_state import remote_doc, remote_state

        doc = remote_doc(load_values(args.values, args.set))
        st.remote = remote_state(doc, request_timeout=args.request_timeout) if doc is not None else None
    print(json.dumps(st.as_dict(), indent=2) if args.json else "\n".join(st.lines()))
    return EXIT_OK


@_command
def cmd_wait(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if not logging.getLogger().handlers:  # progress lines from RayJobs.wait when run from `sc-app`
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    name = _name(args)
    jobs = RayJobs(_kube(args))
    st = jobs.wait(name, timeout=args.timeout, poll=args.poll, started=started)
    print("\n".join(st.lines()))
    return EXIT_OK if st.deployment_status == "Complete" and st.job_status == "SUCCEEDED" else EXIT_FAILED


@_command
def cmd_suspend(args: argparse.Namespace) -> int:
    name = _name(args)
    jobs = RayJobs(_kube(args))
    obj = jobs.get(name)
    st = JobStatus.of(obj)
    if st.finished:  # KubeRay never acts on suspend once the job is terminal: --wait would wait for nothing
        return fail(f"rayjob/{name} is {st.deployment_status}: nothing runs to suspend (KubeRay ignores suspend on a "
                    "finished job); nothing written", EXIT_BAD_INPUT, prog=PROG)
    clusters = {st.cluster} - {""}
    queue = kueue.queue_of(obj)
    # With Kueue, deactivate the Workload first (else Kueue unsuspends the still-admitted job), then suspend the
    # RayJob too, so KubeRay starts stopping the cluster now and not only after Kueue's eviction round trip.
    workloads = kueue.set_active(jobs.kube, obj, False) if queue else []
    jobs.set_suspend(name, True)
    via = f" (Kueue workload {', '.join(workloads)} deactivated: Kueue keeps it suspended)" if workloads else ""
    if not args.wait:
        print(f"rayjob/{name}: suspend requested{via}; KubeRay deletes the cluster, the PVC is kept; "
              "--wait waits until it is Suspended and its pods are gone")
        return EXIT_OK
    jobs.wait_suspended(name, clusters, timeout=args.timeout, poll=args.poll, selector=job_pod_selector(obj))
    print(f"rayjob/{name}: suspended{via} (Suspended, every pod gone: no writer left on the PVC)")
    return EXIT_OK


@_command
def cmd_resume(args: argparse.Namespace) -> int:
    name = _name(args)
    jobs = RayJobs(_kube(args))
    jobs.wait_not_suspending(name, timeout=args.timeout, poll=args.poll)
    obj = jobs.get(name)
    if kueue.queue_of(obj):  # Kueue unsuspends the job once it admits the Workload again; writing suspend=false
        # ourselves would start pods on quota Kueue has not granted (and Kueue would suspend them again)
        workloads = kueue.set_active(jobs.kube, obj, True)
        print(f"rayjob/{name}: resume requested: Kueue workload {', '.join(workloads)} reactivated; Kueue unsuspends "
              f"the job when queue {kueue.queue_of(obj)} admits it, then a new cluster resumes from the newest bundle")
        return EXIT_OK
    jobs.set_suspend(name, False)
    print(f"rayjob/{name}: resumed (new cluster, resumes from the newest bundle)")
    return EXIT_OK


@_command
def cmd_delete(args: argparse.Namespace) -> int:
    release = _release(args)
    if args.raw_name:
        release.ray_object["metadata"]["name"] = args.release
    done = install.delete(_kube(args), release, timeout=args.timeout, poll=args.poll)
    for line in done.lines[:-1] if not done.complete else done.lines:
        print(line)
    if not done.complete:
        return fail(done.lines[-1], EXIT_FAILED, prog=PROG)
    return EXIT_OK


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("release", help="release name (the RayJob is named like the chart names it: <release>-sc-app)")
    p.add_argument("-n", "--namespace", default="default", help="namespace (default: default)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.add_argument(
        "--request-timeout",
        type=_seconds,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
        help=f"longest wait for any one answer of the API server (default {DEFAULT_REQUEST_TIMEOUT:g})",
    )
    p.add_argument("--chart", default=None, help="chart directory (default: $SC_APP_CHART or helm/sc-app)")
    p.add_argument("-f", "--values", action="append", default=[], help="values file (repeatable, later wins)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one value")
    p.add_argument("--raw-name", action="store_true", help="RELEASE is the RayJob's exact name")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``k8s`` with its verbs to the ``sc-app`` parser; each verb's ``func(args) -> int``."""
    k8s = subparsers.add_parser("k8s", help="submit and manage the RayJob on Kubernetes (no Helm needed)")
    verbs = k8s.add_subparsers(dest="k8s_command", metavar="{submit,name,status,wait,suspend,resume,delete}")
    verbs.required = True

    sub = verbs.add_parser("submit", help="render the chart's objects from values and create them")
    _common(sub)
    sub.add_argument("--dry-run", action="store_true", help="print the objects as YAML, create nothing")
    sub.set_defaults(func=cmd_submit)

    nm = verbs.add_parser("name", help="print the RayJob's name as the chart makes it for these values (no cluster "
                          "needed): `export JOB=$(sc-app k8s name RELEASE -f my-values.yaml)`")
    _common(nm)
    nm.set_defaults(func=cmd_name)

    st = verbs.add_parser(
        "status", help="deployment status, retries, resume step, and the running driver's step, bundle and events"
    )
    _common(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--events", type=_count, default=5, metavar="N", help="driver events to show (default 5)")
    st.add_argument("--no-live", action="store_true", help="do not ask the head's Ray Jobs API (no proxy access)")
    st.add_argument("--no-remote", action="store_true", help="do not read the bucket of config.checkpoint.remote "
                    "(its newest bundle; needs its credentials where this runs)")  # fmt: skip
    st.set_defaults(func=cmd_status)

    wt = verbs.add_parser("wait", help="wait until the job completes or fails (exit 0 only on success)")
    _common(wt)
    wt.add_argument("--timeout", type=_seconds, default=24 * 3600.0, help="total seconds (default 86400)")
    wt.add_argument("--poll", type=_seconds, default=10.0, help="seconds between polls (default 10)")
    wt.set_defaults(func=cmd_wait)

    for verb, fn, text in [
        ("suspend", cmd_suspend, "suspend: KubeRay deletes the cluster, the PVC stays (a job queued by Kueue: its "
         "Workload is deactivated, else Kueue would unsuspend it)"),
        ("resume", cmd_resume, "un-suspend (after a suspension in progress ended): a new cluster resumes from the "
         "newest bundle (Kueue: the Workload is reactivated and Kueue unsuspends the job on admission)"),
    ]:
        p = verbs.add_parser(verb, help=text)
        _common(p)
        if verb == "suspend":
            p.add_argument("--wait", action="store_true", help="until Suspended and every pod of the job is gone")
        p.add_argument("--timeout", type=_seconds, default=600.0, help="seconds to wait (default 600)")
        p.add_argument("--poll", type=_seconds, default=2.0, help="seconds between checks (default 2)")
        p.set_defaults(func=fn)

    dl = verbs.add_parser("delete", help="delete the RayJob, then what submit created with it (never the PVC)")
    _common(dl)
    dl.add_argument("--timeout", type=_seconds, default=300.0, help="seconds to wait for the RayJob to go (300)")
    dl.add_argument("--poll", type=_seconds, default=2.0, help="seconds between checks (default 2)")
    dl.set_defaults(func=cmd_delete)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m sc_app.k8s.cli k8s VERB ...``), the same parser as ``sc-app k8s``: returns the
    exit code (a bad flag too: one line, 2) and leaves logging alone, so tests call it in-process."""
    parser = Parser(prog="sc-app")
    register(parser.add_subparsers(dest="command", required=True, parser_class=Parser))
    args = parse(parser, argv)
    return args if isinstance(args, int) else int(args.func(args))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(main())
