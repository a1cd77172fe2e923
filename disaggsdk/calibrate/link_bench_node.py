"""The link bench's node side: runs inside testbed node 0 (``python -m
disaggsdk.calibrate.link_bench_node CONFIG_JSON``), where the Ray cluster is reachable.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import zlib
from typing import IO, TYPE_CHECKING, Protocol, TypedDict

import attrs

from disaggsdk.bench.link_figures import (
    TCP_PAYLOAD_SHARE,
    exposed_floor_s,
    goodput_fraction,
    rate_for_ratio_mbit,
    strict_exposed_floor_s,
    wire_transfer_s,
)

if TYPE_CHECKING:
    from disaggsdk.serve.routing.router import Router
    from disaggsdk.sim.hardware import HardwareProfile
    from disaggsdk.spec.types import Spec

MAX_CPU_MEMORY_GB = 64.0  # what bench_spec may give a rank for the longest prompt's pages and workspace
VOCAB_SPAN = 250  # prompt token ids stay in [2, 252): every tiny model's vocabulary has them


class LinkBenchConfig(TypedDict):
    """What the host passes (JSON, argv[1])."""

    spec_yaml: str  # the deployment: launch.backend ray at the testbed's address, transfer.streaming ignored
    input_lens: list[int]
    ratios: list[float]  # T / C of the shaped rates
    num_prompts: int
    reference_mbit: float
    calibration_rounds: int


class LinkRow(TypedDict):
    """One (mode, prompt length, rate) group: medians over its measured requests, times in ms."""

    mode: str  # "streaming" | "after_forward"
    input_len: int
    rate_mbit: float
    reference: bool  # the reference rate's group (C and the bytes are measured there)
    requests: int
    bytes_per_request: float  # what prefill sent: KV and the context payload
    kv_bytes_per_layer: float
    compute_ms: float  # C: the prefill's forward pass
    line_transfer_ms: float  # T: bytes_per_request at the line rate, with the TCP/IP and Ethernet headers
    transfer_to_compute: float  # T / C
    exposed_ms: float  # forward end -> decode's counter fired: what the TTFT pays
    exposed_after_last_layer_ms: float  # the last layer's writes submitted -> decode's counter fired
    floor_ms: float  # streaming: max(T/L, T - C + T/L); after_forward: T
    # streaming: exposed_after_last_layer_ms / floor_ms (the floor counts from the last layer: the
    # forward's end comes a little later, after the final norm, the head and the sampling);
    # after_forward: exposed_ms / floor_ms
    exposed_over_floor: float
    strict_floor_ms: float  # streaming: max(T/L, T - C + C/L), the bound a link-bound transfer meets; after_forward: T
    exposed_over_strict_floor: float
    kv_goodput_fraction: float | None  # after_forward only: bytes / exposed as a share of the line rate
    ttft_ms: float  # the server's TTFT (router received -> first token at the router)
    ttft_penalty_ms: float  # ttft_ms minus the reference rate's, same mode and length
    sim_ttft_ms: float  # the simulator, given the group's compute and the reference's overhead (`simulated_group_ttft_s`)
    sim_penalty_ms: float
    sim_ttft_error: float  # sim_ttft_ms / ttft_ms - 1 (about 0 at the reference rate, by construction)


class LinkControl(Protocol):
    """Sets the testbed's line rate (the host does it; see the module docstring)."""

    def set_rate(self, rate_mbit: float) -> None: ...


@attrs.define
class PipeLinkControl:
    """`LinkControl` over this process's stdout (requests) and stdin (answers)."""

    requests: IO[str]
    answers: IO[str]

    def set_rate(self, rate_mbit: float) -> None:
        """Ask the host for ``rate_mbit`` and wait until it is in place.

        Raises:
            RuntimeError: the host answered with an error, or closed the pipe.
        """
        self.requests.write(json.dumps({"set_link_mbit": rate_mbit}) + "\n")
        self.requests.flush()
        answer = self.answers.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"the host did not set the link to {rate_mbit:g} Mbit/s: {answer or 'pipe closed'}")


