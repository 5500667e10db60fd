"""Retries of the router's tier calls by gRPC itself, before the tier's first response: with
plain addresses by the router's default policy (one retry of UNAVAILABLE), in mesh mode by the
topology's `retry` as the control plane serves it over xDS. A real tier fails its first
Generate calls UNAVAILABLE (tests/integration/flaky_tier.py) and records each attempt's
`grpc-previous-rpc-attempts`, so a retry by gRPC is told apart from the router's own failover.
The mesh check runs in its own process: grpc's xDS client reads its bootstrap once per process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tiermesh.client import AsyncRouterClient, ChatError

from services.common.config import RouterConfig
from services.common.config_loading import build_config
from services.router.server import RouterServer, start_router
from tests.integration.flaky_tier import FlakyTier, start_flaky_tier

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def flaky(tiny_model_dir: Path) -> AsyncIterator[dict[str, FlakyTier]]:
    """small fails its first call, large its first two."""
    tiers = {
        "small": await start_flaky_tier(tiny_model_dir, "small", failures=1),
        "large": await start_flaky_tier(tiny_model_dir, "large", failures=2),
    }
    yield tiers
    for tier in tiers.values():
        await tier.stop()


@pytest.fixture
async def router(flaky: dict[str, FlakyTier]) -> AsyncIterator[RouterServer]:
    targets = {name: tier.address for name, tier in flaky.items()}
    config = build_config(RouterConfig, {"port": 0, "tiers": targets, "fallback": {}})
    running = await start_router(config)
    yield running
    await running.stop(0)


async def test_plain_addresses_retry_unavailable_once_before_the_first_response(
    flaky: dict[str, FlakyTier], router: RouterServer
) -> None:
    async with AsyncRouterClient(router.address) as client:
        answer = await client.chat("Hi", mode="pinned", tier="small", max_tokens=4)
        # large fails twice: one retry is the whole policy, and the router, with no other
        # replica or tier for a pinned chat, does not call the same tier again
        with pytest.raises(ChatError) as failed:
            await client.chat("Hi", mode="pinned", tier="large", max_tokens=4)
    assert answer.tier == "small" and answer.text
    assert "retried" not in answer.final.reason  # the router saw no failure
    assert flaky["small"].servicer.attempts == [0, 1]  # the second attempt is gRPC's retry
    assert failed.value.code == "UNAVAILABLE"
    assert flaky["large"].servicer.attempts == [0, 1]


@pytest.mark.timeout(300)
def test_mesh_mode_retries_as_the_topology_says(tiny_model_dir: Path) -> None:
    """small's route retries once and small fails once; medium's retries twice and medium fails
    twice (more than the plain default allows); large's has no retry and large fails once."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MESH_SCRIPT), str(tiny_model_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["small"] == {"answered": True, "attempts": [0, 1]}
    assert result["medium"] == {"answered": True, "attempts": [0, 1, 2]}
    assert result["large"] == {"answered": "UNAVAILABLE", "attempts": [0]}


MESH_SCRIPT = r"""
    import asyncio, json, os, sys
    from pathlib import Path
    from mesh.bootstrap import bootstrap_env
    from mesh.control_plane import start_control_plane
    from mesh.topology_file import parse_topology
    from services.common.config import RouterConfig
    from services.common.config_loading import build_config
    from services.router.server import start_router
    from tests.integration.flaky_tier import start_flaky_tier
    from tiermesh.client import AsyncRouterClient, ChatError

    async def main():
        model = Path(sys.argv[1])
        failures = {"small": 1, "medium": 2, "large": 1}
        retries = {"small": 1, "medium": 2}  # large: no retry policy
        tiers = {name: await start_flaky_tier(model, name, failures=failures[name])
                 for name in failures}
        lines = ["tiers:"]
        for name, tier in tiers.items():
            lines += [f"  {name}:"]
            if name in retries:
                lines += [f"    retry: {{retry_on: [unavailable], num_retries: {retries[name]}}}"]
            lines += ["    clusters:", f"      - name: {name}-v1", "        endpoints:",
                      f"          - address: {tier.address}"]
        plane = router = None
        result = {}
        try:
            topology = parse_topology("\n".join(lines) + "\n")
            plane = await start_control_plane(None, topology=topology)
            os.environ.update(bootstrap_env(plane.address, "router-retry-test"))
            targets = {name: f"xds:///tier-{name}" for name in tiers}
            router = await start_router(build_config(
                RouterConfig, {"port": 0, "tiers": targets, "fallback": {}}))
            async with AsyncRouterClient(router.address) as client:
                for name, tier in tiers.items():
                    try:
                        await client.chat("Hi", mode="pinned", tier=name, max_tokens=4)
                        answered = True
                    except ChatError as e:
                        answered = e.code
                    result[name] = {"answered": answered, "attempts": tier.servicer.attempts}
        finally:
            if router is not None:
                await router.stop(0)
            if plane is not None:
                await plane.stop()
            for tier in tiers.values():
                await tier.stop()
        print(json.dumps(result))

    asyncio.run(main())
"""
