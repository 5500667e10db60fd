"""Seeded generator of customer-service requests with reference answers, in three classes.

simple: an FAQ question (one of a fixed set of paraphrases) or the price of a popular product.
medium: the cost of a quantity of any catalogue product (one recalled price, one product).
complex: an order of 2-4 catalogue products, maybe a coupon, and shipping, with the working
written out as a receipt (one line per product carrying the running total, fixed-width amounts,
each sum's carries written before its result) and a final "Answer:" line. Each step is
learnable; what separates the tiers is holding the whole catalogue and getting every one of 4-7
chained steps right.

Knows the shop (store.py) and the answer format; knows nothing of files, tokenizers or models.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from services.common.answers import ANSWER_PREFIX
from services.workload.store import (
    COUPONS,
    FREE_SHIPPING_FROM,
    POLICIES,
    SHIPPING_FEE,
    Product,
    Store,
    build_store,
)

RequestClass = Literal["simple", "medium", "complex"]
Phrasing = Literal["seen", "unseen"]
CLASSES: tuple[RequestClass, ...] = ("simple", "medium", "complex")

STORE_SEED = 20240611  # the shop is fixed: every split and every model shares it
CATALOGUE_SIZE = 120  # products medium and complex requests draw from
AMOUNT_DIGITS = 3  # complex working writes every amount with this many digits ($064)
POPULAR_SIZE = 20  # products simple lookups draw from (the first of the catalogue)
STORE = build_store(STORE_SEED, CATALOGUE_SIZE, POPULAR_SIZE)

LOOKUP_TEMPLATES = (
    "How much does the {item} cost?",
    "What is the price of the {item}?",
    "How much is the {item}?",
    "What does the {item} cost?",
)
MEDIUM_TEMPLATES = (
    "How much do {qty} {items} cost?",
    "What is the price of {qty} {items}?",
    "I want to buy {qty} {items}. How much is that?",
    "How much would {qty} {items} be?",
)
COMPLEX_OPENERS = (
    "I want to order {order}.",
    "Please price an order of {order}.",
    "My cart has {order}.",
)
COMPLEX_COUPON = " I have coupon {code}."
COMPLEX_CLOSERS = (
    " What is my total with shipping?",
    " How much will I pay in total?",
    " What is the final total?",
)


@dataclass(frozen=True)
class WorkloadItem:
    """One request with its verifiable answer.

    `reference` is the full target text a model is trained to produce (without end-of-text);
    `final` is what its last line must say for the answer to count (see scoring.final_answer).
    `phrasing` is "seen" for wordings training uses, "unseen" for held-out ones (phrasings.py).
    """

    id: str
    request_class: RequestClass
    prompt: str
    reference: str
    final: str
    phrasing: Phrasing = "seen"

    def to_json(self, with_phrasing: bool = True) -> dict[str, Any]:
        row = asdict(self)
        if not with_phrasing:
            del row["phrasing"]
        return row

    @staticmethod
    def from_json(row: Mapping[str, Any]) -> WorkloadItem:
        return WorkloadItem(
            id=str(row["id"]),
            request_class=row["request_class"],
            prompt=str(row["prompt"]),
            reference=str(row["reference"]),
            final=str(row["final"]),
            phrasing="unseen" if row.get("phrasing") == "unseen" else "seen",
        )


def _simple(rng: random.Random, store: Store) -> tuple[str, str, str]:
    if rng.random() < 0.5:
        policy = rng.choice(POLICIES)
        return rng.choice(policy.questions), policy.answer, policy.answer
    product = rng.choice(store.popular)
    prompt = rng.choice(LOOKUP_TEMPLATES).format(item=product.name)
    return prompt, *lookup_answer(product)


def lookup_answer(product: Product) -> tuple[str, str]:
    """(reference, final) of a question about one product's price."""
    final = f"${product.price}"
    return f"The {product.name} costs {final}.\n{ANSWER_PREFIX}{final}", final


