"""Published deployments the simulator is held to, each figure with its source.

A `PublishedCase` is one deployment a public source measured: its spec files under ``specs/published/``
(whose comments cite the source and justify every setting), the workload the source states (or the one
chosen where it states none, said why in the spec), and its figures. A `PublishedFigure` is one number or
claim: what was measured, the value or bound, how a simulated value is judged against it (`Comparison`),
where it was published, and how AIConfigurator, the peer tool, predicts it where it can.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import attrs

from disaggsdk.sim.aiconfigurator_peer import AicDefault, AicEstimate

# about: within TOLERANCE of the published number; above / below: the simulated value on the stated side
# of a bound ("> 90 tok/s", "< 50 tok/s").
Comparison = Literal["about", "above", "below"]
TOLERANCE = 0.25  # the accepted gap: every throughput figure within +-25% of the published one
Layout = Literal["disaggregated", "colocated"]


class PublishedRow(TypedDict):
    """One figure as `disaggsdk simulate --published --json` prints it (`published_run.FigureResult.to_json`)."""

    name: str  # the case
    metric: str
    unit: str
    claim: str  # the source's words
    comparison: Comparison
    published: float
    simulated: float | None
    error: float | None  # simulated / published - 1; None for a claim ("> 90") or nothing simulated
    holds: bool
    aiconfigurator: float | None  # its prediction; None where it did not run or cannot predict the case
    aiconfigurator_note: str | None
    sources: dict[str, str]  # kernel kind -> database table or roofline
    detail: str  # how the simulated number came about, in words
    load: str  # the load model the case was simulated under (open loop, closed loop, phase steps), in words
    source: str  # the citation
    spec: str  # the spec file, from the repository's root


@attrs.frozen
class Citation:
    """Where a figure was published."""

    title: str
    url: str
    date: str
    where: str  # the section, table or sentence that states the number

    def __str__(self) -> str:
        return f"{self.title} ({self.date}), {self.where}: {self.url}"


# workloads: what the simulator runs for a case

@attrs.frozen
class ServingLoad:
    """Poisson arrivals at ``request_rate`` for ``duration_s``, fixed lengths, as `disaggsdk simulate` serves
    them; the spec's disaggregated layout and its colocated twin see the same arrivals."""

    request_rate: float
    input_len: int
    output_len: int
    duration_s: float = 600.0

    @property
    def load_model(self) -> str:
        """The load model, in words (`simulate --published` names it for every figure)."""
        return f"open loop: Poisson arrivals at {self.request_rate:g} QPS"


@attrs.frozen
class PhaseSteps:
    """Each phase alone at the batch the source ran, the other phase unlimited: one prefill step of
    ``prefill_tokens_per_rank`` tokens on every rank (whole prompts of ``input_len``), and one decode step of
    ``decode_seqs_per_rank`` sequences on every rank, each with ``decode_context_len`` tokens of KV and
    ``output_len`` tokens to go (what the KV pool reserves for it)."""

    input_len: int
    prefill_tokens_per_rank: int
    decode_seqs_per_rank: int
    decode_context_len: int
    output_len: int

    @property
    def load_model(self) -> str:
        """The load model, in words (`simulate --published` names it for every figure)."""
        return "no serving load: one step of each phase at the source's batch"


@attrs.frozen
class ConcurrencySweep:
    """AIPerf's fixed concurrency, swept, for the spec and its baseline. At a concurrency of N, N clients in a
    closed loop (`workload.ClosedLoop`: each sends its next request when its previous one finished) send
    ``requests_per_client`` x N requests to the idle deployment, as AIPerf's ``--concurrency N --request-count
    10N`` measures after its warm-up requests have finished. For each layout and figure, the most output tokens/s
    per GPU among the concurrencies tried whose mean TTFT and TPOT meet the figure's SLA (`GoodputGain`); the
    concurrencies tried double from ``start_concurrency`` while the SLA holds, to ``max_concurrency`` at most, then
    bisect the bracket to the highest concurrency that meets it (`disaggsdk.sim.tune.highest_count`)."""

    input_len: int
    output_len: int
    requests_per_client: int = 10
    start_concurrency: int = 1
    max_concurrency: int = 1024

    @property
    def load_model(self) -> str:
        """The load model, in words (`simulate --published` names it for every figure)."""
        return (f"closed loop: fixed concurrency (AIPerf --concurrency N, {self.requests_per_client} x N requests), "
                f"N swept per layout")


Workload = ServingLoad | PhaseSteps | ConcurrencySweep


# measures: which simulated quantity a figure is

@attrs.frozen
class TokensPerRequest:
    """Mean tokens/s per request (1 / mean TPOT, as `disaggsdk bench` reports it) in ``layout``."""

    layout: Layout


