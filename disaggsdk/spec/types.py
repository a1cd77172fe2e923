"""The deployment spec: frozen attrs classes whose field names are the YAML keys.

One name per concept across YAML key, keyword argument and attribute (`tp`, `dp`, `replicas`,
`page_size`, `layout`). Each field says what it does and which single-value check it has in its
metadata (`field_checks.about`); `spec.reference` turns that into docs/spec.md and the JSON
Schema. Rules that tie fields together (tp against the model's heads, instances against node
size) live in `spec.rules`.
"""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.field_checks import (
    about,
    check_fields,
    choice,
    in_range,
    non_negative,
    positive,
    power_of_two,
)

# the front end's and the runtime's sections live beside (Spec's fields name them)
from disaggsdk.spec.serving_types import Launch, Serve

Device = Literal["cpu", "cuda"]
Layout = Literal["HND", "NHD"]
Provider = Literal["auto", "shm", "tcp", "efa", "verbs"]
KVDtype = Literal["bfloat16", "float16", "float32", "fp8"]
LoadFormat = Literal["auto", "dummy"]
SpecMethod = Literal["none", "mtp", "ngram"]

DEVICES = ("cpu", "cuda")
LAYOUTS = ("HND", "NHD")
PROVIDERS = ("auto", "shm", "tcp", "efa", "verbs")
GrantKeysSetting = Literal["auto", "on", "off"]
GRANT_KEYS_SETTINGS = ("auto", "on", "off")
KV_DTYPES = ("bfloat16", "float16", "float32", "fp8")
GPU_KINDS = ("h100", "h200", "cpu")


@attrs.frozen
class Hardware:
    """What one node offers. On `gpu: cpu` a "gpu" is a CPU rank (one process)."""

    gpu: str = attrs.field(
        default="h200",
        metadata=about("The accelerator of every node; `cpu` makes each rank one CPU process.", choice(GPU_KINDS)),
    )
    gpus_per_node: int = attrs.field(
        default=8,
        metadata=about("GPUs (on `gpu: cpu`, rank processes) per node; an instance fits one node "
                       "or spans whole nodes.", positive),
    )
    nics_per_node: int = attrs.field(
        default=8, metadata=about("RDMA NICs per node; KV pages leave a node through these.", positive)
    )
    nic_gbps: float = attrs.field(
        default=400.0, metadata=about("Line rate of one NIC in Gb/s; the planner and simulator time "
                                      "KV transfers with it.", positive)
    )

    def __attrs_post_init__(self) -> None:
        check_fields(self)


@attrs.frozen
class Role:
    """One role (prefill or decode): `replicas` instances of `tp` x `dp` ranks each."""

    replicas: int = attrs.field(default=1, metadata=about("Instances of this role.", positive))
    tp: int = attrs.field(
        default=1,
        metadata=about("Tensor-parallel ranks of one dp group; they split the attention heads and "
                       "the MLP/experts.", positive),
    )
    dp: int = attrs.field(
        default=1,
        metadata=about("Data-parallel attention ranks of one instance; each holds its own requests' "
                       "KV and is a group of `tp` ranks.", positive),
    )

    def __attrs_post_init__(self) -> None:
        check_fields(self)

    @property
    def ranks_per_instance(self) -> int:
        return self.tp * self.dp


@attrs.frozen
class KV:
    """KV cache format, shared by prefill and decode (checked again at the handshake)."""

    layout: Layout = attrs.field(
        default="HND",
        metadata=about("Order of one page's axes: `HND` is heads, tokens, head dim; `NHD` is tokens "
                       "first.", choice(LAYOUTS)),
    )
    page_size: int = attrs.field(default=16, metadata=about("Tokens per KV page.", power_of_two))
    dtype: KVDtype = attrs.field(
        default="bfloat16",
        metadata=about("Element type of the KV cache; CPU runs use `float32` to match transformers "
                       "exactly.", choice(KV_DTYPES)),
    )

    def __attrs_post_init__(self) -> None:
        check_fields(self)


