"""Engine settings (`EngineConfig`) and the one path from a deployment spec to them.

A bare engine's defaults are the spec's own (`EngineSettings`, `KV`, `Spec.seed`), declared there
once: an engine built without a spec runs as a launched unit of the default spec does, except
where it says otherwise (it runs on this machine's CPU, its KV in its weights' dtype).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from disaggsdk.engine.scheduler import Mode
from disaggsdk.engine.speculative.config import SpeculativeConfig
from disaggsdk.engine.tier_settings import TierSettings
from disaggsdk.errors import DisaggError
from disaggsdk.models import ModelArch
from disaggsdk.spec.engine_settings import BARE_NUM_PAGES, HeldDtype, WeightDtype, held_dtype
from disaggsdk.spec.topology import RoleName
from disaggsdk.spec.types import Spec

_DEFAULT = Spec()  # the spec's defaults, which a bare engine's are

# what each unit role runs: a decode unit is "mixed" so it can prefill locally when no prefill
# unit is left; a prefill unit never samples and returns the hidden state for decode's context
MODE_OF_ROLE: dict[str, Mode] = {"prefill": "prefill_only", "decode": "mixed", "mixed": "mixed"}


class EngineError(DisaggError):
    """A request or engine setting the engine cannot accept."""


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings. ``kv_dtype`` None means the model's dtype."""

    tp: int = 1
    layout: str = _DEFAULT.kv.layout
    page_size: int = _DEFAULT.kv.page_size
    num_pages: int = BARE_NUM_PAGES  # from a spec: `num_pages_per_rank` (engine.num_pages, or the memory plan's)
    max_num_batched_tokens: int = _DEFAULT.engine.max_num_batched_tokens
    max_num_seqs: int = _DEFAULT.engine.max_num_seqs
    max_model_len: int | None = _DEFAULT.engine.max_model_len  # None: the model's context
    mode: Mode = "mixed"
    device: str = "cpu"  # a bare engine runs here (a spec's default device is cuda)
    dtype: WeightDtype = _DEFAULT.engine.dtype  # of the weights and activations; see `weight_dtype`
    kv_dtype: str | None = None
    seed: int = _DEFAULT.seed
    load_format: str = _DEFAULT.engine.load_format  # "dummy": seeded random weights instead of the checkpoint's
    attention_backend: str | None = None  # None: flashinfer on CUDA, the native kernel ("cpu") on CPU, else torch_ref
    return_hidden_states: bool = False  # give hidden state + logits of each step's last position
    kv_share_path: str | None = None  # tp workers send their KV pool's memfd to this Unix socket
    # compile the step (engine.compiled_step.torch_compile; CPU, tp 1); None: on unless DISAGGSDK_COMPILE=0
    compile: bool | None = _DEFAULT.engine.compile
    # compile while serving eagerly (engine.background_compile): a first token within seconds, the
    # compiled step's speed once ready; False: compile before the engine's first step (tests and
    # benchmarks that measure the compiled step from the start)
    compile_in_background: bool = True
    # bump `LLMEngine.layer_counter` after each layer: what a prefill unit's streamer waits on
    # (from_spec turns it on for prefill units); off, a step runs one counter op per layer less
    # (~60 us each in a compiled decode step)
    count_layers: bool = False
    # speculative decoding (mixed engines; prefill_only ones fill the MTP layer's KV): None is off
    speculative: SpeculativeConfig | None = None
    # vLLM's automatic prefix caching: requests share the cached pages of a common prompt prefix
    # (engine.scheduler; with MTP drafting, keyed one token further: see hash_lookahead)
    prefix_caching: bool = _DEFAULT.engine.prefix_caching
    # host, disk and store tiers below the prefix cache (kv.tiers); None: cached pages die with the pool
    tiers: TierSettings | None = None
    # expert parallelism (engine.expert_parallel): the routed experts spread over ``ep`` ranks: 1 (each
    # rank a tp slice of every expert), tp (this engine's tp ranks) or tp * dp_size (the ranks of a
    # lock-step dp group, engine.dp_lockstep: dp_size > 1 only then)
    ep: int = 1
    dp_rank: int = 0  # this engine's rank in its lock-step dp group
    dp_size: int = 1
    group_address: str | None = None  # "host:port" where a dp group's ranks meet (dp_size > 1; the launcher's)

    @property
    def lockstep(self) -> bool:
        """Whether this engine steps together with other dp ranks (engine.dp_lockstep)."""
        return self.dp_size > 1

    def check_parallel(self, arch: ModelArch) -> None:
        """Refuse a tp / ep / dp combination the engine cannot run, saying what to change.

        Raises:
            EngineError: ep on a dense model, ep other than 1, tp or tp * dp_size, a dp group
                without ep or without an address, or a dp rank outside it.
        """
        if self.ep > 1 and not arch.num_experts:
            raise EngineError(f"ep={self.ep}: {arch.name} has no routed experts to spread; use ep=1")
        if self.ep not in (1, self.tp * self.dp_size):
            raise EngineError(f"ep={self.ep} must be 1 or tp * dp_size = {self.tp} * {self.dp_size} = "
                              f"{self.tp * self.dp_size}: the experts are spread over every rank of the group")
        if self.dp_size > 1 and (self.ep == 1 or self.group_address is None):
            raise EngineError(f"dp_size={self.dp_size}: dp ranks step together only to share experts; set ep="
                              f"{self.tp * self.dp_size} and a group_address (host:port) every rank of the group is given")
        if not 0 <= self.dp_rank < self.dp_size:
            raise EngineError(f"dp_rank={self.dp_rank} is outside [0, dp_size={self.dp_size})")

    @property
    def weight_dtype(self) -> HeldDtype:
        """The dtype the weights are held in: ``dtype``, its ``auto`` resolved for ``device``."""
        return held_dtype(self.dtype, self.device)

    @classmethod
    def from_spec(cls, spec: Spec, *, tp: int, role: str, kv_share_path: str | None = None,
                  instance_role: RoleName | None = None, dp_rank: int = 0,
                  group_address: str | None = None, unit_name: str = "engine", units_on_node: int = 1) -> EngineConfig:
        """The settings of one unit of ``spec``: an instance (or dp group) of ``tp`` ranks in ``role``.

        Args:
            spec: the deployment `Spec` (its kv, engine, device and seed sections).
            tp: the unit's tensor-parallel ranks.
            role: "prefill", "decode" or "mixed".
            kv_share_path: where tp workers hand their KV pool over (units whose pools are shared).
            instance_role: the spec role whose instance the unit is (its ranks' memory sizes the KV pool,
                its ``ep`` and ``dp`` the expert parallelism); default: ``role``, and "decode" for a mixed unit.
            dp_rank: the unit's dp rank in its instance (used when the role's experts span its dp ranks).
            group_address: where those dp ranks meet ("host:port"; required then).
            unit_name: the unit's name (its disk tier's directory: a restarted unit finds its pages again).
            units_on_node: units sharing the node's host tier (`$.kv.tiers.host_gb`), evenly.
        Raises:
            EngineError: an unknown role.
            SpecError: the unit's memory leaves no KV page (``$.engine.num_pages`` unset).
        """
        if role not in MODE_OF_ROLE:
            raise EngineError(f"unknown unit role {role!r}; use one of {sorted(MODE_OF_ROLE)}")
        from disaggsdk.plan.memory import num_pages_per_rank

        sized_as: RoleName = instance_role or ("prefill" if role == "prefill" else "decode")
        shape = spec.roles[sized_as]
        dp_size = shape.dp if shape.ep > 1 else 1  # without ep, dp ranks are independent engines
        return cls(
            ep=shape.ep, dp_rank=dp_rank if dp_size > 1 else 0, dp_size=dp_size,
            group_address=group_address if dp_size > 1 else None,
            tp=tp, layout=spec.kv.layout, page_size=spec.kv.page_size, num_pages=num_pages_per_rank(spec, sized_as),
            max_num_batched_tokens=spec.engine.max_num_batched_tokens, max_num_seqs=spec.engine.max_num_seqs,
            max_model_len=spec.engine.max_model_len, mode=MODE_OF_ROLE[role], device=spec.device,
            dtype=spec.engine.dtype, kv_dtype=spec.kv.dtype, seed=spec.seed,
            return_hidden_states=role == "prefill", kv_share_path=kv_share_path, compile=spec.engine.compile,
            # a decode unit that may turn prefill (serve.autoscale) counts layers too: its KV then streams
            count_layers=role == "prefill" or (role == "decode" and spec.serve.autoscale.enabled),
            load_format=spec.engine.load_format,
            speculative=_speculative(spec, role), prefix_caching=spec.engine.prefix_caching,
            tiers=TierSettings.from_spec(spec, unit_name, units_on_node),
        )


