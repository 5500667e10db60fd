"""Load scenarios for `tiermesh bench`: seeded arrival schedules and seeded request sequences.

A scenario is a rate curve (constant, or waves between ~0 and a peak), a duration with a
warm-up, and a class mix drawn from the reference workload's test split. The same seed always
gives the same arrival times and the same requests, so every configuration of one run sees the
identical offered load. Knows nothing of gRPC, the router or how requests are sent.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services.workload import CLASSES, TRAFFIC_MIX, WorkloadItem, load_split, normalise_mix

LONG_TAIL_MIX: Mapping[str, float] = {"simple": 0.9, "complex": 0.1}
BURST_FLOOR = 0.02  # the lowest rate of a burst wave, as a share of its peak


@dataclass(frozen=True)
class Preset:
    """How long a scenario runs and how much of the start is warm-up (not measured)."""

    name: str
    duration_s: float
    warmup_s: float


PRESETS = {
    "quick": Preset("quick", duration_s=60.0, warmup_s=10.0),  # sized for a 2-core machine
    "seed": Preset("seed", duration_s=1800.0, warmup_s=300.0),  # 30 min, the last 25 stable
}


@dataclass(frozen=True)
class ScenarioKind:
    """A named shape of offered load and its defaults."""

    name: str
    shape: str  # "constant" or "waves"
    rate_rps: float  # constant rate, or the peak of the waves
    mix: Mapping[str, float]
    description: str


# Default rates are sized for the built-in models on a 2-core machine: above what the large
# tier alone serves (~10-20 req/s there), so single saturates, and within what the mesh serves.
SCENARIOS = {
    "burst": ScenarioKind(
        "burst", "waves", 48.0, TRAFFIC_MIX, "rate swings between ~0 and the peak in waves"
    ),
    "long-tail": ScenarioKind(
        "long-tail", "constant", 24.0, LONG_TAIL_MIX, "90% simple / 10% complex at a steady rate"
    ),
    "sustained": ScenarioKind(
        "sustained", "constant", 30.0, TRAFFIC_MIX, "a constant high rate in the traffic mix"
    ),
}


@dataclass(frozen=True)
class Scenario:
    """One fully specified scenario: everything needed to rebuild its schedule."""

    name: str
    shape: str
    rate_rps: float
    duration_s: float
    warmup_s: float
    mix: Mapping[str, float]
    seed: int = 0
    wave_period_s: float = 20.0  # burst only: seconds from one peak to the next

    def __post_init__(self) -> None:
        if self.shape not in ("constant", "waves"):
            raise ValueError(f"shape: expected constant or waves, got {self.shape!r}")
        if self.rate_rps <= 0:
            raise ValueError(f"rate: must be > 0, got {self.rate_rps}")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError(
                f"warmup: must be in [0, duration={self.duration_s}), got {self.warmup_s}"
            )
        if self.wave_period_s <= 0:
            raise ValueError(f"wave_period_s: must be > 0, got {self.wave_period_s}")
        object.__setattr__(self, "mix", normalise_mix(self.mix))

    def rate_at(self, t: float) -> float:
        """Offered requests per second at t seconds after the start."""
        if self.shape == "constant":
            return self.rate_rps
        wave = (1 - math.cos(2 * math.pi * t / self.wave_period_s)) / 2
        return self.rate_rps * (BURST_FLOOR + (1 - BURST_FLOOR) * wave)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "shape": self.shape,
            "rate_rps": self.rate_rps,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "mix": {c: round(w, 4) for c, w in self.mix.items()},
            "seed": self.seed,
            "wave_period_s": self.wave_period_s if self.shape == "waves" else None,
        }


def build_scenario(
    name: str,
    *,
    preset: str = "quick",
    rate_rps: float | None = None,
    duration_s: float | None = None,
    warmup_s: float | None = None,
    mix: Mapping[str, float] | None = None,
    seed: int = 0,
) -> Scenario:
    """The named scenario with its defaults, the preset's timing, and any overrides."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    kind, timing = SCENARIOS[name], PRESETS[preset]
    return Scenario(
        name=name,
        shape=kind.shape,
        rate_rps=kind.rate_rps if rate_rps is None else rate_rps,
        duration_s=timing.duration_s if duration_s is None else duration_s,
        warmup_s=timing.warmup_s if warmup_s is None else warmup_s,
        mix=kind.mix if mix is None else mix,
        seed=seed,
    )


def arrival_times(scenario: Scenario) -> list[float]:
    """Seconds after the start at which requests arrive: a Poisson process at rate_at(t),
    drawn by thinning a homogeneous process at the peak rate. Seeded and deterministic."""
    rng = random.Random(f"arrivals:{scenario.seed}")
    peak = scenario.rate_rps
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= scenario.duration_s:
            return times
        if scenario.shape == "constant" or rng.random() * peak <= scenario.rate_at(t):
            times.append(t)


@dataclass
class RequestSequence:
    """An endless, seeded sequence of workload items in a class mix.

    Item i is the same for every configuration and every run with the same seed, however far
    the sequence is read; classes are drawn by the mix, items within a class cycle through that
    class's test-split items in a seeded order.
    """

    mix: Mapping[str, float]
    seed: int = 0
    pools: Mapping[str, Sequence[WorkloadItem]] | None = None  # default: the test split
    _items: list[WorkloadItem] = field(default_factory=list, init=False)
    _rng: random.Random = field(init=False)
    _next: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.mix = {str(c): w for c, w in normalise_mix(self.mix).items()}
        if self.pools is None:
            self.pools = split_by_class(load_split("test"), self.seed)
        missing = [c for c, w in self.mix.items() if w > 0 and not self.pools.get(c)]
        if missing:
            raise ValueError(f"mix asks for classes with no items: {missing}")
        self._rng = random.Random(f"requests:{self.seed}")

    def __getitem__(self, index: int) -> WorkloadItem:
        assert self.pools is not None
        classes = [c for c in CLASSES if self.mix[c] > 0]
        weights = [self.mix[c] for c in classes]
        while len(self._items) <= index:
            request_class = self._rng.choices(classes, weights)[0]
            pool = self.pools[request_class]
            position = self._next.get(request_class, 0)
            self._items.append(pool[position % len(pool)])
            self._next[request_class] = position + 1
        return self._items[index]


def split_by_class(items: Sequence[WorkloadItem], seed: int) -> dict[str, list[WorkloadItem]]:
    """The items of each class, shuffled by the seed."""
    pools: dict[str, list[WorkloadItem]] = {c: [] for c in CLASSES}
    for item in items:
        pools[item.request_class].append(item)
    for request_class, pool in pools.items():
        random.Random(f"pool:{seed}:{request_class}").shuffle(pool)
    return pools


def schedule_digest(times: Sequence[float], sequence: RequestSequence) -> str:
    """A short fingerprint of the arrivals and the requests they carry, to show two runs (or two
    configurations) offered the same load."""
    digest = hashlib.sha256()
    for index, t in enumerate(times):
        digest.update(f"{t:.6f}:{sequence[index].id};".encode())
    return digest.hexdigest()[:16]
