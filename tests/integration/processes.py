"""Starts tiers and a router as real child processes (`python -m services.tier_<name>`,
`python -m services.router`) on free ports, for fault tests that SIGKILL or SIGSTOP one of them.
Each gets a config file written for the test; its output goes to a log the failure shows.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.child_process import Child
from services.common.ports import free_port
from services.common.serving import NotServingError, wait_serving_async
from services.common.tiers import TIER_NAMES

READY_S = 180.0
LOG_LINES = 30  # of a service's log in a failure's message
# a router that notices a failed or silent tier fast: the fault tests' (a stall after 1 s)
FAST_FAULTS_ROUTER = {
    "max_tokens": 400,
    "load_watch_interval_ms": 100,
    "load_stale_ms": 2000,  # generous: this machine's other work can delay a report
    "stall_timeout_ms": 1000,
    "tier_call_timeout_s": 60.0,
}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return f'"{value}"'
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def write_toml(path: Path, values: dict[str, Any], tables: dict[str, dict[str, Any]]) -> Path:
    lines = [f"{key} = {toml_value(value)}" for key, value in values.items()]
    for name, table in tables.items():
        lines += ["", f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def spawn(name: str, module: str, args: list[str], address: str, log_dir: Path) -> Child:
    """`python -m module args` started as `name`, its output in `log_dir/<name>.log`."""
    command = [sys.executable, "-m", module, *args]
    child = Child(
        name, address, command, log_dir / f"{name}.log", env={"TIERMESH_LOG_LEVEL": "INFO"}
    )
    child.start()
    return child


async def wait_serving(service: Child, timeout_s: float = READY_S) -> None:
    """Polls the service's gRPC health until SERVING; fails with its log if it exits first."""
    try:
        await wait_serving_async(
            service.address, timeout_s, exited=service.exited, name=service.name
        )
    except NotServingError as e:
        raise AssertionError(f"{e}\n{service.log_tail(LOG_LINES)}") from None


@dataclass
class ProcessMesh:
    tiers: dict[str, Child]
    router: Child
    work_dir: Path
    tier_options: dict[str, Any] = field(default_factory=dict)
    models: dict[str, Path] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.router.address

    def start_tier(self, tier: str, port: int, name: str | None = None) -> Child:
        """(Re)starts one tier process on `port`, known as `name` (default: the tier)."""
        name = name or tier
        config = {
            "name": tier,
            "model_path": str(self.models[tier]),
            "port": port,
            "metrics_port": 0,
            **self.tier_options,
        }
        path = write_toml(self.work_dir / f"{name}.toml", config, {})
        module = f"services.tier_{tier}"
        service = spawn(name, module, ["--config", str(path)], f"127.0.0.1:{port}", self.work_dir)
        self.tiers[name] = service
        return service

    def stop(self) -> None:
        for service in (self.router, *self.tiers.values()):
            service.stop()


async def start_process_mesh(
    work_dir: Path,
    models: dict[str, Path],
    *,
    tier_options: dict[str, Any] | None = None,
    router_options: dict[str, Any] | None = None,
    replicas: dict[str, int] | None = None,
) -> ProcessMesh:
    """The three tiers (model per tier; `replicas` processes of a tier, named "small",
    "small-2", ...) and a router, each its own process, all serving."""
    work_dir.mkdir(parents=True, exist_ok=True)
    mesh = ProcessMesh({}, None, work_dir, tier_options or {}, models)  # type: ignore[arg-type]
    try:
        targets: dict[str, list[str]] = {}
        for tier in TIER_NAMES:
            for n in range(1, (replicas or {}).get(tier, 1) + 1):
                name = tier if n == 1 else f"{tier}-{n}"
                targets.setdefault(tier, []).append(
                    mesh.start_tier(tier, free_port(), name).address
                )
        router_port = free_port()
        config = {
            "port": router_port,
            "metrics_port": 0,
            "policy": "interim_heuristic",
            **(router_options or {}),
        }
        tiers = {tier: ",".join(addresses) for tier, addresses in targets.items()}
        path = write_toml(work_dir / "router.toml", config, {"tiers": tiers})
        address = f"127.0.0.1:{router_port}"
        mesh.router = spawn("router", "services.router", ["--config", str(path)], address, work_dir)
        for service in (*mesh.tiers.values(), mesh.router):
            await wait_serving(service)
    except BaseException:
        for service in mesh.tiers.values():
            service.stop()
        if mesh.router is not None:
            mesh.router.stop()
        raise
    return mesh
