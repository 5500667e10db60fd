"""Runs one tier: loads its config, starts the gRPC server, loads the model, serves, drains.

Every tier deployable (services/tier_small, ...) is this module plus its own config file. torch
and transformers are imported only for an engine that needs them: an echo tier starts without
(seconds of CPU less per start, which a supervised restart under load feels).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
from tiermesh.v1 import tier_pb2_grpc

from services.common import env
from services.common.config import TierConfig
from services.common.config_loading import load_config
from services.common.cpu_priority import lower_process, nice_level
from services.common.errors import TiermeshError
from services.common.grpc_service import (
    RunningServer,
    configure_logging,
    serve_until_signalled,
    start_server,
)
from services.common.heap import freeze_heap
from services.common.parent_watch import stop_with_parent
from services.common.telemetry import setup_telemetry
from services.security.settings import ServiceSecurity
from services.tier.admin_servicer import (
    ADMIN_SERVICE,
    TIER_SERVICE,
    TierAdminServicer,
    tier_interceptors,
)
from services.tier.engine import Engine
from services.tier.factory import create_engine
from services.tier.model_swap import EngineSwitch
from services.tier.servicer import TierServicer
from services.tier.startup_record import StartupRecord, process_age_s

log = logging.getLogger(__name__)

SERVICE_NAME = TIER_SERVICE


@dataclass
class TierServer:
    """A running tier: its server, its engines (the serving one and, during a hot swap, the
    one it replaces) and config."""

    config: TierConfig
    engines: EngineSwitch
    running: RunningServer

    @property
    def engine(self) -> Engine:
        """The engine new requests go to."""
        return self.engines.current

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.running.port}"

    async def stop(self, grace_s: float | None = None) -> None:
        await self.running.drain(self.config.drain_grace_s if grace_s is None else grace_s)
        await self.engines.shutdown()


async def start_tier(
    config: TierConfig,
    security: ServiceSecurity | None = None,
    own_process: bool = False,
    engine: Engine | None = None,
) -> TierServer:
    """Starts the server (NOT_SERVING), loads the model, then reports SERVING. `security`
    (TLS, the callers allowed) from the environment in `main`; plaintext when None.
    `own_process`: the process is this tier's alone, so its age counts as the "imports" phase
    of the start-up breakdown (GetStatus), and its heap is frozen before SERVING (the
    "heap_freeze" phase; services/common/heap.py). `engine`: an engine built for `config`, not
    started, to serve instead of the one create_engine() builds (e.g. a torch engine with a step
    observer); a hot swap builds its new engines from the config all the same."""
    startup = StartupRecord(
        imports_s=process_age_s() if own_process else None,
        weights_loading=config.weights_loading if config.engine == "torch" else "",
    )
    security = security or ServiceSecurity()
    security.check_listen(config.host, f"tier {config.name}")
    engines = EngineSwitch(engine if engine is not None else create_engine(config), config)
    servicer = TierServicer(config.name, engines, config.max_tokens)
    servicer.startup = startup
    servicer.last_swap = lambda: engines.last_swap
    admin = TierAdminServicer(engines)

    def register(server: grpc.aio.Server) -> None:
        tier_pb2_grpc.add_TierServiceServicer_to_server(servicer, server)
        tier_pb2_grpc.add_TierAdminServiceServicer_to_server(admin, server)

    running = await start_server(
        config.host,
        config.port,
        register,
        [SERVICE_NAME, ADMIN_SERVICE],
        interceptors=tier_interceptors(security),
        credentials=security.server_credentials(),
        reflection_on=security.reflection,
    )
    try:
        model_code_s = await _import_model_code(config)
        await engines.start()
    except BaseException:
        await running.server.stop(0)
        raise
    phases = model_code_s | engines.startup_s
    if own_process:  # the heap built so far is the tier's for good: out of the collector's reach
        phases["heap_freeze"] = freeze_heap().seconds
    startup.serving(phases)
    await running.set_serving(True)
    log.info("tier %s: SERVING after %s", config.name, startup.describe())
    return TierServer(config, engines, running)


async def _import_model_code(config: TierConfig) -> dict[str, float]:
    """The "model_code" phase: transformers and the model's class imported before the engine
    loads, so that its "weights" phase is the weights alone. Nothing for an engine without a
    transformers model (echo, TensorRT-LLM)."""
    if config.engine != "torch":
        return {}
    from services.tier.model_loading import import_model_code  # torch: only a torch tier

    started = time.perf_counter()
    await asyncio.to_thread(import_model_code, config.model_path)
    return {"model_code": time.perf_counter() - started}


def parse_args(argv: list[str], default_config: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Serve one tiermesh model tier over gRPC.")
    parser.add_argument("--config", type=Path, default=default_config, help="tier config (TOML)")
    parser.add_argument("--port", type=int, help="override the config's port")
    parser.add_argument("--host", help="override the config's host")
    parser.add_argument("--model", type=Path, help="override the config's model_path")
    parser.add_argument("--device", help="override the config's device (cpu, cuda, cuda:N)")
    parser.add_argument("--metrics-port", type=int, help="override the config's metrics_port")
    parser.add_argument(
        "--insecure", action="store_true", help="allow plaintext on a non-loopback address"
    )
    parser.add_argument(
        "--nice",
        type=nice_level,
        default=0,
        help="run this many nice levels below the priority the tier was started at, all but "
        "a torch tier's critical lane (how `tiermesh run` starts torch tiers below the router)",
    )
    return parser.parse_args(argv)


async def _serve(config: TierConfig, security: ServiceSecurity) -> None:
    telemetry = setup_telemetry(f"tier-{config.name}", prometheus_port=config.metrics_port)
    tier = await start_tier(config, security, own_process=True)
    log.info("tier %s serving %s on %s", config.name, config.model_path, tier.address)
    await serve_until_signalled(tier.running, config.drain_grace_s, tier.engines.shutdown)
    telemetry.shutdown()


def main(default_config: Path, argv: list[str] | None = None) -> int:
    """Entrypoint shared by the tier deployables; `default_config` is the tier's own file."""
    args = parse_args(sys.argv[1:] if argv is None else argv, default_config)
    lower_process(args.nice)
    try:
        config = load_config(
            TierConfig,
            args.config,
            port=args.port,
            host=args.host,
            device=args.device,
            metrics_port=args.metrics_port,
        )
        if args.model is not None:
            from services.tier.model_loading import imported_dtype  # torch: only given a model

            dtype = imported_dtype(args.model) or config.dtype
            config = replace(config, model_path=args.model, dtype=dtype)
            config.validate()
        threads = env.torch_threads()
        if threads is not None:
            config = replace(config, torch_threads=threads)
        security = ServiceSecurity.from_env()
        if args.insecure:
            security = replace(security, insecure=True)
        stop_with_parent()
        configure_logging(f"tier-{config.name}", env.log_level())
        asyncio.run(_serve(config, security))
    except TiermeshError as e:
        print(f"tier: {e}", file=sys.stderr)
        return 2
    return 0
