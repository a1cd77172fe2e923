"""Engine throughput against transformers on the same random checkpoint and prompts.

    python -m disaggsdk.bench.engine_bench [--model qwen3-coder-tiny] [--num-prompts 16]
        [--input-len 128] [--output-len 64] [--tp 1] [--layout HND] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

HF_CONFIG = {"qwen3": "Qwen3Config", "qwen3_moe": "Qwen3MoeConfig", "deepseek_v3": "DeepseekV3Config"}


def make_checkpoint(model: str, directory: str, seed: int = 0) -> Any:
    """Save a random float32 transformers model of the catalog config ``model``; return it."""
    import torch
    import transformers

    from disaggsdk.models import catalog_config

    config = catalog_config(model)
    hf_config = getattr(transformers, HF_CONFIG[config["model_type"]])(**config)
    torch.manual_seed(seed)
    net = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    net.generation_config.eos_token_id = None
    net.save_pretrained(directory)
    return net


def run_bench(model: str, num_prompts: int, input_len: int, output_len: int, tp: int = 1,
              layout: str = "HND", seed: int = 0, repeats: int = 3) -> dict[str, Any]:
    """Time the engine and transformers on the same prompts.

    The two sides take turns ``repeats`` times and the fastest run counts (for transformers, the
    fastest run of each prompt), so a busy machine slows neither side's figure more than the other's.

    Returns:
        A dict with tokens/s of each (output tokens / wall time) and the speedup.
    """
    import torch

    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (input_len,), generator=gen).tolist() for _ in range(num_prompts)]
    with tempfile.TemporaryDirectory() as directory:
        hf = make_checkpoint(model, directory, seed)
        config = EngineConfig(tp=tp, layout=layout, page_size=16,
                              num_pages=num_prompts * -(-(input_len + output_len) // 16) + 16,
                              max_num_batched_tokens=max(2048, input_len),
                              compile_in_background=False)  # timed compiled from the first request
        params = SamplingParams(max_tokens=output_len, ignore_eos=True)
        with LLMEngine(directory, config) as engine, torch.inference_mode():
            engine.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
            hf.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
            engine_s = float("inf")
            hf_best = [float("inf")] * num_prompts
            # the sides take turns, so a burst of load elsewhere hits both rather than one
            for _ in range(repeats):
                t0 = time.perf_counter()
                outs = engine.generate(prompts, params)
                engine_s = min(engine_s, time.perf_counter() - t0)
                hf_tokens = hf_same = 0
                for i, (p, o) in enumerate(zip(prompts, outs)):
                    t0 = time.perf_counter()
                    seq = hf.generate(torch.tensor([p]), max_new_tokens=output_len, min_new_tokens=output_len,
                                      do_sample=False, pad_token_id=0)[0, input_len:].tolist()
                    hf_best[i] = min(hf_best[i], time.perf_counter() - t0)
                    hf_tokens += len(seq)
                    hf_same += seq == o.output_ids
        engine_tokens = sum(len(o.output_ids) for o in outs)
        hf_s = sum(hf_best)
    return {
        "model": model, "tp": tp, "layout": layout, "num_prompts": num_prompts, "input_len": input_len,
        "output_len": output_len, "threads": torch.get_num_threads(), "repeats": repeats,
        "engine_s": round(engine_s, 3), "engine_tok_s": round(engine_tokens / engine_s, 1),
        "transformers_s": round(hf_s, 3), "transformers_tok_s": round(hf_tokens / hf_s, 1),
        "speedup": round((engine_tokens / engine_s) / (hf_tokens / hf_s), 2),
        "prompts_with_identical_tokens": hf_same,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print JSON."""
    parser = argparse.ArgumentParser(prog="python -m disaggsdk.bench.engine_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-coder-tiny")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--layout", default="HND", choices=("HND", "NHD"))
    parser.add_argument("--seed", type=int, default=0)
    # One intra-op thread by default: on a shared machine OpenMP threads spin against other
    # processes and timings swing tenfold; both sides run with the same setting either way.
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for both sides")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side; the fastest counts")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from disaggsdk.records.host_cpu import host_cpu

    result = run_bench(args.model, args.num_prompts, args.input_len, args.output_len, args.tp, args.layout,
                       args.seed, args.repeats)
    print(json.dumps(result | {"cpu": host_cpu().as_json()}))  # every figure says where it was taken
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
