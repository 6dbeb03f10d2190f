"""Shared by the ``helm`` and ``kubectl`` stand-ins the runbook sequences run (test_runbook_sequences.py): the
API-server stand-in they talk to (``$KUBECONFIG``), the state directory (``$RUNBOOK_STATE``), the call log."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from sc_app.k8s.api import Kube, load_client


def state() -> Path:
    return Path(os.environ["RUNBOOK_STATE"])


def log_call(tool: str, args: list[str], **extra: Any) -> None:
    with open(state() / "calls.jsonl", "a") as f:
        f.write(json.dumps({"tool": tool, "args": args, **extra}) + "\n")


def namespace(args: list[str]) -> str:
    for flag in ("-n", "--namespace"):
        if flag in args:
            return args[args.index(flag) + 1]
    return "default"


def kube(ns: str) -> Kube:
    return Kube(load_client(os.environ["KUBECONFIG"]), ns)


def unsupported(tool: str, args: list[str]) -> None:
    sys.stderr.write(f"{tool} stand-in: not supported: {' '.join(args)}\n")
    sys.exit(3)
