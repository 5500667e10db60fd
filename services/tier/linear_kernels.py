"""The linear layers of the pooled forward passes, each a callable y = x W^T + b, in the
fastest form the device has: on CPU, the weight packed once by oneDNN (torch's own
`mkldnn._reorder_linear_weight`, in the blocked layout oneDNN's kernels read fastest) and run
by `mkldnn._linear_pointwise`; elsewhere, or where packing is unavailable or fails its check,
F.linear over the weight stored input-major, (in, out) contiguous, which MKL's matrix-vector
product streams faster than transformers' (out, in) layout.

Measured on this project's CPU (2-core AMD EPYC, AVX2, one thread), a (1536, 576) float32
layer: one row 6.96 ms per 60 layers packed against 8.38 input-major; 16 rows 18.4 against
28.1; 200 rows 90 against 213. Packing is checked once per layer against F.linear on a
random row (within float tolerance); the plain weight is not kept beside the packed one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

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


class LinearMaker:
    """Makes a model's linear layers: packed while packing works, else plain input-major."""

    def __init__(self, pack: bool) -> None:
        self.pack = pack

    @classmethod
    def for_weight(cls, weight: torch.Tensor) -> LinearMaker:
        """Packing where `weight`'s device and dtype allow it."""
        return cls(can_pack(weight.device, weight.dtype))

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        """The layer y = x `weight`^T + `bias`, `weight` (out, in) (copied, not kept)."""
        if self.pack:
            layer = packed(weight, bias)
            if layer is not None:
                return layer
            self.pack = False  # said once, in the warning: the rest stay plain too
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
        return "packed by oneDNN" if self.pack else "input-major (F.linear)"


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
