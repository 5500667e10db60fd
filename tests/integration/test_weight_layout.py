"""The Llama-family linear layers prepared for the pooled passes, on tiny seeded checkpoints
(tied Llama, Llama with biases on every projection, Qwen2 with an untied head): after `prepare`
each layer holds its own linear layers (oneDNN-packed when asked to) that compute what the
module's weights did, the modules' own weights are released, the head is packed too (a tied
one apart from a plain copy the embedding lookup reads), and the pooled passes decode what
`generate` gives on the same checkpoint loaded as it is; GPT-2's blocks get packed layers too.
Also the plain input-major kernels (the path of GPUs, of CPUs without oneDNN, and of CPUs where
they measure faster: there a tied head stays one matrix with the lookup), the measured choice
between the two, and the huge-page allocation the plain kernels use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from services.common.errors import ConfigError
from services.tier import gpt2_pooled, huge_pages, linear_kernels, llama_pooled
from services.tier.model_loading import load_causal_lm
from services.tier.pooled_models import PooledPasses, layout_extra_bytes, pooled_passes
from services.tier.tokenizer_loading import encode_prompt
from tests.engine_prompts import PROMPTS
from tests.tiny_llama import build_variant

VARIANTS: dict[str, dict[str, Any]] = {
    "llama-tied": {},
    "llama-biased": {"attention_bias": True, "mlp_bias": True, "seed": 4},
    "qwen2-untied": {"model_type": "qwen2", "tie_word_embeddings": False, "seed": 2},
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def llama_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Path:
    return build_variant(request.param, VARIANTS, tmp_path_factory, tiny_model_dir)


def _generate(model: Any, ids: list[int], steps: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=None,
        )
    return [int(t) for t in out[0, len(ids) :]]


def _pooled_greedy(
    passes: PooledPasses, model: Any, prompts: list[list[int]], steps: int
) -> list[list[int]]:
    """`steps` greedy tokens for each prompt, decoded together through the pooled passes."""
    pool = passes.create_pool(model, len(prompts), 128)
    slots = list(range(len(prompts)))
    tokens = passes.prefill(model, pool, pool.prefill_batch(slots, prompts)).argmax(-1).tolist()
    rows = [[t] for t in tokens]
    for _ in range(steps - 1):
        tokens = passes.decode_step(model, pool, slots, tokens).argmax(-1).tolist()
        for row, token in zip(rows, tokens, strict=True):
            row.append(token)
    return rows


@pytest.fixture
def packed_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiers pack their linear layers whatever this host measures faster."""
    monkeypatch.setenv(linear_kernels.LINEAR_LAYOUT_ENV, "packed")


