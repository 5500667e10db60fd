"""`tiermesh mesh ...`: serve the control plane, show its status, and generate what points at it.

tiermesh mesh serve --topology FILE [--host H] [--port P]   ADS + admin + health; reloads FILE
    [--insecure]                                             plaintext beyond loopback
tiermesh mesh status [--json] [--address ADDR]               nodes, ACK/NACK, endpoints per tier
    [--ca CA [--cert C --key K]] [--api-key KEY]             over TLS; a key with the admin scope
tiermesh mesh bootstrap [--topology FILE] [--node-id ID]     gRPC xDS bootstrap JSON
    [--ca CA [--cert C --key K]]                             ADS over TLS (mTLS with a certificate)
tiermesh mesh bootstrap --validate FILE                      what a bootstrap file lacks
tiermesh mesh envoy [--topology FILE]                        Envoy bootstrap JSON
tiermesh mesh k8s [--topology FILE] [--service-monitor] [--secure] [--cors-origin O]...
                                                             Kubernetes manifests (YAML)
    [--secure]                                               TLS from Secrets, exec health probes
    [--tier-config TIER=FILE]...                             a tier on vllm or a remote server
tiermesh mesh probe TARGET [--calls N]                       which backend answers, N calls

`serve` reads its TLS, allowed ADS callers and API key file from TIERMESH_TLS_*,
TIERMESH_ALLOWED_CALLERS and TIERMESH_KEYS_FILE (services/security/settings.py).
Every command reads the same topology file (default: mesh/topology.yaml). Exit codes: 0 ok,
1 the control plane did not answer, 2 a bad file or flag. Parses arguments and prints; the work
is in the modules it calls. Imports grpc-heavy modules only inside the commands that need them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from mesh.bootstrap import (
    BOOTSTRAP_CONFIG_ENV,
    XdsTls,
    bootstrap_problems,
    envoy_bootstrap,
    grpc_bootstrap,
)
from mesh.last_good import load_or_last_good
from mesh.topology import Topology
from mesh.topology_file import load_topology
from services.common import env
from services.common.config import GatewayConfig
from services.common.config_loading import build_config, read_toml
from services.common.errors import ConfigError
from services.common.extras import require_extra

DEFAULT_TOPOLOGY = Path(__file__).with_name("topology.yaml")
log = logging.getLogger(__name__)


def _topology(args: argparse.Namespace) -> Topology:
    return load_topology(args.topology)


def _fail(message: str, code: int = 2) -> int:
    print(f"tiermesh mesh: {message}", file=sys.stderr)
    return code


async def _serve(topology: Path, host: str, port: int, insecure: bool) -> None:
    require_extra("envoy", "the xDS control plane")
    from mesh.control_plane import start_control_plane
    from services.common.grpc_service import serve_until_signalled
    from services.security.settings import ServiceSecurity

    security = ServiceSecurity.from_env()
    if insecure:
        security = replace(security, insecure=True)
    started = await start_control_plane(topology, host, port, security=security)
    over = "TLS" if security.tls is not None else "plaintext"
    print(
        f"control plane serving ADS on {started.address} over {over} (topology {topology})",
        flush=True,
    )

    async def stop_watching() -> None:
        if started.watcher is not None:
            started.watcher.cancel()

    await serve_until_signalled(started.running, 1.0, stop_watching)


def cmd_serve(args: argparse.Namespace) -> int:
    from services.common.grpc_service import configure_logging
    from services.common.parent_watch import stop_with_parent

    stop_with_parent()
    configure_logging("control-plane", env.log_level())
    try:
        # the listen address of the file, or of its last good copy if the file is invalid
        topology = load_or_last_good(args.topology).topology
        host, _, port = topology.control_plane.rpartition(":")
        asyncio.run(
            _serve(
                args.topology,
                args.host or host,
                port=int(port) if args.port is None else args.port,
                insecure=args.insecure,
            )
        )
    except ConfigError as e:
        return _fail(str(e))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import grpc

    require_extra("envoy", "tiermesh mesh status")
    from mesh.admin import fetch_status, status_json, status_text

    address = args.address or _topology(args).control_plane
    credentials = _client_credentials(args)
    api_key = args.api_key or os.environ.get("TIERMESH_API_KEY")
    try:
        status = fetch_status(address, args.timeout, credentials, api_key)
    except grpc.RpcError as e:
        return _fail(
            f"no answer from the control plane at {address}: {e.code().name}: {e.details()}", 1
        )
    print(status_json(status) if args.json else status_text(status))
    return 0


def cmd_bootstrap(args: argparse.Namespace) -> int:
    if args.validate is not None:
        return _validate_bootstrap(args.validate)
    control_plane = args.control_plane or _topology(args).control_plane
    bootstrap = grpc_bootstrap(
        control_plane,
        args.node_id,
        zone=args.zone,
        region=args.region,
        sub_zone=args.sub_zone,
        tls=_bootstrap_tls(args),
    )
    _print_json(bootstrap)
    return 0


def _validate_bootstrap(path: Path) -> int:
    try:
        bootstrap = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        return _fail(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        return _fail(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}", code=1)
    problems = bootstrap_problems(bootstrap)
    for problem in problems:
        print(f"{path}: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{path}: a valid gRPC xDS bootstrap")
    return 0


def cmd_envoy(args: argparse.Namespace) -> int:
    tls = _bootstrap_tls(args)
    _print_json(envoy_bootstrap(_topology(args), args.node_id, args.admin_port, tls))
    return 0


def cmd_k8s(args: argparse.Namespace) -> int:
    from mesh.k8s import manifests_yaml
    from mesh.k8s_engines import tier_engines

    origins = tuple(args.cors_origin)
    # the gateway's own check (ConfigError: exit 2), so a bad origin never reaches a cluster
    build_config(GatewayConfig, {"cors_origins": list(origins)})
    topology = _topology(args)
    tier_configs = {}
    for value in args.tier_config:
        tier, _, path = value.partition("=")
        if not tier or not path:
            raise ConfigError(f"--tier-config: expected TIER=FILE, got {value!r}")
        tier_configs[tier] = read_toml(Path(path), "tier config")
        try:  # each file alone first, so an error names it
            tier_engines({tier: tier_configs[tier]}, topology)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    text = manifests_yaml(
        topology,
        service_monitor=args.service_monitor,
        secure=args.secure,
        cors_origins=origins,
        tier_configs=tier_configs,
    )
    sys.stdout.write(text)
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    if args.target.startswith("xds:") and not (
        os.environ.get(BOOTSTRAP_CONFIG_ENV) or os.environ.get("GRPC_XDS_BOOTSTRAP")
    ):
        control_plane = args.control_plane or _topology(args).control_plane
        bootstrap = grpc_bootstrap(control_plane, f"probe~{os.getpid()}")
        os.environ[BOOTSTRAP_CONFIG_ENV] = json.dumps(bootstrap)
    from mesh.probe import follow, probe_counts

    if args.follow is not None:
        follow(args.target, args.follow)
        return 0
    counts = probe_counts(args.target, args.calls)
    total = sum(counts.values())
    _print_json(
        {
            "target": args.target,
            "calls": total,
            "counts": counts,
            "shares": {name: round(n / total, 4) for name, n in counts.items()},
        }
    )
    return 0


def _tls_flags(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--ca", type=Path, help=f"CA file: {what} over TLS")
    parser.add_argument("--cert", type=Path, help="client certificate (mTLS), with --key")
    parser.add_argument("--key", type=Path, help="the client certificate's key")


def _bootstrap_tls(args: argparse.Namespace) -> XdsTls | None:
    if args.ca is None:
        if args.cert or args.key:
            raise ConfigError("--cert and --key need --ca")
        return None
    if (args.cert is None) != (args.key is None):
        raise ConfigError("give both --cert and --key, or neither")
    return XdsTls(args.ca, args.cert, args.key)


def _client_credentials(args: argparse.Namespace) -> Any:
    """Channel credentials from --ca/--cert/--key, or None for plaintext."""
    tls = _bootstrap_tls(args)
    if tls is None:
        return None
    from services.security.tls import TlsFiles, channel_credentials

    return channel_credentials(TlsFiles(tls.ca, tls.cert, tls.key))


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _with_topology(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topology", type=Path, default=DEFAULT_TOPOLOGY, help="topology file (YAML)"
    )


def _guarded(func: Any) -> Any:
    """Runs a command, turning a bad topology into exit code 2 with its message."""

    def run(args: argparse.Namespace) -> int:
        try:
            code: int = func(args)
        except ConfigError as e:
            return _fail(str(e))
        return code

    return run


def register(subparsers: Any) -> None:
    """Adds `mesh` and its subcommands to the `tiermesh` command."""
    mesh = subparsers.add_parser("mesh", help="the xDS control plane and what points at it")
    commands = mesh.add_subparsers(dest="mesh_command", required=True, metavar="MESH_COMMAND")

    serve = commands.add_parser("serve", help="serve ADS from a topology file, reloading it")
    _with_topology(serve)
    serve.add_argument("--host", help="listen host (default: the topology's control_plane)")
    serve.add_argument("--port", type=int, help="listen port, 0 = any (default: the topology's)")
    serve.add_argument(
        "--insecure", action="store_true", help="allow plaintext on a non-loopback address"
    )
    serve.set_defaults(func=cmd_serve)

    status = commands.add_parser("status", help="nodes, ACKed/NACKed versions, endpoints")
    _with_topology(status)
    status.add_argument("--address", help="control plane (default: the topology's)")
    status.add_argument("--json", action="store_true", help="the status message as JSON")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait")
    status.add_argument("--api-key", help="a key with the admin scope (default $TIERMESH_API_KEY)")
    _tls_flags(status, "ask the control plane")
    status.set_defaults(func=_guarded(cmd_status))

    bootstrap = commands.add_parser("bootstrap", help="gRPC xDS bootstrap JSON for a client")
    _with_topology(bootstrap)
    bootstrap.add_argument("--control-plane", help="ADS address (default: the topology's)")
    bootstrap.add_argument("--node-id", default="tiermesh-router", help="the client's node id")
    bootstrap.add_argument("--region", default="", help="the client's locality region")
    bootstrap.add_argument("--zone", default="", help="the client's locality zone")
    bootstrap.add_argument("--sub-zone", default="", help="the client's locality sub-zone")
    _tls_flags(bootstrap, "the client's ADS stream")
    bootstrap.add_argument(
        "--validate",
        type=Path,
        metavar="FILE",
        help="check FILE instead: say what a gRPC xDS client would miss in it (exit 1 if any)",
    )
    bootstrap.set_defaults(func=_guarded(cmd_bootstrap))

    envoy = commands.add_parser("envoy", help="Envoy bootstrap JSON pointing at the control plane")
    _with_topology(envoy)
    envoy.add_argument("--node-id", default="tiermesh-envoy", help="Envoy's node id")
    envoy.add_argument("--admin-port", type=int, default=9901, help="Envoy admin port")
    _tls_flags(envoy, "Envoy's ADS stream")
    envoy.set_defaults(func=_guarded(cmd_envoy))

    k8s = commands.add_parser("k8s", help="Kubernetes manifests for the mesh (YAML)")
    _with_topology(k8s)
    k8s.add_argument(
        "--service-monitor",
        action="store_true",
        help="add a Prometheus Operator ServiceMonitor (clusters that run the operator)",
    )
    k8s.add_argument(
        "--secure",
        action="store_true",
        help="TLS everywhere from Secrets (the output says how to create them; no key in it)",
    )
    k8s.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (https://app.example, or *) the gateway serves cross-origin; "
        "repeat for more",
    )
    k8s.add_argument(
        "--tier-config",
        action="append",
        default=[],
        metavar="TIER=FILE",
        help='the config (TOML) of a tier on engine "vllm" (its own image, GPUs, model volume) '
        'or "openai" (a remote server: no pod, an adapter beside the router); repeat per tier',
    )
    k8s.set_defaults(func=_guarded(cmd_k8s))

    probe = commands.add_parser("probe", help="call a target and count which backend answers")
    _with_topology(probe)
    probe.add_argument("target", help="e.g. xds:///tier-large or 127.0.0.1:50063")
    probe.add_argument("--calls", type=int, default=500, help="number of calls")
    probe.add_argument(
        "--follow", type=float, metavar="SECONDS", help="call for SECONDS, one JSON line per 20 ms"
    )
    probe.add_argument("--control-plane", help="ADS address (default: the topology's)")
    probe.set_defaults(func=_guarded(cmd_probe))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m", description="tiermesh xDS mesh")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["mesh", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.func(args)
    return code
