"""Counts what a fault cost each answer: whether the final text is the concatenation of its final
revision's deltas, and, for greedy chats, the tokens lost or duplicated against the answer the
same tier gives the same request with no fault (the reference).

Lost tokens are reference tokens missing from the answer, duplicated tokens are answer tokens
the reference does not have (a repeated stretch, or text that replaced the right one), both from
a token-level diff. Pure: knows the traces and the references, nothing of gRPC or processes.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services.chaos.recording import StreamTrace

ReferenceKey = tuple[str, str]  # (prompt, tier of the final revision)


@dataclass
class TokenAccount:
    """The sums over every completed chat."""

    checked: int = 0  # greedy chats compared with a reference
    lost: int = 0
    duplicated: int = 0
    text_mismatches: int = 0  # Final text != its revision's deltas joined
    answer_mismatches: int = 0  # greedy answers that differ from the reference at all
    unchecked: int = 0  # completed, but no reference to compare with
    examples: list[str] = field(default_factory=list)  # a few request ids that differed

    def to_json(self) -> dict[str, object]:
        return {
            "lost": self.lost,
            "duplicated": self.duplicated,
            "checked_requests": self.checked,
            "unchecked_requests": self.unchecked,
            "text_mismatches": self.text_mismatches,
            "answer_mismatches": self.answer_mismatches,
            "mismatch_examples": self.examples,
        }


def token_diff(reference: Sequence[int], answer: Sequence[int]) -> tuple[int, int]:
    """(lost, duplicated): reference tokens the answer lacks, answer tokens the reference lacks."""
    matcher = difflib.SequenceMatcher(None, list(reference), list(answer), autojunk=False)
    lost = duplicated = 0
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            lost += i2 - i1
        if tag in ("insert", "replace"):
            duplicated += j2 - j1
    return lost, duplicated


def reference_key(trace: StreamTrace) -> ReferenceKey | None:
    """What a chat's answer is compared with: its prompt on the tier that gave the answer."""
    if trace.final is None:
        return None
    return str(trace.options.get("prompt")), trace.final.tier


def account_tokens(
    traces: Mapping[str, StreamTrace],
    references: Mapping[ReferenceKey, Sequence[int]],
    greedy: bool = True,
    max_examples: int = 5,
) -> TokenAccount:
    """`traces` by request id; `references` the unfaulted answer's token ids per key."""
    account = TokenAccount()
    for request_id, trace in traces.items():
        final = trace.final
        if final is None:
            continue
        revision = trace.revisions.get(final.revision)
        text = revision.text if revision is not None else ""
        tokens = revision.token_ids if revision is not None else []
        differs = False
        if text != final.text:
            account.text_mismatches += 1
            differs = True
        key = reference_key(trace)
        reference = references.get(key) if key is not None else None
        if not greedy or reference is None:
            account.unchecked += 1
        else:
            account.checked += 1
            lost, duplicated = token_diff(reference, tokens)
            account.lost += lost
            account.duplicated += duplicated
            if lost or duplicated:
                account.answer_mismatches += 1
                differs = True
        if differs and len(account.examples) < max_examples:
            account.examples.append(request_id)
    return account
