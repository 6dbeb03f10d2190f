"""BundleFiles: how verification's content checks (and policy-format checkers) read a bundle's files.

Invariants: only files the manifest lists are read; each is a regular file inside the bundle, reached without
following a link (``sc_app.io.safe_files.Tree``); no more than a caller's bound is read; and the bytes handed to a
parser are the very bytes whose digest (by the manifest's algorithm) was just compared with the manifest — a file
changed after it was hashed is refused, not parsed. Every failure is a ``FileProblem`` whose message names the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sc_app.checkpoint.manifest import Manifest
from sc_app.io import hashing
from sc_app.io.safe_files import FileProblem, Tree


class BundleFiles:
    def __init__(self, tree: Tree, manifest: Manifest) -> None:
        self._tree = tree
        self.manifest = manifest

    @property
    def path(self) -> Path:
        return self._tree.path

    def at(self, rel: str) -> str:
        """The full path of ``rel``, printable: how every problem names a file."""
        return self._tree.at(rel)

    def listed(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        """Manifest entries (bundle-relative path → ``{"digest", "size"}``) under ``prefix``."""
        return {rel: info for rel, info in self.manifest.files.items() if rel.startswith(prefix)}

    def size(self, rel: str) -> int:
        """Size the manifest records for ``rel`` (verification already matched it with the file)."""
        info = self.manifest.files.get(rel)
        if info is None:
            raise FileProblem(f"{self.at(rel)}: missing (the manifest does not list it)")
        return int(info["size"])

    def read(self, rel: str, limit: int) -> bytes:
        """The bytes of ``rel``, at most ``limit``, and only if their digest is the manifest's."""
        if self.size(rel) > limit:
            raise FileProblem(f"{self.at(rel)}: {self.size(rel)} bytes, more than the {limit} this file may hold")
        data = self._tree.read(rel, limit)
        alg = self.manifest.hash_alg
        if hashing.digest_bytes(data, alg) != self.manifest.files[rel]["digest"]:
            raise FileProblem(f"{self.at(rel)}: {alg} does not match the manifest (changed while being verified)")
        return data

    def load_pt(self, rel: str, limit: int) -> Any:
        """``read`` + ``torch_files.load`` (``weights_only``): what a torch file holds, or a ``FileProblem``."""
        from sc_app.io import torch_files  # deferred: torch only when a bundle's contents are checked

        data = self.read(rel, limit)
        try:
            return torch_files.load(data)
        except Exception as exc:  # a parser fed untrusted bytes: whatever it raises is "does not load"
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            raise FileProblem(
                f"{self.at(rel)}: does not load as a weights-only torch file ({type(exc).__name__}: {first})"
            ) from None
