"""Reading files that someone else may have changed: regular files only, never through a symbolic link, never outside
the directory asked for, never a blocking open, never more bytes than allowed. Pure: no Ray, no torch.

Invariants:
* ``Tree`` holds an open descriptor of one directory (refused when that is a link or not a directory). Every path it
  opens is relative to it, refused by ``unsafe_rel`` unless it is a plain relative path (no absolute path, no ``..``,
  no empty or ``.`` part), and opened one component at a time with ``O_NOFOLLOW``: nothing outside the directory is
  ever opened and no link inside it is followed.
* Only regular files are opened. A FIFO, socket or device is named from its ``lstat`` and never opened (opening a
  FIFO for reading blocks until a writer comes); the open itself is ``O_NONBLOCK`` and re-checked with ``fstat``, so a
  file swapped for a FIFO in between cannot hang a reader either.
* Every failure is a ``FileProblem`` whose message starts with the full path and says what is wrong — never a bare
  ``OSError`` from deep inside, never a ``MemoryError`` (reads are bounded before they start).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sc_app.io import hashing

CHUNK = 8 * 1024 * 1024
MAX_REL_LEN = 4096
SCAN_MAX_DEPTH = 32  # sc-app writes at most 3 levels; deeper is someone else's tree
SCAN_MAX_ENTRIES = 1_000_000

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class FileProblem(OSError):
    """A file cannot be used as asked: missing, not a regular file, a link, unreadable, too large, outside the tree.
    ``str()`` is the one line to show: the path, then what is wrong."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "file problem"


class FileMissing(FileProblem):
    """The path names nothing (``FileProblem`` "missing")."""


