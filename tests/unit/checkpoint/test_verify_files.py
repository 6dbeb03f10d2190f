"""Whatever stands where a bundle's file or directory belongs — a FIFO (opening one for reading blocks forever), a
socket, a device, a directory, a regular file, a link (dangling, to a good copy outside, to a file inside), an
unreadable file or directory — verification names it (file + what is wrong), never opens it, never crashes or hangs;
``ckpt list/verify --json`` print a report; ``on_corrupt=fallback`` resumes the older good bundle."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sc_app.checkpoint import layout, plan_resume, verify_bundle
from sc_app.cli import main
from tests.support.bundles import make_bundle, tree
from tests.support.opens import opened_files, outside
from tests.support.proc import REPO, finishes, unprivileged

Make = Callable[[Path, Path], None]  # (path to replace, scratch dir outside the bundle)


def _replace(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def fifo(path: Path, scratch: Path) -> None:
    _replace(path)
    os.mkfifo(path)


def unix_socket(path: Path, scratch: Path) -> None:
    _replace(path)
    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp")) / "s"  # AF_UNIX paths are short; bind there, move in
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(short))
    os.rename(short, path)
    short.parent.rmdir()


def char_device(path: Path, scratch: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    _replace(path)
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers


def directory(path: Path, scratch: Path) -> None:
    _replace(path)
    path.mkdir()
    (path / "inner").write_bytes(b"x")


def regular_file(path: Path, scratch: Path) -> None:
    _replace(path)
    path.write_bytes(b"a file where a directory belongs")


def dangling_link(path: Path, scratch: Path) -> None:
    _replace(path)
    path.symlink_to(scratch / "nowhere")


def link_to_good_copy_outside(path: Path, scratch: Path) -> None:
    copy = scratch / f"copy-of-{path.name}"
    (shutil.copytree if path.is_dir() else shutil.copy2)(path, copy)
    _replace(path)
    path.symlink_to(copy)


def link_inside(path: Path, scratch: Path) -> None:
    kept = path.with_name(path.name + ".kept")
    path.rename(kept)
    path.symlink_to(kept.name)


KINDS: dict[str, tuple[Make, str]] = {
    "FIFO": (fifo, "is a FIFO"),
    "socket": (unix_socket, "is a socket"),
    "character device": (char_device, "is a character device"),
    "directory": (directory, "is a directory"),
    "dangling link": (dangling_link, "symbolic link"),
    "link to a good copy outside": (link_to_good_copy_outside, "symbolic link"),
    "link to a file inside": (link_inside, "symbolic link"),
}
FILES = ["manifest.json", "policy/model.pt", "train_dataloader.pt", "data_plane/part-00-00000.bin"]
DIRS = ["policy", "data_plane"]


def _assert_named(tmp_path: Path, bundle: Path, rel: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with opened_files() as seen:
        report = finishes(lambda: verify_bundle(bundle))
    assert any(p.startswith(f"{bundle / rel}:") and needle in p for p in report.problems), report.problems
    assert outside(seen, bundle) == [], "verification opened something outside the bundle"
    for argv in (["ckpt", "verify", "--json"], ["ckpt", "list", "--json"], ["preflight", "--dry-run", "--json"]):
        capsys.readouterr()
        rc = finishes(lambda argv=argv: main([*argv, "--checkpoint-dir", str(tmp_path)]))
        assert rc in (0, 2) and json.loads(capsys.readouterr().out), argv
    bad_tree = tree(bundle)
    plan = finishes(lambda: plan_resume(tmp_path))
    assert plan.decision == "resume" and plan.step == 2, plan.reason
    moved = [p for p in (tmp_path / layout.QUARANTINE_DIR).iterdir() if p.is_dir()]
    assert len(moved) == 1 and tree(moved[0]) == bad_tree, "the bad bundle is moved aside intact"


DIR_KINDS = {k: v for k, v in KINDS.items() if k != "directory"} | {"regular file": (regular_file, "regular file")}
# Where a regular file belongs, every other kind of entry; where a directory belongs, every other kind (a file too).
MISPLACED = [
    pytest.param(rel, *kinds[kind], id=f"{rel}-{kind}")
    for rels, kinds in ((FILES, KINDS), (DIRS, DIR_KINDS))
    for rel in rels
    for kind in kinds
]


@pytest.mark.parametrize(("rel", "make", "needle"), MISPLACED)
def test_anything_but_the_expected_kind_of_entry_is_named(
    tmp_path: Path, rel: str, make: Make, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    root = tmp_path / "ckpt"
    make_bundle(root, 2)
    bundle = make_bundle(root, 4)
    make(bundle / rel, scratch)
    _assert_named(root, bundle, rel, needle, capsys)


@pytest.mark.parametrize("kind", ["FIFO", "socket", "dangling link"])
def test_an_extra_entry_the_manifest_does_not_list(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    (bundle / "policy" / "extra").write_bytes(b"")
    make, needle = KINDS[kind]
    make(bundle / "policy" / "extra", tmp_path)
    _assert_named(tmp_path, bundle, "policy/extra", needle, capsys)


def test_a_tree_nested_deeper_than_any_bundle_is_named(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    deep = bundle / "data_plane"
    for _ in range(40):
        deep = deep / "d"
    deep.mkdir(parents=True)
    report = finishes(lambda: verify_bundle(bundle))
    assert any("nested more than" in p for p in report.problems), report.problems


# ---------------------------------------------------------------------------------------------- unreadable
UNREADABLE: dict[str, tuple[str, int, str]] = {
    "file": ("policy/model.pt", 0o000, "cannot be read (Permission denied)"),
    "manifest": ("manifest.json", 0o000, "cannot be read (Permission denied)"),
    "directory": ("policy", 0o000, "cannot be listed (Permission denied)"),
    "directory without read": ("data_plane", 0o311, "cannot be listed (Permission denied)"),
    "bundle": ("", 0o000, "cannot be opened (Permission denied)"),
}

SCRIPT = """
import contextlib, io, json, sys
from pathlib import Path
from sc_app.checkpoint import plan_resume, verify_bundle
from sc_app.cli import main
root = Path(sys.argv[1])
report = verify_bundle(root / "step_4")
plan = plan_resume(root, tidy=False)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["ckpt", "verify", "--json", "--checkpoint-dir", str(root)])
cli = [p for r in json.loads(out.getvalue()) for p in r["problems"]]
print(json.dumps({"problems": report.problems, "decision": plan.decision, "step": plan.step, "rc": rc, "cli": cli}))
"""


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_unreadable_entries_are_named_for_a_reader_permission_bits_stop(case: str) -> None:
    """Run as a reader that permission bits apply to (root keeps reading ``000`` files: ``unprivileged``)."""
    rel, mode, needle = UNREADABLE[case]
    root = Path(tempfile.mkdtemp(prefix="sc-app-unreadable-"))
    target = root / "step_4" / rel if rel else root / "step_4"
    try:
        make_bundle(root, 2)
        bundle = make_bundle(root, 4)
        assert verify_bundle(bundle).ok
        os.chmod(target, mode)
        cmd = unprivileged([sys.executable, "-c", SCRIPT, str(root)])
        if cmd is None:
            pytest.skip("running as root and setpriv cannot drop CAP_DAC_OVERRIDE here")
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert any(p.startswith(f"{target}:") and needle in p for p in out["problems"]), out["problems"]
        assert (out["decision"], out["step"]) == ("resume", 2)
        assert out["rc"] == 2 and any(needle in p for p in out["cli"]), out
    finally:
        if target.exists():
            os.chmod(target, 0o755)
        shutil.rmtree(root)
