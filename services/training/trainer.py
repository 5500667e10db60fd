"""Trains one tier's GPT-2-shaped model on the workload stream and writes a Hugging Face folder.

Each optimiser step takes one kind's batch (a request class, or arithmetic drills; one kind per
batch keeps padding short), packs its examples into as few rows as fit (each example still starts
at position 0 and sees only itself, exactly as serving will), and counts loss on the answer only.
The learning-rate schedule follows the share of the time budget spent (or of `steps` when given,
which makes a run repeatable step for step), so a busy machine shortens training instead of
overrunning.
Knows the workload and torch; nothing of gRPC or serving.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from services.training.growth import grow
from services.training.recipes import TierRecipe
from services.training.tokenizer import EOS_TOKEN, prompt_text, save_tokenizer
from services.workload import CLASSES, WorkloadItem, drill_stream, stream
from services.workload.augment import augmented_stream

# kinds of batch (each step is one kind's batch of ~batch_tokens; the recipe's step_mix gives
# their shares): the three request classes, and "drill", the training-only arithmetic of the
# complex working on its own
KINDS = (*CLASSES, "drill")
TYPICAL_LENGTH: dict[str, int] = {"simple": 32, "medium": 44, "complex": 170, "drill": 60}
WIDTH_STEP = 8  # batch widths are padded to a multiple of this
NOTE_EVERY_S = 60.0  # a plain progress line this often, for logs that are not a terminal


@dataclass(frozen=True)
class TrainingReport:
    """What one training run did; written next to the checkpoint as training.json."""

    tier: str
    seed: int
    steps: int
    seconds: float
    tokens: int
    params: int
    final_loss: float
    recipe: dict[str, Any]
    autocast: str = "bfloat16"  # the precision the steps computed in (float32 without native bf16)


class Batch(NamedTuple):
    """One optimiser step's examples, packed: several examples share a row, each with positions
    from 0 (a new sequence wherever the position falls back), padding only at a row's end."""

    kind: str
    input_ids: torch.Tensor  # (rows, T)
    labels: torch.Tensor  # (rows, T): the answer's tokens, -100 elsewhere
    position_ids: torch.Tensor  # (rows, T)
    tokens: int  # unpadded prompt + answer tokens


def pack(lengths: list[int], width: int) -> list[list[int]]:
    """Example indices grouped into rows of at most `width` tokens, longest first, each into the
    first row it fits (first-fit decreasing); every example is in exactly one row."""
    rows: list[list[int]] = []
    free: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[index] > width:
            raise ValueError(f"an example of {lengths[index]} tokens exceeds the width {width}")
        row = next((r for r, room in enumerate(free) if room >= lengths[index]), len(rows))
        if row == len(rows):
            rows.append([])
            free.append(width)
        rows[row].append(index)
        free[row] -= lengths[index]
    return rows