@attrs.frozen
class Transport:
    """How KV pages travel between prefill and decode."""

    provider: Provider = attrs.field(
        default="auto",
        metadata=about("The libfabric provider; `auto` picks efa/verbs where present, else shm on "
                       "one node.", choice(PROVIDERS)),
    )
    same_host_copy: bool = attrs.field(
        default=True,
        metadata=about(
            "shm only: prefill units map the decode units' KV pools and copy pages with memcpy on "
            "the prefill's core (the immediates that count them still go through libfabric). "
            "false sends every byte through libfabric's shm provider, whose kernel copy runs on "
            "the decode's core at ~0.3-0.6x memcpy (native/README.md)."
        ),
    )
    stuck_after_s: float = attrs.field(
        default=5.0,
        metadata=about(
            "Seconds a unit's transport thread may stay inside one libfabric call (normally "
            "microseconds) before the unit gives up on its endpoint: it exits to be restarted, and "
            "a peer whose queue it was stuck sending to is restarted too. With shm, a process killed "
            "while holding a peer's queue lock (in shared memory) leaves that queue unusable for good.",
            positive,
        ),
    )
    grant_keys: GrantKeysSetting = attrs.field(
        default="auto",
        metadata=about(
            "Open to remote writes only the pages granted to one transfer, each run under a fresh key "
            "revoked when the transfer ends, instead of the whole KV pool under one key: a write "
            "with a captured or stale key lands nowhere. `auto`: on for tcp (reachable through "
            "sockets), off for shm (the OS user is the boundary there) and for NICs (a registration "
            "pins memory: hundreds per request). README, 'Trust boundaries'.",
            choice(GRANT_KEYS_SETTINGS),
        ),
    )
    verify_pages: bool = attrs.field(
        default=False,
        metadata=about(
            "Prefill sends a keyed digest (HMAC-SHA256 under the deployment secret) of every byte it "
            "wrote; decode admits a request only when its pages give the same digest, else retries "
            "it and counts it (`disaggsdk_kv_pages_failed_verification_total`). Costs one hash pass "
            "over the KV on each side; host memory only."
        ),
    )

    def grant_keys_on(self, provider: str) -> bool:
        """Whether units on libfabric ``provider`` (as resolved: "tcp", "tcp;ofi_rxm", "shm", ...) use
        per-grant keys."""
        if self.grant_keys != "auto":
            return self.grant_keys == "on"
        return provider.split(";")[0] == "tcp"

    def __attrs_post_init__(self) -> None:
        check_fields(self)


@attrs.frozen
class TransferSettings:
    """How the KV messenger moves a request's KV."""

    streaming: bool = attrs.field(
        default=True,
        metadata=about("Send pages layer by layer during the forward pass; false is the ablation "
                       "that sends every page after it."),
    )
    deadline_s: float = attrs.field(
        default=30.0,
        metadata=about("Seconds a decode instance waits for a request's KV before it retries on "
                       "another prefill instance (or prefills locally when none is left).", positive),
    )
    max_local_prefill_tokens: int = attrs.field(
        default=0,
        metadata=about("A decode instance computes a prompt itself, with no prefill instance and no transfer, when "
                       "at most this many of its tokens are missing from its prefix cache (Dynamo's conditional "
                       "disaggregation: a short suffix after a cached history costs less there than a handoff). "
                       "Its running requests wait for that chunk, so keep it small; 0: every prompt goes to a "
                       "prefill instance.", non_negative),
    )

    def __attrs_post_init__(self) -> None:
        check_fields(self)


