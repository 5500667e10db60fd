"""Measures what the HTTP gateway adds over the router's gRPC API: starts `tiermesh run` on free
ports (its own run directory, no demo), waits until the tiers, the router and the gateway serve,
runs `tiermesh bench --target openai ... --router ... --relay-floor` against it (one stream and
64, the gateway beside direct gRPC and a bare relay), then stops the mesh.

    .venv/bin/python scripts/gateway_overhead.py [--engine echo] [--base-port B] [--out DIR]
        [-- any further `tiermesh bench` options, e.g. --duration 30 --max-tokens 32]

Exit status: the bench's, or 1 when the mesh did not come up (its log is printed).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.child_process import spawn, stop_process  # noqa: E402
from services.common.serving import NotServingError, wait_serving  # noqa: E402
from services.launcher.child_health import is_http_healthy  # noqa: E402
from services.launcher.local_mesh import free_base_port  # noqa: E402

TIERMESH = [sys.executable, "-m", "services.cli"]
BENCH_DEFAULTS = ["--duration", "20", "--warmup", "4", "--rate", "6", "--max-tokens", "64"]
START_TIMEOUT_S = 240.0


def mesh_serving(base: int, proc: subprocess.Popen[bytes], log: Path) -> bool:
    """The router and tiers say SERVING and the gateway's /health answers 200, before
    START_TIMEOUT_S and before `tiermesh run` exits; else its log tail is printed."""
    deadline = time.monotonic() + START_TIMEOUT_S
    health = f"http://127.0.0.1:{base + 40}/health"

    def failed(why: object) -> bool:
        print(log.read_text(errors="replace")[-4000:], why, sep="\n", file=sys.stderr)
        return False

    try:
        for offset in (0, 10, 11, 12):
            remaining = deadline - time.monotonic()
            wait_serving(f"127.0.0.1:{base + offset}", remaining, exited=proc.poll, interval_s=1.0)
    except NotServingError as e:
        return failed(e)
    while not is_http_healthy(health):
        if proc.poll() is not None or time.monotonic() > deadline:
            return failed(f"{health}: no 200 within {START_TIMEOUT_S:g} s")
        time.sleep(1.0)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("model", "echo"), default="model")
    parser.add_argument("--base-port", type=int, default=0, help="default: a free one")
    parser.add_argument("--out", type=Path, help="report directory (openai.json)")
    args, bench_extra = parser.parse_known_args()
    bench_extra = [a for a in bench_extra if a != "--"]
    base = args.base_port or free_base_port()
    with tempfile.TemporaryDirectory(prefix="tiermesh-gateway-") as run_dir:
        log = Path(run_dir) / "run.log"
        env = {**os.environ, "TIERMESH_RUN_DIR": run_dir}
        command = [*TIERMESH, "run", "--no-demo", "--base-port", str(base)]
        command += ["--engine", args.engine]
        proc = spawn(command, log, env=env, cwd=ROOT)
        try:
            print(f"starting the mesh on base port {base} ({args.engine} tiers)…", flush=True)
            if not mesh_serving(base, proc, log):
                print("the mesh did not come up; its log is above", file=sys.stderr)
                return 1
            bench = [*TIERMESH, "bench", "--target", "openai"]
            bench += ["--url", f"http://127.0.0.1:{base + 40}/v1", "--model", "tiermesh-small"]
            bench += ["--router", f"127.0.0.1:{base}", "--relay-floor", *BENCH_DEFAULTS]
            if args.out:
                bench += ["--out", str(args.out)]
            return subprocess.run([*bench, *bench_extra], cwd=ROOT, env=env).returncode
        finally:  # `tiermesh run` stops every service on Ctrl-C
            stop_process(proc, grace_s=60, sig=signal.SIGINT)


if __name__ == "__main__":
    raise SystemExit(main())
