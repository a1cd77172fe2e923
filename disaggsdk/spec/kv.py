"""The spec's KV sections: the cache format (`KV`), the fabric pages travel over (`Transport`) and how the
messenger moves a request's KV (`TransferSettings`)."""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.engine_settings import MAX_TOKENS, TOKENS_WHY
from disaggsdk.spec.field_checks import CheckedFields, choice, duration, in_range, key, power_of_two

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
