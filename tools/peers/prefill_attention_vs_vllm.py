"""One prompt's causal prefill attention, our kernel against vLLM's, alone on the same shapes.

Usage, from the project root, with vLLM's venv python (it also imports our built kernel):
  PYTHONPATH=. $VLLM_VENV/bin/python tools/peers/prefill_attention_vs_vllm.py [--tokens 1024]
      [--q-heads 8 --kv-heads 2 --head-dim 32] [--threads 1 2] [--calls 20]

Ours: `engine.attention.cpu_backend.causal_prefill` over token-major q, k, v. vLLM's:
``_C::cpu_attention_with_kv_cache`` over its paged cache (block size 128, keys written by its own
``cpu_attn_reshape_and_cache`` before the timing), with its scheduler metadata built once. Prints,
per thread count, each side's best-of-3 median ms per call and the largest difference of the two
outputs (they compute the same softmax(q k^T) v).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch


def best_ms(fn, calls: int) -> float:
    fn()
    rounds = []
    for _ in range(3):
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        rounds.append(statistics.median(times))
    return min(rounds) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--q-heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--only", choices=["ours", "vllm"], default=None)
    args = parser.parse_args()
    n, hq, hkv, d = args.tokens, args.q_heads, args.kv_heads, args.head_dim
    torch.manual_seed(0)
    q, k, v = torch.randn(n, hq, d), torch.randn(n, hkv, d), torch.randn(n, hkv, d)
    scale = d ** -0.5
    rows = {}
    if args.only != "vllm":
        from disaggsdk.engine.attention.cpu_backend import causal_prefill

        starts, lens = torch.tensor([0]), torch.tensor([n])
        ours = torch.empty(n, hq, d)
        rows["ours"] = (lambda: causal_prefill(q, k, v, starts, lens, scale, ours), ours)
    if args.only != "ours":
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)

        block = 128
        blocks = -(-n // block)
        cache = torch.zeros(blocks, hkv, block * 2, d)
        key_cache, value_cache = cache.chunk(2, dim=2)
        torch.ops._C.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, torch.arange(n), "vec", 1.0, 1.0,
                                                "auto")
        qsl, seq_lens = torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32)
        table = torch.arange(blocks, dtype=torch.int32)[None]
        theirs = torch.empty(n, hq, d)

        def vllm_call(metadata):
            torch.ops._C.cpu_attention_with_kv_cache(q, key_cache, value_cache, theirs, qsl, seq_lens, scale, True,
                                                     None, -1, table, 0.0, metadata, None, None, 1.0, 1.0, "auto")

        rows["vllm"] = (vllm_call, theirs)
    result = {"tokens": n, "q_heads": hq, "kv_heads": hkv, "head_dim": d}
    for threads in args.threads:
        torch.set_num_threads(threads)
        for who, (fn, _) in rows.items():
            if who == "vllm":  # its schedule depends on the thread count: built per count, once
                metadata = torch.ops._C.get_scheduler_metadata(1, hq, hkv, d, seq_lens, torch.float32, qsl, True, -1,
                                                               "vec", False, None, "auto")
                result[f"{who}_ms_{threads}t"] = round(best_ms(functools.partial(fn, metadata), args.calls), 3)
            else:
                result[f"{who}_ms_{threads}t"] = round(best_ms(fn, args.calls), 3)
    if len(rows) == 2:
        result["max_abs_diff"] = float((rows["ours"][1] - rows["vllm"][1]).abs().max())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
