"""API keys: stored hashed, checked, scoped, revoked within the reload interval, rate-limited
with a retry delay; and the `tiermesh keys` commands."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.common.errors import ConfigError, PermissionDenied, Unauthenticated
from services.security.api_keys import KeyRing, RateLimited, create_key, load_keys, revoke_key


def test_the_file_holds_a_hash_never_the_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    record, key = create_key(path, "demo", ("chat",))
    text = path.read_text()
    assert key.startswith("tmk_") and key.split("_", 2)[2] not in text
    assert record.hash in text
    assert path.stat().st_mode & 0o777 == 0o600
    assert KeyRing(path).authenticate(key).name == "demo"


def test_missing_unknown_and_tampered_keys_are_unauthenticated(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    _, key = create_key(path, "demo", ("chat",))
    ring = KeyRing(path)
    for token in (None, "", "Bearer", "tmk_nope_nope", key[:-1] + ("A" if key[-1] != "A" else "B")):
        with pytest.raises(Unauthenticated):
            ring.authenticate(token)


def test_scopes(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    _, key = create_key(path, "reader", ("chat",))
    ring = KeyRing(path)
    found = ring.authenticate(key)
    ring.authorize(found, "chat")
    with pytest.raises(PermissionDenied, match="lacks the 'feedback' scope"):
        ring.authorize(found, "feedback")
    with pytest.raises(ConfigError, match="--scopes"):
        create_key(path, "bad", ("root",))


def test_a_revoked_key_stops_within_the_reload_interval(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    _, key = create_key(path, "demo", ("chat",))
    ring = KeyRing(path, reload_s=0.05)
    ring.authenticate(key)
    revoke_key(path, "demo")
    time.sleep(0.06)
    with pytest.raises(Unauthenticated):
        ring.authenticate(key)
    assert load_keys(path)[0].revoked is not None


def test_request_rate_limit_gives_a_retry_delay(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    _, key = create_key(path, "slow", ("chat",), rpm=2)
    ring = KeyRing(path)
    found = ring.authenticate(key)
    ring.admit(found)
    ring.admit(found)
    with pytest.raises(RateLimited) as limited:
        ring.admit(found)
    assert limited.value.status == "RESOURCE_EXHAUSTED"
    assert 0 < limited.value.retry_after_s <= 30.0
    assert "2 requests per minute" in str(limited.value)


def test_token_rate_limit_counts_what_chats_used(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    _, key = create_key(path, "tokens", ("chat",), tpm=100)
    ring = KeyRing(path)
    found = ring.authenticate(key)
    ring.admit(found, tokens=10)
    ring.charge(found, 95)  # the chat used more than admitted: the bucket is spent
    with pytest.raises(RateLimited, match="100 tokens per minute"):
        ring.admit(found, tokens=10)


def test_keys_commands(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"

    def tiermesh(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "services.cli", "keys", *args, "--file", str(path)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    created = tiermesh("create", "--name", "demo", "--scopes", "chat,feedback", "--json")
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)["key"]
    listed = json.loads(tiermesh("list", "--json").stdout)
    assert [(r["name"], r["scopes"], r["revoked"]) for r in listed] == [
        ("demo", ["chat", "feedback"], None)
    ]
    assert "hash" not in listed[0] and key not in json.dumps(listed)
    assert tiermesh("revoke", "demo").returncode == 0
    assert tiermesh("revoke", "demo").returncode == 2
    assert tiermesh("create", "--name", "x", "--scopes", "root").returncode == 2
