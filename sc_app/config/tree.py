"""The raw config tree before validation: ``--set key.path=value`` parsing, where each value came from (for the
error line) and keys renamed since a release. Reading the file and the bounds on every value are
``sc_app.config.input``'s (``read_file`` re-exported here). Pure: no Ray, no torch (``sc_app.config.app`` validates).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import yaml

from sc_app.config.input import ConfigError, read_file, too_big
from sc_app.io.safe_files import show

__all__ = [
    "ConfigError",
    "Override",
    "leaf_sources",
    "origin_of",
    "parse_override",
    "read_file",
    "rename_keys",
    "short_text",
]

# Keys renamed since a release: the old one is still read (with a warning) and names the new one.
RENAMED_KEYS = {"grpo.num_generations_per_prompt": "grpo.group_size"}

log = logging.getLogger("sc_app.config.app")


@dataclass(frozen=True)
class Override:
    """One ``key.path=value`` the user gave, and how they gave it (for error lines): ``--set k=v`` by default, or
    the flag that stands for it (``--checkpoint-dir DIR``)."""

    text: str
    flag: str | None = None

    @property
    def source(self) -> str:
        return self.flag or f"--set '{short_text(self.text)}'"


def short_text(text: str, keep: int = 100) -> str:
    """``text`` as an error line shows it: at most ``keep`` characters, escaped to stay one line."""
    return show(text[:keep]) + ("..." if len(text) > keep else "")


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
    source = source or f"--set '{short_text(text)}'"
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"{source}: expected key.path=value, e.g. --set checkpoint.save_period=2")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # ValueError: an int of more than 4300 digits
        raise ConfigError(f"{source}: value is not valid YAML ({exc.__class__.__name__})") from None
    if problem := too_big(value):
        raise ConfigError(f"{source}: the value {problem}")
    return key.strip(), value


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
