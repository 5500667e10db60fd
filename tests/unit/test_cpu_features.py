"""cpu_features: the flags read from a cpuinfo file as Linux writes it, and the dtype chosen
from them."""

from __future__ import annotations

from pathlib import Path

from services.common.cpu_features import cpu_flags, fastest_cpu_dtype

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512bw {extra}
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512bw {extra}
"""
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm bf16 i8mm\nCPU implementer\t: 0x41\n"


def _cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_native_bfloat16_is_chosen_where_the_cpu_has_it(tmp_path: Path) -> None:
    flags = cpu_flags(_cpuinfo(tmp_path, X86.format(extra="avx512_bf16 avx512_vnni")))
    assert {"avx2", "avx512_bf16", "avx512_vnni"} <= flags
    assert fastest_cpu_dtype(flags) == (
        "bfloat16",
        "the CPU computes bfloat16 natively (avx512_bf16)",
    )
    amx = cpu_flags(_cpuinfo(tmp_path, X86.format(extra="amx_tile amx_bf16 avx512_bf16")))
    assert fastest_cpu_dtype(amx)[1].endswith("(avx512_bf16, amx_bf16)")


def test_float32_elsewhere(tmp_path: Path) -> None:
    avx512 = cpu_flags(_cpuinfo(tmp_path, X86.format(extra="")))
    assert "avx512f" in avx512
    assert fastest_cpu_dtype(avx512)[0] == "float32"
    arm = cpu_flags(_cpuinfo(tmp_path, ARM))
    assert "asimd" in arm and fastest_cpu_dtype(arm)[0] == "float32"
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert fastest_cpu_dtype(frozenset())[0] == "float32"
