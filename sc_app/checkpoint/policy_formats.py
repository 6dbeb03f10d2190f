"""Which check a bundle's ``policy/`` directory must pass: chosen by the policy format its manifest records.

A policy format is a name the manifest records in ``policy_format`` (absent: ``DEFAULT``, the tiny model's
``policy/model.pt`` + ``policy/optimizer.pt``, which every bundle written before formats existed holds) and a
checker ``check(ctx: PolicyCheck) -> list[str]``: the problems it finds, each starting with the path of the file it
names, empty when the policy will restore. A checker

* reads only through ``ctx.files`` (files the manifest lists, regular, inside the bundle, bounded, hash-checked:
  ``sc_app.checkpoint.bundle_files``), never by path;
* uses the same validators its restore uses, so what verifies is what restores;
* reports files under ``policy/`` that its format does not have.

Adding a format (as the hf backend's DCP checkpoints, ``sc-app/dcp-v1``, did): write the checker next to the
format's own code, add one line to ``CHECKERS`` (name → ``"module:function"``, imported only when a bundle of that
format is verified, so this module stays light), and record the name as ``policy_format`` in the manifests the
format's saves write.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sc_app.checkpoint import layout
from sc_app.checkpoint.bundle_files import BundleFiles
from sc_app.checkpoint.manifest import Manifest

DEFAULT = "sc-app/torch-v1"

CHECKERS: dict[str, str] = {
    DEFAULT: "sc_app.rl.state_schema:check_policy_dir",
    "sc-app/dcp-v1": "sc_app.rl.hf.policy_check:check_policy_dir",  # the hf backend (policy_ckpt.POLICY_FORMAT)
}


@dataclass(frozen=True)
class PolicyCheck:
    files: BundleFiles
    manifest: Manifest
    policy_dir: str = layout.POLICY_DIR  # bundle-relative


Checker = Callable[[PolicyCheck], list[str]]


def format_of(manifest: Manifest) -> str:
    return manifest.policy_format or DEFAULT


def resolve(target: str) -> Any:
    """The function a registry names as ``"module:function"``, imported now (registries name the check of a file
    whose restore lives above ``checkpoint/``, which must not import it)."""
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def checker_for(name: str) -> Checker | None:
    """The checker registered for ``name`` (``None`` for a format this sc-app does not know)."""
    target = CHECKERS.get(name)
    if target is None:
        return None
    checker: Checker = resolve(target)
    return checker


def check_policy(ctx: PolicyCheck) -> list[str]:
    name = format_of(ctx.manifest)
    checker = checker_for(name)
    if checker is None:
        return [
            f"{ctx.files.at(layout.MANIFEST_FILE)}: policy format {name!r} is not one this sc-app reads "
            f"({', '.join(sorted(CHECKERS))}); resume it with the sc-app version that wrote it"
        ]
    try:
        return list(checker(ctx))
    except Exception as exc:  # a checker's defect is a named problem, never a crash of `ckpt verify`
        return [f"{ctx.files.at(ctx.policy_dir)}: the {name} checker failed ({type(exc).__name__}: {exc})"]
