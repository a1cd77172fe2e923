"""The deployment spec: frozen attrs classes whose field names are the YAML keys.

One name per concept across YAML key, keyword argument and attribute (`tp`, `dp`, `replicas`,
`page_size`, `layout`). Field validators check single values; rules that tie fields together
(tp against the model's heads, instances against node size) live in `spec.rules`.
"""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.field_checks import check_fields, choice, port, positive, power_of_two

Device = Literal["cpu", "cuda"]
Layout = Literal["HND", "NHD"]
Provider = Literal["auto", "shm", "tcp", "efa", "verbs"]
KVDtype = Literal["bfloat16", "float16", "float32", "fp8"]

DEVICES = ("cpu", "cuda")
LAYOUTS = ("HND", "NHD")
PROVIDERS = ("auto", "shm", "tcp", "efa", "verbs")
KV_DTYPES = ("bfloat16", "float16", "float32", "fp8")
GPU_KINDS = ("h100", "h200", "cpu")


@attrs.frozen
class Hardware:
    """What one node offers. On `gpu: cpu` a "gpu" is a CPU rank (one process)."""

    gpu: str = "h200"
    gpus_per_node: int = 8
    nics_per_node: int = 8
    nic_gbps: float = 400.0

    def __attrs_post_init__(self) -> None:
        check_fields(
            self,
            gpu=choice(GPU_KINDS),
            gpus_per_node=positive,
            nics_per_node=positive,
            nic_gbps=positive,
        )


@attrs.frozen
class Role:
    """One role (prefill or decode): `replicas` instances of `tp` x `dp` ranks each.

    `tp` ranks split attention heads and MLP/experts; `dp` data-parallel attention ranks each hold
    their own requests' KV (each dp rank is a group of `tp` ranks).
    """

    replicas: int = 1
    tp: int = 1
    dp: int = 1

    def __attrs_post_init__(self) -> None:
        check_fields(self, replicas=positive, tp=positive, dp=positive)

    @property
    def ranks_per_instance(self) -> int:
        return self.tp * self.dp


@attrs.frozen
class KV:
    """KV cache format, shared by prefill and decode (checked again at the handshake)."""

    layout: Layout = "HND"
    page_size: int = 16  # tokens per page
    dtype: KVDtype = "bfloat16"

    def __attrs_post_init__(self) -> None:
        check_fields(
            self, layout=choice(LAYOUTS), page_size=power_of_two, dtype=choice(KV_DTYPES)
        )


@attrs.frozen
class Transport:
    """How KV pages travel. `auto` picks efa/verbs where present, else shm on one node.

    `same_host_copy` (shm only): prefill units map the decode units' KV pools (shared memory) and
    copy pages with memcpy on the prefill's core; the immediates that count them still go through
    libfabric. False sends every byte through libfabric's shm provider, whose kernel copy runs on
    the decode's core at ~0.3-0.6x memcpy (native/README.md).
    """

    provider: Provider = "auto"
    same_host_copy: bool = True

    def __attrs_post_init__(self) -> None:
        check_fields(self, provider=choice(PROVIDERS))


@attrs.frozen
class TransferSettings:
    """How the KV messenger moves a request's KV (YAML key `transfer`).

    `streaming: false` is the ablation that sends every page after the forward pass instead of
    layer by layer during it. A decode instance waits `deadline_s` for a request's KV before it
    retries on another prefill instance (or prefills locally when none is left).
    """

    streaming: bool = True
    deadline_s: float = 30.0

    def __attrs_post_init__(self) -> None:
        check_fields(self, deadline_s=positive)


@attrs.frozen
class EngineSettings:
    """Per-rank engine sizes (YAML key `engine`); the defaults suit tiny models on a CPU."""

    num_pages: int = 1024  # KV pages per rank
    max_num_batched_tokens: int = 2048  # token budget of one step (longer prompts are chunked)
    max_num_seqs: int = 64  # requests holding pages at once

    def __attrs_post_init__(self) -> None:
        check_fields(self, num_pages=positive, max_num_batched_tokens=positive, max_num_seqs=positive)


@attrs.frozen
class Serve:
    """The OpenAI-compatible front end. Loopback unless you choose otherwise."""

    host: str = "127.0.0.1"
    port: int = 8000

    def __attrs_post_init__(self) -> None:
        check_fields(self, port=port)


@attrs.frozen
class Spec:
    """A whole disaggregated deployment. Load with `load_spec`, build with `Cluster`."""

    model: str = "qwen3-coder"
    device: Device = "cuda"
    seed: int = 0
    hardware: Hardware = attrs.field(factory=Hardware)
    prefill: Role = attrs.field(factory=Role)
    decode: Role = attrs.field(factory=Role)
    kv: KV = attrs.field(factory=KV)
    transport: Transport = attrs.field(factory=Transport)
    serve: Serve = attrs.field(factory=Serve)
    transfer: TransferSettings = attrs.field(factory=TransferSettings)
    engine: EngineSettings = attrs.field(factory=EngineSettings)
    name: str | None = None  # shown in plans and dashboards; the model name when unset

    def __attrs_post_init__(self) -> None:
        check_fields(self, device=choice(DEVICES))

    @property
    def label(self) -> str:
        """A human name for this deployment: `name`, or the model when no name was given."""
        return self.name or self.model
