"""The first-token race (services/router/first_token_race.py) as a table of scenarios: calls join,
stream or leave, and each step the race returns is written as a transcript line: `stop timer`,
`cancel#N` for each loser to cancel, `answer#N` once the race is settled, `-` for nothing.
"""

from __future__ import annotations

import pytest

from services.router.first_token_race import FirstTokenRace, RaceStep
from services.router.session_calls import CallState

LATE = "no first token from large within 200 ms"


def calls() -> list[CallState]:
    """The late call on large, then backups on medium and small."""
    tiers = ("large", "medium", "small")
    return [CallState(i, tier, f"c-{tier}", 30.0) for i, tier in enumerate(tiers)]


def line(step: RaceStep) -> str:
    words = ["stop timer"] if step.stop_timer else []
    words += [f"cancel#{c.id}" for c in step.cancel]
    words += [f"answer#{step.answer.id}"] if step.answer is not None else []
    return ", ".join(words) or "-"


# inputs: (what, call); after them: the calls still racing, the timer armed, the reason
SCENARIOS: dict[str, tuple[list[tuple[str, int]], list[str], list[int], bool, str]] = {
    "no input yet: the first call races alone, the timer armed": (
        [],
        [],
        [0],
        True,
        "",
    ),
    "first token in time: the timer is stopped, the first call answers": (
        [("stream", 0)],
        ["stop timer, answer#0"],
        [],
        False,
        "",
    ),
    "the timer fired: the backup joins, the timer is no longer armed": (
        [("join", 1)],
        ["-"],
        [0, 1],
        False,
        "",
    ),
    "the backup streams first: it wins, the late call is cancelled": (
        [("join", 1), ("stream", 1)],
        ["-", "cancel#0, answer#1"],
        [],
        False,
        f"{LATE}; answered by medium",
    ),
    "the late call streams first after all: the backup is cancelled": (
        [("join", 1), ("stream", 0)],
        ["-", "cancel#1, answer#0"],
        [],
        False,
        "",
    ),
    "the backup fails while the late call races on: the late call answers": (
        [("join", 1), ("left", 1)],
        ["-", "answer#0"],
        [],
        False,
        "",
    ),
    "the late call fails while the backup races on: the backup answers": (
        [("join", 1), ("left", 0)],
        ["-", "answer#1"],
        [],
        False,
        f"{LATE}; answered by medium",
    ),
    "the first call ends before the timer: alone, its end is the answer's": (
        [("left", 0)],
        ["stop timer, answer#0"],
        [],
        False,
        "",
    ),
    "one of three fails: the other two race on until one streams": (
        [("join", 1), ("join", 2), ("left", 1), ("stream", 2)],
        ["-", "-", "-", "cancel#0, answer#2"],
        [],
        False,
        f"{LATE}; answered by small",
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str) -> None:
    inputs, expected, racing, timer_armed, reason = SCENARIOS[name]
    call = calls()
    race = FirstTokenRace()
    race.begin(call[0], 0.2)
    lines = []
    for what, i in inputs:
        if what == "join":
            race.join(call[i])
            lines.append("-")
        elif what == "stream":
            lines.append(line(race.streamed(call[i])))
        else:
            lines.append(line(race.left(call[i])))
    assert lines == expected
    assert [c.id for c in race.racing] == racing
    assert race.running == bool(racing)
    assert race.timer_armed == timer_armed
    assert race.reason == reason


def test_a_chat_without_a_race_has_nothing_running() -> None:
    race = FirstTokenRace()
    assert (race.running, race.timer_armed, race.reason) == (False, False, "")