@attrs.frozen
class GroupMeasure:
    """What one group of requests measured (medians, seconds and bytes)."""

    requests: int
    bytes_per_request: float
    compute_s: float
    exposed_s: float
    exposed_after_last_layer_s: float
    ttft_s: float


def _prompt(input_len: int, seed: int) -> list[int]:
    return [(seed * 131 + j * 7) % VOCAB_SPAN + 2 for j in range(input_len)]


def measure_group(router: Router, input_len: int, num_prompts: int, tag: str) -> GroupMeasure:
    """Send ``num_prompts`` prompts of ``input_len`` tokens one at a time (ids prefixed ``tag``)
    and read their records back from the units and the router.

    Raises:
        RuntimeError: a request has no full pair of records (prefilled on decode, or retried).
    """
    from disaggsdk.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, ignore_eos=True)
    since_s = time.monotonic()
    for i in range(num_prompts):
        events = router.generate_batch([_prompt(input_len, zlib.crc32(f"{tag}/{i}".encode()))], params, prefix=tag)[0]
        if events and events[-1].error:
            raise RuntimeError(f"{tag}: a {input_len}-token request failed: {events[-1].error}")
    phases = router.ttft_phases(since_s)
    records = [r for s in router.unit_stats().values() for r in s.recent if r.request_id.startswith(tag + "-")]
    prefill = [r for r in records if r.side == "prefill"]
    decode = [r for r in records if r.side == "decode" and not r.prefilled_locally]
    if phases["requests"] != num_prompts or len(prefill) != num_prompts or len(decode) != num_prompts:
        raise RuntimeError(f"{tag}: {phases['requests']} of {num_prompts} requests measured on both units "
                           f"({len(prefill)} prefill, {len(decode)} decode records): a transfer failed or was retried")
    last_layer_s = {r.request_id: r.last_layer_s for r in prefill}
    return GroupMeasure(requests=num_prompts, bytes_per_request=statistics.median(r.bytes for r in prefill),
                        compute_s=phases["median_ms"]["prefill_compute"] / 1e3,
                        exposed_s=statistics.median(r.exposed_s for r in decode),
                        exposed_after_last_layer_s=statistics.median(r.fired_s - last_layer_s[r.request_id]
                                                                     for r in decode),
                        ttft_s=phases["median_ms"]["server_ttft"] / 1e3)


def simulated_ttft_s(spec: Spec, profile: HardwareProfile, input_len: int, rate_mbit: float, streaming: bool) -> float:
    """The simulator's TTFT of one request alone, on ``profile`` with one NIC behind a link of ``rate_mbit``."""
    from disaggsdk.sim.simulator import SimConfig, Simulation
    from disaggsdk.sim.workload import SimRequest

    # the NIC's rate is what it carries of KV: the line rate less TCP/IP and Ethernet headers
    linked = attrs.evolve(profile, nic_gbps=rate_mbit * TCP_PAYLOAD_SHARE / 1e3, nics_per_node=1)
    config = SimConfig(linked, weight_dtype="float32", max_num_batched_tokens=spec.engine.max_num_batched_tokens,
                       streaming=streaming)
    result = Simulation(spec, config).run([SimRequest(0, 0.0, input_len, 1)])
    return float(result["mean_ttft_ms"]) / 1e3


def retimed_profile(spec: Spec, engine_profile: HardwareProfile, input_len: int, compute_s: float) -> HardwareProfile:
    """``engine_profile`` re-timed (`HardwareProfile.slowed_by`) so that the simulated prefill of
    ``input_len`` tokens takes ``compute_s``: the units share the machine's two cores with Ray, the
    link's TCP processing and each other, which the engine timing alone did not, and the shared
    VM's speed drifts from one group to the next."""
    from disaggsdk.models import resolve_model
    from disaggsdk.sim.cost_model import StepCostModel, prefill_context_pairs

    tokens = input_len - 1  # decode's first step runs the last prompt token
    cost = StepCostModel(resolve_model(spec.model), engine_profile, weight_dtype="float32", kv_dtype=spec.kv.dtype)
    return engine_profile.slowed_by(compute_s / cost.step_time_s(tokens, 1, prefill_context_pairs(tokens, 0), 0))


