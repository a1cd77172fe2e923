"""The spec's KV sections: the cache format (`KV`), the fabric pages travel over (`Transport`) and how the
messenger moves a request's KV (`TransferSettings`)."""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.engine_settings import MAX_TOKENS, TOKENS_WHY
from disaggsdk.spec.field_checks import (
    Check,
    CheckedFields,
    choice,
    duration,
    in_range,
    key,
    power_of_two,
    section,
    shown,
)

Layout = Literal["HND", "NHD"]
Provider = Literal["auto", "shm", "tcp", "efa", "verbs"]
KVDtype = Literal["bfloat16", "float16", "float32", "fp8"]
GrantKeysSetting = Literal["auto", "on", "off"]
KVStaging = Literal["auto", "direct", "host"]

LAYOUTS = ("HND", "NHD")
PROVIDERS = ("auto", "shm", "tcp", "efa", "verbs")
GRANT_KEYS_SETTINGS = ("auto", "on", "off")
KV_STAGINGS = ("auto", "direct", "host")
KV_DTYPES = ("bfloat16", "float16", "float32", "fp8")
TierWritePolicy = Literal["write_through", "on_eviction"]
TIER_WRITE_POLICIES = ("write_through", "on_eviction")
MAX_TIER_GB = 1e6  # a petabyte: past it the number is a typo (GB where MB was meant)


def _tier_gb(value: float) -> str | None:
    if not 0 <= value <= MAX_TIER_GB:  # NaN fails too
        return f"must be a size in GB in 0..{MAX_TIER_GB:,.0f} (0: the tier is off), got {shown(value)}"
    return None


def _store_address(value: str) -> str | None:
    if value in ("off", "launch"):
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return f"must be off, launch or a Redis/Valkey address host:port (e.g. 10.0.0.5:6379), got {shown(value)}"
    return None


tier_gb = Check(f"GB in 0..{MAX_TIER_GB:,.0f}", _tier_gb, {"minimum": 0, "maximum": MAX_TIER_GB})
store_address = Check("off, launch or host:port", _store_address, {"pattern": "^(off|launch|.+:[0-9]+)$"})


@attrs.frozen
class KVTiers(CheckedFields):
    """Where prefix-cache pages go when they leave a unit's KV pool (docs/kv_tiers.md)."""

    host_gb: float = key(0.0,
        "Host memory, per node, that keeps pages evicted from the units' KV pools (split evenly among the node's "
        "units; pinned host memory on GPUs); a prompt whose prefix is there loads it instead of computing it. "
        "0: off.", tier_gb)
    disk_gb: float = key(0.0,
        "Local disk, per unit, under `$.kv.tiers.disk_path`, for pages leaving the host tier (or the pool when "
        "the host tier is off); it survives a unit's restart. 0: off.", tier_gb)
    disk_path: str = key("",
        "Directory of the disk tier (one subdirectory per unit); empty: the system's temporary directory.")
    store: str = key("off",
        "A KV store every instance of the deployment reads and writes (Redis or Valkey, as LMCache uses it): "
        "`launch` starts one with the deployment, `host:port` names a running one, `off` has none. A prefix "
        "one prefill instance computed is then a hit on every other.", store_address)
    store_gb: float = key(1.0,
        "Memory of the store `launch` starts (its `maxmemory`; it evicts least recently used pages).", tier_gb)
    write_policy: TierWritePolicy = key("on_eviction",
        "`on_eviction`: a page goes down a tier when the one above evicts it (least recently used first). "
        "`write_through`: every page the engine caches is written to every tier at once, so another instance "
        "finds it in the store before this one evicts it.", choice(TIER_WRITE_POLICIES))

    @property
    def enabled(self) -> bool:
        """Whether any tier is on."""
        return self.host_gb > 0 or self.disk_gb > 0 or self.store != "off"


