"""The `models` command: regenerate the workload splits, train the built-in tiers, evaluate them,
import a real checkpoint (model_import.py).

`register(subparsers)` adds it to any argparse CLI; every subcommand's func takes the parsed
arguments and returns an exit code. Knows the workload, the trainer and the evaluator; nothing of
gRPC or routing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

from services.common.child_process import spawn
from services.training import model_import

# glibc malloc returns big tensor buffers to the OS on every step unless told not to (~25%);
# the tokenizer's own thread pool fights torch's for the 2 cores (2x slower steps).
TRAINING_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "4294967296",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "TOKENIZERS_PARALLELISM": "false",
}
REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = REPO_ROOT / ".tiermesh" / "training"  # per-tier logs of a parallel run
DEFAULT_MINUTES = 50.0  # budget of recipes without a step count, split over tiers by budget share
DEFAULT_SEED = 1234
TIER_CHOICES = ("small", "medium", "large")


def model_dir(tier: str, out: Path | None) -> Path:
    """Where a tier's checkpoint lives: services/tier_<tier>/model, or <out>/<tier>."""
    return out / tier if out is not None else REPO_ROOT / "services" / f"tier_{tier}" / "model"


def register(subparsers: Any) -> None:
    """Adds `models {workload,train,eval}` to an argparse subparsers object."""
    models = subparsers.add_parser("models", help="built-in model family and reference workload")
    models.set_defaults(func=lambda _args: _usage(models))
    sub = models.add_subparsers(dest="models_cmd")

    workload = sub.add_parser("workload", help="regenerate the workload's JSONL splits")
    workload.set_defaults(func=run_workload)

    train = sub.add_parser("train", help="train the tokenizer and the tier checkpoints")
    train.add_argument("--tiers", nargs="+", choices=TIER_CHOICES, default=list(TIER_CHOICES))
    train.add_argument(
        "--minutes",
        type=float,
        default=DEFAULT_MINUTES,
        help="time budget of recipes without a fixed step count (every built-in recipe has one): "
        "each tier trains for its share of the minutes",
    )
    train.add_argument(
        "--parallel",
        action="store_true",
        help="one process per tier with one thread each, side by side (for a core per tier; "
        "on 2 cores one process with both threads trains a tier 1.9x faster)",
    )
    # one process after another is the default now; the old flag still parses
    train.add_argument("--sequential", action="store_true", help=argparse.SUPPRESS)
    train.add_argument("--steps", type=int, help="exact optimiser steps per tier (ignores budget)")
    train.add_argument("--seed", type=int, default=DEFAULT_SEED)
    train.add_argument("--out", type=Path, help="write <out>/<tier>/ instead of services/tier_*")
    train.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    train.set_defaults(func=run_train)

    evaluate = sub.add_parser("eval", help="accuracy and speed of each tier on a split")
    evaluate.add_argument("--split", default="test")
    evaluate.add_argument(
        "--limit", type=int, default=200, help="most items per class and phrasing (0 = all)"
    )
    evaluate.add_argument(
        "--phrasing",
        choices=("all", "seen", "unseen"),
        default="all",
        help="evaluate the items of seen phrasings, of unseen (held-out) ones, or both",
    )
    evaluate.add_argument("--tiers", nargs="+", choices=TIER_CHOICES, default=list(TIER_CHOICES))
    evaluate.add_argument("--out", type=Path, help="read <out>/<tier>/ instead of services/tier_*")
    evaluate.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    evaluate.add_argument("--threads", type=int, default=1, help="torch threads for decoding")
    evaluate.add_argument("--show-failures", type=int, default=0, metavar="N")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object last")
    evaluate.set_defaults(func=run_eval)

    model_import.register(sub)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_workload(_args: argparse.Namespace) -> int:
    from rich.console import Console

    from services.workload import write_splits

    for name, path in write_splits().items():
        Console().print(f"wrote {name}: {path} ({path.stat().st_size:,} bytes)")
    return 0


def _forwarded(
    args: argparse.Namespace, tiers: list[str], minutes: float, threads: int
) -> list[str]:
    argv = ["models", "train", "--tiers", *tiers, "--minutes", str(minutes)]
    argv += ["--seed", str(args.seed), "--threads", str(threads)]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    if args.out is not None:
        argv += ["--out", str(args.out)]
    return argv


