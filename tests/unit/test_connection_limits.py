"""Connection limits without sockets: the gateway's ConnectionGuard decisions as a table, the
descriptor cap rule, gRPC ServerLimits from the environment and as channel arguments, the
gateway's config checks, and the slow-connections fault's plan and tallies."""

from __future__ import annotations

import argparse
import resource
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.chaos.faults import SLOW_CONNECTIONS, fault_targets, parse_faults
from services.chaos.slow_connections import SlowTally
from services.common.config import GatewayConfig
from services.common.config_loading import build_config
from services.common.descriptors import (
    connection_cap,
    open_descriptors,
    raise_open_files_limit,
)
from services.common.errors import ConfigError
from services.common.grpc_service import ServerLimits
from services.gateway.connection_guard import (
    MADE_ROOM,
    MIN_IDLE_S,
    MIN_KEPT_IDLE_S,
    PENDING_S,
    REFUSED_CLIENT,
    REFUSED_FULL,
    ConnectionGuard,
    ConnectionLimits,
)
from services.gateway.server import LIMIT_FLAGS
from services.launcher.echo_tiers import EchoSettings
from services.launcher.local_mesh import plan_children
from services.launcher.run_options import add_connection_limit_flags, connection_limit_flags


@dataclass
class FakeClock:
    """A clock the test moves by hand (named as the fake it is)."""

    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def _guard(total: int = 3, per_client: int = 2) -> tuple[ConnectionGuard[str], FakeClock]:
    clock = FakeClock()
    limits = ConnectionLimits(max_connections=total, max_connections_per_client=per_client)
    return ConnectionGuard(limits, clock=clock), clock


def _connect(guard: ConnectionGuard[str], name: str, host: str) -> str | None:
    """Accepted (admitted under a descriptor number) and adopted by its protocol, as the
    gateway's listener and protocol do; the refusal, if any."""
    fd = 100 + len(name) * 7 + sum(map(ord, name))
    admission = guard.admit(fd, host)
    if admission.refused is None:
        assert guard.adopt(fd, name)
    return admission.refused


def test_a_client_past_its_own_cap_is_refused_while_others_get_in() -> None:
    guard, _ = _guard(total=10, per_client=2)
    assert _connect(guard, "a1", "10.0.0.1") is None
    assert _connect(guard, "a2", "10.0.0.1") is None
    assert _connect(guard, "a3", "10.0.0.1") == REFUSED_CLIENT
    assert _connect(guard, "b1", "10.0.0.2") is None
    assert (guard.open, guard.from_client("10.0.0.1"), guard.refused[REFUSED_CLIENT]) == (3, 2, 1)
    guard.release("a1")
    guard.release("a1")  # idempotent: a deadline and connection_lost both release
    assert _connect(guard, "a3", "10.0.0.1") is None
    assert guard.open == 3


def test_accepted_connections_count_at_once_and_make_no_room_before_adopted() -> None:
    guard, clock = _guard(total=2, per_client=5)
    assert guard.admit(7, "10.0.0.1").refused is None
    assert guard.admit(8, "10.0.0.1").refused is None
    clock.now += PENDING_S / 2  # no protocol has them yet: nothing to close
    assert guard.admit(9, "10.0.0.2").refused == REFUSED_FULL
    assert guard.adopt(7, "first") and not guard.adopt(7, "again")
    clock.now += 1.0
    assert guard.admit(9, "10.0.0.2").make_room == "first"
    # a descriptor never adopted (asyncio could not make it a transport) is forgotten in time
    clock.now += PENDING_S
    assert guard.admit(10, "10.0.0.3").refused is None
    assert guard.open == 1 and not guard.adopt(8, "late")  # 8 and 9 forgotten


@pytest.mark.parametrize(
    ("idle_for_s", "busy", "expected"),
    [
        # the oldest idle connection has waited long enough: it makes room
        (MIN_IDLE_S, False, "made room"),
        # a connection whose request may still be on its way is left alone: refused
        (MIN_IDLE_S / 2, False, REFUSED_FULL),
        # connections serving a request never make room
        (10.0, True, REFUSED_FULL),
    ],
)
def test_at_the_cap_the_connection_idle_longest_makes_room(
    idle_for_s: float, busy: bool, expected: str
) -> None:
    guard, clock = _guard(total=2, per_client=5)
    _connect(guard, "old", "10.0.0.1")
    clock.now += 0.1
    _connect(guard, "newer", "10.0.0.2")
    if busy:
        guard.busy("old")
        guard.busy("newer")
    clock.now += idle_for_s
    admission = guard.admit(3, "10.0.0.3")
    if expected == "made room":
        assert (admission.refused, admission.make_room) == (None, "old")
        assert guard.closed[MADE_ROOM] == 1
        assert guard.from_client("10.0.0.1") == 0 and guard.open == 2
    else:
        assert (admission.refused, admission.make_room) == (expected, None)
        assert guard.open == 2


def test_room_is_made_from_half_open_connections_before_kept_alive_ones() -> None:
    guard, clock = _guard(total=2, per_client=5)
    _connect(guard, "client", "10.0.0.1")
    guard.busy("client")
    guard.idle("client")  # answered, kept alive: idle longest
    clock.now += MIN_KEPT_IDLE_S
    _connect(guard, "half-open", "10.0.0.2")
    clock.now += 1.0
    assert guard.admit(3, "10.0.0.3").make_room == "half-open"
    guard.adopt(3, "newcomer")
    clock.now += 1.0
    assert guard.admit(4, "10.0.0.4").make_room == "newcomer"  # never had a request either


