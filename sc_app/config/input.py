"""What the config accepts from outside: the file (a bounded read of a regular file, then YAML) and the bounds every
value must respect, whatever its key — numbers finite and bounded, strings (paths, names) without NUL bytes and
shorter than the OS's path limit. Pure: no Ray, no torch."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sc_app.io.safe_files import FileProblem, read_regular

MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KiB; /dev/zero or a log passed by mistake is refused
MAX_INT = 2**53  # every integer key: exact in JSON and float, far inside torch's and the OS's ranges
MAX_FLOAT = 1e9  # every float key: finite and bounded (a timeout of 1e300 s overflows the OS's timers)
MAX_SECONDS = 7 * 24 * 3600.0
PATH_MAX = 4096  # Linux: the longest path a system call takes, NUL included
NAME_MAX = 255

SIZE_LIMITS = {  # sizes that allocate memory or processes: far above a real job, far below exhausting a machine
    "TaskConfig.prompt_len": 1 << 20,
    "TaskConfig.response_len": 1 << 20,
    "ModelConfig.max_seq_len": 1 << 20,
    "ModelConfig.vocab_size": 1 << 24,
    "ModelConfig.d_model": 1 << 16,
    "ModelConfig.n_layers": 1024,
    "ModelConfig.n_heads": 1024,
    "GRPOConfig.prompts_per_step": 1 << 20,
    "GRPOConfig.group_size": 1 << 16,
    "GRPOConfig.max_groups_buffered": 1 << 20,
    "TrainerConfig.num_workers": 4096,
    "GenerationWorkersConfig.num_workers": 4096,
    "DataPlaneConfig.storage_units": 4096,
    "RayConfig.num_cpus": 1 << 20,
    "RunConfig.log_buffer": 1 << 24,
}


class ConfigError(ValueError):
    """A configuration problem; ``str()`` is one line naming the key and what to do."""


def check_section(section: str, values: Mapping[str, object]) -> None:
    """``ValueError`` naming the first key of ``section`` (a config class name) whose value is out of bounds."""
    for name, value in values.items():
        for v in value.values() if isinstance(value, dict) else (value,):
            _check_value(f"{section}.{name}", v)


def _check_value(where: str, value: object) -> None:
    if isinstance(value, bool):
        return
    limit = SIZE_LIMITS.get(where, MAX_INT)
    if isinstance(value, int) and abs(value) > limit:
        raise ValueError(f"{_key(where)} = {str(value)[:20]} is too large (at most {limit:,})")
    if isinstance(value, float) and abs(value) > MAX_FLOAT:
        raise ValueError(f"{_key(where)} = {value:g} is too large (at most {MAX_FLOAT:g})")
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError(f"{_key(where)} holds a NUL byte; no path or name can")
        if len(value.encode("utf-8", "surrogatepass")) >= PATH_MAX:
            raise ValueError(f"{_key(where)} is {len(value)} characters long; a path is under {PATH_MAX} bytes")


_SECTION_KEYS = {
    "RunConfig": "run",
    "RayConfig": "ray",
    "DataPlaneConfig": "data_plane",
    "ModelConfig": "model",
    "TaskConfig": "task",
    "GRPOConfig": "grpo",
    "TrainerConfig": "trainer",
    "GenerationWorkersConfig": "generation",
    "CheckpointConfig": "checkpoint",
    "RemoteConfig": "checkpoint.remote",
}


def _key(where: str) -> str:
    cls, _, name = where.partition(".")
    return f"{_SECTION_KEYS.get(cls, cls)}.{name}"


def read_file(p: Path) -> dict[str, Any]:
    """The config file's top-level mapping; ``ConfigError`` (one line) for anything else."""
    try:
        raw = read_regular(p, MAX_CONFIG_BYTES, follow=True)  # never a FIFO or device: no hang, no endless read
    except FileProblem as exc:
        raise ConfigError(f"config file {exc}; pass a YAML file") from None
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
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"config file {p}: a value cannot be read ({str(exc).splitlines()[0][:120]})") from None
    if problem := too_big(loaded):
        raise ConfigError(f"config file {p}: {problem}")
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {p}: top level must be a mapping of sections, got {type(loaded).__name__}")
    return loaded


MAX_NODES = 100_000  # values in a config, aliases counted each time they are used (a real one has a few hundred)


def too_big(tree: object) -> str | None:
    """Why ``tree`` (loaded YAML) is too big to validate — YAML aliases can make a small file expand to billions
    of values ("billion laughs") — else None. Walks at most ``MAX_NODES`` values."""
    stack, seen = [tree], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return f"expands to more than {MAX_NODES:,} values (YAML anchors and aliases?); write it out plainly"
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return None
