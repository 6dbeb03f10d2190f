"""``sc-app k8s submit|status|wait|suspend|resume|delete``: a RayJob from the chart's values, without Helm.

Exit codes: 0 ok; 1 the job failed / timed out waiting; 2 bad input or an API error (one line on stderr).
Invariant: ``delete`` removes the RayJob (KubeRay then removes its cluster) and never the checkpoint PVC.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


def _err(message: str, code: int = EXIT_ERROR) -> int:
    print(f"sc-app k8s: error: {message}", file=sys.stderr)
    return code


def _jobs(args: argparse.Namespace) -> Any:
    from sc_app.k8s.api import RayJobs, api_client

    return RayJobs(api_client(args.kubeconfig, args.context), args.namespace)


def _name(args: argparse.Namespace) -> str:
    """The RayJob name for a release name (what the chart's fullname helper produces)."""
    from sc_app.k8s.manifest import render_release

    if args.raw_name:
        return args.release
    # Render once with throwaway values to learn the object name rule instead of re-implementing it.
    rel = render_release(
        {"image": {"tag": "name-probe"}}, name=args.release, namespace=args.namespace, chart=args.chart
    )
    return rel.ray_object["metadata"]["name"]


def cmd_submit(args: argparse.Namespace) -> int:
    from sc_app.k8s.api import K8sError
    from sc_app.k8s.manifest import ManifestError, load_values, render_release

    try:
        values = load_values(args.values, args.set)
        release = render_release(values, name=args.release, namespace=args.namespace, chart=args.chart)
    except ManifestError as exc:
        return _err(str(exc))
    if args.dry_run:
        sys.stdout.write(release.to_yaml())
        return EXIT_OK
    try:
        for line in _jobs(args).submit(release.objects):
            print(line)
    except K8sError as exc:
        return _err(str(exc))
    print(f"watch: sc-app k8s status {args.release} -n {args.namespace}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from sc_app.k8s.api import K8sError
    from sc_app.k8s.manifest import ManifestError

    try:
        st = _jobs(args).status(_name(args))
    except (K8sError, ManifestError) as exc:
        return _err(str(exc))
    if args.json:
        print(json.dumps(st.as_dict(), indent=2))
    else:
        print("\n".join(st.lines()))
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    from sc_app.k8s.api import K8sError
    from sc_app.k8s.manifest import ManifestError

    if not logging.getLogger().handlers:  # progress lines from RayJobs.wait when run from `sc-app`
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        st = _jobs(args).wait(_name(args), timeout=args.timeout, poll=args.poll)
    except (K8sError, ManifestError) as exc:
        return _err(str(exc))
    except TimeoutError as exc:
        return _err(str(exc), EXIT_FAILED)
    print("\n".join(st.lines()))
    return EXIT_OK if st.deployment_status == "Complete" and st.job_status == "SUCCEEDED" else EXIT_FAILED


def _suspend(args: argparse.Namespace, value: bool) -> int:
    from sc_app.k8s.api import K8sError
    from sc_app.k8s.manifest import ManifestError

    try:
        name = _name(args)
        _jobs(args).set_suspend(name, value)
    except (K8sError, ManifestError) as exc:
        return _err(str(exc))
    print(
        f"rayjob/{name}: "
        + (
            "suspended (cluster deleted, PVC kept)"
            if value
            else "resumed (new cluster, resumes from the newest bundle)"
        )
    )
    return EXIT_OK


def cmd_suspend(args: argparse.Namespace) -> int:
    return _suspend(args, True)


def cmd_resume(args: argparse.Namespace) -> int:
    return _suspend(args, False)


def cmd_delete(args: argparse.Namespace) -> int:
    from sc_app.k8s.api import K8sError
    from sc_app.k8s.manifest import ManifestError

    try:
        name = _name(args)
        _jobs(args).delete(name)
    except (K8sError, ManifestError) as exc:
        return _err(str(exc))
    print(f"deleted rayjob/{name}; the checkpoint PVC and its bundles are kept")
    return EXIT_OK


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("release", help="release name (the RayJob is named like the chart names it: <release>-sc-app)")
    p.add_argument("-n", "--namespace", default="default", help="namespace (default: default)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.add_argument("--chart", default=None, help="chart directory (default: $SC_APP_CHART or helm/sc-app)")
    p.add_argument("--raw-name", action="store_true", help="RELEASE is the RayJob's exact name")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``k8s`` with its verbs to the ``sc-app`` parser; each verb's ``func(args) -> int``."""
    k8s = subparsers.add_parser("k8s", help="submit and manage the RayJob on Kubernetes (no Helm needed)")
    verbs = k8s.add_subparsers(dest="k8s_command", metavar="{submit,status,wait,suspend,resume,delete}")
    verbs.required = True

    sub = verbs.add_parser("submit", help="render the chart's objects from values and create them")
    _common(sub)
    sub.add_argument("-f", "--values", action="append", default=[], help="values file (repeatable, later wins)")
    sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one value")
    sub.add_argument("--dry-run", action="store_true", help="print the objects as YAML, create nothing")
    sub.set_defaults(func=cmd_submit)

    st = verbs.add_parser("status", help="deployment status, retries used of backoffLimit, newest bundle step")
    _common(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=cmd_status)

    wt = verbs.add_parser("wait", help="wait until the job completes or fails (exit 0 only on success)")
    _common(wt)
    wt.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds (default 86400)")
    wt.add_argument("--poll", type=float, default=10.0, help="seconds between polls (default 10)")
    wt.set_defaults(func=cmd_wait)

    for verb, fn, text in [
        ("suspend", cmd_suspend, "suspend: KubeRay deletes the cluster, the PVC stays"),
        ("resume", cmd_resume, "un-suspend: a new cluster starts and resumes from the newest bundle"),
        ("delete", cmd_delete, "delete the RayJob (never the checkpoint PVC)"),
    ]:
        p = verbs.add_parser(verb, help=text)
        _common(p)
        p.set_defaults(func=fn)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m sc_app.k8s.cli``) until ``sc-app`` wires :func:`register`."""
    parser = argparse.ArgumentParser(prog="sc-app")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