def hash_lookahead(config: EngineConfig) -> int:
    """Tokens after a page its prefix-cache key covers: 1 with DeepSeek's MTP layer, whose KV at a
    page's last position was computed from the token after the page (two prompts that share a page
    but not that token must not share the page's MTP KV), else 0."""
    return 1 if config.speculative is not None and config.speculative.method == "mtp" else 0


def _speculative(spec: Spec, role: str) -> SpeculativeConfig | None:
    """A unit's speculation: decode and colocated units draft; a prefill unit runs the MTP layer
    over the prompt (its KV streams to decode like one more layer) and drafts nothing."""
    method = spec.speculative.method
    if method == "none" or (role == "prefill" and method != "mtp"):
        return None
    return SpeculativeConfig(method, spec.speculative.num_tokens)


def check_prompt(arch: ModelArch, config: EngineConfig, request_id: str, prompt_ids: Sequence[int], max_tokens: int) -> None:
    """Whether an engine of ``config`` for model ``arch`` can ever run the prompt (`LLMEngine.check_prompt`).

    Raises:
        EngineError: an empty prompt, a token outside the vocabulary, or prompt + max_tokens over
            the KV pool or the model's context.
    """
    if not prompt_ids:
        raise EngineError(f"{request_id}: empty prompt; give at least one token")
    bad = [t for t in prompt_ids if not 0 <= t < arch.vocab_size]
    if bad:
        raise EngineError(f"{request_id}: token ids {bad[:5]} outside the vocabulary [0, {arch.vocab_size})")
    pool_tokens = config.num_pages * config.page_size
    context = config.max_model_len or arch.max_context_tokens or pool_tokens
    max_len = min(pool_tokens, context)
    if len(prompt_ids) + max_tokens > max_len:
        what = "KV pool" if max_len == pool_tokens else "model's context"
        raise EngineError(
            f"{request_id}: prompt ({len(prompt_ids)}) + max_tokens ({max_tokens}) exceeds the {what} "
            f"of {max_len} tokens; lower max_tokens or shorten the prompt" + (
                "" if what == "model's context" else ", or raise num_pages"))
