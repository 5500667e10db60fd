"""What this machine's CPU computes natively, from /proc/cpuinfo's flags, and the weight dtype
that is fastest for a model served on it: bfloat16 where the CPU has bfloat16 dot-product
instructions, float32 elsewhere (where bfloat16 matrix products are emulated and slower).

Knows nothing of models or torch.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# x86 flags of native bfloat16 arithmetic: AVX-512 BF16 (VDPBF16PS) and AMX tiles
NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's feature flags; empty where the file is missing or has none (not
    Linux, or not x86: its "Features" line is read on ARM)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def fastest_cpu_dtype(flags: frozenset[str]) -> tuple[str, str]:
    """(dtype, why) for weights served on a CPU with `flags`."""
    native = [flag for flag in NATIVE_BFLOAT16_FLAGS if flag in flags]
    if native:
        return "bfloat16", f"the CPU computes bfloat16 natively ({', '.join(native)})"
    return "float32", "the CPU has no bfloat16 arithmetic (no avx512_bf16 or amx_bf16)"
