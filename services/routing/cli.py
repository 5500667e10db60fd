"""`tiermesh route label|train|explain` and `tiermesh route-eval`: build the measured routing
labels, train the complexity predictor and tune cost_target, explain one routing decision, and
evaluate every policy offline (stationary, or through a change of traffic with `--drift`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.common.config import RouterConfig
from services.common.config_loading import load_config
from services.common.tiers import TIER_NAMES
from services.routing.outcomes import LABEL_CONCURRENCY

PHRASINGS = ("seen", "unseen")
ROUTER_CONFIG = Path(__file__).resolve().parent.parent / "router" / "config.toml"


def _router_config() -> RouterConfig:
    return load_config(RouterConfig, ROUTER_CONFIG)


def register(commands: Any) -> None:
    route = commands.add_parser("route", help="routing labels and the complexity predictor")
    actions = route.add_subparsers(dest="route_action", metavar="ACTION", required=True)
    label = actions.add_parser("label", help="run every tier on the splits; label each request")
    label.add_argument("--splits", default="train,dev,test", help="comma-separated splits")
    label.add_argument("--limit", type=int, help="first N items of each split")
    label.add_argument("--model", action="append", default=[], metavar="TIER=PATH")
    label.add_argument(
        "--tiers", default="small,medium,large", help="tiers to run; others keep their results"
    )
    label.add_argument("--threads", type=int, default=2, help="torch threads")
    label.add_argument(
        "--concurrency",
        type=int,
        default=LABEL_CONCURRENCY,
        help=f"requests decoded together per tier (default {LABEL_CONCURRENCY})",
    )
    label.add_argument(
        "--new",
        action="store_true",
        help="run only the items the outcomes file lacks (e.g. new held-out phrasings)",
    )
    label.set_defaults(func=cmd_label)
    train = actions.add_parser("train", help="train the predictor, tune cost_target on dev")
    train.add_argument(
        "--quality-target", type=float, default=0.99, help="of always-large (default 0.99)"
    )
    train.add_argument("--out", type=Path, help="artifact (default: the router's)")
    train.set_defaults(func=cmd_train)
    explain = actions.add_parser(
        "explain", help="why the router's policy sends a prompt to its tier (loads idle)"
    )
    explain.add_argument("prompt", metavar="PROMPT")
    explain.add_argument("--policy", help="another policy than the config's")
    explain.add_argument("--config", type=Path, default=ROUTER_CONFIG, help="router config (TOML)")
    explain.add_argument("--top", type=int, default=8, help="features shown (default 8)")
    explain.add_argument("--json", action="store_true", help="one JSON object")
    explain.set_defaults(func=cmd_explain)

    evaluate = commands.add_parser("route-eval", help="evaluate routing policies offline")
    evaluate.add_argument("--split", default="test")
    evaluate.add_argument("--json", action="store_true", help="one JSON object as the last line")
    evaluate.add_argument("--out", type=Path, default=Path("report/route-eval"))
    evaluate.add_argument("--feedback", type=int, default=3000, help="adaptive feedback requests")
    evaluate.add_argument(
        "--drift",
        action="store_true",
        help="a seeded stream whose mix changes midway, each policy learning as it routes",
    )
    evaluate.add_argument("--seed", type=int, default=0, help="--drift: the stream's seed")
    evaluate.set_defaults(func=cmd_route_eval)


def cmd_label(args: argparse.Namespace) -> int:
    from services.routing.outcomes import (
        build_outcomes,
        load_outcomes,
        model_paths,
        outcomes_path,
        write_outcomes,
    )

    overrides = {}
    for value in args.model:
        tier, _, path = value.partition("=")
        overrides[tier] = Path(path)
    wanted = args.tiers.split(",")
    models = {t: p for t, p in model_paths(overrides).items() if t in wanted}
    console = Console()
    if args.concurrency < 1:
        console.print(f"[red]route label:[/red] --concurrency must be >= 1, got {args.concurrency}")
        return 2
    for tier, path in models.items():
        if not (path / "config.json").is_file():
            console.print(f"[red]route label:[/red] no {tier} model at {path} (`make models`)")
            return 2
    max_tokens = _router_config().max_tokens  # as much as the router lets a tier say
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        for split in args.splits.split(","):
            tasks = {t: progress.add_task(f"{split} {t}", total=None) for t in models}

            def advance(tier: str, done: int, total: int, tasks: Any = tasks) -> None:
                progress.update(tasks[tier], completed=done, total=total)

            path = outcomes_path(split)
            reuse = len(models) < 3 or args.new
            previous = load_outcomes(split) if path.is_file() and reuse else None
            outcomes = build_outcomes(
                split,
                models,
                args.limit,
                max_tokens=max_tokens,
                progress=advance,
                threads=args.threads,
                previous=previous,
                only_new=args.new,
                concurrency=args.concurrency,
            )
            write_outcomes(outcomes, outcomes_path(split))
            labels = {t: sum(o.label == t for o in outcomes) for t in (*TIER_NAMES, "none")}
            console.print(f"{split}: {len(outcomes)} requests, cheapest correct tier {labels}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from services.router.complexity_model import DEFAULT_ARTIFACT
    from services.routing.outcomes import load_outcomes
    from services.routing.predictor_training import (
        label_accuracy,
        latency_us,
        train_model,
        tune_thresholds,
    )

    console = Console()
    train, dev = load_outcomes("train"), load_outcomes("dev")
    model = train_model(train)
    tuning = tune_thresholds(model, dev, _router_config().tier_costs, args.quality_target)
    model = replace(model, small_below=tuning.small_below, medium_below=tuning.medium_below)
    out = args.out or DEFAULT_ARTIFACT
    model.save(out)
    p50, p99 = latency_us(model, [o.prompt for o in dev])
    console.print(
        f"predictor: label accuracy {label_accuracy(model, dev):.3f} on dev; "
        f"score() p50 {p50:.0f} µs, p99 {p99:.0f} µs"
    )
    console.print(
        f"cost_target: small < {tuning.small_below:.3f}, medium < {tuning.medium_below:.3f}: "
        f"dev accuracy {tuning.accuracy:.3f} (always-large {tuning.large_accuracy:.3f}), "
        f"cost {tuning.cost / tuning.large_cost:.1%} of always-large; written to {out}"
    )
    return 0


def cmd_route_eval(args: argparse.Namespace) -> int:
    from services.router.complexity_model import ComplexityModel
    from services.routing.outcomes import load_outcomes
    from services.routing.route_eval import plot, route_eval

    console = Console(stderr=args.json)
    config = _router_config()
    try:
        outcomes = load_outcomes(args.split)
        dev = load_outcomes("dev")
        feedback = load_outcomes("train") + dev
    except FileNotFoundError as e:
        console.print(f"[red]route-eval:[/red] {e}")
        return 2
    if args.drift:
        return _drift(args, outcomes, config, console)
    with console.status("evaluating policies…"):
        report = route_eval(
            outcomes,
            feedback,
            ComplexityModel.load(),
            config.tier_costs,
            config.adaptive_cost_weight,
            args.feedback,
            tuning=dev,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    plot(report, args.out / "cost_quality.png")
    (args.out / "route_eval.json").write_text(json.dumps(report, indent=1))
    _print_table(report, console)
    console.print(f"plot and JSON in {args.out}/")
    if args.json:
        print(json.dumps(report))
    return 0


def _ci(row: dict[str, Any], field: str, percent: bool) -> str:
    """A figure with its 95% interval: "6.1% [5.4-6.8]" or "0.985 [0.981-0.990]"."""
    value, (low, high) = row[field], row.get(f"{field}_ci95", (row[field], row[field]))
    if percent:
        return f"{value:.1%} [{low * 100:.1f}-{high * 100:.1f}]"
    return f"{value:.3f} [{low:.3f}-{high:.3f}]"


def _print_table(report: dict[str, Any], console: Console) -> None:
    spread = report.get("bootstrap", {})
    title = f"routing on {report['requests']} requests (cost: relative price x tokens)"
    if spread:
        title += f"; [95% bootstrap intervals, {spread['resamples']} resamples]"
    table = Table(title=title)
    columns = ("policy", "accuracy", "vs large", "cost vs large", "misroute", "small/big")
    for column in (*columns, "p99 route ms"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    table.add_column("share small/medium/large")
    table.add_column("accuracy seen/unseen")
    rows = [*report["policies"], *report["references"].values()]
    if "escalate" in report:
        rows.append(report["escalate"] | {"name": "escalate (progressive gate)"})
    if "cascade" in report:
        rows.append(report["cascade"] | {"name": "cascade (tuned on dev)"})
    for row in rows:
        share = "/".join(f"{row['share'][t]:.0%}" for t in TIER_NAMES)
        parts = row.get("by_phrasing", {})
        apart = "/".join(f"{parts[p]['accuracy']:.3f}" if p in parts else "-" for p in PHRASINGS)
        split = f"{row.get('misroute_too_small', 0):.1%}/{row.get('misroute_too_big', 0):.1%}"
        table.add_row(
            row["name"],
            _ci(row, "accuracy", False),
            _ci(row, "quality_vs_large", True),
            _ci(row, "cost_vs_large", True),
            _ci(row, "misroute_rate", True),
            split,
            f"{row['p99_route_ms']:.3f}",
            share,
            apart,
        )
    console.print(table)
    curve = report["adaptive_learning_curve"]
    last = curve[-1]
    console.print(
        f"adaptive reward after {last['feedback']} feedback requests: {last['reward']:.3f}"
    )
    for label, key in (
        ("static threshold tuned on dev", "static_threshold_tuned_on_dev"),
        ("best static threshold in hindsight (tuned on this split)", "best_static_threshold"),
    ):
        best = report[key]
        beat = next((p["feedback"] for p in curve if p["reward"] > best["reward"]), None)
        verdict = f"adaptive first above it after {beat}" if beat is not None else "not beaten"
        console.print(f"  {label}: {best['reward']:.3f} ({verdict})")


def _drift(
    args: argparse.Namespace, outcomes: list[Any], config: RouterConfig, console: Console
) -> int:
    from services.router.complexity_model import ComplexityModel
    from services.routing.drift import drift_eval

    with console.status("replaying the drift stream…"):
        report = drift_eval(
            outcomes,
            ComplexityModel.load(),
            config.tier_costs,
            config.adaptive_cost_weight,
            seed=args.seed,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "drift.json").write_text(json.dumps(report, indent=1))
    _print_drift(report["drift"], console)
    console.print(f"JSON in {args.out}/drift.json")
    if args.json:
        print(json.dumps(report))
    return 0


def _mix(mix: dict[str, float]) -> str:
    return ", ".join(f"{group} {share:.0%}" for group, share in mix.items())


def _print_drift(drift: dict[str, Any], console: Console) -> None:
    after = drift["requests"] - drift["change_at"]
    title = (
        f"the {after} requests after the mix changes at request {drift['change_at']} "
        f"(seed {drift['seed']}; 95% bootstrap intervals)"
    )
    table = Table(title=title)
    columns = ("policy", "accuracy", "cost vs large", "reward", "vs best static", "before")
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    best = drift["best_static_after"]
    rows = [*drift["policies"], {"name": "best_static_after", "after": best}]
    for row in rows:
        figures = row["after"]
        gap = figures["reward_vs_best_static"]
        low, high = figures["reward_vs_best_static_ci95"]
        table.add_row(
            row["name"],
            _ci(figures, "accuracy", False),
            _ci(figures, "cost_vs_large", True),
            _ci(figures, "reward", False),
            f"{gap:+.3f} [{low:+.3f}, {high:+.3f}]",
            f"{row['before']['reward']:.3f}" if "before" in row else "-",
        )
    console.print(f"before: {_mix(drift['before_mix'])}; after: {_mix(drift['after_mix'])}")
    console.print(table)
    console.print(
        f"best static after (hindsight): small < {best['small_below']:.2f}, "
        f"medium < {best['medium_below']:.2f}; reward = quality - {drift['cost_weight']} x price"
    )


def cmd_explain(args: argparse.Namespace) -> int:
    from services.common.errors import ConfigError
    from services.router.policy_factory import create_policy
    from services.routing.explain import explain

    console = Console()
    try:
        config = load_config(RouterConfig, args.config, policy=args.policy)
        policy = create_policy(config)
    except (ConfigError, OSError) as e:
        console.print(f"[red]route explain:[/red] {e}")
        return 2
    explanation = explain(policy, args.prompt, config.default_max_tokens, max(0, args.top), config)
    if args.json:
        print(json.dumps(explanation.to_json()))
    else:
        _print_explanation(explanation, console)
    return 0


def _print_explanation(explanation: Any, console: Console) -> None:
    console.print(f"policy [bold]{explanation.policy}[/bold] → [bold]{explanation.tier}[/bold]")
    console.print(f"reason: {explanation.reason}")
    bands = explanation.thresholds
    if bands is not None:
        console.print(
            f"score {explanation.complexity:.3f}; thresholds: small < {bands['small_below']:.3f}, "
            f"medium < {bands['medium_below']:.3f}, else large"
        )
    loads = f"loads: {explanation.loads}"
    if explanation.large_queue_limit is not None:
        loads += f"; past {explanation.large_queue_limit} queued on large, large may go to medium"
    console.print(loads)
    progressive = explanation.progressive
    if progressive is not None:
        console.print(
            f"as a progressive chat (gate {progressive.gate}): {' → '.join(progressive.tiers)}; "
            f"{progressive.reason}"
        )
    view = explanation.predictor
    if view is None:
        console.print("the policy does not read the complexity predictor")
        return
    chances = ", ".join(f"{t} {p:.2f}" for t, p in view.probabilities.items())
    console.print(f"predictor: score {view.score:.3f}; cheapest correct tier: {chances}")
    table = Table(title=f"top {len(view.features)} of {view.feature_count} features by effect")
    for column in ("effect on score", "n-grams", "value", *(f"w {t}" for t in TIER_NAMES)):
        table.add_column(column, justify="left" if column == "n-grams" else "right")
    for row in view.features:
        weights = [f"{row.weights[t]:+.2f}" for t in TIER_NAMES]
        table.add_row(f"{row.effect:+.4f}", " | ".join(row.grams), f"{row.value:.3f}", *weights)
    console.print(table)
