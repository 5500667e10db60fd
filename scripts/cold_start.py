"""Cold start of a tier, lazy against eager weight loading: starts `python -m services.tier_<tier>`
as a process per run on each model, waits for SERVING, reads the start-up breakdown from its
GetStatus and stops it. Runs alternate lazy and eager so a busy machine hits both alike.

    .venv/bin/python scripts/cold_start.py --model services/tier_large/model \
        --model models/smollm2-135m --runs 2 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.child_process import spawn, stop_process
from services.common.ports import free_port
from services.common.serving import NotServingError, wait_serving

ROOT = Path(__file__).resolve().parents[1]


def one_start(model: Path, loading: str, tier: str, work: Path) -> dict[str, float]:
    port = free_port()
    config = work / f"{loading}.toml"
    config.write_text(
        f'name = "{tier}"\nmodel_path = "{model.resolve()}"\nport = {port}\n'
        f'weights_loading = "{loading}"\nmax_running = 16\nmax_tokens = 200\n'
    )
    log = work / f"{loading}.log"
    command = [sys.executable, "-m", f"services.tier_{tier}", "--config", str(config)]
    process = spawn(command, log, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    address = f"127.0.0.1:{port}"
    try:
        try:
            wait_serving(address, 600, exited=process.poll)
        except NotServingError as e:
            raise SystemExit(f"tier did not serve ({e}); see {log}") from None
        with grpc.insecure_channel(address) as channel:
            status = tier_pb2_grpc.TierServiceStub(channel).GetStatus(tier_pb2.GetStatusRequest())
    finally:
        stop_process(process, grace_s=30)
    phases = {phase.name: phase.seconds for phase in status.startup_phases}
    return {**phases, "total": status.startup_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, action="append", required=True)
    parser.add_argument("--tier", default="large", help="the tier deployable to start")
    parser.add_argument("--runs", type=int, default=2, help="starts per model and loading")
    parser.add_argument("--json", action="store_true", help="every run as one JSON line")
    args = parser.parse_args()
    for model in args.model:
        runs: dict[str, list[dict[str, float]]] = {"lazy": [], "eager": []}
        with tempfile.TemporaryDirectory() as work:
            for _ in range(args.runs):
                for loading in ("lazy", "eager"):
                    result = one_start(model, loading, args.tier, Path(work))
                    runs[loading].append(result)
                    if args.json:
                        print(json.dumps({"model": str(model), "loading": loading, **result}))
        medians = {
            loading: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for loading, rs in runs.items()
        }
        for loading, median in medians.items():
            parts = ", ".join(f"{k} {v:.2f} s" for k, v in median.items())
            print(f"{model} {loading} (median of {args.runs}): {parts}")
        to_serving = {
            loading: median["total"] - median.get("imports", 0.0)
            for loading, median in medians.items()
        }
        weights = medians["lazy"]["weights"] / medians["eager"]["weights"]
        after_imports = to_serving["lazy"] / to_serving["eager"]
        print(
            f"{model}: weights lazy/eager {weights:.2f}; "
            f"start-up after imports lazy/eager {after_imports:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
