"""Where one prefill's time goes, ours (LLMEngine) or vLLM's (LLM.generate), on one model directory.

Usage: python tools/peers/prefill_profile.py {ours|vllm} MODEL_DIR [--tokens 1024] [--dtype float32]
       [--threads 1] [--rounds 10]

Times `--rounds` prefills of `--tokens` random ids (one request, max_tokens=1, prefix caching off:
each prompt is new), then records 3 more under torch's profiler and splits their time by kind of
kernel, from the profiler's trace (self time of each op: its time minus the ops it called):

- ``gemm``: the projections: aten::mm / addmm / linear (MKL's sgemm, or oneDNN for bfloat16), vLLM's
  ``_C::onednn_mm`` (oneDNN with the weight prepacked at load), our AMX kernel;
- ``attention``: ours ``disaggsdk::attention`` (native/cpu_attention/causal_prefill.c for a fresh
  prompt), vLLM's ``_C::cpu_attention_with_kv_cache``;
- ``kv_write``: writing the new K and V into the paged cache (index_put, vLLM's reshape_and_cache);
- ``fused_elementwise``: what the compiled step's own generated code does (torch.compile / inductor:
  norms, rotary embedding, activation, residual adds): the self time of the compiled graph's call;
- ``other_ops``: every other op; ``outside_ops``: the prefill's wall time no op accounts for (Python,
  scheduling, sampling, and for vLLM the hop between its front end and engine processes).

The first two kinds name the kernels that ran (``kernels``). With ``--shapes`` the profiler also
records input shapes and ``calls`` lists, per GEMM or attention op and input shapes, the calls and
ms per prefill (shape recording adds a little time of its own: compare the split without it).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import statistics
import tempfile
import time
from collections import defaultdict

KINDS = {  # op name -> kind; matched exactly, then by the prefixes below
    "aten::mm": "gemm", "aten::addmm": "gemm", "aten::linear": "gemm", "aten::bmm": "gemm",
    "_C::onednn_mm": "gemm", "disaggsdk::amx_linear": "gemm", "mkldnn::_linear_pointwise": "gemm",
    "mkl::_mkl_linear": "gemm",
    "disaggsdk::attention": "attention", "_C::cpu_attention_with_kv_cache": "attention",
    "vllm::unified_attention_with_output": "attention",
    "aten::index_put_": "kv_write", "aten::_index_put_impl_": "kv_write",
    "_C::cpu_attn_reshape_and_cache": "kv_write", "vllm::unified_kv_cache_update": "kv_write",
}
PREFIXES = (("## Call CompiledFxGraph", "fused_elementwise"), ("aten::", "other_ops"), ("_C::", "other_ops"),
            ("vllm::", "other_ops"), ("disaggsdk::", "other_ops"), ("mkldnn::", "other_ops"))


def kind_of(name: str) -> str | None:
    """The kind an op's self time counts under; None for a span that is not an op (a Python
    function, a step annotation: its time counts only through the ops inside it)."""
    if name in KINDS:
        return KINDS[name]
    return next((kind for prefix, kind in PREFIXES if name.startswith(prefix)), None)


def self_times_ms(trace_events: list[dict], by_shape: bool = False) -> dict[str, float]:
    """Self time (ms) of every complete ("X") CPU event by name: its duration minus its direct
    children's on the same thread (events nest by time). ``by_shape``: keyed by name and input
    dims (``name [dims]``) instead, for a trace recorded with shapes."""
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in trace_events:
        if e.get("ph") == "X" and "dur" in e and e.get("cat") in ("cpu_op", "user_annotation", "python_function", None):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    self_us: dict[str, float] = defaultdict(float)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [event, children's total us]
        for e in events:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                done, children = stack.pop()
                self_us[_key(done, by_shape)] += done["dur"] - children
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0])
        for done, children in stack:
            self_us[_key(done, by_shape)] += done["dur"] - children
    return {name: us / 1e3 for name, us in self_us.items()}


def _key(event: dict, by_shape: bool) -> str:
    dims = event.get("args", {}).get("Input Dims") if by_shape else None
    return event["name"] if dims is None else f"{event['name']} {json.dumps(dims, separators=(',', ':'))}"


def call_counts(trace_events: list[dict]) -> dict[str, int]:
    """How many complete CPU op events each ``name [dims]`` has in a trace recorded with shapes."""
    counts: dict[str, int] = defaultdict(int)
    for e in trace_events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            counts[_key(e, True)] += 1
    return counts


def calls_by_shape(trace_events: list[dict], prefills: int) -> dict[str, dict[str, float]]:
    """Per GEMM or attention op and input shapes: calls and self ms per prefill, largest first."""
    counts = call_counts(trace_events)
    rows = {key: {"calls": round(counts[key] / prefills, 2), "ms": round(ms / prefills, 3)}
            for key, ms in self_times_ms(trace_events, by_shape=True).items()
            if kind_of(key.split(" ", 1)[0]) in ("gemm", "attention") and key in counts}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["ms"]))


def split(self_ms: dict[str, float], prefills: int, wall_ms: float) -> dict:
    """Per-prefill ms and shares of each kind, and the ops behind gemm and attention."""
    per_kind: dict[str, float] = defaultdict(float)
    kernels: dict[str, dict[str, float]] = {"gemm": {}, "attention": {}}
    for name, ms in self_ms.items():
        kind = kind_of(name)
        if kind is None:
            continue
        per_kind[kind] += ms / prefills
        if kind in kernels and ms / prefills >= 0.05:
            kernels[kind][name] = round(ms / prefills, 2)
    per_kind["outside_ops"] = max(0.0, wall_ms - sum(per_kind.values()))
    return {"ms": {k: round(v, 2) for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])},
            "share": {k: round(v / wall_ms, 3) for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])},
            "kernels": kernels}


def read_trace(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def prompts(n: int, tokens: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, 512) for _ in range(tokens)] for _ in range(n)]


def profile_ours(model_dir: str, args: argparse.Namespace) -> tuple[list[float], list[dict]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(args.threads)
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams

    # compiled, as a unit runs it (and only the compiled step calls attention as the graph op the split names)
    config = EngineConfig(page_size=16, num_pages=args.tokens // 16 + 16, max_num_batched_tokens=max(2048, args.tokens),
                          dtype=args.dtype, prefix_caching=False, compile=True,
                          compile_in_background=False)  # the profile is of the compiled step
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    ps = prompts(args.rounds + 5, args.tokens)
    times = []
    with LLMEngine(model_dir, config) as engine, torch.inference_mode():
        engine.generate([ps[0]], params)  # warm-up: compiles the long-step graph
        for p in ps[1:args.rounds + 1]:
            start = time.perf_counter()
            engine.generate([p], params)
            times.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes) as prof:
            for p in ps[args.rounds + 1:args.rounds + 4]:
                engine.generate([p], params)
        path = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(path)
    return times, read_trace(path)


def profile_vllm(model_dir: str, args: argparse.Namespace) -> tuple[list[float], list[dict]]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    out_dir = tempfile.mkdtemp()
    llm = LLM(model=model_dir, dtype=args.dtype, max_model_len=max(2048, args.tokens + 16), seed=0,
              enable_prefix_caching=False,
              profiler_config={"profiler": "torch", "torch_profiler_dir": out_dir, "torch_profiler_with_stack": False,
                               "torch_profiler_record_shapes": args.shapes})
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    ps = [TokensPrompt(prompt_token_ids=p) for p in prompts(args.rounds + 5, args.tokens)]
    llm.generate([ps[0]], params, use_tqdm=False)
    times = []
    for p in ps[1:args.rounds + 1]:
        start = time.perf_counter()
        llm.generate([p], params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    llm.start_profile()
    for p in ps[args.rounds + 1:args.rounds + 4]:
        llm.generate([p], params, use_tqdm=False)
    llm.stop_profile()
    traces = sorted(glob.glob(os.path.join(out_dir, "*.pt.trace.json*")), key=os.path.getsize)
    return times, read_trace(traces[-1])  # the engine worker's trace (the front end's is smaller)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("who", choices=["ours", "vllm"])
    parser.add_argument("model_dir")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1, help="our torch threads (vLLM picks its own)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shapes", action="store_true", help="also record input shapes: per-shape GEMM and attention calls")
    args = parser.parse_args()
    times, events = (profile_ours if args.who == "ours" else profile_vllm)(args.model_dir, args)
    wall_ms = statistics.median(times) * 1e3
    print(json.dumps({"who": args.who, "tokens": args.tokens, "dtype": args.dtype,
                      "threads": args.threads if args.who == "ours" else None,
                      "prefill_ms": {"median": round(wall_ms, 2), "min": round(min(times) * 1e3, 2)},
                      **split(self_times_ms(events), 3, wall_ms),
                      **({"calls": calls_by_shape(events, 3)} if args.shapes else {})}))


if __name__ == "__main__":
    main()
