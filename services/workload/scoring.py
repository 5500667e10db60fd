"""Scores a model's output against a workload item: the final answer must match exactly.

Knows only the answer format (the last non-empty line, "Answer: " prefix dropped); nothing of
how the output was produced.
"""

from __future__ import annotations

from services.workload.generator import ANSWER_PREFIX, WorkloadItem


def final_answer(text: str) -> str:
    """The final answer in a text: its last non-empty line, without an "Answer: " prefix."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last[len(ANSWER_PREFIX) :].strip() if last.startswith(ANSWER_PREFIX) else last


def score(item: WorkloadItem, output_text: str) -> bool:
    """True when the output's final answer is exactly the item's final answer."""
    return final_answer(output_text) == item.final