def test_a_kept_alive_connection_is_idle_again_from_its_last_response() -> None:
    guard, clock = _guard(total=2, per_client=5)
    _connect(guard, "first", "10.0.0.1")
    _connect(guard, "second", "10.0.0.1")
    guard.busy("first")
    clock.now += 5.0
    guard.idle("first")  # its response just completed: the youngest idle one now
    clock.now += 1.0
    assert guard.admit(3, "10.0.0.2").make_room == "second"
    guard.adopt(3, "third")
    guard.busy("third")
    assert guard.admit(4, "10.0.0.2").refused == REFUSED_FULL  # "first": idle for 1 s only
    clock.now += MIN_KEPT_IDLE_S
    assert guard.admit(4, "10.0.0.2").make_room == "first"
    guard.idle("gone")  # never admitted: nothing happens
    assert guard.open == 2


@pytest.mark.parametrize(
    ("configured", "soft", "expected"),
    [
        (4096, 20_000, 4096),  # well under the limit: as configured
        (4096, 1024, 768),  # 3/4 of a small limit
        (100, 120, 56),  # and never fewer than 64 descriptors outside the cap
        (10, 50, 1),  # at least one
        (4096, None, 4096),  # unlimited
    ],
)
def test_connection_caps_stay_under_the_open_files_limit(
    configured: int, soft: int | None, expected: int
) -> None:
    assert connection_cap(configured, soft) == expected


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    limit = raise_open_files_limit()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert limit.soft == soft and limit.hard in (hard, None)
    assert hard == resource.RLIM_INFINITY or soft == hard
    assert "open files: soft limit" in limit.describe()
    assert (open_descriptors() or 0) > 2


def test_grpc_server_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = ServerLimits.from_env()
    assert defaults == ServerLimits()
    assert dict(defaults.options(1000)) == {
        "grpc.max_allowed_incoming_connections": 1000,
        "grpc.server_handshake_timeout_ms": 5000,
        "grpc.max_concurrent_streams": 4096,
        "grpc.max_connection_idle_ms": 300_000,
    }
    monkeypatch.setenv("TIERMESH_GRPC_MAX_CONNECTIONS", "64")
    monkeypatch.setenv("TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S", "0.5")
    monkeypatch.setenv("TIERMESH_GRPC_MAX_STREAMS", "8")
    monkeypatch.setenv("TIERMESH_GRPC_IDLE_TIMEOUT_S", "0")
    limits = ServerLimits.from_env()
    assert limits == ServerLimits(64, 0.5, 8, 0.0)
    assert "grpc.max_connection_idle_ms" not in dict(limits.options(64))
    monkeypatch.setenv("TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S"):
        ServerLimits.from_env()
    monkeypatch.setenv("TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S", "1")
    monkeypatch.setenv("TIERMESH_GRPC_MAX_CONNECTIONS", "0")
    with pytest.raises(ConfigError, match="TIERMESH_GRPC_MAX_CONNECTIONS"):
        ServerLimits.from_env()


@pytest.mark.parametrize(
    "field", ["header_timeout_s", "body_timeout_s", "keepalive_timeout_s", "max_connections"]
)
def test_bad_gateway_connection_limits_name_the_field(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_config(GatewayConfig, {field: 0})


def test_gateway_limits_come_from_its_config() -> None:
    config = build_config(GatewayConfig, {"max_connections_per_client": 7, "retry_after_s": 0})
    limits = ConnectionLimits.from_config(config, max_connections=99)
    assert (limits.max_connections, limits.max_connections_per_client) == (99, 7)
    assert limits.retry_after_s == 1  # a refusal always says when to come back
    assert limits.header_timeout_s == 10.0


def test_slow_connections_hit_the_gateway_then_the_router() -> None:
    assert parse_faults("slow-connections") == (SLOW_CONNECTIONS,)
    assert fault_targets(SLOW_CONNECTIONS, ("small",), {}, mesh=False) == ["gateway", "router"]


def test_slow_connection_tallies_merge_over_processes() -> None:
    one = SlowTally(asked=10, opened=12, closed_by_server=5, refused_fast=4, peak_open=8)
    one.answers["503"] = 4
    one.close_ms = [1.0, 2.0, 3000.0]
    other = SlowTally.from_json(
        {**SlowTally(asked=5, opened=5, open_at_end=5, peak_open=5).to_json()}, [10.0]
    )
    one.merge(other)
    summary = one.to_json()
    assert (summary["asked"], summary["opened"], summary["open_at_end"]) == (15, 17, 5)
    assert (summary["answers"], summary["close_ms_max"], summary["peak_open"]) == (
        {"503": 4},
        3000.0,
        13,
    )


def test_run_flags_reach_the_gateway_and_every_grpc_server(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_connection_limit_flags(parser)
    args = parser.parse_args(
        [
            "--http-max-connections",
            "100",
            "--http-header-timeout",
            "2",
            "--grpc-handshake-timeout",
            "2.5",
        ]
    )
    limits = connection_limit_flags(args)
    children = plan_children(None, {}, None, tmp_path, echo=EchoSettings(), limits=limits)
    gateway = next(child for child in children if child.name == "gateway")
    assert gateway.command[-4:] == ["--max-connections", "100", "--header-timeout-s", "2.0"]
    gateway_flags = {flag for flag, _, _ in LIMIT_FLAGS}
    assert {"--max-connections", "--header-timeout-s"} <= gateway_flags
    for child in children:
        assert child.env is not None and child.env["TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S"] == "2.5"
        assert "TIERMESH_GRPC_MAX_CONNECTIONS" not in child.env  # not asked: the default
    for bad in (["--http-max-connections", "0"], ["--grpc-handshake-timeout", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
