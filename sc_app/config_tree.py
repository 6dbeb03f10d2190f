"""The raw config tree before validation: ``--set key.path=value`` parsing, where each value came from (for the
error line), the YAML file, and keys renamed since a release. Pure: no Ray, no torch (``sc_app.config`` validates).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Keys renamed since a release: the old one is still read (with a warning) and names the new one.
RENAMED_KEYS = {"grpo.num_generations_per_prompt": "grpo.group_size"}

log = logging.getLogger("sc_app.config")


class ConfigError(ValueError):
    """A configuration problem; ``str()`` is one line naming the key and what to do."""


@dataclass(frozen=True)
class Override:
    """One ``key.path=value`` the user gave, and how they gave it (for error lines): ``--set k=v`` by default, or
    the flag that stands for it (``--checkpoint-dir DIR``)."""

    text: str
    flag: str | None = None

    @property
    def source(self) -> str:
        return self.flag or f"--set '{self.text}'"


def origin_of(loc: str, sources: dict[str, str]) -> str | None:
    """Where the value at ``loc`` (or the section holding it) was set: a config file or a flag."""
    parts = loc.split(".") if loc else []
    for n in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:n]))
        if found:
            return found
    return None


def leaf_sources(tree: Any, prefix: str, source: str, out: dict[str, str]) -> None:
    if isinstance(tree, dict):
        for key, value in tree.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            out[dotted] = source
            leaf_sources(value, dotted, source, out)


def set_path(tree: dict[str, Any], dotted: str, value: Any, *, source: str | None = None) -> None:
    """Set ``tree[a][b][c] = value`` for ``dotted = "a.b.c"``, creating sections; ``ConfigError`` names the key
    and ``source`` (how the user gave it; default ``--set 'a.b.c'``)."""
    source = source or f"--set '{dotted}'"
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"{source}: empty key segment; use --set section.key=value")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str, *, source: str | None = None) -> tuple[str, Any]:
    """``a.b=c`` → ``("a.b", yaml-typed c)``."""
    source = source or f"--set '{text}'"
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"{source}: expected key.path=value, e.g. --set checkpoint.save_period=2")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(f"{source}: value is not valid YAML ({exc.__class__.__name__})") from None
    return key.strip(), value


def read_file(p: Path) -> dict[str, Any]:
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {p}: cannot read ({exc.strerror}); pass an existing YAML file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {p}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {p}: malformed YAML{where}; fix the syntax") from None
    except RecursionError:
        raise ConfigError(f"config file {p}: nested too deeply to be a config") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {p}: top level must be a mapping of sections, got {type(loaded).__name__}")
    return loaded


def rename_keys(tree: dict[str, Any], sources: dict[str, str]) -> None:
    """Move each value given under an old key (``RENAMED_KEYS``) to its new key, warning once per key."""
    for old, new in RENAMED_KEYS.items():
        section, _, leaf = old.rpartition(".")
        node = tree.get(section)
        if not isinstance(node, dict) or leaf not in node:
            continue
        source = sources.get(old, "the config")
        new_leaf = new.rpartition(".")[2]
        if new_leaf in node:
            raise ConfigError(f"{source}: '{old}' is the old name of '{new}', which is set too; keep only '{new}'")
        node[new_leaf] = node.pop(leaf)
        sources[new] = source
        log.warning("%s: '%s' is deprecated; it is now '%s' (read as that)", source, old, new)
