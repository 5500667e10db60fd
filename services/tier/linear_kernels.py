"""The linear layers of the pooled forward passes, each a callable y = x W^T + b, in the
layout this host runs fastest: the weight packed once by oneDNN (torch's own
`mkldnn._reorder_linear_weight`, run by `mkldnn._linear_pointwise`), or F.linear over the
weight stored input-major, (in, out) contiguous, which MKL's matrix-vector product streams
faster than transformers' (out, in) layout. Which one wins depends on the CPU and the dtype, so
on CPU the choice is measured once per model (`choose_layout`, a few milliseconds at start-up,
decode-sized products of the model's own widest shape), unless TIERMESH_LINEAR_LAYOUT names one;
GPUs, and CPUs without oneDNN, use input-major.

Measured: on a 2-core AMD EPYC (AVX-512, no AMX), float32 (1536, 576) one row 6.96 ms per 60
layers packed against 8.38 input-major; on a 2-core Intel Xeon with AMX, float32 (1536, 384)
one row 101 us packed against 71 input-major (one thread; the built-in large's decode step 7.0
against 4.0 ms), but bfloat16 43 us packed against 89. Packing is checked once per layer against
F.linear on a random row (within float tolerance); the plain weight is not kept beside the
packed one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from services.common.errors import ConfigError
from services.tier import huge_pages

log = logging.getLogger(__name__)

Linear = Callable[[torch.Tensor], torch.Tensor]


class PackedLinear:
    """y = x W^T + b with W held in oneDNN's packed layout only."""

    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.weight, self.bias, "none", [], ""
        )
        return y


class PlainLinear:
    """y = x W^T + b with W an (out, in) view of input-major storage."""

    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN packing is there to try: CPU tensors, torch built with oneDNN."""
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def packed(weight: torch.Tensor, bias: torch.Tensor | None) -> PackedLinear | None:
    """`weight` (out, in) packed, or None when packing fails or its product differs from
    F.linear's on a random row (the caller then keeps the weight plain)."""
    try:
        layer = PackedLinear(weight, bias)
        row = torch.randn(1, weight.shape[1], generator=torch.Generator().manual_seed(0))
        row = row.to(weight.dtype)
        tolerance = 1e-3 if weight.dtype == torch.float32 else 3e-2
        expected = F.linear(row, weight, bias).float()
        got = layer(row).float()
        if got.shape == expected.shape and torch.allclose(
            got, expected, rtol=tolerance, atol=tolerance
        ):
            return layer
        log.warning("oneDNN packed linear layer disagrees with F.linear: keeping the layers plain")
    except (RuntimeError, AttributeError) as e:
        log.warning("oneDNN packing failed (%s): keeping the linear layers plain", e)
    return None


PACKED, INPUT_MAJOR = "packed", "input-major"
LINEAR_LAYOUT_ENV = "TIERMESH_LINEAR_LAYOUT"  # listed with the others in services/common/env.py
LINEAR_LAYOUTS = ("auto", PACKED, INPUT_MAJOR)
# rows per product the choice is timed at: one decoding stream, and a batch of them
TIMED_ROWS = (1, 16)


def time_layouts(
    out_features: int, in_features: int, dtype: torch.dtype, rounds: int = 5
) -> dict[str, float]:
    """Microseconds one product of each layout takes on this host (CPU), summed over
    TIMED_ROWS rows: a random (out, in) layer, the two layouts timed in turn within each round
    so a neighbour's load falls on both, the best round of each kept."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    layers: dict[str, Linear] = {
        PACKED: PackedLinear(weight, None),
        INPUT_MAJOR: PlainLinear(weight.t().contiguous().t(), None),
    }
    inputs = [torch.randn(rows, in_features, generator=generator).to(dtype) for rows in TIMED_ROWS]
    best = {name: float("inf") for name in layers}
    with torch.inference_mode():
        for _ in range(rounds):
            for name, layer in layers.items():
                started = time.perf_counter()
                for _ in range(4):
                    for x in inputs:
                        layer(x)
                best[name] = min(best[name], (time.perf_counter() - started) / 4 * 1e6)
    return best


def faster_layout(timings: Mapping[str, float]) -> str:
    """The layout with the lower time (packed on a tie: it was the earlier default)."""
    return INPUT_MAJOR if timings[INPUT_MAJOR] < timings[PACKED] else PACKED


@dataclass(frozen=True)
class LayoutChoice:
    """Which layout a model's linear layers take, and why (for the log and the bench)."""

    layout: str  # PACKED or INPUT_MAJOR
    why: str  # "measured", "TIERMESH_LINEAR_LAYOUT", or why packing is not there
    timings_us: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """`layout (why)`, e.g. "input-major (measured)" (what `bench engine` reports)."""
        return f"{self.layout} ({self.why})"


