"""The answer format every tier is trained to end with, and how two answers are compared.

A text's final answer is its last non-empty line, without the "Answer: " prefix. Pure string
functions: knows nothing of the workload that generates requests, of models or of routing.
"""

from __future__ import annotations

ANSWER_PREFIX = "Answer: "


def final_answer(text: str) -> str:
    """The final answer in a text: its last non-empty line, without an "Answer: " prefix."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last[len(ANSWER_PREFIX) :].strip() if last.startswith(ANSWER_PREFIX) else last


def answers_agree(a: str, b: str) -> bool:
    """True when two texts end with the same final answer."""
    return final_answer(a) == final_answer(b)
