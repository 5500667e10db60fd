"""`tiermesh run`'s supervisor against real (tiny, model-free) child processes: a killed child
is restarted after its backoff with a new pid in pids.json, repeated crashes in the window stop
everything with a message, and stopping goes gateway, router, then the rest. The clock is
passed in, so backoffs are checked without waiting for them. And the plan of `--replicas` and
of the tiers' lower CPU priority."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from services.common.child_process import Child
from services.common.errors import ConfigError
from services.launcher.echo_tiers import EchoSettings
from services.launcher.local_mesh import plan_children
from services.launcher.run_options import TIER_NICE
from services.launcher.supervisor import RestartPolicy, Supervisor, stop_in_order

SLEEPER = "import time; time.sleep(60)"
# on SIGTERM, appends its name to the file given, then exits
RECORDER = (
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def child(tmp_path: Path, name: str, *args: str, code: str = SLEEPER) -> Child:
    command = [sys.executable, "-c", code, *args]
    return Child(name, "127.0.0.1:1", command, tmp_path / f"{name}.log")


def model_folders(tmp_path: Path) -> dict[str, Path]:
    """A folder per tier that passes plan_children's check for a model (nothing is started)."""
    models = {}
    for tier in ("small", "medium", "large"):
        (tmp_path / tier).mkdir()
        (tmp_path / tier / "config.json").write_text("{}")
        models[tier] = tmp_path / tier
    return models


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Child]]:
    started = [child(tmp_path, name) for name in ("small", "router")]
    for c in started:
        c.start()
    yield started
    stop_in_order(started, grace_s=5)


def kill(c: Child) -> None:
    assert c.process is not None
    c.process.send_signal(signal.SIGKILL)
    c.process.wait()


def test_a_killed_child_is_restarted_after_its_backoff(
    children: list[Child], tmp_path: Path
) -> None:
    out = io.StringIO()
    pids = tmp_path / "pids.json"
    supervisor = Supervisor(children, lambda c: True, Console(file=out, width=200), pids)
    small, router = children
    assert small.process is not None and router.process is not None
    first_pid, router_pid = small.process.pid, router.process.pid
    assert json.loads(pids.read_text()) == {"small": first_pid, "router": router_pid}
    kill(small)
    assert supervisor.poll(now=100.0) is None
    assert (
        "small killed by SIGKILL" in out.getvalue()
        and "restarting small in 0.5 s" in out.getvalue()
    )
    assert supervisor.poll(now=100.4) is None and small.exited() == -signal.SIGKILL
    assert supervisor.poll(now=100.5) is None
    assert small.exited() is None and small.process.pid != first_pid
    assert json.loads(pids.read_text()) == {"small": small.process.pid, "router": router_pid}
    assert supervisor.poll(now=100.6) is None
    assert "small serving again" in out.getvalue() and router.process.pid == router_pid
    kill(small)  # a second crash within the window waits twice as long
    supervisor.poll(now=101.0)
    assert "restarting small in 1.0 s" in out.getvalue()


def test_a_child_that_served_for_stable_s_before_it_crashed_restarts_after_the_first_backoff(
    children: list[Child], tmp_path: Path
) -> None:
    out = io.StringIO()
    supervisor = Supervisor(children, lambda c: True, Console(file=out, width=200), tmp_path / "p")
    small = children[0]
    kill(small)
    supervisor.poll(now=100.0)
    supervisor.poll(now=100.5)  # restarted
    supervisor.poll(now=100.6)  # serving again
    kill(small)  # a crash loop: 0.4 s after it served again
    supervisor.poll(now=101.0)
    assert "restarting small in 1.0 s (crash 2 of 5" in out.getvalue()
    supervisor.poll(now=102.0)
    supervisor.poll(now=102.1)  # serving again
    kill(small)  # served 10 s: not a loop, though the crash still counts
    supervisor.poll(now=112.1)
    assert "restarting small in 0.5 s (crash 3 of 5" in out.getvalue()
    supervisor.poll(now=112.6)
    supervisor.poll(now=112.7)
    kill(small)
    supervisor.poll(now=113.0)
    assert "restarting small in 1.0 s (crash 4 of 5" in out.getvalue()


def test_repeated_crashes_in_the_window_stop_everything(
    children: list[Child], tmp_path: Path
) -> None:
    out = io.StringIO()
    policy = RestartPolicy(base_s=0.1, max_s=0.1, max_crashes=3, window_s=60.0)
    supervisor = Supervisor(
        children, lambda c: True, Console(file=out, width=200), tmp_path / "p.json", policy
    )
    small = children[0]
    why = None
    for now in (0.0, 10.0, 20.0):
        kill(small)
        assert why is None
        why = supervisor.poll(now=now)
        supervisor.poll(now=now + 0.1)  # restarted
    assert (
        why == "small crashed 3 times within 60 s (last: killed by SIGKILL); stopping every service"
    )


def test_crashes_older_than_the_window_are_forgotten(children: list[Child], tmp_path: Path) -> None:
    policy = RestartPolicy(base_s=0.1, max_s=0.1, max_crashes=2, window_s=60.0)
    supervisor = Supervisor(
        children, lambda c: True, Console(file=io.StringIO()), tmp_path / "p.json", policy
    )
    for now in (0.0, 61.0, 122.0):
        kill(children[0])
        assert supervisor.poll(now=now) is None
        supervisor.poll(now=now + 0.1)


