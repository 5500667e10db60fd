"""`tiermesh run`: starts the three tiers, the router and the HTTP gateway (OpenAI API and chat
page) as child processes on this machine, waits for them to be healthy, shows one streamed
answer, restarts a child that crashes (supervisor.py), and stops them all on Ctrl-C/SIGTERM.
With `--mesh` it also starts the xDS control plane on a topology generated for the ports in use,
and the router reaches the tiers through `xds:///tier-<name>` targets.

Knows process management and gRPC health; never imports torch (the tiers do, in their own
processes).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from rich.console import Console

from mesh.bootstrap import XdsTls
from services.common import env
from services.common.child_process import SERVICES_DIR, Child
from services.common.config import GatewayConfig, TierConfig
from services.common.config_loading import build_config, load_config
from services.common.errors import ConfigError
from services.common.ports import free_port, free_port_layout
from services.common.tiers import TIER_NAMES
from services.launcher.child_health import is_healthy, tier_status, wait_healthy
from services.launcher.echo_tiers import EchoSettings, echo_tier_command
from services.launcher.remote_tiers import remote_tier_commands
from services.launcher.run_addresses import (
    remove_run_addresses,
    run_addresses,
    write_run_addresses,
)
from services.launcher.run_options import TIER_NICE, ConnectionLimitFlags
from services.launcher.secure_run import SecureRun, prepare_secure_run
from services.launcher.start_report import demo_chat, print_start_report
from services.launcher.supervisor import Supervisor, stop_in_order
from services.launcher.vllm_tiers import vllm_tier_command
from services.security.tls import channel_credentials

# `--base-port B` layout: router B, tiers B+10..12, metrics B+20..23, control plane B+30,
# HTTP gateway B+40 (else --http-port, default 8080).
BASE_PORT_OFFSETS = (0, 10, 11, 12, 20, 21, 22, 23, 30, 40)
DEFAULT_HTTP_PORT = 8080


def free_base_port(attempts: int = 50) -> int:
    """A base port whose whole `--base-port` layout is free on 127.0.0.1 right now."""
    return free_port_layout(BASE_PORT_OFFSETS, attempts)


def tier_config_path(tier: str) -> Path:
    return SERVICES_DIR / f"tier_{tier}" / "config.toml"


def plan_children(
    base_port: int | None,
    models: dict[str, Path],
    device: str | None,
    run_dir: Path,
    mesh: bool = False,
    http_port: int | None = None,
    replicas: dict[str, int] | None = None,
    secure: SecureRun | None = None,
    echo: EchoSettings | None = None,
    tier_nice: int = TIER_NICE,
    cors_origins: tuple[str, ...] = (),
    remotes: dict[str, tuple[str, ...]] | None = None,
    limits: ConnectionLimitFlags | None = None,
    vllm: frozenset[str] = frozenset(),
    router_args: tuple[str, ...] = (),
) -> list[Child]:
    """The processes to start (the gateway, then the router last); raises ConfigError if a
    model folder is missing. `replicas` runs that many processes of a tier ("small", "small-2",
    ...; those past the first on free ports, metrics off), all given to the router. `secure`
    gives every child its TLS and key environment. `echo` runs echo tiers (no model).
    `tier_nice` is added to the tiers' nice value (0: the launcher's priority); a torch tier is
    started at the launcher's and lowers itself (`--nice`), all but its critical lane.
    `cors_origins`: the browser origins the gateway answers cross-origin (none: same origin).
    `remotes`: tiers served by remote OpenAI-compatible servers, one process per URL
    (remote_tiers.py); echo does not apply to them. `limits`: connection limits asked for on
    the command line (the gateway's as its flags, the gRPC servers' as TIERMESH_GRPC_*).
    `vllm`: tiers served by vLLM in their own process (vllm_tiers.py). `router_args`: more
    flags for the router's command line (e.g. `--progressive-gate always`)."""
    xds_tls = secure.router_xds_tls() if secure is not None else None
    children = _plan_children(
        base_port,
        models,
        device,
        run_dir,
        mesh,
        http_port,
        replicas,
        xds_tls,
        echo,
        tier_nice,
        remotes or {},
        vllm,
    )
    if cors_origins:
        build_config(GatewayConfig, {"cors_origins": list(cors_origins)})  # the gateway's check
        gateway = next(child for child in children if child.name == "gateway")
        gateway.command += [a for origin in cors_origins for a in ("--cors-origin", origin)]
    if router_args:
        router = next(child for child in children if child.name == "router")
        router.command += list(router_args)
    if limits is not None:  # the gateway's on its command line, the gRPC servers' in their env
        gateway = next(child for child in children if child.name == "gateway")
        gateway.command += limits.gateway_args()
        for child in children:
            child.env = {**(child.env or {}), **limits.environment()}
    if secure is not None:
        for child in children:
            child.env = {**(child.env or {}), **secure.env_for(child.name)}
    return children