@attrs.frozen
class EngineSettings:
    """Per-rank engine sizes; the defaults suit tiny models on a CPU."""

    num_pages: int = attrs.field(default=1024, metadata=about("KV pages per rank.", positive))
    max_num_batched_tokens: int = attrs.field(
        default=2048,
        metadata=about("Token budget of one engine step; longer prompts are prefilled in chunks.", positive),
    )
    max_num_seqs: int = attrs.field(
        default=64, metadata=about("Requests holding KV pages at once, per rank.", positive)
    )
    compile: bool | None = attrs.field(
        default=None,
        metadata=about("Compile each unit's model step with torch.compile (CPU units of tp 1; attention and "
                       "the layer counter are ops inside the graph, so KV streaming is unchanged). Unset: on, "
                       "unless the environment says `DISAGGSDK_COMPILE=0`. Each unit compiles before it "
                       "reports ready (seconds; cached on disk afterwards)."),
    )
    prefix_caching: bool = attrs.field(
        default=True,
        metadata=about("Cache the KV pages of prompts and reuse them for later prompts that start the same "
                       "(vLLM's automatic prefix caching): a hit computes only the new suffix, and a decode unit "
                       "asks prefill only for the pages it lacks. With MTP drafting pages are keyed one token further."),
    )
    load_format: LoadFormat = attrs.field(
        default="auto",
        metadata=about("`auto`: the checkpoint's weights (a tiny catalog model's trained checkpoint ships "
                       "with the package); `dummy`: seeded random weights of the same shapes, the checkpoint "
                       "unread (as vLLM's `--load-format dummy`).", choice(("auto", "dummy"))),
    )

    def __attrs_post_init__(self) -> None:
        check_fields(self)


@attrs.frozen
class Speculative:
    """Speculative decoding on the decode instances: draft tokens cheaply, verify them in one pass."""

    method: SpecMethod = attrs.field(
        default="none",
        metadata=about("`mtp`: the model's multi-token-prediction layer drafts (DeepSeek-V3/R1 checkpoints with "
                       "their MTP weights); `ngram`: prompt lookup, the tokens that followed the latest earlier "
                       "occurrence of the last few tokens (any model); `none`. Greedy outputs are unchanged, "
                       "sampled ones keep the model's distribution.", choice(("none", "mtp", "ngram"))),
    )
    num_tokens: int = attrs.field(
        default=1, metadata=about("Draft tokens per request per step, 1 to 4 (vLLM's num_speculative_tokens).",
                                  in_range(1, 4)),
    )

    def __attrs_post_init__(self) -> None:
        check_fields(self)


@attrs.frozen
class Spec:
    """A whole disaggregated deployment. Load with `load_spec`, build with `Cluster`."""

    model: str = attrs.field(
        default="qwen3-coder",
        metadata=about("A catalog model name (`-tiny` ones run on a CPU) or a local checkpoint "
                       "directory with a config.json."),
    )
    device: Device = attrs.field(
        default="cuda",
        metadata=about("Where the ranks run: `cuda` GPUs, or `cpu` processes (with `hardware.gpu: cpu`).",
                       choice(DEVICES)),
    )
    seed: int = attrs.field(default=0, metadata=about("Seeds random weights (`engine.load_format: dummy`), sampling without a request seed, "
                                                 "and the per-request choice of prefill source ranks."))
    hardware: Hardware = attrs.field(factory=Hardware, metadata=about("The nodes."))
    prefill: Role = attrs.field(factory=Role, metadata=about("The prefill instances."))
    decode: Role = attrs.field(factory=Role, metadata=about("The decode instances."))
    kv: KV = attrs.field(factory=KV, metadata=about("The KV cache format."))
    transport: Transport = attrs.field(factory=Transport, metadata=about("How KV pages travel."))
    serve: Serve = attrs.field(factory=Serve, metadata=about("The OpenAI-compatible front end."))
    launch: Launch = attrs.field(factory=Launch, metadata=about("Where the units run (this machine, or Ray)."))
    transfer: TransferSettings = attrs.field(
        factory=TransferSettings, metadata=about("How the KV messenger moves a request's KV.")
    )
    engine: EngineSettings = attrs.field(factory=EngineSettings, metadata=about("Per-rank engine sizes."))
    speculative: Speculative = attrs.field(
        factory=Speculative, metadata=about("Speculative decoding on the decode instances.")
    )
    name: str | None = attrs.field(
        default=None, metadata=about("Shown in plans and dashboards; the model name when unset.")
    )

    def __attrs_post_init__(self) -> None:
        check_fields(self)

    @property
    def label(self) -> str:
        """A human name for this deployment: `name`, or the model when no name was given."""
        return self.name or self.model
