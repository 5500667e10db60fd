"""A KV-cache pool allocated once per model: fixed slots, each holding one sequence's keys and
values up to a maximum length, so memory never grows with load.

Knows tensor shapes only: nothing of models' weights, requests or gRPC. Not thread-safe: owned
by the batch scheduler's thread (reads of the counters from other threads are benign).
"""

from __future__ import annotations

import torch


class PoolFull(Exception):
    """No free slot; the caller waits or sheds the request."""


class KvCachePool:
    def __init__(
        self,
        *,
        layers: int,
        slots: int,
        heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (layers, slots, heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (L, S, nh, T, hs)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (L, S, nh, T, hs)
        self.slots = slots
        self.max_len = max_len
        self.lengths = [0] * slots  # positions filled per slot
        self._free = list(range(slots - 1, -1, -1))
        self.peak_tokens = 0

    @property
    def capacity_tokens(self) -> int:
        return self.slots * self.max_len

    @property
    def used_tokens(self) -> int:
        return sum(self.lengths)  # a free slot's length is 0

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def bytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes)

    def acquire(self) -> int:
        if not self._free:
            raise PoolFull(f"all {self.slots} KV-cache slots in use")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    def note_use(self) -> None:
        self.peak_tokens = max(self.peak_tokens, self.used_tokens)
