"""Read buffers a restore reuses for its segments, so their bytes land in pages already mapped.

Reading into a freshly allocated buffer makes the kernel fault in and zero every page first: 0.4-0.5 CPU-s per GiB
here on top of the read itself (the read into a reused buffer costs what a raw read does, 0.2-0.3). A restore that
read each 64 MiB part whole into a new buffer paid that for every byte, most of what it cost over TransferQueue's
own put. Now each segment is read alone into a buffer of this pool and the fresh pages are only those of the
segments in flight at once (the reader's queue and the puts). A buffer goes back to the pool only when nothing
views it any more: a segment's hold ends when its put has completed (TransferQueue's put sends the tensors' memory
as it is, zero-copy, and the storage unit has received it once the put returns). A hold never released (a failed
put, a consumer that stopped) keeps its buffer out of the pool for good: it is then freed like any tensor, never
reused while something may read it.
"""

from __future__ import annotations

import threading

import torch

KEEP = 8  # free buffers kept (a stream has ~5 segments alive: reading, queued, in its puts)


class PartLease:
    """One segment's buffer (``tensor``: exactly its size) and the holds on it (the first is the taker's)."""

    def __init__(self, pool: PartBuffers, base: torch.Tensor, size: int) -> None:
        self._pool = pool
        self._base = base
        self.tensor = base[:size]
        self._holds = 1  # the reader's own
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            if self._holds <= 0:
                raise RuntimeError("hold on a part buffer already given back")
            self._holds += 1

    def release(self) -> None:
        with self._lock:
            self._holds -= 1
            last = self._holds == 0
        if last:
            self._pool.give(self._base)


class PartBuffers:
    """A small pool of uint8 buffers, each at least as large as the part it is lent for (thread-safe)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers made (what the tests check reuse by)

    def take(self, size: int) -> PartLease:
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.numel() >= size]
            if fits:  # by position: ``list.remove`` would compare tensors element by element
                base = self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
            else:
                base = None
                self.allocated += 1
        if base is None:
            base = torch.empty(size, dtype=torch.uint8)
        return PartLease(self, base, size)

    def give(self, base: torch.Tensor) -> None:
        with self._lock:
            self._free.append(base)
            if len(self._free) > self.keep:
                self._free.pop(min(range(len(self._free)), key=lambda i: self._free[i].numel()))