@attrs.frozen
class TtftPenalty:
    """Mean TTFT disaggregated minus mean TTFT colocated on the same GPUs and arrivals, ms."""


@attrs.frozen
class PrefillThroughput:
    """Prompt tokens per second per node of the prefill instance, in the workload's prefill step."""


@attrs.frozen
class DecodeThroughput:
    """Output tokens per second per node of the decode instance, in the workload's decode step."""


@attrs.frozen
class GoodputGain:
    """Output tokens/s per GPU of the spec over its baseline's, each at the load that gives the most while its
    mean TTFT is at most ``ttft_ms`` and its mean TPOT at most ``tpot_ms``."""

    ttft_ms: float
    tpot_ms: float


Measure = TokensPerRequest | TtftPenalty | PrefillThroughput | DecodeThroughput | GoodputGain


@attrs.frozen
class RecordedPrediction:
    """AIConfigurator's prediction of a figure as recorded when this table was written (the docs page shows
    it; the command runs the peer itself where it is installed): its value, or None with the reason."""

    value: float | None
    note: str


@attrs.frozen
class PublishedFigure:
    """One published number or claim."""

    metric: str  # what it is, in words
    unit: str
    value: float  # the published number, or the bound of an above/below claim
    comparison: Comparison
    claim: str  # as the source states it
    citation: Citation
    measure: Measure
    aiconfigurator: AicDefault | AicEstimate | None = None  # how the peer predicts it, where it can
    aiconfigurator_recorded: RecordedPrediction | None = None

    def error(self, simulated: float | None) -> float | None:
        """simulated / published - 1 for a number; None for a bound's claim or no simulated value."""
        if simulated is None or self.comparison != "about":
            return None
        return simulated / self.value - 1

    def holds(self, simulated: float | None) -> bool:
        """A number within `TOLERANCE` of the published one; a claim on its stated side of the bound."""
        if simulated is None:
            return False
        if self.comparison == "above":
            return simulated > self.value
        if self.comparison == "below":
            return simulated < self.value
        error = self.error(simulated)
        return error is not None and abs(error) <= TOLERANCE


@attrs.frozen
class PublishedCase:
    """One published deployment: its spec (a file under ``specs/published/``), workload and figures."""

    name: str
    title: str
    spec: str
    workload: Workload
    figures: tuple[PublishedFigure, ...]
    baseline_spec: str | None = None  # the layout a `GoodputGain` is measured against, simulated colocated
    not_modelled: tuple[str, ...] = ()  # what the deployment does that neither the spec nor the simulator says


# the cases

_SEED = Citation(
    title="disaggsdk's design, the reference deployment numbers it is measured against (the seed)",
    url="docs/architecture.md",
    date="the project's seed",
    where="\"mixed prefill/decode could not hold more than ~50 tokens/s per request; with one prefill node feeding "
          "three decode nodes, >90 tokens/s per request at ~1 QPS per decode node, for ~100 ms of extra TTFT. With "
          "data-parallel decode (8 ranks of one GPU per node), ~50 tokens/s at 1 QPS per rank\" (they match Perplexity's "
          "\"Disaggregated Prefill and Decode\", Aug 1, 2025, https://www.perplexity.ai/hub/blog/disaggregated-prefill-"
          "and-decode, which we could read only in part)",
)
_SEED_PEER = RecordedPrediction(None, "the seed states request rates; AIConfigurator estimates a step at a stated "
                                      "batch or searches layouts under an SLA, neither of which the seed gives")
_LMSYS = "Deploying DeepSeek with PD Disaggregation and Large-scale Expert Parallelism on 96 H100 GPUs (LMSYS blog)"
_LMSYS_URL = "https://lmsys.org/blog/2025-05-05-large-scale-ep/"
_DYNAMO = Citation(
    title="Advanced Disagg Perf Tuning, NVIDIA Dynamo's Qwen3-32B-FP8 recipe guide (ai-dynamo/dynamo PR #4655)",
    url="https://github.com/ai-dynamo/dynamo/blob/main/recipes/qwen3-32b-fp8/aic_based_disagg_perf_tuning.md",
    date="Nov 27, 2025",
    where="Case Study, Conclusion: Qwen3-32B-FP8 on 8 x H200 (TRT-LLM), ISL 4,000 / OSL 500, >= 60 tok/s per user, "
          "prefix caching off",
)
_DYNAMO_TPOT_MS = 1000 / 60  # >= 60 tok/s per user

