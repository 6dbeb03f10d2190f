"""``sc-app config``: print the resolved config (embedded default, ``--config``, ``--set``) as YAML."""

from __future__ import annotations

import argparse

from sc_app.cli.options import add_config, resolve
from sc_app.config.app import dump_config
from sc_app.exits import EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    cf = sub.add_parser("config", help="print the resolved config as YAML")
    add_config(cf)
    cf.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace) -> int:
    print(dump_config(resolve(args)), end="")
    return EXIT_OK
