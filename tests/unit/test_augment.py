"""Training-only augmentation: its wordings are disjoint from the held-out ones, no augmented
prompt is a dev or test prompt, and every reworded item keeps the answer of its question."""

from __future__ import annotations

import re
from itertools import islice

from services.workload import STORE, held_out_prompts, load_split
from services.workload import train_wordings as train
from services.workload.augment import augmented_stream
from services.workload.generator import LOOKUP_TEMPLATES, MEDIUM_TEMPLATES
from services.workload.phrasings import (
    CONTEXTS,
    GREETINGS,
    UNKNOWN_QUESTIONS,
    UNSEEN_LOOKUP_TEMPLATES,
    UNSEEN_MEDIUM_TEMPLATES,
    UNSEEN_POLICY_QUESTIONS,
)
from services.workload.scoring import score
from services.workload.store import FALLBACK_ANSWER, POLICIES

N = 6000  # augmented items drawn per class


def _key(text: str) -> str:
    """A wording with casing and punctuation set aside."""
    return re.sub(r"[^a-z{} ]", "", text.lower()).strip()


def _keys(*groups: tuple[str, ...]) -> set[str]:
    return {_key(text) for group in groups for text in group}


def test_training_wordings_are_disjoint_from_held_out_and_seen_ones() -> None:
    held_out = _keys(
        UNSEEN_LOOKUP_TEMPLATES,
        UNSEEN_MEDIUM_TEMPLATES,
        UNKNOWN_QUESTIONS,
        GREETINGS,
        CONTEXTS,
        *UNSEEN_POLICY_QUESTIONS.values(),
    )
    seen = _keys(LOOKUP_TEMPLATES, MEDIUM_TEMPLATES, *(p.questions for p in POLICIES))
    training = _keys(
        train.TRAIN_LOOKUP_TEMPLATES,
        train.TRAIN_MEDIUM_TEMPLATES,
        train.TRAIN_UNKNOWN_QUESTIONS,
        train.TRAIN_GREETINGS,
        train.TRAIN_CONTEXTS,
        *train.TRAIN_POLICY_QUESTIONS.values(),
    )
    assert not training & held_out
    assert not training & seen
    assert set(train.TRAIN_POLICY_QUESTIONS) == {p.topic for p in POLICIES}


def test_no_augmented_prompt_is_a_dev_or_test_prompt() -> None:
    held_out = held_out_prompts()
    unseen = {i.prompt for n in ("dev", "test") for i in load_split(n, phrasing="unseen")}
    for request_class in ("simple", "medium"):
        items = list(islice(augmented_stream(1, request_class, held_out), N))
        reworded = {i.prompt for i in items if i.id.endswith("-aug")}
        assert len(reworded) > N // 3, "most items are reworded"
        assert not reworded & held_out
        assert not {i.prompt for i in items} & unseen
    # the filter is what guarantees it: without it, surface noise does hit a held-out prompt
    unfiltered = islice(augmented_stream(1, "medium"), 5 * N)
    assert {i.prompt for i in unfiltered} & unseen


def test_reworded_items_keep_the_answer_of_their_question() -> None:
    answers = {p.answer for p in POLICIES}
    unknown = 0
    for item in islice(augmented_stream(4, "simple"), N):
        assert score(item, item.reference)
        if item.final == FALLBACK_ANSWER:
            unknown += 1
            assert item.reference == FALLBACK_ANSWER
        elif not item.final.startswith("$"):
            assert item.final in answers
    assert unknown > N // 40
    prices = {p.name: p.price for p in STORE.products}
    for item in islice(augmented_stream(4, "medium"), N):
        name = item.reference.split(" costs ")[0].split(" ", 1)[1]
        qty = int(item.reference.splitlines()[1].split(" x ")[0])
        assert item.final == f"${qty * prices[name]}" and score(item, item.reference)


def test_complex_items_and_the_same_seed_are_unchanged() -> None:
    first = list(islice(augmented_stream(2, "simple"), 50))
    assert first == list(islice(augmented_stream(2, "simple"), 50))
    assert first != list(islice(augmented_stream(3, "simple"), 50))
    complex_items = list(islice(augmented_stream(2, "complex"), 20))
    assert not any(i.id.endswith("-aug") for i in complex_items)