def fitted_overhead_ms(spec: Spec, engine_profile: HardwareProfile, input_len: int, streaming: bool,
                       reference_mbit: float, reference: GroupMeasure) -> float:
    """What the reference group's TTFT (the link costs little there) has beyond the simulated one,
    in ms and at least 0: the serving stack's handoff, which the engine timing does not see."""
    retimed = retimed_profile(spec, engine_profile, input_len, reference.compute_s)
    return max(0.0, reference.ttft_s - simulated_ttft_s(spec, retimed, input_len, reference_mbit, streaming)) * 1e3


def simulated_group_ttft_s(spec: Spec, engine_profile: HardwareProfile, overhead_ms: float, input_len: int,
                           rate_mbit: float, streaming: bool, compute_s: float) -> float:
    """The simulator's TTFT for one group: ``engine_profile`` re-timed to the group's own measured
    compute, the reference's fitted overhead added, one NIC behind the group's link. Given the
    compute, what the simulator predicts is the link's part: its error is the link model's."""
    profile = retimed_profile(spec, engine_profile, input_len, compute_s)
    profile = attrs.evolve(profile, handoff_overhead_ms=profile.handoff_overhead_ms + overhead_ms)
    return simulated_ttft_s(spec, profile, input_len, rate_mbit, streaming)


def row(spec: Spec, engine_profile: HardwareProfile, overhead_ms: float, mode: str, input_len: int, rate_mbit: float,
        reference: bool, measured: GroupMeasure, reference_row: LinkRow | None) -> LinkRow:
    """One group's figures (see `LinkRow`)."""
    from disaggsdk.messenger.context import context_bytes
    from disaggsdk.models import resolve_model

    arch = resolve_model(spec.model)
    streaming = mode == "streaming"
    transfer_s = wire_transfer_s(measured.bytes_per_request, rate_mbit)
    # the ablation sends everything after the forward: its floor is the whole transfer
    floor_s = exposed_floor_s(transfer_s, measured.compute_s, arch.num_layers) if streaming else transfer_s
    strict_s = strict_exposed_floor_s(transfer_s, measured.compute_s, arch.num_layers) if streaming else transfer_s
    judged_s = measured.exposed_after_last_layer_s if streaming else measured.exposed_s
    sim_s = simulated_group_ttft_s(spec, engine_profile, overhead_ms, input_len, rate_mbit, streaming,
                                   measured.compute_s)
    ttft_ms, sim_ms = measured.ttft_s * 1e3, sim_s * 1e3
    kv_bytes = measured.bytes_per_request - context_bytes(arch.hidden_size, arch.vocab_size)
    return {
        "mode": mode, "input_len": input_len, "rate_mbit": rate_mbit, "reference": reference,
        "requests": measured.requests, "bytes_per_request": measured.bytes_per_request,
        "kv_bytes_per_layer": kv_bytes / arch.num_layers,
        "compute_ms": measured.compute_s * 1e3, "line_transfer_ms": transfer_s * 1e3,
        "transfer_to_compute": transfer_s / measured.compute_s,
        "exposed_ms": measured.exposed_s * 1e3,
        "exposed_after_last_layer_ms": measured.exposed_after_last_layer_s * 1e3, "floor_ms": floor_s * 1e3,
        "exposed_over_floor": judged_s / floor_s,
        "strict_floor_ms": strict_s * 1e3, "exposed_over_strict_floor": judged_s / strict_s,
        "kv_goodput_fraction": (None if streaming or measured.exposed_s <= 0
                                else goodput_fraction(measured.bytes_per_request, measured.exposed_s, rate_mbit)),
        "ttft_ms": ttft_ms,
        "ttft_penalty_ms": ttft_ms - (reference_row["ttft_ms"] if reference_row else ttft_ms),
        "sim_ttft_ms": sim_ms,
        "sim_penalty_ms": sim_ms - (reference_row["sim_ttft_ms"] if reference_row else sim_ms),
        "sim_ttft_error": sim_ms / ttft_ms - 1,
    }


