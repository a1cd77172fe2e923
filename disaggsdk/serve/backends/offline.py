"""Offline disaggregated generation: start a spec's units, run the prompts, tear everything down.

What `disaggsdk generate --spec SPEC` runs (and what a notebook can call directly).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NotRequired, TypedDict

import msgspec

from disaggsdk.launch.base import LaunchError

if TYPE_CHECKING:
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.spec import Spec


class SpecOutput(TypedDict):
    """One prompt's result on a launched spec."""

    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None
    instance: str  # the decode (or mixed) unit that answered
    text: NotRequired[str]  # where the model has a tokenizer
    error: NotRequired[str]  # where the request failed


class SpecRun(TypedDict):
    """What `generate_with_spec` returns (and `generate --spec --json` prints)."""

    model: str
    units: list[str]
    outputs: list[SpecOutput]
    transfer: dict[str, dict[str, object]]  # unit -> its role and every field of `UnitCounters`


def generate_with_spec(spec: Spec, prompts: Sequence[Sequence[int]] | None = None,
                       params: SamplingParams | None = None, *, texts: Sequence[str] = (), tiny: bool = False,
                       colocated: bool = False, provider: str | None = None, timeout_s: float = 600.0,
                       on_event: Callable[[str], None] | None = None) -> SpecRun:
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
        "instance", "error"?}], "transfer": {unit: {"role", every field of `UnitCounters`}}}``.
    Raises:
        LaunchError: the deployment cannot start, or a request fails.
    """
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.launch.launcher.supervisor import start_runtime
    from disaggsdk.serve.backends.local import serve_runtime

    params = params or SamplingParams()
    with serve_runtime(spec, start_runtime, tiny=tiny, colocated=colocated, provider=provider, on_event=on_event) as rt:
        all_prompts = [rt.encode(t) for t in texts] + [list(p) for p in (prompts or [])]
        if not all_prompts:
            raise LaunchError("give at least one prompt")
        events = rt.generate_batch(all_prompts, params, timeout_s=timeout_s, prefix="gen")
        stats = rt.unit_stats()
        tokenizer = rt.tokenizer_or_none()
        outputs: list[SpecOutput] = []
        for prompt, evs in zip(all_prompts, events):
            token_ids = [t for e in evs for t in e.new_token_ids]
            item: SpecOutput = {"prompt_ids": prompt, "token_ids": token_ids,
                                "finish_reason": evs[-1].finish_reason, "instance": evs[-1].instance}
            if evs[-1].error:
                item["error"] = evs[-1].error
            if tokenizer is not None:
                item["text"] = tokenizer.decode(token_ids)
            outputs.append(item)
        # every counter of each unit, under the names `UnitCounters` declares
        transfer = {name: {"role": s.role, **msgspec.structs.asdict(s.counters)} for name, s in stats.items()}
        return {"model": rt.spec.model, "units": sorted(rt.runtime.unit_roles()), "outputs": outputs, "transfer": transfer}

