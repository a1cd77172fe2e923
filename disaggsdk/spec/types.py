"""The deployment spec: frozen attrs classes whose field names are the YAML keys."""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.engine_settings import EngineSettings, HeldDtype, Speculative, held_dtype
from disaggsdk.spec.field_checks import CheckedFields, choice, in_range, key, section
from disaggsdk.spec.kv import KV, TransferSettings, Transport
from disaggsdk.spec.serving import Launch, Serve
from disaggsdk.spec.topology import Hardware, Role, RoleName

Device = Literal["cpu", "cuda"]
DEVICES = ("cpu", "cuda")
MAX_SEED = 2**32 - 1


@attrs.frozen
class Spec(CheckedFields):
    """A whole disaggregated deployment. Load with `load_spec`, build with `Cluster`."""

    model: str = key("qwen3-coder",
        "A catalog model name (`-tiny` ones run on a CPU) or a local checkpoint directory with a config.json.")
    device: Device = key("cuda",
        "Where the ranks run: `cuda` GPUs, or `cpu` processes (with `$.hardware.gpu: cpu`).", choice(DEVICES))
    seed: int = key(0,
        "Seeds random weights (`$.engine.load_format: dummy`), sampling without a request seed, and the per-request "
        "choice of prefill source ranks.", in_range(0, MAX_SEED, "the units seed torch with it times 1,000,003, "
                                                   "which must fit 64 bits"))
    hardware: Hardware = section(Hardware, "The nodes.")
    prefill: Role = section(Role, "The prefill instances.")
    decode: Role = section(Role, "The decode instances.")
    kv: KV = section(KV, "The KV cache format.")
    transport: Transport = section(Transport, "How KV pages travel.")
    serve: Serve = section(Serve, "The OpenAI-compatible front end.")
    launch: Launch = section(Launch, "Where the units run (this machine, or Ray).")
    transfer: TransferSettings = section(TransferSettings, "How the KV messenger moves a request's KV.")
    engine: EngineSettings = section(EngineSettings, "Per-rank engine sizes.")
    speculative: Speculative = section(Speculative, "Speculative decoding on the decode instances.")
    name: str | None = key(None, "Shown in plans and dashboards; the model name when unset.")

    @property
    def roles(self) -> dict[RoleName, Role]:
        """The roles by YAML key, prefill first: ``{"prefill": ..., "decode": ...}``."""
        return {"prefill": self.prefill, "decode": self.decode}

    @property
    def weight_dtype(self) -> HeldDtype:
        """The dtype the units hold weights in: `$.engine.dtype`, its `auto` resolved for `device`."""
        return held_dtype(self.engine.dtype, self.device)

    @property
    def label(self) -> str:
        """A human name for this deployment: `name`, or the model when no name was given."""
        return self.name or self.model