def medium_answer(product: Product, qty: int) -> tuple[str, str]:
    """(reference, final) of a question about the cost of `qty` of one product."""
    total = qty * product.price
    reference = (
        f"{_article(product.name)} {product.name} costs ${product.price}.\n"
        f"{qty} x ${product.price} = ${total}\n"
        f"{ANSWER_PREFIX}${total}"
    )
    return reference, f"${total}"


def _medium(rng: random.Random, store: Store) -> tuple[str, str, str]:
    product = rng.choice(store.products)
    qty = rng.randint(2, 9)
    prompt = rng.choice(MEDIUM_TEMPLATES).format(qty=qty, items=product.plural)
    return prompt, *medium_answer(product, qty)


def _article(name: str) -> str:
    return "An" if name[0] in "aeiou" else "A"


def _order_phrase(lines: list[tuple[int, Product]]) -> str:
    parts = [f"{qty} {p.name if qty == 1 else p.plural}" for qty, p in lines]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _amount(dollars: int) -> str:
    """A working amount: fixed width, so every sum lines its digits up the same way."""
    return f"${dollars:0{AMOUNT_DIGITS}d}"


def _carries(a: int, b: int, sign: Literal["+", "-"]) -> str:
    """The carries of a + b (the borrows of a - b) out of each column but the highest, units
    first, in brackets: `[01]` for $097 + $012 (7 + 2 carries nothing, 9 + 1 carries one).

    Written before the result, they leave no digit of it depending on columns to its right:
    each result digit is its own column plus the carry into it, already on the line."""
    out, carry = [], 0
    for column in range(AMOUNT_DIGITS - 1):
        x, y = (a // 10**column) % 10, (b // 10**column) % 10
        carry = int(x + y + carry >= 10) if sign == "+" else int(x - y - carry < 0)
        out.append(str(carry))
    return "[" + "".join(out) + "]"


def _sum(a: int, b: int, sign: Literal["+", "-"]) -> str:
    """One step of the working: `$097 + $012 [01] = $109` (fixed-width amounts, carries first)."""
    result = a + b if sign == "+" else a - b
    return f"{_amount(a)} {sign} {_amount(b)} {_carries(a, b, sign)} = {_amount(result)}"


def _complex_lines(rng: random.Random, store: Store) -> list[tuple[int, Product]]:
    """2-4 distinct products with quantities 1-3, redrawn until the subtotal fits the width."""
    while True:
        products = rng.sample(store.products, rng.choice((2, 3, 3, 4)))
        lines = [(rng.randint(1, 3), p) for p in products]
        if sum(q * p.price for q, p in lines) < 10**AMOUNT_DIGITS:
            return lines


def _complex(rng: random.Random, store: Store) -> tuple[str, str, str]:
    lines = _complex_lines(rng, store)
    code = rng.choice((None, *COUPONS))
    prompt = rng.choice(COMPLEX_OPENERS).format(order=_order_phrase(lines))
    if code is not None:
        prompt += COMPLEX_COUPON.format(code=code)
    prompt += rng.choice(COMPLEX_CLOSERS)

    # one line per product with the running total on it: every step reads the line above
    work: list[str] = []
    running = 0
    for qty, p in lines:
        amount = qty * p.price
        total = _sum(running, amount, "+") if running else _amount(amount)
        work.append(f"{p.name}: {qty} x {_amount(p.price)} = {_amount(amount)}, total {total}")
        running += amount
    if code is not None:
        off = min(COUPONS[code], running)
        work.append(f"coupon {code}: {_sum(running, off, '-')}")
        running -= off
    fee = 0 if running >= FREE_SHIPPING_FROM else SHIPPING_FEE
    rule = "free" if fee == 0 else f"under ${FREE_SHIPPING_FROM}"
    work.append(f"shipping ({rule}): {_sum(running, fee, '+')}")
    running += fee
    work.append(f"{ANSWER_PREFIX}${running}")
    return prompt, "\n".join(work), f"${running}"


def arithmetic_drill(rng: random.Random) -> tuple[str, str]:
    """A training-only calculator request in the receipt's own notation: add up 2-5 amounts,
    sometimes take one off, with the running total written line by line. Not a workload class
    (never routed or scored); the trainer mixes it in so the arithmetic of complex working is
    practised apart from recalling prices."""
    while True:
        amounts = [rng.randint(1, 3) * rng.randint(5, 99) for _ in range(rng.randint(2, 5))]
        off = rng.choice((0, 0, 5, 10, 20))
        if sum(amounts) < 10**AMOUNT_DIGITS and sum(amounts) >= off:
            break
    listed = ", ".join(_amount(a) for a in amounts[:-1]) + f" and {_amount(amounts[-1])}"
    prompt = f"Add up {listed}" + (f", then take off {_amount(off)}." if off else ".")
    work, running = [], amounts[0]
    for amount in amounts[1:]:
        work.append(_sum(running, amount, "+"))
        running += amount
    if off:
        work.append(_sum(running, off, "-"))
        running -= off
    work.append(f"{ANSWER_PREFIX}${running}")
    return prompt, "\n".join(work)


def drill_stream(seed: int) -> Iterator[tuple[str, str]]:
    """Endless (prompt, reference) arithmetic drills; the same seed gives the same sequence."""
    rng = random.Random(f"{seed}:drill")
    while True:
        yield arithmetic_drill(rng)


BUILDERS = {"simple": _simple, "medium": _medium, "complex": _complex}


def normalise_mix(mix: Mapping[str, float]) -> dict[RequestClass, float]:
    """Checks a class mix (weights per class, any scale) and returns it summing to 1."""
    unknown = set(mix) - set(CLASSES)
    if unknown:
        raise ValueError(f"mix has unknown classes {sorted(unknown)}; known: {CLASSES}")
    if any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix weights must be >= 0 and not all 0, got {dict(mix)}")
    total = sum(mix.values())
    return {c: float(mix.get(c, 0.0)) / total for c in CLASSES}


def class_counts(n: int, mix: Mapping[str, float]) -> dict[RequestClass, int]:
    """Splits n items over the classes in proportion to mix (largest remainder, exact total)."""
    shares = normalise_mix(mix)
    counts = {c: int(n * shares[c]) for c in CLASSES}
    order = sorted(CLASSES, key=lambda c: n * shares[c] - counts[c], reverse=True)
    for c in order[: n - sum(counts.values())]:
        counts[c] += 1
    return counts


def stream(seed: int, request_class: RequestClass, store: Store = STORE) -> Iterator[WorkloadItem]:
    """Endless items of one class; the same seed always yields the same sequence."""
    rng = random.Random(f"{seed}:{request_class}")
    build = BUILDERS[request_class]
    index = 0
    while True:
        prompt, reference, final = build(rng, store)
        yield WorkloadItem(
            f"{request_class}-{seed}-{index}", request_class, prompt, reference, final
        )
        index += 1


def generate(
    seed: int,
    n: int,
    mix: Mapping[str, float],
    exclude_prompts: frozenset[str] = frozenset(),
    store: Store = STORE,
    unique: bool = True,
) -> list[WorkloadItem]:
    """n items with class counts given by mix, shuffled by the seed.

    medium and complex items whose prompt is in exclude_prompts are skipped, and with `unique`
    so are repeats within the result, so splits built one after another never share such a
    prompt. simple prompts come from a small fixed set and repeat by design. Raises ValueError
    when the class has too few distinct prompts left for the count asked.
    """
    items: list[WorkloadItem] = []
    for request_class, count in class_counts(n, mix).items():
        seen = set(exclude_prompts)
        source = stream(seed, request_class, store)
        drawn, rejected = 0, 0
        while drawn < count:
            item = next(source)
            if request_class != "simple" and item.prompt in seen:
                rejected += 1
                if rejected > 100 * count + 10_000:
                    raise ValueError(f"too few distinct {request_class} prompts for {count} items")
                continue
            if unique:
                seen.add(item.prompt)
            items.append(item)
            drawn += 1
    random.Random(seed).shuffle(items)
    return items
