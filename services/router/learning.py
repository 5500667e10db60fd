"""What the router learns from its chats: it remembers each answered chat's decision so a later
Feedback can reward it, and turns a progressive chat into a signal for the routing policy (a
draft whose final answer the refinement changed was the wrong call; one it kept was right).

Observes each chat's session events (chat_events.py) as the servicer relays them. Compares
answers with the function it is given; knows nothing of the workload, gRPC or telemetry.
Not thread-safe: used from the router's event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from tiermesh.v1 import router_pb2

from services.common.answers import answers_agree
from services.common.errors import PermissionDenied
from services.router.chat_events import SessionEvent
from services.router.chat_plan import ChatPlan
from services.router.policy import RouteChoice, RoutingPolicy

AnswersAgree = Callable[[str, str], bool]  # do two texts give the same final answer?
FEEDBACK_MEMORY = 10_000  # request ids remembered for Feedback


class RoutingLessons:
    """The router's memory of recent decisions and the policy it teaches."""

    def __init__(
        self,
        policy: RoutingPolicy,
        agree: AnswersAgree = answers_agree,
        memory: int = FEEDBACK_MEMORY,
    ) -> None:
        self._policy = policy
        self._agree = agree
        self._memory = memory
        # request id -> (the policy's choice, the tier that answered, the caller who asked):
        # what Feedback rewards, and who may give it
        self._recent: OrderedDict[str, tuple[RouteChoice, str, str]] = OrderedDict()

    def observer(self, plan: ChatPlan, choice: RouteChoice, caller: str = "") -> ChatLessons:
        """The observer of one planned chat's events, `choice` the policy's view of it;
        `caller` identifies who asked (the API key's id; empty without keys)."""
        return ChatLessons(self, plan, choice, caller)

    def feedback(self, request_id: str, score: float, caller: str = "") -> bool:
        """Rewards the tier that answered `request_id` with `score` in [0, 1], once: False when
        the request is not (or no longer) remembered, or was rewarded already. PermissionDenied
        when `caller` is not who made the request, so no one steers the policy with others'
        requests."""
        remembered = self._recent.get(request_id)
        if remembered is None:
            return False
        choice, tier, owner = remembered
        if owner != caller:
            raise PermissionDenied(
                f"request_id: {request_id!r} was made by another caller; only its caller may "
                "give feedback on it"
            )
        del self._recent[request_id]
        self._policy.learn(choice, tier, score)
        return True

    def answered(
        self,
        plan: ChatPlan,
        choice: RouteChoice,
        tier: str,
        draft: str | None,
        refined: str | None,
        caller: str = "",
    ) -> None:
        """Remembers the decision; with both a complete draft and a complete refinement, the
        refine tier was right and the draft tier right only if the answers agree."""
        self._recent[plan.request_id] = (choice, tier, caller)
        self._recent.move_to_end(plan.request_id)
        while len(self._recent) > self._memory:
            self._recent.popitem(last=False)
        if draft is not None and refined is not None:
            same = self._agree(draft, refined)
            self._policy.learn(choice, plan.tiers[0], 1.0 if same else 0.0)
            self._policy.learn(choice, plan.tiers[1], 1.0)


class ChatLessons:
    """Collects one chat's revision texts from its deltas; at Final, hands what it saw over."""

    def __init__(
        self, lessons: RoutingLessons, plan: ChatPlan, choice: RouteChoice, caller: str = ""
    ) -> None:
        self._lessons = lessons
        self._plan = plan
        self._choice = choice
        self._caller = caller
        self._texts: dict[int, list[str]] = {}
        self._complete: set[int] = set()  # revisions whose tier finished without error

    def observe(self, event: SessionEvent) -> None:
        if not isinstance(event, router_pb2.ChatEvent):
            return
        if event.HasField("delta"):
            self._texts.setdefault(event.delta.revision, []).append(event.delta.text)
        elif event.HasField("revision_end") and not event.revision_end.error:
            self._complete.add(event.revision_end.revision)
        elif event.HasField("final"):
            progressive = self._plan.mode == router_pb2.MODE_PROGRESSIVE
            draft, refined = (self._text(0), self._text(1)) if progressive else (None, None)
            self._lessons.answered(
                self._plan, self._choice, event.final.tier, draft, refined, self._caller
            )

    def _text(self, revision: int) -> str | None:
        """The revision's text if it completed, else None."""
        if revision not in self._complete:
            return None
        return "".join(self._texts.get(revision, []))