def kind(mode: int) -> str:
    """What an ``st_mode`` is, as a phrase: "a regular file", "a FIFO", ..."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a file of unknown type"


def not_regular(mode: int) -> str:
    """Why an entry that is not a regular file or directory is refused (links are never followed)."""
    if stat.S_ISLNK(mode):
        return "is a symbolic link (sc-app never writes one); not followed"
    return f"is {kind(mode)}, not a regular file; not opened"


def show(text: str | Path) -> str:
    """``text`` safe to print on one line: undecodable bytes and control characters escaped."""
    s = str(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return s if s.isprintable() else s.encode("unicode_escape").decode("ascii")


def unsafe_rel(rel: object) -> str | None:
    """Why ``rel`` is not a plain relative path inside a directory (``None`` when it is one)."""
    if not isinstance(rel, str) or not rel:
        return "is not a path"
    if len(rel) > MAX_REL_LEN:
        return f"is longer than {MAX_REL_LEN} characters"
    if rel.startswith("/"):
        return "is absolute, a path outside the bundle"
    parts = rel.split("/")
    if ".." in parts:
        return "climbs with '..', a path outside the bundle"
    if any(p in ("", ".") for p in parts):
        return "is not a plain relative path (empty or '.' part)"
    if any(ord(c) < 32 or c in "\\\x7f" for c in rel):
        return "holds control characters or backslashes"
    return None


@dataclass
class Inventory:
    """What a directory tree holds, without following links: regular files (relative path → size), directories,
    everything else (path → why it is refused), and what could not be listed (path → why)."""

    files: dict[str, int] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    odd: dict[str, str] = field(default_factory=dict)
    unlisted: dict[str, str] = field(default_factory=dict)

    def kind_of(self, rel: str) -> str | None:
        if rel in self.files:
            return "a regular file"
        if rel in self.dirs:
            return "a directory"
        if rel in self.odd:
            return "odd"
        return None

    def hidden(self, rel: str) -> bool:
        """True when ``rel`` lies under (or is) something the scan could not list or refused to enter."""
        parts = rel.split("/")
        prefixes = {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
        return bool(prefixes & (set(self.unlisted) | set(self.odd))) or "." in self.unlisted


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValueError):
        return "the path holds a NUL byte" if "null" in str(exc) else str(exc)
    return getattr(exc, "strerror", None) or type(exc).__name__


class Tree:
    """One directory, held open; every read is confined to it (see the module's invariants)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: str | Path) -> Tree:
        path = Path(path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise FileMissing(f"{show(path)}: missing") from None
        except OSError as exc:
            raise FileProblem(f"{show(path)}: cannot be examined ({_reason(exc)})") from None
        if not stat.S_ISDIR(st.st_mode):
            if stat.S_ISLNK(st.st_mode):
                raise FileProblem(f"{show(path)}: {not_regular(st.st_mode)}")
            raise FileProblem(f"{show(path)}: is {kind(st.st_mode)}, expected a directory")
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            raise FileProblem(f"{show(path)}: cannot be opened ({_reason(exc)})") from None
        return cls(path, fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def at(self, rel: str) -> str:
        """The full path of ``rel``, printable."""
        return show(self.path / rel)

    # -- opening ----------------------------------------------------------------------------------------------
    def _explain(self, dir_fd: int, name: str, rel: str, exc: OSError, want: str) -> FileProblem:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return FileMissing(f"{self.at(rel)}: missing")
        except OSError as exc2:
            return FileProblem(f"{self.at(rel)}: cannot be examined ({_reason(exc2)})")
        if stat.S_ISLNK(st.st_mode):
            return FileProblem(f"{self.at(rel)}: {not_regular(st.st_mode)}")
        if want == "a directory" and not stat.S_ISDIR(st.st_mode):
            return FileProblem(f"{self.at(rel)}: is {kind(st.st_mode)}, expected a directory")
        return FileProblem(f"{self.at(rel)}: cannot be read ({_reason(exc)})")

    def _parent(self, rel: str) -> tuple[int, str]:
        """Descriptor of ``rel``'s directory (the caller closes it unless it is ``self.fd``) and its last part."""
        why = unsafe_rel(rel)
        if why is not None:
            raise FileProblem(f"{show(self.path)}: '{show(str(rel))}' {why}")
        parts = rel.split("/")
        fd = self.fd
        try:
            for i, part in enumerate(parts[:-1]):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise self._explain(fd, part, "/".join(parts[: i + 1]), exc, "a directory") from None
                if fd != self.fd:
                    os.close(fd)
                fd = child
        except BaseException:
            if fd != self.fd:
                os.close(fd)
            raise
        return fd, parts[-1]

    def open_file(self, rel: str) -> int:
        """A read-only descriptor of the regular file ``rel`` (the caller closes it)."""
        parent, name = self._parent(rel)

        def open_() -> int:
            try:
                return os.open(name, _FILE_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise self._explain(parent, name, rel, exc, "a regular file") from None

        try:
            return _open_checked(self.at(rel), lambda: os.stat(name, dir_fd=parent, follow_symlinks=False), open_)
        finally:
            if parent != self.fd:
                os.close(parent)

    def read(self, rel: str, limit: int) -> bytes:
        """The whole content of ``rel``; ``FileProblem`` when it holds more than ``limit`` bytes."""
        fd = self.open_file(rel)
        try:
            return _read_fd(fd, limit, self.at(rel))
        finally:
            os.close(fd)

    def digest(self, rel: str, alg: str) -> tuple[str, int]:
        """Digest (``sc_app.io.hashing`` algorithm ``alg``) and size of ``rel``, read once."""
        fd = self.open_file(rel)
        try:
            return hashing.digest_fd(fd, alg)
        except OSError as exc:
            raise FileProblem(f"{self.at(rel)}: cannot be read ({_reason(exc)})") from None
        finally:
            os.close(fd)

    def sha256(self, rel: str) -> tuple[str, int]:
        return self.digest(rel, hashing.SHA256)

    # -- listing -----------------------------------------------------------------------------------------------
    def scan(self, *, max_depth: int = SCAN_MAX_DEPTH, max_entries: int = SCAN_MAX_ENTRIES) -> Inventory:
        """Every entry under the directory, links and special files named but never followed or opened."""
        inv = Inventory()
        seen = 0

        def walk(fd: int, prefix: str, depth: int) -> None:
            nonlocal seen
            try:
                entries = list(os.scandir(fd))
            except OSError as exc:
                inv.unlisted[prefix.rstrip("/") or "."] = f"cannot be listed ({_reason(exc)})"
                return
            for entry in sorted(entries, key=lambda e: e.name):
                seen += 1
                if seen > max_entries:
                    inv.unlisted[prefix.rstrip("/") or "."] = f"holds more than {max_entries} entries; not all listed"
                    return
                rel = prefix + entry.name
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError as exc:
                    inv.unlisted[rel] = f"cannot be examined ({_reason(exc)})"
                    continue
                if stat.S_ISREG(st.st_mode):
                    inv.files[rel] = st.st_size
                elif stat.S_ISDIR(st.st_mode):
                    inv.dirs.add(rel)
                    if depth >= max_depth:
                        inv.unlisted[rel] = f"nested more than {max_depth} directories deep; not listed"
                        continue
                    try:
                        child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                    except OSError as exc:
                        inv.unlisted[rel] = f"cannot be listed ({_reason(exc)})"
                        continue
                    try:
                        walk(child, rel + "/", depth + 1)
                    finally:
                        os.close(child)
                else:
                    inv.odd[rel] = not_regular(st.st_mode)

        walk(self.fd, "", 0)
        return inv


def _read_fd(fd: int, limit: int, where: str) -> bytes:
    size = os.fstat(fd).st_size
    if size > limit:
        raise FileProblem(f"{where}: {size} bytes, more than the {limit} this file may hold")
    chunks: list[bytes] = []
    got = 0
    try:
        while chunk := os.read(fd, min(CHUNK, limit + 1 - got)):
            chunks.append(chunk)
            got += len(chunk)
            if got > limit:
                raise FileProblem(f"{where}: grew past the {limit} bytes this file may hold while being read")
    except OSError as exc:
        if isinstance(exc, FileProblem):
            raise
        raise FileProblem(f"{where}: cannot be read ({_reason(exc)})") from None
    return b"".join(chunks)


def open_regular(path: str | Path, *, follow: bool = False) -> int:
    """A read-only descriptor of ``path``, which must be a regular file and not a link (its last component is not
    followed; callers pass paths inside a bundle that verified) — or, with ``follow``, a link to a regular file (a
    Hugging Face cache's model directory is links to blobs). Never blocks (a FIFO or device is refused before it
    is opened, and again on the descriptor). The caller closes it."""
    path = Path(path)
    flags = _FILE_FLAGS & ~os.O_NOFOLLOW if follow else _FILE_FLAGS

    def open_() -> int:
        try:
            return os.open(path, flags)
        except OSError as exc:
            raise FileProblem(f"{show(path)}: cannot be read ({_reason(exc)})") from None

    return _open_checked(show(path), (lambda: os.stat(path)) if follow else (lambda: os.lstat(path)), open_)


def _open_checked(where: str, lstat: Callable[[], os.stat_result], open_: Callable[[], int]) -> int:
    """The descriptor ``open_()`` returns, only for a regular file: checked before the open (without following a
    link) and again on the descriptor, since the entry can be swapped in between."""
    try:
        st = lstat()
    except (FileNotFoundError, NotADirectoryError):  # nothing there (or a file where a directory should be)
        raise FileMissing(f"{where}: missing") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise FileProblem(f"{where}: cannot be examined ({_reason(exc)})") from None
    if stat.S_ISDIR(st.st_mode):
        raise FileProblem(f"{where}: is a directory, expected a regular file")
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(f"{where}: {not_regular(st.st_mode)}")
    fd = open_()
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FileProblem(f"{where}: {not_regular(mode)}")
    return fd


def read_regular(path: str | Path, limit: int, *, follow: bool = False) -> bytes:
    """The content of the regular file ``path`` (see ``open_regular``), at most ``limit`` bytes."""
    fd = open_regular(path, follow=follow)
    try:
        return _read_fd(fd, limit, show(path))
    finally:
        os.close(fd)


def read_optional(path: str | Path, limit: int, *, follow: bool = False) -> bytes | None:
    """``read_regular``, but None when ``path`` does not exist (a record not written yet)."""
    try:
        return read_regular(path, limit, follow=follow)
    except FileMissing:
        return None
