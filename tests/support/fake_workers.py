"""In-process stand-ins for the trainer and generation workers, for unit tests of the controller (no Ray).

Each worker method is reached the way the controller reaches a Ray actor's: ``worker.method.remote(*args)``
returns an awaitable, and an awaitable passed as an argument is resolved first (as Ray resolves an ``ObjectRef``
passed at the top level), so one weights "object" can be handed to every generation worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sc_app.checkpoint import node_parts
from sc_app.checkpoint.node_parts import PolicyPart
from sc_app.checkpoint.writer import FileRecord
from sc_app.rl.backend import Rollout, TrainStepResult


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        async def call() -> Any:
            resolved = [await a if inspect.isawaitable(a) else a for a in args]
            out = self._fn(*resolved)
            return await out if inspect.isawaitable(out) else out

        return asyncio.ensure_future(call())


class FakeActor:
    """Every public method but ``called`` is reached as ``.name.remote(...)``; ``called(name)`` lists the
    arguments of each call made so far (in order)."""

    _log: list[tuple[str, Any]]

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("_") or name == "called" or not callable(attr):
            return attr
        return _Method(attr)

    def called(self, name: str) -> list[Any]:
        return [args for method, args in self._log if method == name]


class FakeGenerator(FakeActor):
    """Generates ``group_size`` rows per prompt with reward ``reward(prompt_index, row)`` at its weights version."""

    def __init__(self, group_size: int, reward: Callable[[int, int], float] = lambda p, r: float(r % 2)) -> None:
        self._group_size = group_size
        self._reward = reward
        self._version = 0
        self._gate: asyncio.Event | None = None  # when set, generate waits for it
        self._log: list[tuple[str, Any]] = []

    def generate(self, prompt_indices: list[int]) -> Any:
        async def run() -> Rollout:
            if self._gate is not None:
                await self._gate.wait()
            self._log.append(("generate", list(prompt_indices)))
            rewards = [self._reward(p, r) for p in prompt_indices for r in range(self._group_size)]
            n = len(rewards)
            fields = {"reward": torch.tensor(rewards), "tokens": torch.zeros(n, 3, dtype=torch.long)}
            return Rollout(fields=fields, version=self._version)

        return run()

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self._log.append(("set_weights", version))
        self._version = version


class FakeTrainer(FakeActor):
    """Trains nothing; records what it was asked, and writes a one-file policy for a save."""

    own_disk: Path | None = None  # set: this rank's node has a disk of its own (its part is staged there)
    big: int = 0  # bytes of the unhashed staged file (0: 3)

    def __init__(self, rank: int = 0) -> None:
        self._rank = rank
        self._version = 0
        self._captured: int | None = None
        self._log: list[tuple[str, Any]] = []

    def train_step(self, sample_ids: list[str], version: int, capture: bool) -> TrainStepResult:
        self._log.append(("train_step", (list(sample_ids), version, capture)))
        self._version = version
        if capture:
            self._captured = version
        return TrainStepResult(loss=0.0, rows=len(sample_ids))

    def get_weights(self) -> dict[str, torch.Tensor] | None:
        return {"w": torch.full((2,), float(self._version))} if self._rank == 0 else None

    def capture_state(self) -> int:
        self._log.append(("capture_state", self._version))
        self._captured = self._version
        return self._version

    def write_captured(self, policy_dir: str, target: Any = None) -> PolicyPart:
        """With ``own_disk`` set, the part is staged there (a node with a disk of its own, ``volume=local``),
        with two more files it did not hash: an empty one and one of ``big`` bytes (several gather chunks)."""
        self._log.append(("write_captured", self._captured))
        data = f"rank {self._rank} version {self._captured}".encode()
        where = Path(policy_dir) if self.own_disk is None else node_parts.fresh(self.own_disk)
        path = where / f"rank{self._rank}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files = {path.name: FileRecord("sha256", hashlib.sha256(data).hexdigest(), len(data))}
        if self.own_disk is None:
            return PolicyPart(files)
        (where / "sub").mkdir()
        (where / "sub" / f"unhashed{self._rank}").write_bytes(b"x" * (self.big or 3))
        (where / "sub" / f"empty{self._rank}").write_bytes(b"")
        return PolicyPart(files, "fake-host", node_parts.list_files(where))

    def read_part(self, rel: str, offset: int) -> bytes:
        assert self.own_disk is not None
        self._log.append(("read_part", (rel, offset)))
        return node_parts.read_chunk(self.own_disk, rel, offset)

    def drop_part(self) -> None:
        assert self.own_disk is not None
        self._log.append(("drop_part", None))
        node_parts.clear(self.own_disk)
