"""Prices and cost per output token: reads the price file and prices measured busy time.

A price profile gives each service (the tiers and the router) a price per hour of busy time;
cost = sum of CPU-seconds x price per hour / 3600. Knows nothing of how the CPU-seconds were
measured or what produced the tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.common.config_loading import read_toml
from services.common.errors import ConfigError
from services.common.tiers import TIER_NAMES

DEFAULT_PRICES = Path(__file__).resolve().parent / "prices.toml"
SERVICES = (*TIER_NAMES, "router")


@dataclass(frozen=True)
class PriceProfile:
    """Dollars per hour of busy time, per service."""

    name: str
    description: str
    per_hour: Mapping[str, float]

    def cost(self, cpu_seconds: Mapping[str, float]) -> float:
        """Dollars for the busy time given per service (services without a price are free)."""
        return sum(self.per_hour.get(name, 0.0) * s / 3600 for name, s in cpu_seconds.items())

    def to_json(self) -> dict[str, object]:
        return {"description": self.description, "per_hour": dict(self.per_hour)}


def load_prices(path: Path = DEFAULT_PRICES) -> dict[str, PriceProfile]:
    """Every profile of a price file; raises ConfigError naming the file and field."""
    data = read_toml(path, "price file")
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise ConfigError(f"{path}: profiles: expected at least one [profiles.NAME] table")
    loaded = {}
    for name, table in profiles.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: profiles.{name}: expected a table")
        per_hour: dict[str, float] = {}
        for service in SERVICES:
            value = table.get(service)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"{path}: profiles.{name}.{service}: expected dollars per hour >= 0, "
                    f"got {value!r}"
                )
            per_hour[service] = float(value)
        unknown = sorted(set(table) - set(SERVICES) - {"description"})
        if unknown:
            raise ConfigError(f"{path}: profiles.{name}.{unknown[0]}: unknown field")
        loaded[name] = PriceProfile(name, str(table.get("description", "")), per_hour)
    return loaded


def cost_per_million_tokens(
    profiles: Mapping[str, PriceProfile], cpu_seconds: Mapping[str, float], output_tokens: int
) -> dict[str, float | None]:
    """Dollars per 1M output tokens under each profile (None when no tokens were delivered)."""
    return {
        name: None
        if output_tokens <= 0
        else round(profile.cost(cpu_seconds) / output_tokens * 1e6, 6)
        for name, profile in profiles.items()
    }