class ExampleBatches:
    """Endless packed batches (`Batch`) from the workload stream (with `augment`, simple and
    medium requests reworded: services.workload.augment). A batch holds the same examples a
    padded batch of one example a row would (batch_tokens // the kind's typical length of them,
    drawn at random), packed into rows of `row_width` tokens (the model's positions; wider only
    for an example longer than that, which the model then refuses). One example a row, padding
    was 23-58% of a batch's tokens; packed, short examples fill their rows. No held-out prompt is
    ever in a batch."""

    def __init__(
        self,
        tokenizer: Any,
        seed: int,
        held_out: frozenset[str],
        batch_tokens: int,
        step_mix: tuple[float, ...],
        augment: bool = False,
        row_width: int = 256,
    ):
        if len(step_mix) != len(KINDS) or min(step_mix) < 0 or sum(step_mix) <= 0:
            raise ValueError(f"step_mix needs {len(KINDS)} shares >= 0 for {KINDS}: {step_mix}")
        self._mix = step_mix
        self._row_width = row_width
        self._tokenizer = tokenizer
        self._rng = random.Random(seed)
        self._held_out = held_out
        self._rows = {k: max(1, batch_tokens // TYPICAL_LENGTH[k]) for k in KINDS}
        source = partial(augmented_stream, held_out=held_out) if augment else stream
        self._streams: dict[str, Iterator[tuple[str, str]]] = {
            c: self._fresh(source(seed, c)) for c in CLASSES
        }
        self._streams["drill"] = drill_stream(seed)

    def _fresh(self, items: Iterator[WorkloadItem]) -> Iterator[tuple[str, str]]:
        for item in items:
            if item.request_class == "simple" or item.prompt not in self._held_out:
                yield item.prompt, item.reference

    def next_batch(self) -> Batch:
        kind = self._rng.choices(KINDS, weights=self._mix)[0]
        pairs = [next(self._streams[kind]) for _ in range(self._rows[kind])]
        prompts = self._tokenizer([prompt_text(prompt) for prompt, _ in pairs])["input_ids"]
        answers = self._tokenizer(
            [reference + EOS_TOKEN for _, reference in pairs], add_special_tokens=False
        )["input_ids"]
        lengths = [len(p) + len(a) for p, a in zip(prompts, answers, strict=True)]
        # rows as wide as the model's positions: few distinct batch shapes (every new shape costs
        # the CPU kernels a fresh set-up), and room for several short examples in each
        width = max(self._row_width, -(-max(lengths) // WIDTH_STEP) * WIDTH_STEP)
        rows = pack(lengths, width)
        pad = int(self._tokenizer.pad_token_id)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        # padding continues the row's last positions (causal attention never lets it reach back)
        positions = torch.arange(width, dtype=torch.long).repeat(len(rows), 1)
        for row, members in enumerate(rows):
            at = 0
            for index in members:
                p, a = prompts[index], answers[index]
                end = at + len(p) + len(a)
                ids[row, at:end] = torch.tensor(p + a)
                labels[row, at + len(p) : end] = torch.tensor(a)
                positions[row, at:] = torch.arange(width - at)
                at = end
        return Batch(kind, ids, labels, positions, sum(lengths))


def build_model(recipe: TierRecipe, tokenizer: Any) -> Any:
    """A freshly initialised GPT2LMHeadModel of the recipe's shape for this tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=recipe.n_positions,
        n_embd=recipe.n_embd,
        n_layer=recipe.n_layer,
        n_head=recipe.n_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        # GPT-2's tanh GELU (`gelu_new`) as one kernel instead of eight elementwise ops: the same
        # function, a step of the large tier ~1.3x faster; serving runs it the same way
        activation_function="gelu_pytorch_tanh",
    )
    return GPT2LMHeadModel(config)


def _lr_at(step: int, progress: float, recipe: TierRecipe) -> float:
    """Linear warm-up over warmup_steps, then cosine from lr to lr / 10 as progress goes 0 -> 1."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def bf16_is_native() -> bool:
    """True when this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere (AVX2 only)
    torch emulates it ~40x slower than float32, so training keeps float32 there."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def batch_loss(model: Any, batch: Batch) -> torch.Tensor:
    """The model's mean loss over the batch's answer tokens. transformers reads the packing from
    the positions (a new sequence wherever they fall back, with no attention mask and no cache
    given) and keeps each example's attention to itself."""
    loss: torch.Tensor = model(
        input_ids=batch.input_ids,
        labels=batch.labels,
        position_ids=batch.position_ids,
        use_cache=False,
    ).loss
    return loss


def _step(
    model: Any, optimiser: Any, batch: Batch, lr: float, bf16: bool = True
) -> tuple[float, int]:
    for group in optimiser.param_groups:
        group["lr"] = lr
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = batch_loss(model, batch)
    torch.autograd.backward(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimiser.step()
    optimiser.zero_grad(set_to_none=True)
    return float(loss.item()), batch.tokens


def train_tier(
    recipe: TierRecipe,
    tokenizer: Any,
    out_dir: Path,
    *,
    seconds: float,
    seed: int,
    held_out: frozenset[str],
    steps: int | None = None,
    grow_from: Path | None = None,
) -> TrainingReport:
    """Trains one tier for about `seconds` (or exactly `steps`) and saves it (fp16) to out_dir.

    With `grow_from` (a checkpoint folder trained with the same tokenizer, of the same width or
    half of it), training starts from that model grown to the recipe's shape (growth.py) instead
    of from random weights.
    """
    torch.manual_seed(seed)
    model = build_model(recipe, tokenizer)
    if grow_from is not None:
        model = grow(
            load_trained(grow_from, tokenizer),
            model,
            lambda n_layer, n_embd, n_head: build_model(
                replace(recipe, n_layer=n_layer, n_embd=n_embd, n_head=n_head), tokenizer
            ),
        )
    model.train()
    optimiser = torch.optim.AdamW(
        model.parameters(),
        lr=recipe.lr,
        betas=(0.9, 0.98),
        weight_decay=recipe.weight_decay,
        fused=True,
    )
    batches = ExampleBatches(
        tokenizer,
        seed,
        held_out,
        recipe.batch_tokens,
        recipe.step_mix,
        recipe.augment,
        row_width=recipe.n_positions,
    )
    params = sum(p.numel() for p in model.parameters())
    bf16 = bf16_is_native()
    start = time.perf_counter()
    step, tokens, ema = 0, 0, 0.0
    last_note = start
    columns = (
        TextColumn(f"[bold]{recipe.tier}[/] {params / 1e6:.1f}M"),
        BarColumn(),
        TextColumn("step {task.fields[step]} loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns) as progress:
        task = progress.add_task(recipe.tier, total=1.0, step=0, loss=float("nan"))
        done = 0.0
        while done < 1.0:
            lr = _lr_at(step, done, recipe)
            loss, n = _step(model, optimiser, batches.next_batch(), lr, bf16)
            step, tokens = step + 1, tokens + n
            ema = loss if step == 1 else 0.98 * ema + 0.02 * loss
            now = time.perf_counter()
            done = step / steps if steps is not None else (now - start) / seconds
            progress.update(task, completed=min(1.0, done), step=step, loss=ema)
            if now - last_note >= NOTE_EVERY_S:
                last_note = now
                progress.console.print(
                    f"{recipe.tier} step {step} {100 * done:.0f}% loss {ema:.4f} "
                    f"{tokens / (now - start):,.0f} tok/s"
                )
    elapsed = time.perf_counter() - start
    save_checkpoint(model, tokenizer, out_dir)
    report = TrainingReport(
        recipe.tier,
        seed,
        step,
        round(elapsed, 1),
        tokens,
        params,
        round(ema, 4),
        asdict(recipe),
        "bfloat16" if bf16 else "float32",
    )
    (out_dir / "training.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    return report


def load_trained(folder: Path, tokenizer: Any) -> Any:
    """The fp32 GPT2LMHeadModel saved in `folder`, which must have been trained with `tokenizer`."""
    from services.tier.model_loading import load_causal_lm

    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no trained checkpoint to grow from in {folder}: train it first")
    loaded = load_causal_lm(folder, dtype="float32")
    if loaded.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"{folder} was trained with another tokenizer: train it again first")
    return loaded.model


def save_checkpoint(model: Any, tokenizer: Any, out_dir: Path) -> None:
    """Writes config.json, model.safetensors (fp16) and the tokenizer files to out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.safetensors"):
        stale.unlink()
    model.eval()
    model.to(torch.float16).save_pretrained(str(out_dir), safe_serialization=True)
    model.to(torch.float32)
    save_tokenizer(tokenizer, out_dir)
