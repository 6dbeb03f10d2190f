"""The transport interface: how one weights version travels from trainer rank 0 to a vLLM engine's workers.

The control path is the same for every transport (``push``): one Ray object per version, trainer rank 0's
``get_weights`` result, read by every generation worker. A transport decides only what that object is (its
``WeightSender``, on every trainer rank) and how a vLLM engine lands it in its workers (its ``WeightReceiver``).
The Hugging Face engine and the tiny backend take the object-store payload (a state dict) as it is: the config
allows another transport only with ``generation.engine=vllm``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class Received:
    """What a receiver landed in an engine: how many tensors, and the state dict itself when the payload carried it
    on the host (object store); None when the bytes reached the engine's workers only (nccl)."""

    tensors: int
    state: Mapping[str, Any] | None = None

    def host_state(self) -> Mapping[str, Any]:
        """The state dict, for a host copy of the model (``grpo.old_logprobs=trainer``)."""
        if self.state is None:
            raise RuntimeError(
                "this weight transport delivers the weights to the engine's workers only: a host copy of the model "
                "(grpo.old_logprobs=trainer) cannot be loaded; set grpo.old_logprobs=engine"
            )
        return self.state


class WeightSender(Protocol):
    """On a trainer rank: what its ``get_weights`` returns."""

    def payload(self, weights: Mapping[str, Any] | None) -> Any:
        """The object for this rank's ``full_weights()`` (None on ranks other than 0, which stays None)."""
        ...

    def wait(self) -> None:
        """Returns once the last payload's bytes have left this rank: the optimizer may change them after it."""
        ...


class WeightReceiver(Protocol):
    """In a generation worker with a vLLM engine: lands a payload in every worker of ``llm`` (``collective_rpc``)."""

    def receive(self, llm: Any, payload: Any) -> Received: ...


class WeightTransport(ABC):
    """One way the bytes of a weights version travel; ``factory.transport_for`` picks it from the config."""

    name: ClassVar[str]

    @abstractmethod
    def sender(self, rank: int) -> WeightSender:
        """What trainer ``rank`` holds (built in the trainer worker's ``setup``)."""

    @abstractmethod
    def receiver(self, worker_index: int) -> WeightReceiver:
        """What generation worker ``worker_index``'s vLLM engine holds."""
