#!/usr/bin/env bash
# Checks the torch engine on an NVIDIA GPU (the CUDA path) end to end, each step with its own
# timeout, PASS/FAIL per step, and carries on after a failure. In this order (the newest checks
# first, so a run cut short still has them):
#   bench   `tiermesh bench engine --json` (our engine against sequential Hugging Face generate,
#           same greedy ids) with model and engine on the GPU: the large tier in float32 and the
#           SmolLM2-shaped model in bfloat16, at 1/16/64 streams x 64 tokens
#   mesh    `tiermesh run --device cuda` (built-in models), one routed and one progressive
#           `tiermesh chat --json`, each tier's device from its GetStatus, then Ctrl-C's signal
#           and a clean exit
#   engine  scripts/cuda_check.py: each built-in tier (small, medium, large) on the GPU against
#           the CPU (greedy token ids alone, batched, continued; the first differing position on
#           a mismatch), throughput at 1/16/64 streams x 64 tokens for the large tier and a
#           randomly initialised Llama of SmolLM2-135M's shape (float32, bfloat16), one tier
#           served over gRPC on the GPU
#
# Run from the repository root on a machine with a GPU:
#     OUT=/tmp/cuda_check bash scripts/cuda_check.sh            # DEVICE=cuda by default
#     DEVICE=cpu PYTHON=.venv/bin/python WHEELS= OUT=/tmp/cudacheck_out \
#         bash scripts/cuda_check.sh                            # a dry run on the CPU
# Writes $OUT/cuda_check.log (everything printed), $OUT/cuda_check.json (each step's result and
# time), $OUT/engine/cuda_check.json (token ids, mismatches, throughput rows),
# $OUT/bench_engine.jsonl, $OUT/mesh.log and $OUT/chat.jsonl. If $WHEELS (default .whl/) holds
# wheels (the servers' dependencies, for a machine without them), they are installed into
# /tmp/site and put on PYTHONPATH after the repository, which is used in place
# (PYTHONPATH=.:clients/python/src:/tmp/site): a tiermesh_client wheel there is skipped, so the
# client and its stubs always come from this checkout. WHEELS= (empty) installs none.
# Environment: PYTHON (default python3), WHEELS, CHECKS (default bench,mesh,engine: which steps),
# LEVELS (default 1,16,64 on a GPU, 1,4 on the CPU),
# BASE_PORT (default 52100), TIME_SCALE (each step's time limit times this; 1 on a GPU, 3 on
# the CPU). Each step has its own time limit (520 s together on a GPU); on an H200 the whole
# run took 270 s. The integration tests are not run here: they build
# their tiers on the CPU and have no switch for another device.
set -u -o pipefail

DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/cuda_check}
PYTHON=${PYTHON:-python3}
BASE_PORT=${BASE_PORT:-52100}
if [ "$DEVICE" = cpu ]; then
    LEVELS=${LEVELS:-1,4} BENCH_TOKENS=16 TIME_SCALE=${TIME_SCALE:-3}
else
    LEVELS=${LEVELS:-1,16,64} BENCH_TOKENS=64 TIME_SCALE=${TIME_SCALE:-1}
fi
mkdir -p "$OUT/engine"
LOG="$OUT/cuda_check.log"
: >"$LOG"
export PYTHONUNBUFFERED=1
STARTED=$(date +%s)
STEPS=()

say() { echo "$*" | tee -a "$LOG"; }
CHECKS=${CHECKS:-bench,mesh,engine}
wants() { [[ ",$CHECKS," == *",$1,"* ]]; }

# one step: NAME, its timeout in seconds, then the command; its output goes to the log, its
# result to the summary
step() {
    local name=$1 limit=$(($2 * TIME_SCALE))
    shift 2
    local t0 rc
    t0=$(date +%s)
    say "==== $name"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=$?
    local took=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
        say "PASS $name (${took} s)"
    else
        say "FAIL $name (rc $rc, ${took} s)"
    fi
    STEPS+=("{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $took}")
    return 0
}