def _plan_children(
    base_port: int | None,
    models: dict[str, Path],
    device: str | None,
    run_dir: Path,
    mesh: bool,
    http_port: int | None,
    replicas: dict[str, int] | None,
    xds_tls: XdsTls | None = None,
    echo: EchoSettings | None = None,
    tier_nice: int = TIER_NICE,
    remotes: dict[str, tuple[str, ...]] | None = None,
    vllm: frozenset[str] = frozenset(),
) -> list[Child]:
    children = []
    tier_targets = []
    tier_ports: dict[str, list[int]] = {}
    for index, tier in enumerate(TIER_NAMES):
        port = None if base_port is None else base_port + 10 + index
        config = load_config(TierConfig, tier_config_path(tier), port=port, device=device)
        model = models.get(tier, config.model_path)
        count = (replicas or {}).get(tier, 1)
        commands: list[list[str]] = []  # each replica's own command, for a remote tier
        process_nice = tier_nice  # a torch tier lowers itself, all but its critical lane
        if urls := (remotes or {}).get(tier):
            if count > 1:
                raise ConfigError(
                    f"--replicas {tier}={count}: a remote tier runs one process per URL of "
                    f"--model {tier}=URL,URL,..."
                )
            commands = remote_tier_commands(tier, tier_config_path(tier), run_dir, urls)
            tier_command, count = commands[0], len(commands)
        elif echo is not None:
            tier_command = echo_tier_command(tier, tier_config_path(tier), run_dir, echo)
        elif not (model / "config.json").is_file():
            raise ConfigError(
                f"tier {tier}: no model at {model} (train the built-in family with "
                f"`make models`, or pass --model {tier}=PATH)"
            )
        elif tier in vllm:
            tier_command = vllm_tier_command(tier_config_path(tier), run_dir, model)
        else:
            tier_command = [sys.executable, "-m", f"services.tier_{tier}", "--model", str(model)]
            tier_command += ["--device", device] if device is not None else []
            tier_command += ["--nice", str(tier_nice)] if tier_nice else []
            process_nice = 0
        command = list(tier_command)
        if port is not None and base_port is not None:
            command += ["--port", str(port), "--metrics-port", str(base_port + 20 + index)]
        address = f"{config.host}:{config.port}"
        children.append(Child(tier, address, command, run_dir / f"{tier}.log", nice=process_nice))
        addresses, tier_ports[tier] = [address], [config.port]
        for n in range(2, count + 1):
            name, port = f"{tier}-{n}", free_port()
            own = commands[n - 1] if commands else tier_command
            replica = [*own, "--port", str(port), "--metrics-port", "0"]
            addresses.append(f"{config.host}:{port}")
            tier_ports[tier].append(port)
            log_path = run_dir / f"{name}.log"
            children.append(Child(name, addresses[-1], replica, log_path, nice=process_nice))
        tier_targets += ["--tier", f"{tier}={','.join(addresses)}"]
    router_port = 50051 if base_port is None else base_port
    router_address = f"127.0.0.1:{router_port}"
    router_command = [sys.executable, "-m", "services.router", "--port", str(router_port)]
    if base_port is not None:
        router_command += ["--metrics-port", str(base_port + 23)]
    router_env = None
    if mesh:
        control_plane, router_env, tier_targets = _plan_control_plane(
            tier_ports, router_port, run_dir, xds_tls
        )
        children.append(control_plane)
    children.append(_plan_gateway(base_port, http_port, router_address, run_dir))
    children.append(
        Child(
            "router",
            router_address,
            router_command + tier_targets,
            run_dir / "router.log",
            env=router_env,
        )
    )
    return children


def _plan_gateway(
    base_port: int | None, http_port: int | None, router_address: str, run_dir: Path
) -> Child:
    """The HTTP gateway child: on --http-port, else BASE+40 with --base-port, else 8080."""
    if http_port is None:
        http_port = DEFAULT_HTTP_PORT if base_port is None else base_port + 40
    command = [sys.executable, "-m", "services.gateway", "--port", str(http_port)]
    command += ["--router", router_address]
    address = f"127.0.0.1:{http_port}"
    health = f"http://{address}/health"
    return Child("gateway", address, command, run_dir / "gateway.log", health_url=health)