CASES: tuple[PublishedCase, ...] = (
    PublishedCase(
        name="seed-r1-tp8",
        title="DeepSeek-R1, tp=8 prefill node feeding 3 tp=8 decode nodes, 8 x H200 each (the seed)",
        spec="seed_r1_tp8.yaml",
        workload=ServingLoad(request_rate=3.0, input_len=2048, output_len=256),
        figures=(
            PublishedFigure("tokens/s per request, disaggregated", "tok/s", 90.0, "above",
                            ">90 tok/s per request at ~1 QPS per decode node", _SEED,
                            TokensPerRequest("disaggregated"), aiconfigurator_recorded=_SEED_PEER),
            PublishedFigure("TTFT over colocated", "ms", 100.0, "about",
                            "~100 ms of extra TTFT", _SEED, TtftPenalty(), aiconfigurator_recorded=_SEED_PEER),
            PublishedFigure("tokens/s per request, colocated", "tok/s", 50.0, "below",
                            "mixed prefill/decode could not hold more than ~50 tok/s per request", _SEED,
                            TokensPerRequest("colocated"), aiconfigurator_recorded=_SEED_PEER),
        ),
        not_modelled=("MTP speculative decoding, if the seed's deployment drafted (it does not say)",
                      "the prefill-to-decode hand-off's own latency (bootstrap, transfer completion, the decode "
                      "side's polling): only the KV bytes over the NICs are priced",
                      "the seed's colocated load: at 3 QPS over 4 nodes a colocated node spends ~8% of its time in "
                      "prefill steps, too little to halve tokens/s per request; the seed does not state the load "
                      "its colocated figure was measured at. A closed loop at the same throughput (8 clients, "
                      "3.0-3.2 QPS) gives the same picture: 105 tok/s per request disaggregated, 107 colocated, "
                      "TTFT 21 ms over colocated; colocated falls under 50 only past ~64 clients (11.8 QPS), where "
                      "disaggregated falls with it"),
    ),
    PublishedCase(
        name="seed-r1-dp8",
        title="DeepSeek-R1, tp=8 prefill node feeding a decode node of 8 data-parallel ranks (EP8), H200 (the seed)",
        spec="seed_r1_dp8.yaml",
        workload=ServingLoad(request_rate=8.0, input_len=2048, output_len=256),
        figures=(
            PublishedFigure("tokens/s per request, disaggregated", "tok/s", 50.0, "about",
                            "~50 tok/s at 1 QPS per rank, 8 ranks a node", _SEED,
                            TokensPerRequest("disaggregated"), aiconfigurator_recorded=_SEED_PEER),
        ),
        not_modelled=("expert load imbalance across the 8 ranks: the tables time balanced routing and the case "
                      "states none (1.0)",
                      "MTP speculative decoding, if the seed's deployment drafted (it does not say)"),
    ),
    PublishedCase(
        name="lmsys-r1-96xh100",
        title="DeepSeek-V3/R1, prefill 4 nodes (DP32, EP32) and decode 9 nodes (DP72, EP72) of 8 x H100, SGLang",
        spec="lmsys_r1_96xh100.yaml",
        workload=PhaseSteps(input_len=2000, prefill_tokens_per_rank=16384, decode_seqs_per_rank=256,
                            decode_context_len=2000, output_len=100),
        figures=(
            PublishedFigure(
                "input tokens/s per prefill node", "tok/s", 52_300.0, "about",
                "52.3k input tokens per second per node for 2,000-token inputs (4 nodes, EP32)",
                Citation(_LMSYS, _LMSYS_URL, "May 5, 2025",
                         "opening and Conclusion (the Evaluation section gives 54,543 tok/s per node for 2K prompts)"),
                PrefillThroughput(),
                aiconfigurator=AicEstimate(model_path="deepseek-ai/DeepSeek-R1", system="h100_sxm", backend="sglang",
                                           mode="static_ctx", isl=2000, osl=1, batch_size=8, tp=1, dp=32, etp=1, ep=32),
                aiconfigurator_recorded=RecordedPrediction(
                    31_683.5, "cli estimate static_ctx, bs 8 per rank (16,000 tokens), EP32: TTFT 4,040 ms"),
            ),
            PublishedFigure(
                "output tokens/s per decode node", "tok/s", 22_300.0, "about",
                "22.3k output tokens per second per node (9 nodes, EP72; 22,282 at batch 256 per device, KV 2,000)",
                Citation(_LMSYS, _LMSYS_URL, "May 5, 2025", "Evaluation, the decode table (SGLang Default)"),
                DecodeThroughput(),
                aiconfigurator=AicEstimate(model_path="deepseek-ai/DeepSeek-R1", system="h100_sxm", backend="sglang",
                                           mode="static_gen", isl=2000, osl=100, batch_size=256, tp=1, dp=72, etp=1,
                                           ep=72),
                aiconfigurator_recorded=RecordedPrediction(
                    None, "cli estimate static_gen at EP72 stops: \"Cross-node EP requires DeepEP A2A data\" (its "
                          "multi-node DeepEP tables stop at 8 nodes); at EP64 it gives 17,323 tok/s per node"),
            ),
        ),
        not_modelled=(
            "two-batch overlap of attention with DeepEP dispatch/combine (SGLang --enable-two-batch-overlap)",
            "EPLB with 32 redundant experts (288 over 72 ranks; the spec partitions 256) and the expert imbalance "
            "it leaves: the tables time balanced routing",
            "data-parallel dense FFN and LM head (--moe-dense-tp-size 1, --enable-dp-lm-head): tp=1 ranks give the "
            "same here",
            "per-role engine settings: the prefill budget (16,384 tokens per device) is the workload's, not the "
            "spec's",
        ),
    ),
    PublishedCase(
        name="dynamo-qwen3-32b-fp8",
        title="Qwen3-32B-FP8 on 8 x H200: 4 prefill (tp=1) + 2 decode (tp=2) against 4 aggregated tp=2 workers",
        spec="dynamo_qwen3_32b_fp8_disagg.yaml",
        baseline_spec="dynamo_qwen3_32b_fp8_agg.yaml",
        # the guide's measurements are AIPerf runs at a fixed concurrency (the recipe's perf.yaml: --concurrency N,
        # --request-count 10 x N, after N warm-up requests), the concurrency tuned per deployment to the SLA
        workload=ConcurrencySweep(input_len=4000, output_len=500),
        figures=(
            PublishedFigure(
                "tok/s per GPU, disaggregated over aggregated, TTFT <= 600 ms", "x", 2.48, "about",
                "under TTFT constraint of 600 ms, disagg delivers a 148% tps/gpu perf gain over agg", _DYNAMO,
                GoodputGain(ttft_ms=600.0, tpot_ms=_DYNAMO_TPOT_MS),
                aiconfigurator=AicDefault(model_path="Qwen/Qwen3-32B-FP8", system="h200_sxm", backend="trtllm",
                                          total_gpus=8, isl=4000, osl=500, ttft_ms=600.0, tpot_ms=16.67),
                aiconfigurator_recorded=RecordedPrediction(
                    1.2531, "cli default, trtllm: disagg 762.98 (4 x tp1 prefill + 1 x tp4 decode, bs 128) over agg "
                            "608.86 (2 x tp4, bs 40) tok/s per GPU"),
            ),
            PublishedFigure(
                "tok/s per GPU, disaggregated over aggregated, TTFT <= 1200 ms", "x", 2.02, "about",
                "under TTFT constraint of 1200 ms, disagg delivers a 102% tps/gpu perf gain over agg", _DYNAMO,
                GoodputGain(ttft_ms=1200.0, tpot_ms=_DYNAMO_TPOT_MS),
                aiconfigurator=AicDefault(model_path="Qwen/Qwen3-32B-FP8", system="h200_sxm", backend="trtllm",
                                          total_gpus=8, isl=4000, osl=500, ttft_ms=1200.0, tpot_ms=16.67),
                aiconfigurator_recorded=RecordedPrediction(
                    1.1542, "cli default, trtllm: disagg 762.98 (4 x tp1 prefill + 1 x tp4 decode, bs 128) over agg "
                            "661.05 (4 x tp2, bs 24) tok/s per GPU"),
            ),
        ),
        not_modelled=(
            "TRT-LLM's kernels: the h200 profile's tables are SGLang 0.5.14's (one profile per GPU kind); with "
            "TRT-LLM 1.3.0rc20's own tables in their place the gains are 1.52 and 1.29 under the same concurrency "
            "sweep, so the kernels are not what the figure misses",
            "per-role scheduler settings: the recipe's prefill workers run without the overlap scheduler "
            "(disable_overlap_scheduler: true), its decode and aggregated workers with it; the profile's overlap "
            "applies to all (2 ms a prefill step of ~400 ms)",
            "per-role engine settings: the prefill workers' max_batch_size 1 (one prompt a step) is not expressed; "
            "the prefill instances fill the token budget instead",
            "chunked prefill off (TRT-LLM enable_chunked_prefill: false): the simulator always chunks to the budget",
            "what holds the measured aggregated deployment to few clients: the recipe benchmarks it at 2 clients a "
            "GPU (this deployment at 6), and the guide found its TTFT 'higher than expected' (request queuing) and "
            "lowered its max_batch_size. Under the same closed loop the simulated aggregated workers queue each "
            "prompt behind whole prefill steps and stall their decodes for every step that carries one, yet meet "
            "the SLA to several times that concurrency (the figures' details): whatever makes the measured "
            "aggregated TTFT climb sooner is not modelled (candidates, none measured: TRT-LLM's scheduling of whole "
            "prompts without chunking, the front end's work per 4,000-token prompt, the recipe's round-robin "
            "router where the simulator routes to the least loaded worker)",
        ),
    ),
)


def case_names() -> list[str]:
    """The names `disaggsdk simulate --published NAME` takes, in table order."""
    return [case.name for case in CASES]