@attrs.frozen
class KV(CheckedFields):
    """KV cache format, shared by prefill and decode (checked again at the handshake)."""

    layout: Layout = key("HND",
        "Order of one page's axes: `HND` is heads, tokens, head dim; `NHD` is tokens first.", choice(LAYOUTS))
    page_size: int = key(16, "Tokens per KV page.",
                         power_of_two(1024, "a request takes whole pages: larger ones leave most of each last one unused"))
    dtype: KVDtype = key("bfloat16",
        "Element type of the KV cache; CPU runs use `float32` to match transformers exactly. `fp8` stores "
        "float8_e4m3fn (vLLM's `kv_cache_dtype=fp8`): each value divided by its layer's static `k_scale` / "
        "`v_scale` from the checkpoint (1.0 where it has none), so pages take and move half of bfloat16's bytes.",
        choice(KV_DTYPES))
    tiers: KVTiers = section(KVTiers, "Host, disk and shared-store tiers below the KV pool.")


@attrs.frozen
class Transport(CheckedFields):
    """How KV pages travel between prefill and decode."""

    provider: Provider = key("auto",
        "The libfabric provider; `auto` picks efa/verbs where present, else shm on one node.", choice(PROVIDERS))
    same_host_copy: bool = key(True,
        "shm only: prefill units map the decode units' KV pools and copy pages with memcpy on the prefill's core "
        "(the immediates that count them still go through libfabric). false sends every byte through libfabric's "
        "shm provider, whose kernel copy runs on the decode's core at ~0.3-0.6x memcpy (native/README.md).")
    stuck_after_s: float = key(5.0,
        "Seconds a unit's transport thread may stay inside one libfabric call (normally microseconds) before the "
        "unit gives up on its endpoint: it exits to be restarted, and a peer whose queue it was stuck sending to "
        "is restarted too. With shm, a process killed while holding a peer's queue lock (in shared memory) leaves "
        "that queue unusable for good.", duration("s"))
    grant_keys: GrantKeysSetting = key("auto",
        "Open to remote writes only the pages granted to one transfer, each run under a fresh key revoked when the "
        "transfer ends, instead of the whole KV pool under one key: a write with a captured or stale key lands "
        "nowhere. `auto`: on for tcp (reachable through sockets), off for shm (the OS user is the boundary there) "
        "and for NICs (a registration pins memory: hundreds per request). docs/security.md.",
        choice(GRANT_KEYS_SETTINGS))
    verify_pages: bool = key(False,
        "Prefill sends a keyed digest (HMAC-SHA256 under the deployment secret) of every byte it wrote; decode "
        "admits a request only when its pages give the same digest, else retries it and counts it "
        "(`disaggsdk_kv_pages_failed_verification_total`). Costs one hash pass over the KV on each side; host "
        "memory only.")
    kv_staging: KVStaging = key("auto",
        "Where the transport reads and writes KV pages. `direct`: in the pools themselves (GPU memory needs a "
        "provider with FI_HMEM for CUDA: efa, verbs with GPUDirect, shm with CUDA IPC). `host`: through a host "
        "mirror of each rank's pool, copied page by page as layers finish (prefill) and before a request is "
        "scheduled (decode), as vLLM's NIXL connector with `kv_buffer_device: cpu`; it doubles the KV memory in "
        "host RAM. `auto`: direct for host pools, and for GPU pools where the provider registers CUDA memory, "
        "else host (tcp, or a libfabric built without CUDA); each unit logs which it chose. docs/gpu.md.",
        choice(KV_STAGINGS))

    def grant_keys_on(self, provider: str) -> bool:
        """Whether units on libfabric ``provider`` (as resolved: "tcp", "tcp;ofi_rxm", "shm", ...) use
        per-grant keys."""
        if self.grant_keys != "auto":
            return self.grant_keys == "on"
        return provider.split(";")[0] == "tcp"


@attrs.frozen
class TransferSettings(CheckedFields):
    """How the KV messenger moves a request's KV."""

    streaming: bool = key(True,
        "Send pages layer by layer during the forward pass; false is the ablation that sends every page after it.")
    deadline_s: float = key(30.0,
        "Seconds a decode instance waits for a request's KV before it retries on another prefill instance (or "
        "prefills locally when none is left).", duration("s"))
    max_local_prefill_tokens: int = key(0,
        "A decode instance computes a prompt itself, with no prefill instance and no transfer, when at most this "
        "many of its tokens are missing from its prefix cache (Dynamo's conditional disaggregation: a short suffix "
        "after a cached history costs less there than a handoff). Its running requests wait for that chunk, so "
        "keep it small; 0: every prompt goes to a prefill instance.", in_range(0, MAX_TOKENS, TOKENS_WHY))
