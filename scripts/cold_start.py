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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.launcher.local_mesh import free_port, is_serving

ROOT = Path(__file__).resolve().parents[1]


def one_start(model: Path, loading: str, tier: str, work: Path) -> dict[str, float]:
    port = free_port()
    config = work / f"{loading}.toml"
    config.write_text(
        f'name = "{tier}"\nmodel_path = "{model.resolve()}"\nport = {port}\n'
        f'weights_loading = "{loading}"\nmax_running = 16\nmax_tokens = 200\n'
    )
    log = (work / f"{loading}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", f"services.tier_{tier}", "--config", str(config)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while not is_serving(address):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"tier did not serve; see {work / (loading + '.log')}")
            time.sleep(0.2)
        with grpc.insecure_channel(address) as channel:
            status = tier_pb2_grpc.TierServiceStub(channel).GetStatus(tier_pb2.GetStatusRequest())
    finally:
        process.terminate()
        process.wait(30)
        log.close()
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
