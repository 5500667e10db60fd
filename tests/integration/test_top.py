"""`tiermesh top --once --json` against a real router and tiers (tiny model, in-process on port
0): one row per tier replica from its GetStatus, with the router's health, in the README's shape."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from tiermesh.client import AsyncRouterClient

from services.cli.main import main
from services.cli.top_command import ROUTER_CONFIG, router_replicas
from services.launcher.run_addresses import run_addresses, write_run_addresses
from services.terminal.top_view import snapshot_table
from tests.integration.mesh import start_mesh
from tests.integration.processes import write_toml

ROW_FIELDS = {
    "tier", "address", "error", "model", "engine", "serving", "queued", "max_queued", "running",
    "max_running", "kv_pool_used_tokens", "kv_pool_capacity_tokens", "kv_pool_use_share",
    "decode_busy_share", "tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "completed", "rejected",
    "startup_s", "startup_phases", "weights_loading", "last_swap", "engine_running",
    "engine_waiting", "prefix_cache_hit_rate", "queued_batch", "paused",
}  # fmt: skip


async def top_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = await asyncio.to_thread(main, ["top", "--once", "--json", *argv])
    assert code == 0
    snapshot: dict[str, Any] = json.loads(capsys.readouterr().out)
    return snapshot


async def test_top_once_json_reads_every_tier_of_the_router(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mesh = await start_mesh(tiny_model_dir, tiers=("small", "large"))
    try:
        async with AsyncRouterClient(mesh.address) as client:
            await client.chat("What is your return policy?", mode="pinned", tier="small")
        targets = {name: tier.address for name, tier in mesh.tiers.items()}
        router_config = write_toml(tmp_path / "router.toml", {}, {"tiers": targets})
        snapshot = await top_json(
            capsys, "--router", mesh.address, "--router-config", str(router_config)
        )
        assert snapshot["router"] == {"address": mesh.address, "serving": True}
        rows = {row["tier"]: row for row in snapshot["tiers"]}
        assert set(rows) == {"small", "large"}
        for name, row in rows.items():
            assert set(row) == ROW_FIELDS
            assert row["address"] == targets[name]
            assert row["error"] is None and row["serving"]
            assert row["model"] == f"{name}/{tiny_model_dir.name}"
            assert row["kv_pool_capacity_tokens"] > 0
            assert 0.0 <= row["decode_busy_share"] <= 1.0
            assert 0.0 <= row["kv_pool_use_share"] <= 1.0
            phases = ["model_code", "weights", "weight_layout", "kv_pool", "warm_up"]
            assert list(row["startup_phases"]) == phases
            assert row["weights_loading"] == "lazy"
        assert rows["small"]["completed"] == 1 and rows["small"]["tokens_per_s"] > 0
        assert rows["small"]["ttft_ms_p50"] > 0
        assert rows["large"]["completed"] == 0 and rows["large"]["tokens_per_s"] == 0
        assert rows["small"]["last_swap"] is None

        # after a hot swap of large, its row names the swap, and so does the table
        swap = ["tier", "swap", "large", str(tiny_model_dir), "--address", targets["large"]]
        assert await asyncio.to_thread(main, swap) == 0
        capsys.readouterr()
        snapshot = await top_json(capsys, "--router-config", str(router_config))
        swapped = next(row for row in snapshot["tiers"] if row["tier"] == "large")["last_swap"]
        assert swapped["phase"] == "done" and swapped["error"] is None
        assert swapped["old_model_id"] == swapped["new_model_id"] == f"large/{tiny_model_dir.name}"
        console = Console(record=True, width=200, file=io.StringIO())
        console.print(snapshot_table(snapshot))
        assert "(swapped " in console.export_text()
        assert all(row["queued_batch"] == row["paused"] == 0 for row in snapshot["tiers"])
        # batch requests waiting and paused show after queued and running
        snapshot["tiers"][0] |= {"queued": 5, "queued_batch": 3, "running": 16, "paused": 2}
        console.print(snapshot_table(snapshot))
        shown = console.export_text()
        assert f"5/{snapshot['tiers'][0]['max_queued']} (3 batch)" in shown
        assert "(2 paused)" in shown

        # --tier names replicas directly; one that does not answer gets its error, not a crash
        down = "127.0.0.1:1"
        snapshot = await top_json(
            capsys, "--router", mesh.address, "--tier", f"small={targets['small']}", "--tier", down
        )
        small, missing = snapshot["tiers"]
        assert small["tier"] == "small" and small["error"] is None
        assert missing["address"] == down and missing["error"].startswith("UNAVAILABLE")
    finally:
        await mesh.stop()


async def test_top_finds_the_tiers_of_the_mesh_tiermesh_run_started_here(
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mesh = await start_mesh(tiny_model_dir, tiers=("small", "large"))
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        monkeypatch.setenv("TIERMESH_RUN_DIR", str(run_dir))
        children = [(name, tier.address) for name, tier in mesh.tiers.items()]
        write_run_addresses(run_dir, run_addresses([*children, ("router", mesh.address)]))
        for argv in ([], ["--router", mesh.address]):  # that mesh's router, named or not
            snapshot = await top_json(capsys, *argv)
            assert snapshot["router"] == {"address": mesh.address, "serving": True}
            rows = [(row["tier"], row["address"], row["error"]) for row in snapshot["tiers"]]
            assert rows == [(name, address, None) for name, address in children]
        # another router: its tiers are not this mesh's, so the router's config names them
        other = await top_json(capsys, "--router", "127.0.0.1:1")
        assert other["router"] == {"address": "127.0.0.1:1", "serving": None}
        rows = [(row["tier"], row["address"]) for row in other["tiers"]]
        assert rows == router_replicas(ROUTER_CONFIG)
    finally:
        await mesh.stop()
