"""The spec's engine sections: per-rank sizes (`EngineSettings`) and speculative decoding (`Speculative`)."""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.field_checks import CheckedFields, choice, count, count_or_unset, fraction, in_range, key

LoadFormat = Literal["auto", "dummy"]
SpecMethod = Literal["none", "mtp", "ngram"]
WeightDtype = Literal["auto", "float32", "bfloat16", "float16"]
HeldDtype = Literal["float32", "bfloat16", "float16"]  # what `auto` becomes on a device
WEIGHT_DTYPES = ("auto", "float32", "bfloat16", "float16")
# KV pages of an engine run without a spec (`serve --model`, `generate --model`, a bare EngineConfig), which has
# no memory plan to size its pool from: the 1,024 every unit had before pools were sized from memory.
BARE_NUM_PAGES = 1024
# Token counts a spec sets: 2^24, past the longest context of any model (Llama 4 Scout's 10M tokens).
MAX_TOKENS = 1 << 24
TOKENS_WHY = "more tokens than any model's context, 10M at the longest"
# KV pages per rank: page ids are int32 in the attention kernels' page tables (kv_page_indices)
MAX_NUM_PAGES = 2**31 - 1
# Requests one rank holds at once: far above what any GPU batches (vLLM's default max_num_seqs is 256-1,024)
MAX_NUM_SEQS = 65_536


@attrs.frozen
class EngineSettings(CheckedFields):
    """Per-rank engine sizes; the defaults suit tiny models on a CPU."""

    num_pages: int | None = key(None,
        "KV pages per rank. Unset: sized from the memory plan, what `$.engine.memory_utilization` of the device leaves "
        "after the rank's weights and workspace (`disaggsdk plan` shows it; docs/memory.md); a number wins over the "
        "plan.", count_or_unset(MAX_NUM_PAGES, "page ids are int32 in the attention kernels' page tables"))
    memory_utilization: float = key(0.9,
        "Fraction of each rank's device memory (a GPU's from `$.hardware.gpu`, a CPU rank's `$.hardware.cpu_memory_gb`) "
        "that weights, workspace and the KV pool may fill, as vLLM's `gpu_memory_utilization`.", fraction)
    max_model_len: int | None = key(None,
        "Longest request a unit accepts, prompt + output tokens (vLLM's `--max-model-len`): the HTTP front end "
        "refuses longer ones, and a pool sized from memory must hold one such request. Unset: the model's "
        "`max_position_embeddings` (262,144 for Qwen3-Coder, which 8 x H200 in bfloat16 leave no room for: Qwen "
        "serves it with a shorter one).", count_or_unset(MAX_TOKENS, TOKENS_WHY))
    max_num_batched_tokens: int = key(2048,
        "Token budget of one engine step; longer prompts are prefilled in chunks.", count(MAX_TOKENS, TOKENS_WHY))
    max_num_seqs: int = key(64, "Requests holding KV pages at once, per rank.",
                            count(MAX_NUM_SEQS, "far above any GPU's batch; vLLM's default is 256 to 1,024"))
    compile: bool | None = key(None,
        "Compile each unit's model step (units of tp 1): with torch.compile on a CPU (attention and the layer "
        "counter are ops inside the graph, so KV streaming is unchanged); on a GPU, its decode steps as CUDA graphs "
        "captured at padded batch sizes up to `max_num_seqs`, the layer counter written from inside them (FlashInfer "
        "attention; written, not yet run on a GPU). Unset: on, unless the environment says `DISAGGSDK_COMPILE=0`. "
        "On a CPU a unit serves on the eager step at once and compiles in the background, then runs the compiled "
        "step (minutes on a first start, under a minute from torch's compile cache; a compile that fails leaves "
        "it eager, with one line that says so); CUDA graphs are captured before a unit reports ready.")
    prefix_caching: bool = key(True,
        "Cache the KV pages of prompts and reuse them for later prompts that start the same (vLLM's automatic "
        "prefix caching): a hit computes only the new suffix, and a decode unit asks prefill only for the pages it "
        "lacks. With MTP drafting pages are keyed one token further.")
    load_format: LoadFormat = key("auto",
        "`auto`: the checkpoint's weights (a tiny catalog model's trained checkpoint ships with the package); "
        "`dummy`: seeded random weights of the same shapes, the checkpoint unread (as vLLM's `--load-format "
        "dummy`).", choice(("auto", "dummy")))
    dtype: WeightDtype = key("auto",
        "Element type of the model's weights and activations in every unit (the KV cache's is `$.kv.dtype`; FP8 "
        "checkpoint weights stay FP8 on a GPU). `auto`: `float32` on a CPU, which matches transformers exactly, and "
        "`bfloat16` on CUDA, the dtype the target models ship in (vLLM's `--dtype auto`).", choice(WEIGHT_DTYPES))


def held_dtype(dtype: WeightDtype, device: str) -> HeldDtype:
    """The dtype weights are held in on ``device`` ("cpu" or "cuda") for an `EngineSettings.dtype` setting."""
    if dtype != "auto":
        return dtype
    return "float32" if device == "cpu" else "bfloat16"


@attrs.frozen
class Speculative(CheckedFields):
    """Speculative decoding on the decode instances: draft tokens cheaply, verify them in one pass."""

    method: SpecMethod = key("none",
        "`mtp`: the model's multi-token-prediction layer drafts (DeepSeek-V3/R1 checkpoints with their MTP "
        "weights); `ngram`: prompt lookup, the tokens that followed the latest earlier occurrence of the last few "
        "tokens (any model); `none`. Greedy outputs are unchanged, sampled ones keep the model's distribution.",
        choice(("none", "mtp", "ngram")))
    num_tokens: int = key(1,
        "Draft tokens per request per step, 1 to 4 (vLLM's num_speculative_tokens).", in_range(1, 4))
