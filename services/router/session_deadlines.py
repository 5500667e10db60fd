"""The timeouts a chat's tier calls carry: what is left of the client's deadline (else the
configured default), and for a refinement what is left of its budget, which starts with its first
call, short of the client's deadline by the time needed to send Final.

Pure arithmetic over times it is given (the SessionClock's perf_counter scale); no clock, no I/O.
"""

from __future__ import annotations

FINAL_MARGIN_S = 0.05  # time kept back from the client's deadline to send Final after a refine
SHORTEST_S = 0.001  # a call's timeout is never zero or negative


class SessionDeadlines:
    def __init__(
        self, deadline: float | None, call_timeout_s: float | None, refine_budget_s: float
    ) -> None:
        """`deadline`: the client's (None: none); `call_timeout_s`: a call's timeout without
        one (None: none); `refine_budget_s`: how long a refinement may take in all."""
        self._deadline = deadline
        self._call_timeout_s = call_timeout_s
        self._refine_budget_s = refine_budget_s
        self._refine_deadline: float | None = None

    def client_remaining_s(self, now: float) -> float | None:
        """Seconds left of the client's deadline; None when it set none."""
        return None if self._deadline is None else max(SHORTEST_S, self._deadline - now)

    def call_s(self, now: float) -> float | None:
        """The timeout of a tier call: the client's deadline, else the configured default."""
        remaining = self.client_remaining_s(now)
        return self._call_timeout_s if remaining is None else remaining

    def refine_s(self, now: float) -> float:
        """What is left of the refinement's budget (it starts at the first call asking),
        within the client's deadline."""
        if self._refine_deadline is None:
            self._refine_deadline = now + self._refine_budget_s
        budget = max(SHORTEST_S, self._refine_deadline - now)
        remaining = self.client_remaining_s(now)
        if remaining is None:
            return budget
        return max(SHORTEST_S, min(budget, remaining - FINAL_MARGIN_S))