def test_stop_drains_gateway_then_router_then_the_rest(tmp_path: Path) -> None:
    record = tmp_path / "stopped.txt"
    names = ("small", "large", "gateway", "router")
    started = [child(tmp_path, n, str(record), n, code=RECORDER) for n in names]
    for c in started:
        c.start()
    deadline = time.monotonic() + 30
    while not all("ready" in c.log_tail() for c in started):  # SIGTERM handlers installed
        assert time.monotonic() < deadline, [c.log_tail() for c in started]
        time.sleep(0.05)
    stop_in_order(started, grace_s=10)
    order = record.read_text().split()
    assert order[:2] == ["gateway", "router"] and sorted(order[2:]) == ["large", "small"]


def test_replicas_are_planned_as_more_children_given_to_the_router(tmp_path: Path) -> None:
    models = model_folders(tmp_path)
    children = plan_children(9000, models, None, tmp_path / "logs", replicas={"small": 2})
    names = [c.name for c in children]
    assert names[:4] == ["small", "small-2", "medium", "large"] and names[-1] == "router"
    small, second = children[0], children[1]
    assert second.command[second.command.index("--metrics-port") + 1] == "0"
    assert second.address.endswith(second.command[second.command.index("--port") + 1])
    router = children[-1].command
    assert f"small={small.address},{second.address}" in router
    # with --mesh the replicas are endpoints of the tier's cluster in the topology written
    meshed = plan_children(9000, models, None, tmp_path / "logs", mesh=True, replicas={"small": 2})
    second_port = meshed[1].address.rsplit(":", 1)[1]
    topology = (tmp_path / "logs" / "topology.yaml").read_text()
    assert "127.0.0.1:9010\n" in topology and f"127.0.0.1:{second_port}\n" in topology


def nice_flag(command: list[str]) -> int | None:
    """The value of a command's `--nice` (a torch tier lowering itself), None without one."""
    return int(command[command.index("--nice") + 1]) if "--nice" in command else None


def test_tiers_are_planned_at_a_lower_cpu_priority_than_the_router_and_gateway(
    tmp_path: Path,
) -> None:
    models = model_folders(tmp_path)
    planned = plan_children(9000, models, None, tmp_path / "logs", replicas={"large": 2})
    # a torch tier starts at the launcher's priority and lowers itself, all but its critical lane
    nice = {c.name: (c.nice, nice_flag(c.command)) for c in planned}
    assert nice == {
        "small": (0, TIER_NICE),
        "medium": (0, TIER_NICE),
        "large": (0, TIER_NICE),
        "large-2": (0, TIER_NICE),
        "gateway": (0, None),
        "router": (0, None),
    }
    same = plan_children(9000, models, None, tmp_path / "logs", tier_nice=0)
    assert {c.nice for c in same} == {0}
    assert not any("--nice" in c.command for c in same)
    # other engines' tiers are started lowered by the launcher
    echo = plan_children(9000, models, None, tmp_path / "logs", echo=EchoSettings())
    assert {c.name: c.nice for c in echo} == {
        "small": TIER_NICE,
        "medium": TIER_NICE,
        "large": TIER_NICE,
        "gateway": 0,
        "router": 0,
    }


def test_a_child_with_a_nice_value_runs_and_restarts_below_the_launchers_priority(
    tmp_path: Path,
) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    tier, router = child(tmp_path, "small"), child(tmp_path, "router")
    tier.nice = 7
    for c in (tier, router):
        c.start()
    try:
        supervisor = Supervisor(
            [tier, router], lambda c: True, Console(file=io.StringIO()), tmp_path / "p.json"
        )
        assert tier.process is not None and router.process is not None
        assert os.getpriority(os.PRIO_PROCESS, tier.process.pid) == min(own + 7, 19)
        assert os.getpriority(os.PRIO_PROCESS, router.process.pid) == own
        first = tier.process.pid
        kill(tier)
        supervisor.poll(now=0.0)
        supervisor.poll(now=1.0)  # restarted after its 0.5 s backoff
        assert tier.process.pid != first and tier.exited() is None
        assert os.getpriority(os.PRIO_PROCESS, tier.process.pid) == min(own + 7, 19)
    finally:
        stop_in_order([tier, router], grace_s=5)


def test_cors_origins_are_passed_to_the_gateway_only(tmp_path: Path) -> None:
    models = model_folders(tmp_path)
    origins = ("https://app.example", "*")
    planned = plan_children(9000, models, None, tmp_path / "logs", cors_origins=origins)
    commands = {c.name: c.command for c in planned}
    gateway = commands.pop("gateway")
    assert gateway[-4:] == ["--cors-origin", "https://app.example", "--cors-origin", "*"]
    assert not any("--cors-origin" in command for command in commands.values())
    plain = plan_children(9000, models, None, tmp_path / "logs")
    assert "--cors-origin" not in next(c for c in plain if c.name == "gateway").command
    with pytest.raises(ConfigError, match=r"cors_origins\[1\]"):  # before anything starts
        plan_children(9000, models, None, tmp_path / "logs", cors_origins=("*", "app.example"))
