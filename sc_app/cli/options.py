"""What every ``sc-app`` command shares: the options more than one command takes (``--checkpoint-dir``, ``--json``,
``--config``/``--set``), and reading them. The parser that reports a bad flag as one line is ``sc_app.exits.Parser``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sc_app.config.app import AppConfig, Override, load_config


class BadDir(Exception):
    """A ``--checkpoint-dir`` a command cannot use; the message is its one error line."""


def add_checkpoint_dir(p: Any, *, required: bool = True, help: str | None = None) -> None:
    """``--checkpoint-dir DIR`` on a parser or an argument group."""
    p.add_argument("--checkpoint-dir", metavar="DIR", required=required, help=help)


def add_json(p: argparse.ArgumentParser, help: str = "machine-readable output") -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_config(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--set KEY=VALUE``: the run config, resolved by ``resolve``."""
    p.add_argument("--config", metavar="FILE", help="YAML config; the embedded default when omitted")
    p.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config key, e.g. --set checkpoint.save_period=2 (repeatable)",
    )


def resolve(args: argparse.Namespace) -> AppConfig:
    """The config of ``--config``/``--set``; ``--checkpoint-dir`` and ``--max-steps``, where a command has them,
    override ``checkpoint.dir`` and ``run.max_steps`` (``ConfigError``, one line)."""
    overrides: list[str | Override] = list(args.overrides)
    if getattr(args, "checkpoint_dir", None) is not None:
        overrides.append(Override(f"checkpoint.dir={args.checkpoint_dir}", f"--checkpoint-dir {args.checkpoint_dir}"))
    if getattr(args, "max_steps", None) is not None:
        overrides.append(Override(f"run.max_steps={args.max_steps}", f"--max-steps {args.max_steps}"))
    return load_config(args.config, overrides)


def checkpoint_root(args: argparse.Namespace, *, must_exist: bool) -> Path:
    """``--checkpoint-dir`` as a directory that can be read, else ``BadDir`` with the one line to print."""
    from sc_app.checkpoint import volume

    root = Path(args.checkpoint_dir)
    problem = volume.unusable_as_dir(root)
    if problem is None and must_exist and not root.exists():
        problem = f"checkpoint dir {root} does not exist"
    if problem:
        raise BadDir(problem)
    return root