def test_prepared_layers_compute_what_the_modules_did_and_release_their_weights(
    llama_dir: Path, packed_layout: None
) -> None:
    model = load_causal_lm(llama_dir).model
    blocks = model.model.layers
    x = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = [
            (
                torch.cat(
                    [b.self_attn.q_proj(x), b.self_attn.k_proj(x), b.self_attn.v_proj(x)], -1
                ),
                torch.cat([b.mlp.gate_proj(x), b.mlp.up_proj(x)], -1),
                b.mlp.down_proj(b.mlp.up_proj(x)),
            )
            for b in blocks
        ]
        head = model.lm_head(x)
    embeddings = model.model.embed_tokens.weight.detach().clone()
    passes = pooled_passes(model, 64)
    assert not isinstance(passes, str)
    passes.prepare(model)
    layers = model.tiermesh_layers
    assert all(isinstance(layer.o, linear_kernels.PackedLinear) for layer in layers)
    with torch.inference_mode():
        for layer, (qkv, gate_up, mlp) in zip(layers, expected, strict=True):
            torch.testing.assert_close(layer.qkv(x), qkv, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(layer.gate_up(x), gate_up, rtol=1e-4, atol=1e-5)
            up = layer.gate_up(x)[:, layer.intermediate :]
            torch.testing.assert_close(layer.down(up), mlp, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model.tiermesh_head(x), head, rtol=1e-4, atol=1e-5)
    for block in blocks:
        for linear in (block.self_attn.q_proj, block.self_attn.o_proj, block.mlp.down_proj):
            assert linear.weight.numel() == 0  # released: the layer holds its own form
    lookup = model.model.embed_tokens.weight
    torch.testing.assert_close(lookup, embeddings, rtol=0, atol=0)  # the same numbers
    assert isinstance(model.tiermesh_head, linear_kernels.PackedLinear)  # tied or not
    assert model.lm_head.weight.numel() == 0
    assert lookup.is_contiguous()  # (vocab, C): a lookup reads one row
    # a tied head's second copy counts in what the tier reports it holds
    copy = lookup.numel() * lookup.element_size() if model.config.tie_word_embeddings else 0
    assert layout_extra_bytes(model) == copy
    prepared = model.tiermesh_layers
    passes.prepare(model)  # a second call changes nothing
    assert model.tiermesh_layers is prepared


def test_gpt2_blocks_get_packed_layers_that_compute_what_conv1d_did(
    tiny_model_dir: Path, packed_layout: None
) -> None:
    model = load_causal_lm(tiny_model_dir).model
    x = torch.randn(2, model.config.n_embd, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected = [(b.attn.c_attn(x), b.mlp.c_proj(b.mlp.c_fc(x))) for b in model.transformer.h]
    passes = pooled_passes(model, 64)
    assert not isinstance(passes, str)
    passes.prepare(model)
    with torch.inference_mode():
        for layer, (attn, mlp) in zip(model.tiermesh_layers, expected, strict=True):
            assert isinstance(layer.attn, linear_kernels.PackedLinear)
            torch.testing.assert_close(layer.attn(x), attn, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(layer.mlp_proj(layer.fc(x)), mlp, rtol=1e-4, atol=1e-5)
    for block in model.transformer.h:
        assert block.attn.c_attn.weight.numel() == block.mlp.c_proj.weight.numel() == 0


def test_plain_kernels_are_input_major_on_huge_pages() -> None:
    weight = torch.randn(1536, 576, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(1536, generator=torch.Generator().manual_seed(3))
    kernels = linear_kernels.LinearMaker(linear_kernels.LayoutChoice("input-major", "asked"))
    layer = kernels.linear(weight, bias)
    assert isinstance(layer, linear_kernels.PlainLinear)
    assert layer.weight.t().is_contiguous()  # (in, out) storage
    assert layer.weight.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    x = torch.randn(2, 576, generator=torch.Generator().manual_seed(4))
    expected = torch.nn.functional.linear(x, weight, bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)  # summed another way


def test_prepared_model_decodes_what_generate_gives_on_the_checkpoint_as_loaded(
    llama_dir: Path,
) -> None:
    reference = load_causal_lm(llama_dir)
    model = load_causal_lm(llama_dir).model
    passes = pooled_passes(model, 128)
    assert not isinstance(passes, str)
    passes.prepare(model)
    prompts = [encode_prompt(reference.tokenizer, p) for p in PROMPTS[:3]]
    for ids, row in zip(prompts, _pooled_greedy(passes, model, prompts, 12), strict=True):
        assert row == _generate(reference.model, ids, 12)


def test_without_packing_a_tied_head_is_the_lookups_own_matrix_input_major(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llama_dir = build_variant("llama-tied", VARIANTS, tmp_path_factory, tiny_model_dir)
    monkeypatch.setattr(linear_kernels, "can_pack", lambda device, dtype: False)
    reference = load_causal_lm(llama_dir)
    model = load_causal_lm(llama_dir).model
    passes = pooled_passes(model, 128)
    assert not isinstance(passes, str)
    passes.prepare(model)
    lookup = model.model.embed_tokens.weight
    assert isinstance(model.tiermesh_head, linear_kernels.PlainLinear)
    assert model.tiermesh_head.weight is lookup and lookup.t().is_contiguous()  # held once
    assert layout_extra_bytes(model) == 0
    assert all(isinstance(layer.o, linear_kernels.PlainLinear) for layer in model.tiermesh_layers)
    prompt = encode_prompt(reference.tokenizer, PROMPTS[0])
    assert _pooled_greedy(passes, model, [prompt], 12) == [_generate(reference.model, prompt, 12)]


def test_layers_asked_input_major_are_plain_and_decode_what_generate_gives(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(linear_kernels.LINEAR_LAYOUT_ENV, "input-major")
    reference = load_causal_lm(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir).model
    passes = pooled_passes(model, 128)
    assert not isinstance(passes, str)
    passes.prepare(model)
    choice = model.tiermesh_linear_layout
    assert (choice.layout, choice.why) == (
        linear_kernels.INPUT_MAJOR,
        linear_kernels.LINEAR_LAYOUT_ENV,
    )
    for layer in model.tiermesh_layers:
        for linear in (layer.attn, layer.proj, layer.fc, layer.mlp_proj):
            assert isinstance(linear, linear_kernels.PlainLinear)
            assert linear.weight.t().is_contiguous()  # (in, out) storage
    prompts = [encode_prompt(reference.tokenizer, p) for p in PROMPTS[:2]]
    for ids, row in zip(prompts, _pooled_greedy(passes, model, prompts, 12), strict=True):
        assert row == _generate(reference.model, ids, 12)


def test_auto_layout_is_the_one_measured_faster_on_this_host(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(linear_kernels.LINEAR_LAYOUT_ENV, raising=False)
    model = load_causal_lm(tiny_model_dir).model
    passes = pooled_passes(model, 64)
    assert not isinstance(passes, str)
    passes.prepare(model)
    choice = model.tiermesh_linear_layout
    timings = choice.timings_us
    assert choice.why == "measured"
    assert set(timings) == {linear_kernels.PACKED, linear_kernels.INPUT_MAJOR}
    assert all(0 < us < 1e6 for us in timings.values())
    assert choice.layout == linear_kernels.faster_layout(timings)
    kind = (
        linear_kernels.PackedLinear
        if choice.layout == linear_kernels.PACKED
        else linear_kernels.PlainLinear
    )
    assert all(isinstance(layer.fc, kind) for layer in model.tiermesh_layers)


def test_the_faster_layout_wins_and_a_tie_keeps_packing() -> None:
    faster = linear_kernels.faster_layout
    assert faster({"packed": 101.0, "input-major": 71.0}) == "input-major"
    assert faster({"packed": 43.0, "input-major": 89.0}) == "packed"
    assert faster({"packed": 50.0, "input-major": 50.0}) == "packed"


def test_an_unknown_layout_asked_for_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(linear_kernels.LINEAR_LAYOUT_ENV, "blocked")
    with pytest.raises(ConfigError, match=r"TIERMESH_LINEAR_LAYOUT='blocked'.*auto, packed"):
        linear_kernels.asked_layout()
    weight = torch.zeros(4, 4)
    with pytest.raises(ConfigError):
        linear_kernels.choose_layout(weight, (16, 4))


def test_huge_page_tensors_start_on_a_huge_page_and_small_ones_are_plain() -> None:
    numel = 3 * huge_pages.HUGE_PAGE_BYTES // 4
    tensor = huge_pages.empty(numel, torch.float32)
    assert tensor.shape == (numel,) and tensor.dtype == torch.float32
    assert tensor.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    tensor.fill_(1.5)
    assert float(tensor.sum()) == 1.5 * numel
    # The request is what the code controls: the kernel marks the mapping "hg" (VM_HUGEPAGE).
    # Whether the first touch then got 2 MiB pages depends on free contiguous memory at that
    # moment (a loaded machine falls back to 4 KiB pages), so that is not asserted.
    kernel_has_thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    assert ("hg" in _vm_flags(tensor.data_ptr())) == kernel_has_thp
    assert ("hg" in _vm_flags(tensor.data_ptr() + numel * 4 - 1)) == kernel_has_thp
    small = huge_pages.empty(1000, torch.bfloat16)
    assert small.shape == (1000,) and small.dtype == torch.bfloat16 and small._base is None


def _vm_flags(address: int) -> list[str]:
    """VmFlags of the mapping of this process that holds `address`, from smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_passes_rms_norm_is_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = torch.Generator().manual_seed(6)
    norm = LlamaRMSNorm(576, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576, generator=generator))
    norm = norm.to(dtype)
    x = (3 * torch.randn(8, 576, generator=generator)).to(dtype)
    with torch.inference_mode():
        assert torch.equal(llama_pooled._norm((norm.weight, norm.variance_epsilon), x), norm(x))


def test_gpt2_activation_runs_as_one_kernel_within_an_ulp_of_transformers() -> None:
    from transformers.activations import ACT2FN

    generator = torch.Generator().manual_seed(7)
    x = 4 * torch.randn(64, 1536, generator=generator)
    for name in ("gelu_new", "gelu_pytorch_tanh"):
        act = ACT2FN[name]
        fused = gpt2_pooled.fused_activation(act)
        assert fused is not act  # replaced by the one-kernel tanh GELU
        with torch.inference_mode():
            expected, got = act(x), fused(x)
        # one ulp of the value, or two of 1.0 near zero (where 1 + tanh(...) cancels)
        eps = torch.finfo(torch.float32).eps
        tolerance = torch.where(expected.abs() >= 1.0, eps * expected.abs(), 2 * eps)
        assert ((got - expected).abs() <= tolerance).all()
    relu = ACT2FN["relu"]
    assert gpt2_pooled.fused_activation(relu) is relu  # anything else is kept as it is
