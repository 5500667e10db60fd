"""A FAKE of the slice of `tensorrt_llm`'s LLM API the TensorRT-LLM engine uses.

It mirrors the documented shapes (LLM(model=..., kv_cache_config=..., max_batch_size=...),
generate_async(..., streaming=True) yielding RequestOutput with outputs[0] a CompletionOutput
carrying text / token_ids / logprobs / finish_reason and the text_diff / token_ids_diff
increments, RequestOutput.abort()). It runs no model: its tokens are the prompt's ids
reversed. It is never coverage of the real package, which needs an NVIDIA GPU.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class FakeKvCacheConfig:
    free_gpu_memory_fraction: float | None = None
    max_tokens: int | None = None


@dataclass
class FakeSamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    logprobs: int | None = None


@dataclass
class FakeCompletionOutput:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    _last_text: int = 0
    _last_ids: int = 0

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_ids :]


class FakeRequestOutput:
    """Async-iterable like TensorRT-LLM's streaming result; one token per iteration."""

    def __init__(self, prompt_ids: list[int], params: FakeSamplingParams, tokens_per_step: int):
        self.prompt_token_ids = prompt_ids
        self.outputs = [FakeCompletionOutput()]
        self.finished = False
        self.aborted = False
        self._plan = list(reversed(prompt_ids))[: params.max_tokens]
        self._params = params
        self._per_step = tokens_per_step

    def abort(self) -> None:
        self.aborted = True

    def __aiter__(self) -> FakeRequestOutput:
        return self

    async def __anext__(self) -> FakeRequestOutput:
        completion = self.outputs[0]
        if self.finished or self.aborted:
            raise StopAsyncIteration
        await asyncio.sleep(0.001)
        completion._last_text, completion._last_ids = (
            len(completion.text),
            len(completion.token_ids),
        )
        for _ in range(self._per_step):
            if len(completion.token_ids) == len(self._plan):
                break
            token = self._plan[len(completion.token_ids)]
            completion.token_ids.append(token)
            completion.text += f"<{token}>"
            completion.logprobs.append(-0.5)
        if len(completion.token_ids) == len(self._plan):
            self.finished = True
            short = len(self._plan) == self._params.max_tokens
            completion.finish_reason = "length" if short else "stop"
        return self


class FakeLLM:
    instances: ClassVar[list[FakeLLM]] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model = model
        self.kwargs = kwargs
        self.requests: list[FakeRequestOutput] = []
        self.shut_down = False
        FakeLLM.instances.append(self)

    def generate_async(
        self, inputs: list[int], sampling_params: FakeSamplingParams, streaming: bool = False
    ) -> FakeRequestOutput:
        assert streaming, "the engine must stream"
        output = FakeRequestOutput(list(inputs), sampling_params, tokens_per_step=2)
        self.requests.append(output)
        return output

    def shutdown(self) -> None:
        self.shut_down = True
