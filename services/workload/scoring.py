"""Scores a model's output against a workload item: the final answer must match exactly.

Knows only the answer format (the last non-empty line, "Answer: " prefix dropped); nothing of
how the output was produced.
"""

from __future__ import annotations

from services.common.answers import final_answer as final_answer
from services.workload.generator import WorkloadItem


def score(item: WorkloadItem, output_text: str) -> bool:
    """True when the output's final answer is exactly the item's final answer."""
    return final_answer(output_text) == item.final
