"""The workload generator: deterministic, honours the class mix, and its scorer is exact."""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import replace

import pytest

from services.workload import (
    CLASSES,
    SPLITS,
    STORE,
    build_splits,
    class_counts,
    final_answer,
    generate,
    load_split,
    score,
)
from services.workload.generator import arithmetic_drill
from services.workload.store import POLICIES


def test_same_seed_same_items_and_other_seed_differs() -> None:
    mix = {"simple": 1, "medium": 1, "complex": 1}
    assert generate(7, 90, mix) == generate(7, 90, mix)
    assert generate(7, 90, mix) != generate(8, 90, mix)


def test_committed_splits_match_the_generator() -> None:
    built = build_splits()
    for spec in SPLITS:
        assert load_split(spec.name, phrasing=None) == built[spec.name], f"{spec.name} is stale"


def test_class_mix_is_honoured() -> None:
    items = generate(3, 1000, {"simple": 0.9, "medium": 0.06, "complex": 0.04})
    assert Counter(i.request_class for i in items) == {"simple": 900, "medium": 60, "complex": 40}
    only_complex = generate(3, 25, {"complex": 1.0})
    assert {i.request_class for i in only_complex} == {"complex"}
    assert sum(class_counts(7, {"simple": 1, "medium": 1, "complex": 1}).values()) == 7


def test_bad_mix_is_rejected_with_the_class_named() -> None:
    with pytest.raises(ValueError, match="huge"):
        generate(1, 10, {"huge": 1.0})
    with pytest.raises(ValueError):
        generate(1, 10, {"simple": 0.0})


def test_test_split_has_the_traffic_mix_and_enough_hard_items() -> None:
    counts = Counter(i.request_class for i in load_split("test"))
    assert counts["simple"] / sum(counts.values()) == pytest.approx(0.9)
    assert counts["medium"] >= 200 and counts["complex"] >= 150


def test_held_out_prompts_do_not_leak_into_train() -> None:
    train = {i.prompt for i in load_split("train") if i.request_class != "simple"}
    test = {i.prompt for i in load_split("test") if i.request_class != "simple"}
    assert not train & test


def test_scorer_accepts_reference_and_rejects_wrong_final_answer() -> None:
    for item in generate(11, 30, {c: 1.0 for c in CLASSES}):
        assert score(item, item.reference)
        assert score(item, item.reference + "\n")
        wrong = (
            item.reference.rsplit("\n", 1)[0] + "\nAnswer: $0" if "\n" in item.reference else "?"
        )
        assert not score(item, wrong)
        assert not score(replace(item, final=item.final + "1"), item.reference)
    assert final_answer("a\nAnswer: $12\n\n") == "$12"
    assert final_answer("") == ""


def test_return_policy_question_and_lookups_use_popular_items() -> None:
    returns = next(p for p in POLICIES if p.topic == "returns")
    assert "What is your return policy?" in returns.questions
    simple = [i for i in generate(5, 400, {"simple": 1.0}) if i.final.startswith("$")]
    popular = {p.name for p in STORE.popular}
    assert simple and all(any(name in i.prompt for name in popular) for i in simple)


def _checked_sums(working: str) -> int:
    """Asserts every `$a +/- $b [carries] = $c` of a working and returns how many there were."""
    found = re.findall(r"\$(\d+) ([+-]) \$(\d+) \[(\d+)\] = \$(\d+)", working)
    for left, op, right, carried, result in found:
        assert len(left) == len(right) == len(result) == 3, working  # fixed width
        a, b, c = int(left), int(right), int(result)
        assert c == (a + b if op == "+" else a - b), working
        # the carry (borrow) out of the lowest k columns, units first
        low = [(a % 10**k, b % 10**k, 10**k) for k in (1, 2)]
        expected = [x + y >= m if op == "+" else x < y for x, y, m in low]
        assert carried == "".join(str(int(e)) for e in expected), working
    return len(found)


def test_arithmetic_drills_add_up_with_their_carries() -> None:
    rng = random.Random(4)
    for _ in range(300):
        prompt, working = arithmetic_drill(rng)
        asked = re.fullmatch(r"Add up (.+?)(?:, then take off \$(\d+))?\.", prompt)
        assert asked is not None, prompt
        amounts = [int(a) for a in re.findall(r"\$(\d+)", asked[1])]
        off = int(asked[2] or 0)
        assert _checked_sums(working) == len(amounts) - 1 + (asked[2] is not None)
        assert working.splitlines()[-1] == f"Answer: ${sum(amounts) - off}"


def test_complex_working_adds_up() -> None:
    items = generate(2, 200, {"complex": 1.0})
    assert {len([ln for ln in i.reference.splitlines() if ", total " in ln]) for i in items} == {
        2,
        3,
        4,
    }
    for item in items:
        lines = item.reference.splitlines()
        assert lines[-1] == f"Answer: {item.final}"
        assert lines[-2].startswith("shipping")
        assert lines[-2].endswith(f"${int(item.final[1:]):03d}")
        for line in lines[:-1]:
            for qty, price, amount in re.findall(r"(\d) x \$(\d+) = \$(\d+)", line):
                assert int(qty) * int(price) == int(amount), line
        # every product after the first adds to the total, a coupon subtracts, shipping adds
        products = len([ln for ln in lines if ", total " in ln])
        assert _checked_sums(item.reference) == products + ("coupon" in item.reference)
        for line in lines:
            for name in re.findall(r"^([a-z]+ [a-z]+): \d x \$(\d+)", line):
                assert int(name[1]) == STORE.price(name[0]), line  # catalogue prices
