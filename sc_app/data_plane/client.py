"""The abstract data-plane client: every adapter implements all of it (seed flow 5).

Invariants every adapter keeps:
* ``load_checkpoint`` is allowed only on a *bootstrap* client, and only while the data plane is untouched —
  no read or write through this client **or any other client in any process** (``RestoreRefused``).
* A connect-only client may not be built before the restore decision is sealed (``RestoreOrderError``):
  this is the seed's "restore happens before the connect-only client exists", asserted rather than assumed.
* ``put_samples`` on existing ids overwrites the fields ``data`` holds only; it never changes which rows exist.
* ``put_samples`` returns the rows' global indexes where the adapter has them; a caller may pass them back
  (``global_indexes=``) to later calls on the *same* rows, which then skip the data plane's key lookup. They are
  valid from the put until the rows are cleared (indexes are reused after a clear), and a put with them must carry
  the rows' tags (TransferQueue replaces a row's tags on every put).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensordict import TensorDict


METADATA_FILE = "metadata.json"  # what ``save_checkpoint`` writes last into its directory, with ``user_metadata``


class RestoreRefused(RuntimeError):
    """A restore was asked for on a data plane that something has already read or written."""


class RestoreOrderError(RuntimeError):
    """A connect-only client was built before the restore decision was sealed."""


class DataPlaneDetached(RuntimeError):
    """A call through a client of a data plane this process has left (a warm in-job restore rebuilt or refilled
    it): refused, never retried. The old run's rows and global indexes mean nothing to the new data plane, and a
    process's TransferQueue attachment is shared — a late call of the old run would land on the rebuilt one."""


class RowsMissing(LookupError):
    """A read found fewer rows than it asked for (TransferQueue's key lookup leaves out keys it does not hold)."""


@dataclass(frozen=True)
class CapturedRows:
    """What a checkpoint window captured: exactly these rows and, when the caller knows them, each group's field
    names (group id → names; ``None`` for a group whose fields are unknown: every field it holds is read) and
    each row's tags as listed in the window. A deferred writer reads exactly this state back."""

    sample_ids: list[str]
    field_names: dict[str, list[str] | None] | None = None
    tags: dict[str, dict[str, Any]] | None = None


class DataPlaneSnapshot(ABC):
    """A captured data-plane checkpoint; ``write()`` puts its bytes under the directory it was captured for."""

    @abstractmethod
    async def write(self, *, executor: Executor | None = None) -> dict[str, Any]:
        """Finish writing (blocking file work on ``executor``, default: the loop's); returns stats (``bytes``,
        ``rows``, ``seconds``, and ``files``: name → ``hashing.FileDigest.as_dict()`` where the writer hashed them)."""


class DataPlaneClient(ABC):
    bootstrap: bool

    @abstractmethod
    async def put_samples(
        self,
        partition: str,
        sample_ids: list[str],
        data: TensorDict,
        tags: list[dict[str, Any]] | None = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> list[int] | None:
        """Write ``data``'s fields onto these rows (creating them); returns their global indexes, or None."""

    @abstractmethod
    async def get_samples(
        self,
        partition: str,
        sample_ids: list[str],
        field_names: list[str] | None = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> TensorDict:
        """Rows in the order asked, as dense tensors (one per field; ``field_names`` None: every field)."""

    @abstractmethod
    async def clear_samples(
        self, partition: str, sample_ids: list[str], *, global_indexes: list[int] | None = None
    ) -> None: ...

    @abstractmethod
    async def list_samples(self, partition: str) -> dict[str, dict[str, Any]]:
        """Every stored row of ``partition``: sample id → its tags."""

    async def list_sample_ids(self, partition: str) -> set[str]:
        return set(await self.list_samples(partition))

    @abstractmethod
    async def save_checkpoint(
        self, directory: Path, metadata: dict[str, Any], partition: str, captured: CapturedRows
    ) -> DataPlaneSnapshot:
        """Capture the ``captured`` rows of ``partition`` (exactly what the replay index lists) for ``directory``.

        Called inside the barrier's exclusive window. Returns a snapshot whose ``write()`` the caller awaits
        *after* the window closes; an adapter may do all the I/O here (then ``write()`` is a no-op) or only
        record what to copy — then the caller keeps the freeze (``replay_buffer.py``) until ``write()``
        returns. ``metadata`` (incl. ``digest``) ends up in ``directory/METADATA_FILE`` under ``user_metadata``.
        """

    @abstractmethod
    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Restore rows from ``directory`` onto an untouched data plane; returns the stored metadata."""

    @abstractmethod
    def seal(self, info: dict[str, Any]) -> None:
        """Record that the restore decision is made; connect-only clients may be built from now on."""
