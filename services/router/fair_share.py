"""Fair shares of the router between API keys, within a priority: each key's chats in flight
against its weighted part of all that priority's chats in flight (max-min fairness). Under
pressure (the chat's tier cannot start it in time), a chat whose key already holds more than its
part is refused at once instead of stepping down onto the capacity the other keys need; a key
within its part steps down as usual. "More than its part" allows for chance: keys sending at
their fair rates hold their parts only on average, so a key is over only past its part plus two
standard deviations of a binomial draw (its weight's share of the chats in flight) plus one
chat. One key alone, or calls without keys, always have their whole part.

Pure bookkeeping, no clock and no I/O; the servicer counts each chat in and out. Not
thread-safe: one event loop.
"""

from __future__ import annotations

import math
from collections import defaultdict

SIGMAS = 2.0  # how far past its part, in standard deviations of chance, a key may go


class FairShare:
    def __init__(self) -> None:
        # priority -> key -> (chats in flight, the key's weight)
        self._inflight: dict[str, dict[str, int]] = defaultdict(dict)
        self._weights: dict[str, float] = {}

    def start(self, key: str, priority: str, weight: float = 1.0) -> None:
        """A chat of `key` at `priority` is in flight now."""
        keys = self._inflight[priority]
        keys[key] = keys.get(key, 0) + 1
        self._weights[key] = weight

    def end(self, key: str, priority: str) -> None:
        """That chat ended."""
        keys = self._inflight[priority]
        left = keys.get(key, 0) - 1
        if left > 0:
            keys[key] = left
        else:
            keys.pop(key, None)

    def over_share(self, key: str, priority: str, weight: float = 1.0) -> bool:
        """Whether one more chat of `key` at `priority` would put its chats in flight past its
        weighted part of all of them (with chance's allowance), while another key has chats in
        flight too."""
        keys = dict(self._inflight[priority])
        if not keys or set(keys) == {key}:
            return False
        keys[key] = keys.get(key, 0) + 1
        weights = {k: self._weights.get(k, 1.0) for k in keys} | {key: weight}
        share = weight / sum(weights.values())
        total = sum(keys.values())
        part = total * share
        return keys[key] > part + SIGMAS * math.sqrt(total * share * (1 - share)) + 1

    def inflight(self, key: str, priority: str) -> int:
        return self._inflight[priority].get(key, 0)
