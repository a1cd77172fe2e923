"""Exposed KV transfer time: layer-streamed writes against the send-after-forward ablation.

For each mode the spec's deployment starts on local processes; requests of ``prompt_len``
tokens run one at a time (no queueing in the measurement), after a warm-up. Per request the
decode side measures the *exposed* transfer time: from the end of prefill's forward pass (the
timestamp prefill puts in the context payload) to the moment the decode's immediate counter
fired. Both sides read CLOCK_MONOTONIC of one machine. Measurement only: `summarize` is pure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypedDict

import attrs

if TYPE_CHECKING:
    from disaggsdk.launch.launcher.units import CpuAffinity
    from disaggsdk.records.request_transfer import RequestTransfer
    from disaggsdk.report.ttft_phases import PhaseSummary
    from disaggsdk.spec.types import Spec


class TransferSummary(TypedDict):
    """`summarize`'s answer: one mode's exposed and total transfer times (ms), per request."""

    requests: int
    mean_exposed_ms: float
    median_exposed_ms: float
    p99_exposed_ms: float
    mean_transfer_ms: float
    mean_lead_ms: float
    bytes_per_request: float
    kv_bytes_per_token: float  # KV bytes sent (the context payload left out) per prompt token sent
    writes_per_request: float


class ModeResult(TransferSummary):
    """`run_mode`'s answer: the summary and the measured requests' TTFT by phase."""

    ttft_phases: PhaseSummary


class Comparison(TypedDict):
    """`compare`'s answer (printed as JSON by ``disaggsdk kv-bench``)."""

    model: str
    kv_dtype: str
    prompt_len: int
    num_requests: int
    streaming: ModeResult
    ablation: ModeResult
    exposed_ratio: float | None  # streaming / ablation mean exposed time; None when the ablation's is 0


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def summarize(decode: Sequence[RequestTransfer], prefill: Sequence[RequestTransfer],
              context_bytes: int = 0) -> TransferSummary:
    """Statistics of per-request records (`RequestTransfer`) of one mode, times in ms.

    Args:
        decode: decode-side records (exposed_s).
        prefill: prefill-side records (bytes, writes, transfer_s, lead_s, num_tokens).
        context_bytes: bytes of the context payload each request also sends (not KV).
    Returns:
        exposed mean/median/p99, transfer mean, mean lead (first write before the forward
        ended), bytes and writes per request, and KV bytes per token sent (a partly filled last
        page travels whole, so this is a little above the format's bytes per token).
    """
    exposed = [r.exposed_s * 1e3 for r in decode]
    kv_per_token = [(r.bytes - context_bytes) / r.num_tokens for r in prefill if r.num_tokens]
    return {
        "requests": len(decode),
        "mean_exposed_ms": statistics.fmean(exposed) if exposed else 0.0,
        "median_exposed_ms": statistics.median(exposed) if exposed else 0.0,
        "p99_exposed_ms": _percentile(exposed, 99),
        "mean_transfer_ms": statistics.fmean([r.transfer_s * 1e3 for r in prefill]) if prefill else 0.0,
        "mean_lead_ms": statistics.fmean([r.lead_s * 1e3 for r in prefill]) if prefill else 0.0,
        "bytes_per_request": statistics.fmean([r.bytes for r in prefill]) if prefill else 0.0,
        "kv_bytes_per_token": statistics.fmean(kv_per_token) if kv_per_token else 0.0,
        "writes_per_request": statistics.fmean([r.writes for r in prefill]) if prefill else 0.0,
    }


def run_mode(spec: Spec, streaming: bool, prompt_len: int, num_requests: int, provider: str | None = None,
             cpu_affinity: CpuAffinity = None, on_event: Callable[[str], None] | None = None) -> ModeResult:
    """Start the deployment with ``transfer.streaming = streaming`` and measure it.

    Returns:
        `summarize` of the measured requests, and their TTFT by phase (``ttft_phases``).
    """
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.launch.launcher.supervisor import start_runtime
    from disaggsdk.messenger.context import context_bytes
    from disaggsdk.models import resolve_model
    from disaggsdk.plan.memory import num_pages_per_rank
    from disaggsdk.serve.backends.local import serve_runtime

    pages = -(-(prompt_len + 8) // spec.kv.page_size) + 2
    spec = attrs.evolve(
        spec, transfer=attrs.evolve(spec.transfer, streaming=streaming),
        engine=attrs.evolve(spec.engine, num_pages=max(min(num_pages_per_rank(spec, r) for r in spec.roles), 2 * pages),
                            max_num_batched_tokens=max(spec.engine.max_num_batched_tokens, prompt_len),
                            # every request moves its whole prompt: a cache hit would time a smaller transfer
                            prefix_caching=False),
    )
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    with serve_runtime(spec, start_runtime, provider=provider, cpu_affinity=cpu_affinity, on_event=on_event) as rt:
        vocab = 250
        rt.generate_batch([[(7 * j) % vocab + 2 for j in range(prompt_len)]], params, prefix="warmup")
        measured_from_s = time.monotonic()
        ids = []
        for i in range(num_requests):
            prompt = [(i * 13 + j * 7) % vocab + 2 for j in range(prompt_len)]
            rt.generate_batch([prompt], params, prefix=f"kvbench{i}")
            ids.append(f"kvbench{i}")
        stats = rt.unit_stats()
        phases = rt.ttft_phases(measured_from_s)
    decode = [r for s in stats.values() if s.role == "decode" for r in s.recent if r.request_id.startswith("kvbench")]
    prefill = [r for s in stats.values() if s.role == "prefill" for r in s.recent if r.request_id.startswith("kvbench")]
    arch = resolve_model(spec.model)
    return {**summarize(decode, prefill, context_bytes(arch.hidden_size, arch.vocab_size)), "ttft_phases": phases}


def compare(spec: Spec, prompt_len: int = 1024, num_requests: int = 8, provider: str | None = None,
            cpu_affinity: CpuAffinity = None, on_event: Callable[[str], None] | None = None) -> Comparison:
    """Both modes and the ratio of their mean exposed times (streaming / ablation)."""
    streaming = run_mode(spec, True, prompt_len, num_requests, provider, cpu_affinity, on_event)
    ablation = run_mode(spec, False, prompt_len, num_requests, provider, cpu_affinity, on_event)
    ratio = streaming["mean_exposed_ms"] / ablation["mean_exposed_ms"] if ablation["mean_exposed_ms"] else None
    return {"model": spec.model, "kv_dtype": spec.kv.dtype, "prompt_len": prompt_len, "num_requests": num_requests,
            "streaming": streaming, "ablation": ablation, "exposed_ratio": ratio}
