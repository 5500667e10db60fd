"""Training-only augmentation: simple and medium requests reworded so a model learns the question,
not the string, and off-domain questions answered with store.FALLBACK_ANSWER.

Every wording here is training-only and disjoint from the held-out ones (phrasings.py): other
paraphrase templates, other policy questions, other off-domain questions, other greetings and
sentences of context. Surface noise (casing, punctuation, a typo, a quantity as a word) reuses
phrasings' edits, seeded apart from them. The trainer additionally drops any augmented prompt
that is a dev or test prompt, so no held-out prompt is ever shown to a model. train.jsonl is not
touched: it holds the seen items the routing labels are measured on.

The training-only wordings themselves are in train_wordings.py. Knows the shop and the seen and
held-out wordings; nothing of files, tokenizers or models.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from services.workload.generator import (
    LOOKUP_TEMPLATES,
    MEDIUM_TEMPLATES,
    STORE,
    RequestClass,
    WorkloadItem,
    lookup_answer,
    medium_answer,
    stream,
)
from services.workload.phrasings import (
    NUMBER_WORDS,
    Transform,
    _lower,
    _punctuation,
    _typo,
    _upper,
    greeted,
)
from services.workload.store import FALLBACK_ANSWER, POLICIES, Store
from services.workload.train_wordings import (
    TRAIN_CONTEXTS,
    TRAIN_GREETINGS,
    TRAIN_LOOKUP_TEMPLATES,
    TRAIN_MEDIUM_TEMPLATES,
    TRAIN_POLICY_QUESTIONS,
    TRAIN_UNKNOWN_QUESTIONS,
)

AUGMENTED_CLASSES: tuple[RequestClass, ...] = ("simple", "medium")
PLAIN_SHARE = 0.3  # of augmented-class items: the seen item as the generator makes it
UNKNOWN_SHARE = 0.12  # of reworded simple items: an off-domain question
NEW_WORDING_SHARE = 0.6  # of reworded items: a training-only template or question

UPPER_SHARE = 0.15  # of surface-noised texts: all in capitals (and nothing else changed)


def _greeting(text: str, _protected: frozenset[str], rng: random.Random) -> str:
    return greeted(rng.choice(TRAIN_GREETINGS), text)


def _context(text: str, _protected: frozenset[str], rng: random.Random) -> str:
    return f"{rng.choice(TRAIN_CONTEXTS)} {text}"


# in the order they apply; upper case comes alone, UPPER_SHARE of the time (capitals are other
# tokens altogether, so a model needs them more often than one edit in six)
TRAIN_TRANSFORMS: tuple[Transform, ...] = (_lower, _upper, _punctuation, _typo, _context, _greeting)


def surface_noise(text: str, protected: frozenset[str], rng: random.Random, least: int) -> str:
    """The text with `least` to 2 seeded surface edits: casing, punctuation, one typo (never in a
    protected word), a training-only sentence of context and/or greeting before it."""
    if rng.random() < UPPER_SHARE:
        return _upper(text, protected, rng)
    others = [i for i, edit in enumerate(TRAIN_TRANSFORMS) if edit is not _upper]
    chosen = rng.sample(others, rng.randint(least, 2))
    for index in sorted(chosen):
        text = TRAIN_TRANSFORMS[index](text, protected, rng)
    return text


def _reworded_simple(rng: random.Random, store: Store) -> tuple[str, str, str]:
    """(prompt, reference, final) of a reworded FAQ, price lookup or off-domain question."""
    if rng.random() < UNKNOWN_SHARE:
        prompt = surface_noise(rng.choice(TRAIN_UNKNOWN_QUESTIONS), frozenset(), rng, least=0)
        return prompt, FALLBACK_ANSWER, FALLBACK_ANSWER
    new = rng.random() < NEW_WORDING_SHARE
    if rng.random() < 0.5:
        policy = rng.choice(POLICIES)
        base = rng.choice(TRAIN_POLICY_QUESTIONS[policy.topic] if new else policy.questions)
        prompt = surface_noise(base, frozenset(), rng, least=0 if new else 1)
        return prompt, policy.answer, policy.answer
    product = rng.choice(store.popular)
    template = rng.choice(TRAIN_LOOKUP_TEMPLATES if new else LOOKUP_TEMPLATES)
    protected = frozenset(product.name.split())
    prompt = surface_noise(template.format(item=product.name), protected, rng, 0 if new else 1)
    return prompt, *lookup_answer(product)


def _reworded_medium(rng: random.Random, store: Store) -> tuple[str, str, str]:
    """(prompt, reference, final) of a reworded quantity question, the quantity maybe a word."""
    product = rng.choice(store.products)
    qty = rng.randint(2, 9)
    new = rng.random() < NEW_WORDING_SHARE
    as_word = rng.random() < 0.25
    template = rng.choice(TRAIN_MEDIUM_TEMPLATES if new else MEDIUM_TEMPLATES)
    prompt = template.format(qty=NUMBER_WORDS[qty] if as_word else qty, items=product.plural)
    if prompt[0].islower() and rng.random() < 0.7:
        prompt = prompt[0].upper() + prompt[1:]
    protected = frozenset(product.plural.split()) | {NUMBER_WORDS[qty]}
    prompt = surface_noise(prompt, protected, rng, least=0 if new or as_word else 1)
    return prompt, *medium_answer(product, qty)


def augmented_stream(
    seed: int,
    request_class: RequestClass,
    held_out: frozenset[str] = frozenset(),
    store: Store = STORE,
) -> Iterator[WorkloadItem]:
    """Endless training items of one class: the generator's stream, with simple and medium items
    reworded (PLAIN_SHARE of them left as they are). A reworded prompt that is in `held_out`
    (the dev and test prompts) is dropped. Complex items pass through unchanged; so does the
    generator's stream for a plain item (the caller filters those as before)."""
    rng = random.Random(f"{seed}:{request_class}:augment")
    for item in stream(seed, request_class, store):
        if request_class not in AUGMENTED_CLASSES or rng.random() < PLAIN_SHARE:
            yield item
            continue
        build = _reworded_simple if request_class == "simple" else _reworded_medium
        prompt, reference, final = build(rng, store)
        if prompt in held_out:
            continue
        yield WorkloadItem(f"{item.id}-aug", request_class, prompt, reference, final)