def bench_spec(spec: Spec, streaming: bool, input_lens: list[int]) -> Spec:
    """``spec`` for one mode: room for the longest prompt in one chunk (and the CPU memory the plan
    needs for it), no prefix cache (every request moves its whole prompt), a transfer deadline the
    slowest rate cannot reach."""
    from disaggsdk.plan.memory import spec_memory_problems

    longest = max(input_lens)
    pages = 2 * (-(-(longest + 8) // spec.kv.page_size)) + 8
    spec = attrs.evolve(
        spec, transfer=attrs.evolve(spec.transfer, streaming=streaming, deadline_s=max(spec.transfer.deadline_s, 300.0)),
        engine=attrs.evolve(spec.engine, num_pages=max(spec.engine.num_pages or 0, pages), prefix_caching=False,
                            max_num_batched_tokens=max(spec.engine.max_num_batched_tokens, longest)))
    while spec_memory_problems(spec) and spec.hardware.cpu_memory_gb < MAX_CPU_MEMORY_GB:
        spec = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, cpu_memory_gb=2 * spec.hardware.cpu_memory_gb))
    return spec


def run(config: LinkBenchConfig, link: LinkControl, log: IO[str]) -> tuple[list[LinkRow], HardwareProfile]:
    """Measure every (mode, length, rate) group; see the module docstring.

    Returns:
        the rows, and the engine profile the simulator's figures started from (before anchoring).
    """
    from disaggsdk.calibrate.engine_profile import calibrate_engine
    from disaggsdk.launch.launcher.supervisor import start_runtime
    from disaggsdk.serve.backends.local import serve_runtime
    from disaggsdk.spec import parse_spec_yaml

    base = parse_spec_yaml(config["spec_yaml"])
    log.write(f"timing the engine for the simulator ({config['calibration_rounds']} rounds)\n")
    profile, _, _ = calibrate_engine(base.model, rounds=config["calibration_rounds"])
    rates: dict[int, list[float]] = {}
    rows: list[LinkRow] = []
    for mode in ("streaming", "after_forward"):
        spec = bench_spec(base, mode == "streaming", config["input_lens"])
        log.write(f"{mode}: launching\n")
        with serve_runtime(spec, start_runtime, on_event=lambda line: print(line, file=log, flush=True)) as router:
            for input_len in config["input_lens"]:
                link.set_rate(config["reference_mbit"])
                measure_group(router, input_len, 1, f"warm-{mode}-{input_len}")
                first = measure_group(router, input_len, config["num_prompts"], f"lb-{mode}-{input_len}-ref")
                overhead_ms = fitted_overhead_ms(spec, profile, input_len, mode == "streaming", config["reference_mbit"],
                                                 first)
                reference = row(spec, profile, overhead_ms, mode, input_len, config["reference_mbit"], True, first, None)
                rows.append(reference)
                if input_len not in rates:  # from the streaming run's reference: both modes share the rates
                    rates[input_len] = [rate_for_ratio_mbit(first.bytes_per_request / TCP_PAYLOAD_SHARE, first.compute_s,
                                                            ratio)
                                        for ratio in config["ratios"]]
                for k, rate in enumerate(rates[input_len]):
                    link.set_rate(rate)
                    measured = measure_group(router, input_len, config["num_prompts"], f"lb-{mode}-{input_len}-{k}")
                    rows.append(row(spec, profile, overhead_ms, mode, input_len, rate, False, measured, reference))
                    log.write(f"{mode} {input_len} tokens at {rate:.1f} Mbit/s: exposed {rows[-1]['exposed_ms']:.1f} ms "
                              f"({rows[-1]['exposed_after_last_layer_ms']:.1f} after the last layer), "
                              f"floor {rows[-1]['floor_ms']:.1f} ms, TTFT {rows[-1]['ttft_ms']:.1f} ms "
                              f"(sim {rows[-1]['sim_ttft_ms']:.1f})\n")
                    log.flush()
    return rows, profile


def main(argv: list[str]) -> int:
    """``python -m disaggsdk.calibrate.link_bench_node CONFIG_JSON``: measure, print the result line."""
    config: LinkBenchConfig = json.loads(argv[1])
    rows, profile = run(config, PipeLinkControl(sys.stdout, sys.stdin), sys.stderr)
    engine_profile = {k: v for k, v in attrs.asdict(profile).items() if k != "sources"}
    sys.stdout.write(json.dumps({"result": rows, "engine_profile": engine_profile}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
