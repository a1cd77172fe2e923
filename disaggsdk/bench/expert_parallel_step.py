"""The expert all-to-all of a decode step on CPU: bytes, calls and time per rank, and its share of the step.

    python -m disaggsdk.bench.expert_parallel_step [--model deepseek-r1-tiny] [--dp 2] [--tp 1]
        [--batch 1 --batch 8 --batch 32] [--warmup-steps 5] [--steps 30] [--prompt-len 32] [--mtp 0]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import time
from typing import TYPE_CHECKING, Any

from disaggsdk.engine.group_address import free_loopback_address

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.expert_parallel import ExpertDispatcher
    from disaggsdk.engine.llm_engine import LLMEngine

DEFAULT_BATCHES = (1, 8, 32)
PAGE_SIZE = 16
RANK_TIMEOUT_S = 600.0  # one rank's whole run, every batch; a hung group is killed after it


def cpu_model_name() -> str:
    """The CPU's "Model name" as ``lscpu`` prints it ("unknown" where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip()
                 for line in out.splitlines() if line.startswith("Model name:")), "unknown")


def cores_of(dp_rank: int, tp: int, num_cpus: int) -> list[int]:
    """The cores dp rank ``dp_rank`` (and its tp workers) is pinned to: its own ``tp`` where the
    machine has ``tp x dp`` of them, else they wrap around (ranks then share cores)."""
    return sorted({(dp_rank * tp + i) % num_cpus for i in range(tp)})


def _pin(cores: list[int]) -> bool:
    """Pin this process (and what it spawns later) to ``cores``; False where the OS refuses."""
    try:
        os.sched_setaffinity(0, cores)
    except (AttributeError, OSError):
        return False
    return True


def _dispatcher_of(engine: LLMEngine) -> ExpertDispatcher:
    """The rank's one dispatcher (every MoE layer of the rank holds this same object, so its counters
    are the rank's totals)."""
    dispatcher = engine.runner.tp.experts
    if dispatcher is None:
        raise RuntimeError("this engine runs without expert parallelism: no dispatcher to measure")
    return dispatcher


def _measure_batch(engine: LLMEngine, dispatcher: ExpertDispatcher | None, batch: int, prompt_len: int,
                   warmup_steps: int, steps: int, mtp_tokens: int, seed: int) -> dict[str, Any]:
    """B requests on ``engine``: prefill, warm up, measure ``steps`` decode steps, then abort them and
    step until the group (if any) is idle. Returns the per-step records and the window's totals."""
    import torch

    from disaggsdk.engine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    vocab = min(engine.arch.vocab_size, 32000)
    ids = [f"b{batch}-s{seed}-{i}" for i in range(batch)]
    # enough tokens that no request ends inside the window, whatever MTP accepts
    max_tokens = (warmup_steps + steps + 2) * (1 + mtp_tokens) + 8
    for rid in ids:
        prompt = torch.randint(0, vocab, (prompt_len,), generator=gen).tolist()
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    step_chunks: list[list[tuple[int, int]]] = []  # per step, (start_pos, num_tokens) of each chunk
    engine.on_step = lambda chunks: step_chunks.append([(c.start_pos, c.num_tokens) for c in chunks])
    try:
        engine.step()  # the prompts' step: the budget holds every prompt, so one step prefills them all
        if len(step_chunks) != 1 or sum(n for _, n in step_chunks[0]) != batch * prompt_len:
            raise RuntimeError(f"the {batch} prompts did not prefill in one step: raise max_num_batched_tokens")
        for _ in range(warmup_steps):
            engine.step()
        start = dispatcher.counters.copy() if dispatcher is not None else None
        records = []
        for _ in range(steps):
            before = dispatcher.counters.copy() if dispatcher is not None else None
            num_chunks = len(step_chunks)
            t0 = time.perf_counter()
            engine.step()
            step_s = time.perf_counter() - t0
            chunks = step_chunks[num_chunks:]
            record: dict[str, Any] = {"step_s": step_s,
                                      "num_tokens": sum(n for c in chunks for _, n in c),
                                      "num_requests": sum(len(c) for c in chunks),
                                      "decode_only": all(start_pos >= prompt_len for c in chunks for start_pos, _ in c)}
            if dispatcher is not None and before is not None:
                delta = dispatcher.counters.since(before)
                record.update(delta.counts(), payload_bytes=delta.payload_bytes, exchange_s=delta.exchange_s)
            records.append(record)
        totals = None
        if dispatcher is not None and start is not None:
            window = dispatcher.counters.since(start)
            totals = {**window.counts(), "payload_bytes": window.payload_bytes, "exchange_s": window.exchange_s}
    finally:
        engine.on_step = None
    for rid in ids:
        engine.abort(rid)
    engine.step_until_group_idle()  # in a lock-step group the others may still be measuring
    return {"steps": records, "totals": totals}