def asked_layout() -> str:
    """TIERMESH_LINEAR_LAYOUT: `auto` (the default: the faster of the two, timed at start-up),
    `packed` (oneDNN) or `input-major` (F.linear); raises ConfigError for anything else."""
    value = os.environ.get(LINEAR_LAYOUT_ENV, "auto").strip().lower() or "auto"
    if value not in LINEAR_LAYOUTS:
        raise ConfigError(
            f"{LINEAR_LAYOUT_ENV}={value!r}: expected one of {', '.join(LINEAR_LAYOUTS)}"
        )
    return value


# the timed matrix keeps the layer's input width and at most this many weights (16 MiB in
# float32), so timing a large model's layer costs milliseconds and no large temporaries
TIMED_MAX_WEIGHTS = 1 << 22


def choose_layout(weight: torch.Tensor, shape: tuple[int, int]) -> LayoutChoice:
    """The layout for a model whose parameters are like `weight` (device, dtype) and whose
    widest linear layer is `shape` (out, in): input-major where packing is not available,
    TIERMESH_LINEAR_LAYOUT's where it is set, else the one measured faster here."""
    asked = asked_layout()  # checked everywhere, so a typo is an error on every host
    if not can_pack(weight.device, weight.dtype):
        why = (
            f"no oneDNN packing for {weight.device.type} {str(weight.dtype).removeprefix('torch.')}"
        )
        return LayoutChoice(INPUT_MAJOR, why)
    if asked != "auto":
        return LayoutChoice(asked, LINEAR_LAYOUT_ENV)
    out_features, in_features = shape
    out_features = max(1, min(out_features, TIMED_MAX_WEIGHTS // max(1, in_features)))
    try:
        timings = time_layouts(out_features, in_features, weight.dtype)
    except (RuntimeError, AttributeError) as e:
        log.warning("timing the linear layouts failed (%s): keeping them input-major", e)
        return LayoutChoice(INPUT_MAJOR, "packing failed")
    return LayoutChoice(faster_layout(timings), "measured", timings)


class LinearMaker:
    """Makes a model's linear layers in the layout of its `choice`: packed while packing works,
    else plain input-major."""

    def __init__(self, choice: LayoutChoice) -> None:
        self.choice = choice

    @classmethod
    def for_model(cls, weight: torch.Tensor, shape: tuple[int, int]) -> LinearMaker:
        """The layout `choose_layout` picks for a model like `weight` whose widest linear
        layer is `shape` (out, in)."""
        return cls(choose_layout(weight, shape))

    @property
    def pack(self) -> bool:
        return self.choice.layout == PACKED

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        """The layer y = x `weight`^T + `bias`, `weight` (out, in) (copied, not kept)."""
        if self.pack:
            layer = packed(weight, bias)
            if layer is not None:
                return layer
            # said once, in the warning: the rest stay plain too
            self.choice = LayoutChoice(INPUT_MAJOR, "packing failed its check")
        return PlainLinear(self.input_major(weight).t(), bias)

    def input_major(self, weight: torch.Tensor) -> torch.Tensor:
        """`weight` (out, in) copied as one (in, out) contiguous matrix, on huge pages on CPU."""
        numel = weight.numel()
        if weight.device.type == "cpu":
            storage = huge_pages.empty(numel, weight.dtype)
        else:
            storage = torch.empty(numel, dtype=weight.dtype, device=weight.device)
        return storage.view(weight.shape[1], weight.shape[0]).copy_(weight.t())

    @property
    def kind(self) -> str:
        """The layout and why, for the log: with the times when it was measured."""
        kind = "packed by oneDNN" if self.pack else "input-major (F.linear)"
        times = ", ".join(f"{k} {us:.0f} us" for k, us in self.choice.timings_us.items())
        return f"{kind} ({self.choice.why}{': ' + times if times else ''})"


def release(module: Any) -> None:
    """Drops a linear (or Conv1D) module's weight once a layer holds its own form of it."""
    weight = module.weight
    empty = torch.empty(0, dtype=weight.dtype, device=weight.device)
    module.weight = torch.nn.Parameter(empty, requires_grad=False)


@torch.no_grad()
def own_memory(model: Any, moving: list[torch.Tensor]) -> None:
    """Copies every parameter of `model` but those `moving` into memory of its own, so nothing
    keeps a lazy load's memory-mapped files mapped once the moving weights were copied."""
    skip = {id(weight) for weight in moving}
    for parameter in model.parameters():
        if id(parameter) not in skip:
            parameter.data = parameter.data.clone()
