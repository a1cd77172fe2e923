"""Architecture facts of a model: what the planner, the engine and the simulator need to know.

A `ModelArch` is derived from a Hugging Face ``config.json`` dict (catalog entries are stored the
same way), so a catalog model and a checkpoint directory go through one code path.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from disaggsdk.errors import ModelError

AttentionKind = Literal["gqa", "mla"]

# HF `architectures[0]` -> our family name.
ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "float8_e4m3fn": 1}


@attrs.frozen
class ModelArch:
    """Architecture numbers of one model.

    For GQA models ``num_kv_heads`` and ``head_dim`` describe K and V; for MLA models the KV cache
    holds one latent of ``kv_lora_rank + qk_rope_head_dim`` values per token per layer and
    ``num_kv_heads`` is 1 (the latent is shared by all heads and cannot be split by head).
    """

    name: str
    family: str  # "qwen3" | "qwen3_moe" | "deepseek_v3"
    attention: AttentionKind
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    # MoE (0 when dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_k_dense: int = 0
    # MLA (0 when GQA)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    num_mtp_layers: int = 0
    hf_config: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def max_context_tokens(self) -> int | None:
        """Positions the model was built for (``max_position_embeddings``): prompt + output; None if unstated."""
        value = self.hf_config.get("max_position_embeddings")
        return int(value) if value else None

    @property
    def kv_values_per_token_layer(self) -> int:
        """Cache elements one token adds to one layer (all KV heads, K and V; or the MLA latent)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token_layer(self, dtype: str = "bfloat16") -> int:
        """Bytes of KV cache one token adds to one layer, whole model (not per rank)."""
        return self.kv_values_per_token_layer * dtype_bytes(dtype)

    def kv_bytes_per_token(self, dtype: str = "bfloat16") -> int:
        """Bytes of KV cache one token adds across all layers (MTP layer excluded)."""
        return self.num_layers * self.kv_bytes_per_token_layer(dtype)

    def kv_bytes_per_token_rank(self, tp: int, dtype: str = "bfloat16") -> int:
        """Bytes of KV cache one token adds on one rank of a tp-way instance.

        GQA heads split while tp <= num_kv_heads and are replicated beyond; MLA is replicated.
        """
        if self.attention == "mla":
            return self.kv_bytes_per_token(dtype)
        heads_per_rank = max(1, self.num_kv_heads // tp)
        return self.num_layers * 2 * heads_per_rank * self.head_dim * dtype_bytes(dtype)


def dtype_bytes(dtype: str) -> int:
    """Size in bytes of one element of a KV dtype name."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}") from None


def arch_from_hf_config(config: dict[str, Any], name: str) -> ModelArch:
    """Derive a `ModelArch` from a Hugging Face config.json dict.

    Raises:
        ModelError: unsupported architecture or a missing field (the message names it).
    """
    archs = config.get("architectures") or []
    family = ARCHITECTURES.get(archs[0]) if archs else None
    if family is None:
        raise ModelError(f"{name}: unsupported architecture {archs[0] if archs else '(none)'!r} in config.json "
                         f"field 'architectures'; supported: {sorted(ARCHITECTURES)}")

    if "num_experts" not in config and "num_local_experts" in config:
        # transformers 5's save_pretrained writes the Qwen3-MoE expert count under this name
        config = {**config, "num_experts": config["num_local_experts"]}

    def need(key: str) -> Any:
        if key not in config:
            raise ModelError(f"{name}: config.json lacks field {key!r} required by {archs[0]}")
        return config[key]

    heads = need("num_attention_heads")
    common = dict(
        name=name,
        family=family,
        num_layers=need("num_hidden_layers"),
        hidden_size=need("hidden_size"),
        vocab_size=need("vocab_size"),
        num_attention_heads=heads,
        intermediate_size=need("intermediate_size"),
        hf_config=dict(config),
    )
    if family == "deepseek_v3":
        return ModelArch(
            attention="mla",
            num_kv_heads=1,
            head_dim=need("qk_nope_head_dim") + need("qk_rope_head_dim"),
            num_experts=config.get("n_routed_experts") or 0,
            num_experts_per_tok=config.get("num_experts_per_tok") or 0,
            moe_intermediate_size=config.get("moe_intermediate_size") or 0,
            num_shared_experts=config.get("n_shared_experts") or 0,
            first_k_dense=config.get("first_k_dense_replace", 0),
            q_lora_rank=config.get("q_lora_rank") or 0,
            kv_lora_rank=need("kv_lora_rank"),
            qk_rope_head_dim=need("qk_rope_head_dim"),
            qk_nope_head_dim=need("qk_nope_head_dim"),
            v_head_dim=need("v_head_dim"),
            num_mtp_layers=config.get("num_nextn_predict_layers", 0),
            **common,
        )
    head_dim = config.get("head_dim") or common["hidden_size"] // heads
    moe = {}
    if family == "qwen3_moe":
        moe = dict(
            num_experts=need("num_experts"),
            num_experts_per_tok=need("num_experts_per_tok"),
            moe_intermediate_size=need("moe_intermediate_size"),
        )
    return ModelArch(
        attention="gqa",
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        **moe,
        **common,
    )
