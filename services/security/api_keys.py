"""API keys: created by `tiermesh keys create`, stored hashed in a JSON file that servers watch,
with scopes (chat, feedback, admin) and per-key limits on requests and tokens per minute.

A key reads `tmk_<id>_<secret>`: the id finds the record, the secret is checked against its
SHA-256 (keys are random 256-bit values, so a fast hash is the right one; it is never stored
in clear). The file is re-read when it changes, checked at most every `reload_s`, so a revoked
key stops working within that interval. Knows nothing of gRPC: callers map the errors.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.common.errors import ConfigError, Overloaded, PermissionDenied, Unauthenticated

SCOPES = ("chat", "feedback", "admin")
PREFIX = "tmk_"


@dataclass(frozen=True)
class ApiKey:
    """One key's record as stored: never the secret itself."""

    id: str
    name: str
    hash: str  # sha256 hex of the secret part
    scopes: tuple[str, ...]
    rpm: int | None = None  # requests per minute; None = unlimited
    tpm: int | None = None  # tokens per minute (prompt + completion); None = unlimited
    created: str = ""
    revoked: str | None = None
    # the highest chat priority it may ask for: "batch", "interactive" or "critical"; None = any
    max_priority: str | None = None
    weight: float = 1.0  # its part of the mesh under load, against other keys' (fair share)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def load_keys(path: Path) -> list[ApiKey]:
    """The records in `path` (none when it does not exist)."""
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [ApiKey(**{**record, "scopes": tuple(record["scopes"])}) for record in data["keys"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not a tiermesh key file ({e})") from None


def _save(path: Path, keys: list[ApiKey]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"keys": [asdict(k) for k in keys]}, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


PRIORITY_CEILINGS = ("batch", "interactive", "critical")


def create_key(
    path: Path,
    name: str,
    scopes: tuple[str, ...],
    rpm: int | None = None,
    tpm: int | None = None,
    max_priority: str | None = None,
) -> tuple[ApiKey, str]:
    """Adds a key to the file; returns its record and the key itself, shown once."""
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise ConfigError(
            f"--scopes: {', '.join(unknown) or 'none given'}; use {', '.join(SCOPES)}"
        )
    if max_priority is not None and max_priority not in PRIORITY_CEILINGS:
        raise ConfigError(f"--max-priority: {max_priority!r}; use {', '.join(PRIORITY_CEILINGS)}")
    for limit, value in (("--rpm", rpm), ("--tpm", tpm)):
        if value is not None and value < 1:
            raise ConfigError(f"{limit}: must be at least 1, got {value}")
    keys = load_keys(path)
    if any(k.name == name and k.revoked is None for k in keys):
        raise ConfigError(f"--name: a key named {name!r} exists already (revoke it first)")
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    record = ApiKey(
        key_id, name, _digest(secret), tuple(scopes), rpm, tpm, _now(), max_priority=max_priority
    )
    _save(path, [*keys, record])
    return record, f"{PREFIX}{key_id}_{secret}"


def revoke_key(path: Path, name_or_id: str) -> ApiKey:
    """Marks the live key with this name or id revoked; returns its record."""
    keys = load_keys(path)
    for i, key in enumerate(keys):
        if key.revoked is None and name_or_id in (key.name, key.id):
            keys[i] = ApiKey(**{**asdict(key), "revoked": _now()})
            _save(path, keys)
            return keys[i]
    raise ConfigError(f"no live key named or with id {name_or_id!r} in {path}")


@dataclass
class _Bucket:
    """A token bucket refilled continuously at `per_minute` per minute."""

    per_minute: float
    level: float = field(init=False)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.level = self.per_minute

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.stamp)  # `now` may predate a bucket made after it
        self.level = min(self.per_minute, self.level + elapsed * self.per_minute / 60.0)
        self.stamp = now

    def wait_s(self, cost: float, now: float) -> float:
        """0 when `cost` fits now, else the seconds until it will."""
        self._refill(now)
        if self.level >= cost:
            return 0.0
        return (cost - self.level) * 60.0 / self.per_minute

    def take(self, cost: float, now: float) -> None:
        self._refill(now)
        self.level -= cost


class RateLimited(Overloaded):
    """A key is over its per-minute limit; `retry_after_s` says when it will fit again."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KeyRing:
    """The keys a server accepts, re-read from `path` when it changes, with per-key limits.

    Thread-safe. `authenticate` and `authorize` raise Unauthenticated / PermissionDenied;
    `admit` raises RateLimited with the retry delay; `charge` counts a chat's tokens."""

    def __init__(self, path: Path, reload_s: float = 1.0) -> None:
        self.path = path
        self.reload_s = reload_s
        self._lock = threading.Lock()
        self._checked = 0.0
        self._stamp: int | None = None
        self._keys: dict[str, ApiKey] = {}
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}
        self._reload(force=True)

    def _reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self.reload_s:
            return
        self._checked = now
        try:
            stamp: int | None = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and not force:
            return
        self._stamp = stamp
        self._keys = {k.id: k for k in load_keys(self.path) if k.revoked is None}

    def authenticate(self, token: str | None) -> ApiKey:
        """The live key `token` is, or Unauthenticated saying why not."""
        if not token:
            raise Unauthenticated("an API key is required (authorization: Bearer tmk_...)")
        key_id, _, secret = token.removeprefix(PREFIX).partition("_")
        with self._lock:
            self._reload()
            key = self._keys.get(key_id)
        if not token.startswith(PREFIX) or key is None:
            raise Unauthenticated("unknown or revoked API key")
        if not hmac.compare_digest(key.hash, _digest(secret)):
            raise Unauthenticated("unknown or revoked API key")
        return key

    @staticmethod
    def authorize(key: ApiKey, scope: str) -> None:
        if scope not in key.scopes:
            raise PermissionDenied(
                f"API key {key.name!r} lacks the {scope!r} scope (has: {', '.join(key.scopes)})"
            )

    def admit(self, key: ApiKey, tokens: int = 0) -> None:
        """Takes one request (and `tokens` expected tokens) from the key's budgets, or raises
        RateLimited with how long to wait; a refused request takes nothing."""
        now = time.monotonic()
        with self._lock:
            waits: list[tuple[float, str]] = []
            requests = self._bucket(self._requests, key.id, key.rpm)
            tokens_bucket = self._bucket(self._tokens, key.id, key.tpm)
            if requests is not None:
                waits.append((requests.wait_s(1, now), f"{key.rpm} requests per minute"))
            if tokens_bucket is not None:
                waits.append(
                    (
                        tokens_bucket.wait_s(min(tokens, key.tpm or 0), now),
                        f"{key.tpm} tokens per minute",
                    )
                )
            wait, limit = max(waits, default=(0.0, ""))
            if wait > 0:
                raise RateLimited(
                    f"API key {key.name!r} is over its limit of {limit}; retry in {wait:.1f} s",
                    wait,
                )
            if requests is not None:
                requests.take(1, now)
            if tokens_bucket is not None and tokens:
                tokens_bucket.take(tokens, now)

    def charge(self, key: ApiKey, tokens: int) -> None:
        """Counts tokens a chat used beyond what `admit` took (the bucket may go negative)."""
        with self._lock:
            bucket = self._bucket(self._tokens, key.id, key.tpm)
            if bucket is not None and tokens > 0:
                bucket.take(tokens, time.monotonic())

    @staticmethod
    def _bucket(buckets: dict[str, _Bucket], key_id: str, limit: int | None) -> _Bucket | None:
        if limit is None:
            return None
        bucket = buckets.get(key_id)
        if bucket is None or bucket.per_minute != limit:
            bucket = buckets[key_id] = _Bucket(float(limit))
        return bucket


def describe(keys: list[ApiKey]) -> list[dict[str, Any]]:
    """`tiermesh keys list --json` rows: everything but the hash."""
    return [{k: v for k, v in asdict(key).items() if k != "hash"} for key in keys]