def _engine_config(tp: int, dp: int, dp_rank: int, ep: int, address: str | None, max_batch: int, prompt_len: int,
                   warmup_steps: int, steps: int, mtp_tokens: int) -> EngineConfig:
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.speculative.config import SpeculativeConfig

    tokens_per_request = prompt_len + (warmup_steps + steps + 4) * (1 + mtp_tokens) + 16
    return EngineConfig(
        tp=tp, ep=ep, dp_rank=dp_rank, dp_size=dp, group_address=address if dp > 1 else None,
        page_size=PAGE_SIZE, num_pages=max_batch * -(-tokens_per_request // PAGE_SIZE) + 16,
        max_num_seqs=max_batch, max_num_batched_tokens=max(2048, max_batch * prompt_len),
        max_model_len=tokens_per_request + 16,
        compile=False,  # an ep rank cannot compile its step (the exchange sizes buffers on the host): nor the baseline
        speculative=SpeculativeConfig("mtp", mtp_tokens) if mtp_tokens else None,
    )


def _rank_main(dp_rank: int, opts: dict[str, Any], address: str | None, results: Queue) -> None:
    """One dp rank (or, with ``opts["baseline"]``, the tp 1 engine without ep) in its own process:
    measure every batch and put ``(dp_rank, result)`` or ``(dp_rank, "error: ...")`` on ``results``."""
    try:
        import torch

        torch.set_num_threads(1)
        baseline = opts["baseline"]
        tp = 1 if baseline else opts["tp"]
        cores = cores_of(0 if baseline else dp_rank, tp, os.cpu_count() or 1)
        pinned = _pin(cores)
        from disaggsdk.engine.llm_engine import LLMEngine

        batches = opts["baseline_batches"] if baseline else opts["batches"]
        dp, ep = (1, 1) if baseline else (opts["dp"], opts["tp"] * opts["dp"])
        config = _engine_config(tp, dp, dp_rank, ep, address, max(batches), opts["prompt_len"], opts["warmup_steps"],
                                opts["steps"], opts["mtp_tokens"])
        out: dict[str, Any] = {"dp_rank": dp_rank, "cores": cores if pinned else None, "batches": {}}
        with LLMEngine(opts["model"], config) as engine, torch.inference_mode():
            dispatcher = None if baseline else _dispatcher_of(engine)
            for batch in batches:
                out["batches"][batch] = _measure_batch(engine, dispatcher, batch, opts["prompt_len"],
                                                       opts["warmup_steps"], opts["steps"], opts["mtp_tokens"],
                                                       seed=opts["seed"] + 1000 * dp_rank + batch)
        results.put((dp_rank, out))
    except BaseException as exc:  # reported to the parent (which names the rank), then raised here too
        results.put((dp_rank, f"error: {type(exc).__name__}: {exc}"))
        raise


def _run_processes(num: int, opts: dict[str, Any], address: str | None) -> list[dict[str, Any]]:
    """Start ``num`` rank processes, collect their results in rank order; kill every one still alive
    when this returns or raises (a failed rank leaves the others blocked in a collective). Not daemons:
    a rank of tp > 1 starts its tp workers."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, opts, address, results)) for r in range(num)]
    got: dict[int, dict[str, Any]] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while len(got) < num:
            try:
                rank, value = results.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the ranks did not finish in {RANK_TIMEOUT_S:.0f} s") from None
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got]
                if dead:
                    raise RuntimeError(f"rank {dead[0]} exited with code {procs[dead[0]].exitcode}") from None
                continue
            if isinstance(value, str):
                raise RuntimeError(f"rank {rank}: {value}")
            got[rank] = value
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return [got[r] for r in range(num)]


def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step figures of one rank over the window: byte and call means, time medians, and the share."""
    step_s = [r["step_s"] for r in records]
    out: dict[str, Any] = {"step_ms_median": round(1e3 * statistics.median(step_s), 4),
                           "step_ms_mean": round(1e3 * statistics.mean(step_s), 4)}
    if "exchange_s" in records[0]:
        exchange_s = [r["exchange_s"] for r in records]
        for name in ("payload_bytes", "dispatch_payload_bytes", "combine_payload_bytes", "metadata_bytes",
                     "local_bytes", "rows_sent", "num_all_to_all_calls"):
            out[f"{name}_per_step"] = statistics.mean(r[name] for r in records)
        out["exchange_ms_median"] = round(1e3 * statistics.median(exchange_s), 4)
        out["exchange_ms_mean"] = round(1e3 * statistics.mean(exchange_s), 4)
        out["exchange_share"] = round(sum(exchange_s) / sum(step_s), 4)  # of the window's wall time
    return out


def _sim_prediction(model: str, tp: int, dp: int, batch: int, mtp_tokens: int, weight_dtype: str) -> dict[str, Any]:
    """The simulator's all-to-all of one decode step of this shape (uniform routing), as a rank's mean."""
    from disaggsdk.models import resolve_model
    from disaggsdk.sim.all_to_all import all_to_all_bytes_per_step, wire_dtype

    instance_tokens = dp * batch * (1 + mtp_tokens)  # each request verifies its drafts with its last token
    # with MTP: the layer fills its KV over the step's tokens, then chains the other drafts one token a request
    passes = (instance_tokens,) + (dp * batch,) * (mtp_tokens - 1) if mtp_tokens else ()
    traffic = all_to_all_bytes_per_step(resolve_model(model), tp, dp, tp * dp, instance_tokens,
                                        activation_dtype=wire_dtype(weight_dtype), mtp_pass_tokens=passes)
    return {"payload_bytes_per_step": traffic.payload_bytes,
            "dispatch_payload_bytes_per_step": traffic.dispatch_payload_bytes,
            "combine_payload_bytes_per_step": traffic.combine_payload_bytes,
            "metadata_bytes_per_step": traffic.metadata_bytes, "local_bytes_per_step": traffic.local_bytes,
            "num_all_to_all_calls_per_step": traffic.num_all_to_all_calls, "num_moe_layers": traffic.num_moe_layers,
            "routing": "uniform", "activation_dtype": wire_dtype(weight_dtype)}


def run_bench(model: str = "deepseek-r1-tiny", dp: int = 2, tp: int = 1, batches: tuple[int, ...] = DEFAULT_BATCHES,
              warmup_steps: int = 5, steps: int = 30, prompt_len: int = 32, mtp_tokens: int = 0, seed: int = 0,
              baseline: bool = True) -> dict[str, Any]:
    """Measure the instance's decode steps at every batch (per rank) and the tp 1 baseline.

    Returns:
        The JSON-ready result (the module doc says what each part is).
    Raises:
        ValueError: a shape the bench does not run (ep must exceed 1, batches and steps positive).
        RuntimeError: a rank failed or hung (its message names it); no process is left behind.
    """
    from disaggsdk.engine.config import EngineConfig

    if tp * dp < 2:
        raise ValueError(f"--tp {tp} x --dp {dp} gives ep {tp * dp}: expert parallelism needs at least 2 ranks")
    if min(batches) < 1 or steps < 1 or warmup_steps < 0 or prompt_len < 1 or mtp_tokens < 0:
        raise ValueError("--batch, --steps and --prompt-len must be >= 1, --warmup-steps and --mtp >= 0")
    batches = tuple(sorted(set(batches)))
    opts = {"model": model, "tp": tp, "dp": dp, "batches": batches, "prompt_len": prompt_len,
            "warmup_steps": warmup_steps, "steps": steps, "mtp_tokens": mtp_tokens, "seed": seed, "baseline": False,
            "baseline_batches": tuple(sorted({b for batch in batches for b in (batch, dp * batch)}))}
    load_before = os.getloadavg()
    ranks = _run_processes(dp, opts, free_loopback_address() if dp > 1 else None)
    # after the instance, alone on the machine: the same model, tp 1, every expert, one core
    base = _run_processes(1, {**opts, "baseline": True}, None)[0] if baseline else None
    weight_dtype = EngineConfig().weight_dtype
    result: dict[str, Any] = {
        "bench": "expert_parallel_step", "model": model, "tp": tp, "dp": dp, "ep": tp * dp, "mtp_tokens": mtp_tokens,
        "prompt_len": prompt_len, "warmup_steps": warmup_steps, "steps": steps, "threads_per_rank": 1,
        "dtype": weight_dtype, "cpu_model": cpu_model_name(), "num_cpus": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()], "batches": [],
    }
    for batch in batches:
        entry: dict[str, Any] = {
            "batch_per_rank": batch, "instance_batch": dp * batch,
            "ranks": [{"dp_rank": r["dp_rank"], "cores": r["cores"], **_summary(r["batches"][batch]["steps"]),
                       "window_totals": r["batches"][batch]["totals"], "steps": r["batches"][batch]["steps"]}
                      for r in ranks],
            "sim": _sim_prediction(model, tp, dp, batch, mtp_tokens, weight_dtype),
        }
        if base is not None:
            entry["baseline_tp1_no_ep"] = {
                "cores": base["cores"],
                "at_batch": {"batch": batch, **_summary(base["batches"][batch]["steps"])},
                "at_instance_batch": {"batch": dp * batch, **_summary(base["batches"][dp * batch]["steps"])},
            }
        result["batches"].append(entry)
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print JSON."""
    parser = argparse.ArgumentParser(prog="python -m disaggsdk.bench.expert_parallel_step",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="deepseek-r1-tiny", help="an MoE catalog model (qwen3-coder-tiny too)")
    parser.add_argument("--dp", type=int, default=2, help="lock-step dp ranks, one process each")
    parser.add_argument("--tp", type=int, default=1, help="tp ranks of each dp rank (ep = tp x dp)")
    parser.add_argument("--batch", type=int, action="append", help="decoding requests per dp rank (repeatable; "
                        f"default {' '.join(map(str, DEFAULT_BATCHES))})")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="measured decode steps per batch")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--mtp", type=int, default=0, help="MTP draft tokens per step (0: off)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-baseline", action="store_true", help="skip the tp 1 engine without ep")
    args = parser.parse_args(argv)
    result = run_bench(args.model, args.dp, args.tp, tuple(args.batch or DEFAULT_BATCHES), args.warmup_steps,
                       args.steps, args.prompt_len, args.mtp, args.seed, baseline=not args.no_baseline)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
