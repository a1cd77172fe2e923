"""When a request stops: an end-of-sequence or stop token, or its token budget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from disaggsdk.engine.sampling_params import SamplingParams


def eos_token_ids(hf_config: Mapping[str, Any]) -> frozenset[int]:
    """The model's end-of-sequence ids (``eos_token_id`` of its config.json: one id, a list, or none)."""
    eos = hf_config.get("eos_token_id")
    if eos is None:
        return frozenset()
    return frozenset(eos) if isinstance(eos, list) else frozenset({eos})


def model_eos_ids(model: str, hf_config: Mapping[str, Any]) -> frozenset[int]:
    """The ids a request of ``model`` stops on: config.json's and generation_config.json's, as
    transformers and vLLM stop on both (the engine's stop rule and its grammars' end tokens)."""
    from disaggsdk.models.shipped import read_generation_config

    return eos_token_ids(hf_config) | eos_token_ids(read_generation_config(model))


def stop_reason(params: SamplingParams, num_output_tokens: int, token: int, eos_ids: frozenset[int]) -> str | None:
    """Why a request stops after sampling ``token`` as its ``num_output_tokens``-th output token.

    Returns:
        "stop" (a stop token, or EOS unless ``params.ignore_eos``), "length" (``params.max_tokens``
        reached), or None to go on.
    """
    if token in params.stop_token_ids or (not params.ignore_eos and token in eos_ids):
        return "stop"
    if num_output_tokens >= params.max_tokens:
        return "length"
    return None
