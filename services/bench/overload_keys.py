"""The API keys of `tiermesh bench --scenario overload`: a throwaway secure setup in a temporary
folder (a CA, every service's certificate and a keys file, as `tiermesh run --secure` issues
them), N chat keys, each with its share of the offered rate, and which key sends request i:
drawn by those shares from a generator seeded by (seed, i), the same in every run.

Knows certificate and key files and the SDK's client; nothing of the mesh's processes, the
load or the report.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tiermesh.client import AsyncRouterClient, tls_credentials

from services.launcher.secure_run import SecureRun, prepare_secure_run
from services.security.api_keys import create_key

KEY_PREFIX = "bench-key-"  # the keys' names: bench-key-1 (the slowest), bench-key-2, ...
CERT_HOURS = 4.0  # the certificates outlive any bench run; the folder is gone after it


def key_rates(keys: int, ratio: float) -> dict[str, float]:
    """Each key's share of the offered rate, by name: bench-key-1 the slowest, the last `ratio`
    times its rate, those between spaced geometrically (equal shares at ratio 1). Raises
    ValueError for fewer than one key or a ratio under 1."""
    if keys < 1:
        raise ValueError(f"--keys: at least 1 (0 runs without keys), got {keys}")
    if not ratio >= 1.0:
        raise ValueError(
            f"--key-rate-ratio: at least 1 (the last key's rate over the first's), got {ratio}"
        )
    weights = [ratio ** (k / (keys - 1)) if keys > 1 else 1.0 for k in range(keys)]
    total = sum(weights)
    return {f"{KEY_PREFIX}{k + 1}": w / total for k, w in enumerate(weights)}


def key_of(seed: int, rates: Mapping[str, float]) -> Callable[[int], str]:
    """The key request i is sent under: drawn by the rate shares from a generator seeded by
    (seed, i), so each key's arrivals are a seeded Poisson thinning of the schedule."""
    names = list(rates)
    weights = [rates[n] for n in names]

    def pick(index: int) -> str:
        return random.Random(f"key:{seed}:{index}").choices(names, weights)[0]

    return pick


@dataclass(frozen=True)
class BenchKeys:
    """The bench's secure setup and its chat keys."""

    secure: SecureRun  # the mesh's certificates and keys file (plan_children's `secure`)
    secrets: Mapping[str, str]  # key name -> the key itself
    rates: Mapping[str, float]  # key name -> its share of the offered rate

    @property
    def first(self) -> str:
        """The slowest key: it sends the capacity ramp and the unloaded pass alone."""
        return next(iter(self.rates))

    def client(self, router: str, name: str) -> AsyncRouterClient:
        """A client of the router at `router` over TLS (trusting the bench's CA) with key `name`."""
        credentials = tls_credentials(self.secure.ca)
        return AsyncRouterClient(router, credentials=credentials, api_key=self.secrets[name])


@contextlib.contextmanager
def bench_keys(keys: int, ratio: float) -> Iterator[BenchKeys]:
    """A CA, the services' certificates and `keys` chat keys (key_rates' names and shares) in a
    temporary folder, removed on exit."""
    rates = key_rates(keys, ratio)
    with tempfile.TemporaryDirectory(prefix="tiermesh-bench-keys-") as folder:
        secure = prepare_secure_run(Path(folder), hours=CERT_HOURS)
        secrets = {name: create_key(secure.keys_file, name, ("chat",))[1] for name in rates}
        yield BenchKeys(secure, secrets, rates)
