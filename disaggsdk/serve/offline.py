"""Offline disaggregated generation: start a spec's units, run the prompts, tear everything down.

What `disaggsdk generate --spec SPEC` runs (and what a notebook can call directly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from disaggsdk.launch.tiny import LaunchError


def generate_with_spec(spec: Any, prompts: Sequence[Sequence[int]] | None = None, params: Any = None, *,
                       texts: Sequence[str] = (), tiny: bool = False, colocated: bool = False,
                       provider: str | None = None, timeout_s: float = 600.0,
                       on_event: Any = None) -> dict[str, Any]:
    """Run prompts through prefill -> KV transfer -> decode on local processes.

    Args:
        spec: a `Spec`.
        prompts: token ids of each prompt (after ``texts``, which are tokenized first).
        params: one `SamplingParams` for all prompts.
        texts: prompts as text (the model's tokenizer adds BOS).
        tiny: run a GPU spec with its tiny model on the CPU.
        colocated: every instance mixed, no KV transfer (the baseline).
        provider: override the spec's libfabric provider.
        timeout_s: limit for the whole batch.
        on_event: start-up / failure line callback (stderr when None).
    Returns:
        ``{"model", "units", "outputs": [{"prompt_ids", "token_ids", "finish_reason", "text"?,
        "instance", "error"?}], "transfer": {unit: {...}}}``.
    Raises:
        LaunchError: the deployment cannot start, or a request fails.
    """
    from disaggsdk.engine.sampling import SamplingParams
    from disaggsdk.serve.local import serve_locally

    params = params or SamplingParams()
    with serve_locally(spec, tiny=tiny, colocated=colocated, provider=provider, on_event=on_event) as rt:
        all_prompts = [rt.encode(t) for t in texts] + [list(p) for p in (prompts or [])]
        if not all_prompts:
            raise LaunchError("give at least one prompt")
        events = rt.generate_batch(all_prompts, params, timeout_s=timeout_s, prefix="gen")
        stats = rt.unit_stats()
        tokenizer = rt.tokenizer_or_none()
        outputs = []
        for prompt, evs in zip(all_prompts, events):
            token_ids = [t for e in evs for t in e.new_token_ids]
            item: dict[str, Any] = {"prompt_ids": prompt, "token_ids": token_ids,
                                    "finish_reason": evs[-1].finish_reason, "instance": evs[-1].instance}
            if evs[-1].error:
                item["error"] = evs[-1].error
            if tokenizer is not None:
                item["text"] = tokenizer.decode(token_ids)
            outputs.append(item)
        transfer = {
            name: {"role": s.role, "bytes": s.transfer_bytes, "writes": s.transfer_writes,
                   "transfer_s": s.transfer_s, "exposed_transfer_s": s.exposed_transfer_s,
                   "failures": s.transfer_failures, "retried": s.requests_retried,
                   # the prefix cache: prompt tokens found cached, pages and bytes a decode unit held already
                   "prefix_cache_hits": s.prefix_cache_hits, "pages_not_sent": s.pages_not_sent,
                   "bytes_not_sent": s.bytes_not_sent, "fully_cached": s.requests_fully_cached,
                   "prefilled_short": s.requests_prefilled_short}
            for name, s in stats.items()
        }
        return {"model": rt.spec.model, "units": sorted(rt.runtime.units), "outputs": outputs, "transfer": transfer}