WHEELS=${WHEELS-.whl}
mapfile -t wheels < <(ls "${WHEELS:-/nonexistent}"/*.whl 2>/dev/null | grep -v /tiermesh_client-)
if [ ${#wheels[@]} -gt 0 ]; then
    say "installing ${#wheels[@]} wheels from $WHEELS into /tmp/site"
    if $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "${wheels[@]}" 2>&1 | tee -a "$LOG"; then
        SITE=:/tmp/site
    else
        say "FAIL installing the wheels in $WHEELS (carrying on with the installed packages)"
    fi
fi
export PYTHONPATH=$PWD:$PWD/clients/python/src${SITE:-}${PYTHONPATH:+:$PYTHONPATH}
export DEVICE OUT PYTHON BASE_PORT LEVELS

say "---- machine"
(nvidia-smi 2>&1 || echo "nvidia-smi: not available") | tee -a "$LOG"
$PYTHON - <<'EOF' 2>&1 | tee -a "$LOG"
import sys
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("transformers", "tokenizers", "grpc", "google.protobuf", "numpy", "fastapi",
             "opentelemetry.sdk", "cryptography"):
    try:
        module = __import__(name, fromlist=["__version__"])
        print(f"  {name} {getattr(module, '__version__', '?')} {module.__file__}")
    except Exception as e:
        print(f"  {name}: {type(e).__name__}: {e}")
EOF

# `tiermesh bench engine` loads its model and engine on the CPU (it has no --device): the same
# command runs here with both moved to $DEVICE; its last line is the JSON report
bench_engine() {
    "$PYTHON" - "$@" <<'PY'
import functools, os, sys
from pathlib import Path
sys.path.insert(0, "scripts")
device = os.environ["DEVICE"]
import services.bench.engine_bench as eb
eb.TierConfig = functools.partial(eb.TierConfig, device=device)
load = eb.load_causal_lm
eb.load_causal_lm = lambda path, _device="cpu", *a, **k: load(path, device, *a, **k)
args = sys.argv[1:]
model = Path(args[args.index("--model") + 1])
if not (model / "config.json").exists():
    from cuda_check import smollm2_shape
    smollm2_shape(model, Path("services/tier_large/model"))
from services.cli.main import main
sys.argv = ["tiermesh", "bench", "engine", *args]
sys.exit(main())
PY
}
export -f bench_engine
SMOL=/tmp/cuda_check_smollm2_shape
# the built-in large model in float32 (as its tier runs), then the SmolLM2-shaped model in
# bfloat16 (the longer one: sequential generate of 64 streams on 30 layers); transformers' own
# batching is left out, for time
for bench in "services/tier_large/model float32 60" "$SMOL bfloat16 220"; do
    wants bench || break
    read -r model dtype limit <<<"$bench"
    step "bench engine on $DEVICE: $model $dtype" "$limit" \
        bash -c 'set -o pipefail; bench_engine "$@" | tee -a "$OUT/bench_engine.jsonl"' _ \
        --model "$model" --dtype $dtype --concurrency "$LEVELS" --max-tokens $BENCH_TOKENS \
        --rounds 2 --no-transformers-batching --json
done

# each tier's device, from its GetStatus (`tiermesh run` puts small, medium, large on ports
# BASE_PORT+10..12); fails unless every one is on $DEVICE
tier_devices() {
    "$PYTHON" - "$BASE_PORT" "$DEVICE" <<'PY'
import sys
import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc
base, device, ok = int(sys.argv[1]), sys.argv[2].split(":")[0], True
for i, name in enumerate(("small", "medium", "large")):
    with grpc.insecure_channel(f"127.0.0.1:{base + 10 + i}") as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        status = stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=10)
    print(f"  {name}: device {status.device}, model {status.model_id}")
    ok = ok and status.device.startswith(device)
sys.exit(0 if ok else 1)
PY
}
export -f tier_devices

mesh() {
    set -o pipefail
    local router=127.0.0.1:$BASE_PORT
    "$PYTHON" -m services.cli run --device "$DEVICE" --base-port "$BASE_PORT" --no-demo \
        >"$OUT/mesh.log" 2>&1 &
    local pid=$! ok=1
    for _ in $(seq 1 90); do
        grep -q "Ctrl-C stops every service" "$OUT/mesh.log" && break
        kill -0 $pid 2>/dev/null || break
        sleep 1
    done
    cat "$OUT/mesh.log"
    if grep -q "Ctrl-C stops every service" "$OUT/mesh.log"; then
        : >"$OUT/chat.jsonl"
        for mode in routed progressive; do
            echo "---- chat --mode $mode"
            if "$PYTHON" -m services.cli chat --json --router "$router" --mode "$mode" \
                --max-tokens 32 --timeout 60 "How much does the blue kettle cost?" \
                | tee -a "$OUT/chat.jsonl"; then
                echo "PASS chat $mode"
            else
                echo "FAIL chat $mode"
                ok=0
            fi
        done
        echo "---- each tier's device (GetStatus)"
        if ! tier_devices; then
            echo "FAIL a tier is not on $DEVICE"
            ok=0
        fi
    else
        echo "FAIL the mesh did not come up"
        ok=0
    fi
    kill -INT $pid 2>/dev/null
    for _ in $(seq 1 30); do kill -0 $pid 2>/dev/null || break; sleep 1; done
    if kill -0 $pid 2>/dev/null; then
        echo "FAIL the mesh did not stop within 30 s of Ctrl-C; killing it"
        kill -KILL $pid
        ok=0
    fi
    wait $pid
    echo "mesh exit status $?"
    tail -n 20 "$OUT/mesh.log"
    [ $ok = 1 ] || tail -n 30 .tiermesh/logs/*.log
    [ $ok = 1 ]
}
export -f mesh
wants mesh && step "mesh: tiermesh run --device $DEVICE, routed + progressive chat" 90 bash -c mesh

wants engine && step "engine: tiers cuda=cpu, throughput, gRPC tier" 150 \
    $PYTHON scripts/cuda_check.py --out "$OUT/engine" --device "$DEVICE" --levels "$LEVELS"
# scripts/cuda_check.py reports mismatches and failed sub-steps in its own lines; count them here
if wants engine && [ -f "$OUT/engine/cuda_check.json" ]; then
    $PYTHON - "$OUT/engine/cuda_check.json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
r = json.load(open(sys.argv[1]))
bad = {k: v["differ_at"] for k, v in r.get("compare", {}).items() if v["differ_at"]}
errors = r.get("errors", {})
print(("PASS" if not bad and not errors else "FAIL")
      + f" engine details: {len(r.get('compare', {}))} comparisons, {len(bad)} differ, "
      f"{len(errors)} sub-steps failed")
for k, v in bad.items():
    print(f"  differ: {k}: (prompt, first differing token) {v}")
for k, v in errors.items():
    print(f"  error: {k}: {v}")
for k, rows in (r.get("throughput") or {}).items():
    for row in rows or []:
        print(f"  throughput {k}: {row}")
EOF
fi

total=$(($(date +%s) - STARTED))
{
    printf '{"device": "%s", "levels": "%s", "seconds": %s, "steps": [' "$DEVICE" "$LEVELS" "$total"
    (IFS=,; printf '%s' "${STEPS[*]}")
    printf ']}\n'
} >"$OUT/cuda_check.json"
say "---- summary ($total s)"
grep -E '^(PASS|FAIL)' "$LOG" | tee -a "$LOG"
