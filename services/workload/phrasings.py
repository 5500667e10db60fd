"""Held-out phrasings: simple and medium requests worded in ways training never shows a model,
and "unknown" requests the shop cannot answer (expected reply: store.FALLBACK_ANSWER).

An unseen item asks the same thing as a seen one, so its reference answer is the seen one's. Its
wording comes from new paraphrase templates (other words, other word order) or from a seen
template changed on the surface: casing, punctuation, a typo, a greeting before the question, a
sentence of context, a quantity written as a word. Only dev and test hold such items; a prompt
any seen template can produce is never called unseen (`is_seen_prompt`).

Knows the shop and the generator's seen templates; nothing of files, splits, tokenizers or models.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from functools import cache

from services.workload.generator import (
    LOOKUP_TEMPLATES,
    MEDIUM_TEMPLATES,
    STORE,
    RequestClass,
    WorkloadItem,
    lookup_answer,
    medium_answer,
)
from services.workload.store import FALLBACK_ANSWER, POLICIES, Store

UNSEEN_CLASSES: tuple[RequestClass, ...] = ("simple", "medium")
UNKNOWN_SHARE = 0.1  # of unseen simple items: questions outside the shop's domain

# New paraphrases per policy topic: never in POLICIES, so never trained on.
UNSEEN_POLICY_QUESTIONS: dict[str, tuple[str, ...]] = {
    "returns": (
        "How long do I have to return an item?",
        "Can I give back something I bought?",
        "I changed my mind about a purchase, can I return it?",
        "Do you accept returns?",
    ),
    "shipping": (
        "What do you charge for shipping?",
        "Is shipping free?",
        "Shipping costs, how much are they?",
        "Do I have to pay for delivery?",
    ),
    "delivery_time": (
        "Where is my order?",
        "How long until my order gets here?",
        "When does my package come?",
        "How long will shipping take?",
    ),
    "refund_time": (
        "How long until I get my refund?",
        "When do I receive my refund?",
        "My refund, when will it be paid?",
    ),
    "coupons": (
        "Do you have coupon codes?",
        "Are there any discount codes?",
        "Can I get a discount?",
    ),
    "payment": (
        "Can I pay with PayPal?",
        "Do you take credit cards?",
        "What can I pay with?",
    ),
    "cancel": (
        "Can I still cancel my order?",
        "I want to cancel my order, is that possible?",
        "How can I cancel a purchase?",
    ),
    "warranty": (
        "Is there a warranty?",
        "My item stopped working, is it covered?",
        "How long is the warranty?",
    ),
    "hours": (
        "When are you open?",
        "What are your opening hours?",
        "At what time can I call support?",
    ),
    "international": (
        "Do you ship to Canada?",
        "Can I order from another country?",
        "Do you ship internationally?",
    ),
}
UNKNOWN_QUESTIONS = (
    "What is the weather like today?",
    "Can you write me a poem?",
    "What is the capital of France?",
    "Tell me a joke.",
    "Where is your nearest store?",
    "What is your phone number?",
    "Can I speak to a manager?",
    "How do I reset my password?",
    "Do you have a loyalty program?",
    "Can you help me with my homework?",
    "Who makes your products?",
    "Do you sell gift wrapping?",
)
UNSEEN_LOOKUP_TEMPLATES = (
    "What's the price of the {item}?",
    "The {item}, how much is it?",
    "Price of the {item}?",
    "Could you tell me what the {item} costs?",
    "How much are you asking for the {item}?",
)
UNSEEN_MEDIUM_TEMPLATES = (
    "What would {qty} {items} cost me?",
    "Price for {qty} {items}?",
    "If I buy {qty} {items}, what do I pay?",
    "{qty} {items}, how much is that in total?",
    "Could you tell me the cost of {qty} {items}?",
    "I need {qty} {items}. What's the total?",
)
GREETINGS = ("Hi!", "Hello,", "Hi there.", "Good morning!", "Hey,")
CONTEXTS = (
    "I am a new customer.",
    "I am shopping for a gift.",
    "I found your shop online.",
    "Quick question.",
    "I have a question for you.",
)
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _lower(text: str, _protected: frozenset[str], _rng: random.Random) -> str:
    return text.lower()


def _upper(text: str, _protected: frozenset[str], _rng: random.Random) -> str:
    return text.upper()


def _punctuation(text: str, _protected: frozenset[str], rng: random.Random) -> str:
    stripped = text.rstrip("?.!")
    return stripped + rng.choice(("", "??", " ?", "?!", "...")) if stripped != text else text + "?"


def _typo(text: str, protected: frozenset[str], rng: random.Random) -> str:
    """One letter dropped, doubled or swapped with its neighbour in one unprotected word."""
    words = text.split(" ")
    candidates = [
        i
        for i, w in enumerate(words)
        if len(w.strip("?.,!")) >= 4
        and w.strip("?.,!").isalpha()
        and w.strip("?.,!").lower() not in protected
    ]
    if not candidates:
        return text
    index = rng.choice(candidates)
    word = words[index]
    at = rng.randrange(1, len(word.strip("?.,!")) - 1)
    kind = rng.choice(("drop", "double", "swap"))
    if kind == "drop":
        word = word[:at] + word[at + 1 :]
    elif kind == "double":
        word = word[:at] + word[at] + word[at:]
    else:
        word = word[:at] + word[at + 1] + word[at] + word[at + 2 :]
    words[index] = word
    return " ".join(words)


def greeted(greeting: str, text: str) -> str:
    """`text` after `greeting`; after one that ends in a comma, its first letter in lower case
    (unless it is "I")."""
    if greeting.endswith(",") and not text.startswith("I "):
        return f"{greeting} {text[0].lower()}{text[1:]}"
    return f"{greeting} {text}"


def _greeting(text: str, _protected: frozenset[str], rng: random.Random) -> str:
    return greeted(rng.choice(GREETINGS), text)


def _context(text: str, _protected: frozenset[str], rng: random.Random) -> str:
    return f"{rng.choice(CONTEXTS)} {text}"


Transform = Callable[[str, frozenset[str], random.Random], str]
# in the order they apply: a greeting comes before a sentence of context, both before the question
TRANSFORMS: tuple[Transform, ...] = (_lower, _upper, _punctuation, _typo, _context, _greeting)


def _reworded(base: str, protected: frozenset[str], rng: random.Random, least: int) -> str:
    """The base question with `least` to 2 seeded surface transforms applied. Upper case comes
    alone: with a greeting or context the prompt can outgrow what a built-in tier admits
    (upper-case words take several tokens each)."""
    chosen = rng.sample(range(len(TRANSFORMS)), rng.randint(least, 2))
    if TRANSFORMS.index(_upper) in chosen:
        chosen = [TRANSFORMS.index(_upper)]
    for index in sorted(chosen):
        base = TRANSFORMS[index](base, protected, rng)
    return base


@cache
def _seen_prompts() -> frozenset[str]:
    """Every prompt the seen templates can produce for simple and medium requests."""
    seen = {q for policy in POLICIES for q in policy.questions}
    seen |= {t.format(item=p.name) for t in LOOKUP_TEMPLATES for p in STORE.popular}
    seen |= {
        t.format(qty=qty, items=p.plural)
        for t in MEDIUM_TEMPLATES
        for p in STORE.products
        for qty in range(2, 10)
    }
    return frozenset(seen)


def is_seen_prompt(prompt: str) -> bool:
    """True when a seen (trained) template produces exactly this prompt."""
    return prompt in _seen_prompts()


def _unseen_simple(rng: random.Random, store: Store) -> tuple[str, str, str, str]:
    """(kind, prompt, reference, final), kind being "unknown", "policy" or "lookup"."""
    roll = rng.random()
    if roll < UNKNOWN_SHARE:
        prompt = _reworded(rng.choice(UNKNOWN_QUESTIONS), frozenset(), rng, least=0)
        return "unknown", prompt, FALLBACK_ANSWER, FALLBACK_ANSWER
    if roll < 0.55:
        policy = rng.choice(POLICIES)
        new = rng.random() < 0.6
        base = rng.choice(UNSEEN_POLICY_QUESTIONS[policy.topic] if new else policy.questions)
        prompt = _reworded(base, frozenset(), rng, least=0 if new else 1)
        return "policy", prompt, policy.answer, policy.answer
    product = store.popular[rng.randrange(len(store.popular))]
    new = rng.random() < 0.6
    template = rng.choice(UNSEEN_LOOKUP_TEMPLATES if new else LOOKUP_TEMPLATES)
    protected = frozenset(product.name.split())
    prompt = _reworded(template.format(item=product.name), protected, rng, least=0 if new else 1)
    return "lookup", prompt, *lookup_answer(product)


def _unseen_medium(rng: random.Random, store: Store) -> tuple[str, str, str, str]:
    product = store.products[rng.randrange(len(store.products))]
    qty = rng.randint(2, 9)
    new = rng.random() < 0.6
    template = rng.choice(UNSEEN_MEDIUM_TEMPLATES if new else MEDIUM_TEMPLATES)
    as_word = rng.random() < 0.2
    prompt = template.format(qty=NUMBER_WORDS[qty] if as_word else qty, items=product.plural)
    if prompt[0].islower():
        prompt = prompt[0].upper() + prompt[1:]
    protected = frozenset(product.plural.split()) | {NUMBER_WORDS[qty]}
    prompt = _reworded(prompt, protected, rng, least=0 if new or as_word else 1)
    return "medium", prompt, *medium_answer(product, qty)


def unseen_stream(
    seed: int, request_class: RequestClass, store: Store = STORE
) -> Iterator[WorkloadItem]:
    """Endless unseen items of one class (simple or medium); the same seed, the same sequence.
    Ids read `<class>-<seed>-unseen-<n>`, or `simple-<seed>-unknown-<n>` for unknown requests."""
    if request_class not in UNSEEN_CLASSES:
        raise ValueError(f"no unseen phrasings for {request_class!r}; only {UNSEEN_CLASSES}")
    rng = random.Random(f"{seed}:{request_class}:unseen")
    build = _unseen_simple if request_class == "simple" else _unseen_medium
    index = 0
    while True:
        kind, prompt, reference, final = build(rng, store)
        if is_seen_prompt(prompt):
            continue  # a surface change that changed nothing, or a seen wording by chance
        tag = "unknown" if kind == "unknown" else "unseen"
        item_id = f"{request_class}-{seed}-{tag}-{index}"
        yield WorkloadItem(item_id, request_class, prompt, reference, final, phrasing="unseen")
        index += 1


def generate_unseen(
    seed: int,
    counts: dict[RequestClass, int],
    exclude_prompts: frozenset[str] = frozenset(),
    store: Store = STORE,
) -> list[WorkloadItem]:
    """`counts[c]` unseen items of each class c, in class order, no prompt twice and none in
    exclude_prompts (so dev's unseen prompts differ from test's)."""
    items: list[WorkloadItem] = []
    seen = set(exclude_prompts)
    for request_class, count in counts.items():
        source = unseen_stream(seed, request_class, store)
        while sum(1 for i in items if i.request_class == request_class) < count:
            item = next(source)
            if item.prompt not in seen:
                seen.add(item.prompt)
                items.append(item)
    return items
