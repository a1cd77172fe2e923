"""Offline engine throughput on one model directory: ours (LLMEngine) or vLLM (LLM.generate).

Usage: python tools/peers/engine_side_by_side.py {ours|vllm} MODEL_DIR OUT_JSON [--threads N] [--dtype float32]
16 prompts x 128 random ids (seed 1234), 64 greedy tokens each, ignore_eos; one warm-up pass, then 3
timed passes; the fastest counts. Prints one JSON line; OUT_JSON keeps the token ids for comparison.
"""

import json
import random
import sys
import time


def prompts() -> list[list[int]]:
    random.seed(1234)
    return [[random.randrange(3, 512) for _ in range(128)] for _ in range(16)]


def run_vllm(model_dir: str, dtype: str) -> tuple[list[float], list[list[int]]]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model_dir, dtype=dtype, max_model_len=2048, seed=0)
    sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    reqs = [TokensPrompt(prompt_token_ids=p) for p in prompts()]
    llm.generate(reqs, sp, use_tqdm=False)
    times = []
    outs = []
    for _ in range(3):
        start = time.perf_counter()
        outs = llm.generate(reqs, sp, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return times, [list(o.outputs[0].token_ids) for o in outs]


def run_ours(model_dir: str, dtype: str, threads: int) -> tuple[list[float], list[list[int]]]:
    import torch

    torch.set_num_threads(threads)
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams

    ps = prompts()
    config = EngineConfig(page_size=16, num_pages=16 * 13 + 16, max_num_batched_tokens=2048, dtype=dtype,
                          compile_in_background=False)  # measured compiled from the first request
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    times = []
    outs = []
    with LLMEngine(model_dir, config) as engine, torch.inference_mode():
        engine.generate(ps, params)
        for _ in range(3):
            start = time.perf_counter()
            outs = engine.generate(ps, params)
            times.append(time.perf_counter() - start)
    return times, [list(o.output_ids) for o in outs]


def main() -> None:
    who, model_dir, out = sys.argv[1:4]
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
    dtype = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "float32"
    times, tokens = run_vllm(model_dir, dtype) if who == "vllm" else run_ours(model_dir, dtype, threads)
    ntok = sum(len(t) for t in tokens)
    res = {"who": who, "dtype": dtype, "threads": threads, "times_s": [round(t, 3) for t in times],
           "out_tok_per_s": round(ntok / min(times), 1)}
    with open(out, "w") as f:
        json.dump({**res, "tokens": tokens}, f)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