def _training_command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "services.training", *argv]


def run_train(args: argparse.Namespace) -> int:
    env = {**os.environ, **TRAINING_ENV}
    args.tiers = [t for t in TIER_CHOICES if t in args.tiers]  # a grown tier after its source
    if args.parallel:
        from services.training.recipes import RECIPES

        waiting = [t for t in args.tiers if RECIPES[t].grow_from in args.tiers]
        if waiting:
            print(
                f"--parallel: {', '.join(waiting)} starts from a tier trained in the same run; "
                "train that tier first, or train without --parallel",
                file=sys.stderr,
            )
            return 2
        return _train_in_parallel(args, env)
    if any(os.environ.get(k) != v for k, v in TRAINING_ENV.items()):
        # malloc reads its settings only at process start: run the training in a fresh interpreter
        command = _training_command(_forwarded(args, args.tiers, args.minutes, args.threads))
        with _stopped_with_this_process() as children:
            children.append(subprocess.Popen(command, env=env, cwd=REPO_ROOT))
            return children[0].wait()
    return _train(args)


@contextmanager
def _stopped_with_this_process() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to put child processes in; they are terminated when this process is told to stop
    (SIGTERM) or leaves the block early, so no training outlives the command that started it."""
    children: list[subprocess.Popen[bytes]] = []

    def stop(_signum: int, _frame: object) -> None:
        for child in children:
            child.terminate()
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield children
    finally:
        signal.signal(signal.SIGTERM, previous)
        for child in children:
            if child.poll() is None:
                child.terminate()


def _train_in_parallel(args: argparse.Namespace, env: dict[str, str]) -> int:
    """One process per tier, one thread each, tier t training for minutes x its budget share."""
    with _stopped_with_this_process() as processes:
        return _watch_parallel(args, env, processes)


def _watch_parallel(
    args: argparse.Namespace, env: dict[str, str], processes: list[subprocess.Popen[bytes]]
) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from services.training.recipes import RECIPES

    console = Console()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    children: dict[str, tuple[subprocess.Popen[bytes], Path, float]] = {}
    for tier in args.tiers:
        minutes = args.minutes * RECIPES[tier].budget_share
        log = LOG_DIR / f"{tier}.log"
        command = _training_command(_forwarded(args, [tier], minutes, threads=1))
        child = spawn(command, log, env=env, cwd=REPO_ROOT)
        processes.append(child)
        children[tier] = (child, log, minutes)
        console.print(f"training {tier} for {minutes:.1f} min, log: {log}")
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        tasks = {t: progress.add_task(t, total=60 * m) for t, (_, _, m) in children.items()}
        while any(child.poll() is None for child, _, _ in children.values()):
            time.sleep(2.0)
            for tier, (child, log, _) in children.items():
                note = _last_line(log, prefix=f"{tier} step")
                progress.update(
                    tasks[tier],
                    completed=time.perf_counter() - started,
                    description=f"{tier}: {note}" if child.poll() is None else f"{tier}: done",
                )
        for tier, task in tasks.items():
            progress.update(task, completed=60 * children[tier][2])
    failed = [t for t, (child, _, _) in children.items() if child.returncode != 0]
    for tier, (_, log, _) in children.items():
        console.print(_last_line(log, prefix=f"{tier}:") or f"{tier}: see {log}")
    console.print(f"trained {', '.join(args.tiers)} in {time.perf_counter() - started:.0f} s")
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}[/]")
    return 1 if failed else 0


def _last_line(log: Path, prefix: str) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    return next((line.strip() for line in reversed(lines) if line.startswith(prefix)), "")


def _train(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from services.training.recipes import RECIPES
    from services.training.tokenizer import EOS_TOKEN, prompt_text, train_tokenizer
    from services.training.trainer import train_tier
    from services.workload import drill_stream, held_out_prompts, load_split

    console = Console(soft_wrap=True)
    torch.set_num_threads(args.threads)
    # transformers' notices about padding without a mask and an unset loss type do not apply to
    # these models (see trainer._step); its weight-loading bars are off in load_causal_lm
    hf_logging.set_verbosity(logging.ERROR)
    train_items = load_split("train")
    texts = [prompt_text(i.prompt) + i.reference + EOS_TOKEN for i in train_items]
    drills = islice(drill_stream(args.seed), len(train_items) // 10)
    texts += [prompt_text(prompt) + reference + EOS_TOKEN for prompt, reference in drills]
    # questions in capitals, so that upper-case words are tokens of their own rather than one
    # token per letter (which a two-layer model cannot put back together)
    texts += [prompt_text(i.prompt.upper()) for i in train_items if i.request_class != "complex"]
    tokenizer = train_tokenizer(texts, vocab_size=1536)
    held_out = held_out_prompts()
    shares = {t: RECIPES[t].budget_share for t in args.tiers}
    started = time.perf_counter()
    for tier in args.tiers:
        seconds = 60 * args.minutes * shares[tier] / sum(shares.values())
        out = model_dir(tier, args.out)
        source = RECIPES[tier].grow_from
        if source is not None:
            console.print(f"{tier} starts from {source} ({model_dir(source, args.out)}), grown")
        report = train_tier(
            RECIPES[tier],
            tokenizer,
            out,
            seconds=seconds,
            seed=args.seed,
            held_out=held_out,
            steps=args.steps if args.steps is not None else RECIPES[tier].steps,
            grow_from=None if source is None else model_dir(source, args.out),
        )
        console.print(
            f"{tier}: {report.params:,} params, {report.steps} steps, {report.tokens:,} tokens, "
            f"{report.seconds:.0f} s, loss {report.final_loss:.4f} -> {out}"
        )
    console.print(f"trained {', '.join(args.tiers)} in {time.perf_counter() - started:.0f} s")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from services.training.evaluation import TierEvaluation, evaluate_tier, per_class
    from services.workload import CLASSES, load_split

    console = Console(stderr=args.json)
    torch.set_num_threads(args.threads)
    phrasing = None if args.phrasing == "all" else args.phrasing
    items = per_class(load_split(args.split, phrasing=phrasing), args.limit or None)
    results: list[TierEvaluation] = []
    with Progress(console=console, transient=True) as progress:
        for tier in args.tiers:
            task = progress.add_task(f"eval {tier}", total=len(items))
            result = evaluate_tier(
                tier,
                model_dir(tier, args.out),
                items,
                dtype=args.dtype,
                on_item=partial(progress.advance, task),
            )
            results.append(result)
    seen = "/".join(str(results[0].counts[c]) for c in CLASSES) if results else ""
    unseen = "/".join(str(results[0].counts_unseen[c]) for c in CLASSES) if results else ""
    table = Table(
        title=f"built-in tiers on {args.split}, greedy, batch 1, {args.threads} thread",
        caption=f"accuracy on {seen} {'/'.join(CLASSES)} items of seen phrasings, and on "
        f"{unseen} of unseen ones (columns marked *); size = safetensors bytes",
    )
    unseen_columns = [f"{c}*" for c in CLASSES if results and results[0].counts_unseen[c]]
    for column in ("tier", *CLASSES, *unseen_columns, "tok/s", "TTFT ms", "params", "size"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for r in results:
        cells = [_percent(r.accuracy[c]) for c in CLASSES]
        cells += [_percent(r.accuracy_unseen[c]) for c in CLASSES if f"{c}*" in unseen_columns]
        table.add_row(
            r.tier,
            *cells,
            f"{r.tokens_per_s:,.0f}",
            f"{r.ttft_ms:.1f}",
            f"{r.params / 1e6:.2f}M",
            f"{r.bytes / 1e6:.1f} MB",
        )
    console.print(table)
    for r in results:
        for item_id, expected, got in r.failures[: args.show_failures]:
            console.print(f"[red]{r.tier} {item_id}[/] expected {expected!r}, got {got!r}")
    if args.json:
        print(json.dumps({"tiers": {r.tier: r.to_json() for r in results}}))
    return 0


def _percent(accuracy: float | None) -> str:
    return "-" if accuracy is None else f"{100 * accuracy:.1f}%"
