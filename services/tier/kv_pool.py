"""A KV-cache pool allocated once per model: fixed slots, each holding one sequence's keys and
values up to a maximum length, so memory never grows with load. Also the bookkeeping every
pooled architecture shares: several prompts packed into one prefill (PrefillBatch: which
positions belong to which slot, storing each prompt's keys), and one decode step's batch view
(write each row's new position, read each row's window, the mask for rows shorter than the
window).

Knows tensor shapes only: nothing of models' weights, requests or gRPC. acquire() and release()
are thread-safe (a slot is reserved when a request is admitted, on the event loop, and freed by
the batch scheduler's thread); everything else is owned by the scheduler's thread (reads of the
counters from other threads are benign).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch


class PoolFull(Exception):
    """No free slot; the caller waits or sheds the request (admission reserves a slot before a
    request reaches the batch loop, so the loop itself never meets a full pool)."""


@dataclass(frozen=True)
class PrefillBatch:
    """Several prompts packed end to end into one sequence of N positions, each prompt
    restarting at position 0: the linear layers run once over all N tokens, attention runs per
    prompt (segment), so each prompt's result is the one it gets alone."""

    slots: list[int]
    tokens: torch.Tensor  # (1, N) every prompt's ids, one after another
    positions: torch.Tensor  # (1, N) each token's position within its own prompt
    segments: list[tuple[int, int]]  # per prompt: [start, end) within the N positions
    last: torch.Tensor  # (B,) the index of each prompt's last token within the N positions
    slot_index: torch.Tensor  # (B,) the slots as a tensor, for one write to all of them

    @property
    def size(self) -> int:
        return len(self.slots)


@dataclass(frozen=True)
class DecodeBatch:
    """The slots of one decode step, each fed one token at its own position."""

    slots: list[int]
    slot_index: torch.Tensor  # (B,) the slots as a tensor
    position: torch.Tensor  # (B,) where each row's new token goes (= its length before)
    window: int  # positions read this step: the longest row's, new token included
    mask: torch.Tensor | None  # (B, 1, 1, W) True where a row may attend; None = all rows full
    contiguous: bool  # slots are first..first+B-1: the pool's slices are views, not copies

    @property
    def size(self) -> int:
        return len(self.slots)


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
        shape = (layers, slots, heads, max_len, head_dim)  # heads: key/value heads
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (L, S, nkv, T, hs)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (L, S, nkv, T, hs)
        self.device = device
        self.slots = slots
        self.max_len = max_len
        self.lengths = [0] * slots  # positions filled per slot
        self._free = list(range(slots - 1, -1, -1))
        self._free_lock = threading.Lock()
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
        """Reserves a free slot (emptied) for one sequence; raises PoolFull when none is free."""
        with self._free_lock:
            if not self._free:
                raise PoolFull(f"all {self.slots} KV-cache slots in use")
            slot = self._free.pop()
            self.lengths[slot] = 0
            return slot

    def release(self, slot: int) -> None:
        with self._free_lock:
            if slot in self._free:
                raise ValueError(f"KV-cache slot {slot} released twice")
            self.lengths[slot] = 0
            self._free.append(slot)

    def note_use(self) -> None:
        self.peak_tokens = max(self.peak_tokens, self.used_tokens)

    def prefill_batch(self, slots: list[int], prompts: list[list[int]]) -> PrefillBatch:
        """The packed view of one prefill: prompts[i] (never empty) goes into slots[i]."""
        segments, start = [], 0
        for prompt in prompts:
            if not prompt or len(prompt) > self.max_len:
                raise ValueError(f"prompt of {len(prompt)} tokens for slots of {self.max_len}")
            segments.append((start, start + len(prompt)))
            start += len(prompt)
        ids = [token for prompt in prompts for token in prompt]
        positions = [p for prompt in prompts for p in range(len(prompt))]
        device = self.device
        return PrefillBatch(
            slots=slots,
            tokens=torch.tensor([ids], dtype=torch.long, device=device),  # (1, N)
            positions=torch.tensor([positions], dtype=torch.long, device=device),  # (1, N)
            segments=segments,
            last=torch.tensor([end - 1 for _, end in segments], device=device),  # (B,)
            slot_index=torch.tensor(slots, dtype=torch.long, device=device),  # (B,)
        )

    def store_prompt(
        self, layer: int, batch: PrefillBatch, row: int, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Writes prompt `row`'s keys and values (1, nkv, T, hs) at positions [0, T) of its
        slot; the slot's length is set by finish_prompts once every layer is written."""
        slot, steps = batch.slots[row], keys.shape[2]
        self.keys[layer, slot, :, :steps] = keys[0]
        self.values[layer, slot, :, :steps] = values[0]

    def store_prompts(
        self, layer: int, batch: PrefillBatch, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Writes every prompt's keys and values (B, nkv, T, hs), padded to the longest prompt
        T with zeros, at positions [0, T) of their slots, in one write each: a slot's positions
        past its prompt hold zeros until its own decode steps write them."""
        steps = keys.shape[2]
        self.keys[layer, batch.slot_index, :, :steps] = keys
        self.values[layer, batch.slot_index, :, :steps] = values

    def finish_prompts(self, batch: PrefillBatch) -> None:
        for slot, (start, end) in zip(batch.slots, batch.segments, strict=True):
            self.lengths[slot] = end - start

    def decode_batch(self, slots: list[int]) -> DecodeBatch:
        """The view of one decode step over `slots`: positions, window and mask."""
        lengths = [self.lengths[s] for s in slots]
        position = torch.tensor(lengths, dtype=torch.long, device=self.device)  # (B,)
        window = max(lengths) + 1
        mask: torch.Tensor | None = None  # every row sees its whole window: no mask needed
        if min(lengths) != window - 1:
            mask = torch.arange(window, device=self.device)[None, :] <= position[:, None]  # (B, W)
            mask = mask[:, None, None, :]  # (B, 1, 1, W)
        first = slots[0]
        return DecodeBatch(
            slots=slots,
            slot_index=torch.tensor(slots, dtype=torch.long, device=self.device),
            position=position,
            window=window,
            mask=mask,
            contiguous=slots == list(range(first, first + len(slots))),
        )

    def append(
        self, layer: int, batch: DecodeBatch, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes each row's new key and value (B, nkv, 1, hs) at its position and returns every
        row's window of keys and values (B, nkv, W, hs), the new position included."""
        index, position = batch.slot_index, batch.position
        if batch.size == 1:  # plain indexing: a third of the time of an indexed write
            slot, end = batch.slots[0], batch.window - 1
            self.keys[layer, slot, :, end] = keys[0, :, 0]  # (nkv, hs)
            self.values[layer, slot, :, end] = values[0, :, 0]
        else:
            self.keys[layer, index, :, position] = keys[:, :, 0]  # (B, nkv, hs) in (S, nkv, T, hs)
            self.values[layer, index, :, position] = values[:, :, 0]
        if batch.contiguous:
            first, end = batch.slots[0], batch.slots[0] + batch.size
            window_keys = self.keys[layer, first:end, :, : batch.window]  # (B, nkv, W, hs)
            window_values = self.values[layer, first:end, :, : batch.window]
        else:
            window_keys = self.keys[layer, index, :, : batch.window]  # (B, nkv, W, hs)
            window_values = self.values[layer, index, :, : batch.window]
        return window_keys, window_values

    def finish_step(self, batch: DecodeBatch) -> None:
        """Every slot of the step grew by one position."""
        for s in batch.slots:
            self.lengths[s] += 1
