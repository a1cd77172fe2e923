"""Speculative decoding against plain decoding, same engine, same prompts: acceptance and tok/s.

    python -m disaggsdk.bench.spec_bench --model deepseek-r1-tiny --method mtp --num-tokens 1
        [--batch 1 --batch 8] [--output-len 128] [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.spec.engine_settings import HeldDtype


def _timed_decode(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> tuple[float, list[list[int]]]:
    """Greedy generation of ``output_len`` tokens for every prompt at once. Returns the mean over
    requests of each one's decode time per token (from its first token to its last) and the tokens."""
    from disaggsdk.engine.sampling_params import SamplingParams

    base = f"bench-{time.monotonic_ns()}-"
    ids = [f"{base}{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=output_len, ignore_eos=True))
    first_s: dict[str, float] = {}
    last: dict[str, tuple[float, list[int]]] = {}
    while len(last) < len(ids):
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.output_ids and out.request_id not in first_s:
                first_s[out.request_id] = now
            if out.finished:
                last[out.request_id] = (now, list(out.output_ids))
    per_token_s = [(last[r][0] - first_s[r]) / max(len(last[r][1]) - 1, 1) for r in ids]
    return statistics.mean(per_token_s), [last[r][1] for r in ids]


def run_spec_bench(model: str, method: str, num_tokens: int, batches: list[int], output_len: int = 128,
                   repeats: int = 3, compile_step: bool | None = None, dtype: HeldDtype = "float32") -> dict[str, Any]:
    """The comparison for each batch size (see the module docstring)."""
    from disaggsdk.bench.code_corpus import held_out_prompts
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.engine.speculative.config import SpeculativeConfig
    from disaggsdk.engine.tokenizer import load_tokenizer
    from disaggsdk.errors import ModelError

    tok = load_tokenizer(model)
    if tok is None:
        raise ModelError(f"{model} has no tokenizer on this machine: the bench encodes text prompts")
    texts = held_out_prompts(max(batches))
    result: dict[str, Any] = {"model": model, "method": method, "num_tokens": num_tokens, "output_len": output_len,
                              "dtype": dtype, "rounds": repeats,
                              "prompt_tokens": [len(tok.encode(t)) for t in texts], "batches": []}
    for batch in batches:
        prompts = [tok.encode(t) for t in texts[:batch]]
        specs = {"plain": None, "speculative": SpeculativeConfig(method, num_tokens)}
        engines = {name: LLMEngine(model, EngineConfig(num_pages=64 * batch, compile=compile_step, speculative=spec,
                                                        dtype=dtype, compile_in_background=False))
                   for name, spec in specs.items()}
        try:
            for engine in engines.values():
                engine.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
            seconds: dict[str, list[float]] = {name: [] for name in engines}
            outputs: dict[str, list] = {}
            for r in range(repeats):
                for name in (list(engines) if r % 2 == 0 else list(reversed(engines))):
                    per_token_s, outputs[name] = _timed_decode(engines[name], prompts, output_len)
                    seconds[name].append(per_token_s)
            row: dict[str, Any] = {"batch": batch, "acceptance": engines["speculative"].spec_stats.to_json()}
        finally:
            for engine in engines.values():
                engine.close()
        for name in engines:
            row[f"{name}_tokens_per_s_per_request"] = round(1 / statistics.median(seconds[name]), 1)
        ratios = [p / s for p, s in zip(seconds["plain"], seconds["speculative"])]
        row["speedup"] = round(statistics.median(ratios), 3)
        row["round_speedups"] = [round(x, 3) for x in ratios]
        row["identical_greedy_tokens"] = outputs["plain"] == outputs["speculative"]
        result["batches"].append(row)
    return result


def main(argv: list[str] | None = None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-r1-tiny")
    p.add_argument("--method", choices=("mtp", "ngram"), default="mtp")
    p.add_argument("--num-tokens", type=int, default=1, help="drafts per step (1..4)")
    p.add_argument("--batch", type=int, action="append", help="requests at once (repeatable; default 1 and 8)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5, help="rounds of turns (the figures are medians)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="weights and KV (bfloat16 runs matmuls on oneDNN, whose cost hardly grows from 1 to 8 rows)")
    p.add_argument("--compile", choices=("on", "off", "default"), default="default",
                   help="the compiled step (default: the engine's default)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    compile_step = {"on": True, "off": False, "default": None}[a.compile]
    print(json.dumps(run_spec_bench(a.model, a.method, a.num_tokens, a.batch or [1, 8], a.output_len, a.repeats,
                                    compile_step, a.dtype), indent=1))


if __name__ == "__main__":
    main()
