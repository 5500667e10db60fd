"""What asking vLLM for each token's log-probability costs: offline `LLM.generate` of one batch
with and without `logprobs=0`, alternated over rounds, tokens/s of each (run it with .venv-vllm's
python: `.venv-vllm/bin/python scripts/vllm_logprobs_cost.py --model models/smollm2-135m`)."""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder")
    parser.add_argument("--streams", type=int, default=64, help="prompts in the batch")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens of each answer")
    parser.add_argument("--rounds", type=int, default=2, help="each setting this many times")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=2048,
        enforce_eager=True,
        max_num_seqs=args.streams,
    )
    prompts = [
        f"Write story number {n} about a dragon who learns to cook." for n in range(args.streams)
    ]
    for round_ in range(1, args.rounds + 1):
        for logprobs in (None, 0):
            params = SamplingParams(
                max_tokens=args.max_tokens,
                temperature=0.0,
                ignore_eos=True,
                logprobs=logprobs,
                detokenize=False,
            )
            started = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - started
            tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
            print(
                f"round {round_}, logprobs={logprobs}: {tokens / seconds:.1f} tokens/s "
                f"({tokens} tokens in {seconds:.2f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