def _plan_control_plane(
    tier_ports: dict[str, list[int]], router_port: int, run_dir: Path, xds_tls: XdsTls | None = None
) -> tuple[Child, dict[str, str], list[str]]:
    """The control plane child (on a topology written for these ports, a tier's replicas as
    endpoints of its one cluster, balanced by xDS round robin), the router's xDS
    bootstrap environment (ADS over TLS with `xds_tls`), and the router's xds:/// targets."""
    from mesh.bootstrap import bootstrap_env
    from mesh.topology import dump_yaml, local_topology, xds_target

    topology = local_topology(tier_ports, router_port)
    path = run_dir / "topology.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_yaml(topology, "# written by `tiermesh run --mesh`; edits are served\n"))
    command = [sys.executable, "-m", "mesh", "serve", "--topology", str(path)]
    child = Child("control-plane", topology.control_plane, command, run_dir / "control-plane.log")
    targets = [arg for tier in tier_ports for arg in ("--tier", f"{tier}={xds_target(tier)}")]
    bootstrap = bootstrap_env(topology.control_plane, f"router~{router_port}", xds_tls)
    return child, bootstrap, targets


def stop_all(children: list[Child], grace_s: float = 15.0) -> None:
    """Gateway and router first (they drain their clients), then the rest."""
    stop_in_order(children, grace_s)


@contextlib.contextmanager
def started(
    children: list[Child],
    console: Console,
    error: Exception,
    grace_s: float = 15.0,
    credentials: grpc.ChannelCredentials | None = None,
) -> Iterator[list[Child]]:
    """Starts `children` and yields them once each serves; raises `error` if one exits or time
    runs out first (the console has shown which, with its log tail). However the block ends,
    every child is stopped (`stop_all`). `credentials` make the health checks mTLS."""
    try:
        for child in children:
            child.start()
        if not wait_healthy(children, console, credentials):
            raise error
        yield children
    finally:
        stop_all(children, grace_s)


def run_mesh(
    *,
    base_port: int | None,
    models: dict[str, Path],
    device: str | None,
    demo_prompt: str | None,
    console: Console | None = None,
    mesh: bool = False,
    http_port: int | None = None,
    replicas: dict[str, int] | None = None,
    secure: bool = False,
    echo: EchoSettings | None = None,
    tier_nice: int = TIER_NICE,
    cors_origins: tuple[str, ...] = (),
    remotes: dict[str, tuple[str, ...]] | None = None,
    limits: ConnectionLimitFlags | None = None,
    vllm: frozenset[str] = frozenset(),
    router_args: tuple[str, ...] = (),
) -> int:
    console = console or Console()
    run_dir = Path(env.run_dir())
    secure_run = prepare_secure_run(run_dir) if secure else None
    # the launcher's own health checks and GetStatus calls present the router's identity
    credentials = channel_credentials(secure_run.files("router")) if secure_run else None
    # Every service appends its finished spans here; `tiermesh trace` reads them.
    os.environ.setdefault("TIERMESH_TRACE_FILE", str(run_dir / "traces.jsonl"))
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        children = plan_children(
            base_port,
            models,
            device,
            run_dir / "logs",
            mesh=mesh,
            http_port=http_port,
            replicas=replicas,
            secure=secure_run,
            echo=echo,
            tier_nice=tier_nice,
            cors_origins=cors_origins,
            remotes=remotes,
            limits=limits,
            vllm=vllm,
            router_args=router_args,
        )
    except ConfigError as e:
        console.print(f"[red]tiermesh run:[/red] {e}")
        return 2
    stop_requested: list[str] = []

    def request_stop(signum: int, _frame: object) -> None:
        stop_requested.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for child in children:
            child.start()
        if not wait_healthy(children, console, credentials):
            return 1
        print_start_report(
            children, console, lambda address: tier_status(address, credentials), secure_run
        )
        write_run_addresses(run_dir, run_addresses((c.name, c.address) for c in children))
        if mesh:
            control_plane = next(c for c in children if c.name == "control-plane")
            status = f"tiermesh mesh status --address {control_plane.address}"
            if secure_run is not None:  # mTLS, and a key with the admin scope
                ops = secure_run.files("launcher")
                status += f" --ca {ops.ca} --cert {ops.cert} --key {ops.key} --api-key ADMIN_KEY"
            console.print(
                f"mesh: router -> xds:///tier-NAME; topology {run_dir / 'logs' / 'topology.yaml'} "
                f"(edits are served); {status}"
            )
        if demo_prompt and not stop_requested:
            demo_chat(children[-1].address, demo_prompt, console, secure_run)
        healthy = functools.partial(is_healthy, credentials=credentials)
        supervisor = Supervisor(children, healthy, console, run_dir / "pids.json")
        console.print(f"pids: {run_dir / 'pids.json'}; a crashed service is restarted")
        console.print("[dim]serving; Ctrl-C stops every service[/dim]")
        while not stop_requested:
            if (why := supervisor.poll()) is not None:
                console.print(f"[red]{why}[/red]")
                return 1
            time.sleep(0.2)
        console.print(f"{stop_requested[0]} received: stopping every service")
        return 0
    finally:
        remove_run_addresses(run_dir)
        stop_all(children)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
