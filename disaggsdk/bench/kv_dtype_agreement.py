"""How far an fp8 KV cache moves a model's greedy output from a float32 KV cache's.

The same model, weights and prompts run twice through the engine, once with each KV element type
(`$.kv.dtype`), greedily; prompts are held-out code (`code_corpus.held_out_windows`: windows of
files no tiny checkpoint was trained on, more than one per file where 32 prompts need it). Per
prompt, the two continuations are compared up to their first differing token: before it both runs
saw the same context, so their tokens and the logprobs of the chosen tokens are comparable; after
it they continue different texts and are not compared.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from disaggsdk.engine.sequence import RequestOutput
    from disaggsdk.spec.engine_settings import HeldDtype


@dataclass(frozen=True)
class KVDtypeAgreement:
    """The comparison of one model's greedy outputs under two KV element types (module docstring)."""

    model: str
    kv_dtype: str  # the one measured
    reference_kv_dtype: str
    weights_dtype: HeldDtype
    num_prompts: int
    max_tokens: int  # generated per prompt
    prompt_tokens_mean: float
    token_agreement: float
    identical_outputs: int
    mean_abs_logprob_diff: float
    max_abs_logprob_diff: float
    positions_compared: int


def compare_outputs(reference: Sequence[RequestOutput], measured: Sequence[RequestOutput]) -> dict[str, float]:
    """Agreement of two runs' greedy outputs of the same prompts (module docstring).

    Args:
        reference, measured: one finished output per prompt, in the same order, each with the
            chosen tokens' logprobs (``SamplingParams(logprobs=0)``).
    Returns:
        token_agreement, identical_outputs, mean_abs_logprob_diff, max_abs_logprob_diff,
        positions_compared.
    """
    same_positions = total_positions = identical = 0
    diffs: list[float] = []
    for ref, got in zip(reference, measured, strict=True):
        n = max(len(ref.output_ids), len(got.output_ids))
        total_positions += n
        prefix = 0
        while prefix < min(len(ref.output_ids), len(got.output_ids)) and ref.output_ids[prefix] == got.output_ids[prefix]:
            prefix += 1
        same_positions += prefix
        identical += prefix == n
        compared = min(prefix + 1, len(ref.new_logprobs), len(got.new_logprobs))
        diffs += [abs(got.new_logprobs[i].logprob - ref.new_logprobs[i].logprob) for i in range(compared)]
    return {
        "token_agreement": same_positions / total_positions if total_positions else 1.0,
        "identical_outputs": identical,
        "mean_abs_logprob_diff": sum(diffs) / len(diffs) if diffs else 0.0,
        "max_abs_logprob_diff": max(diffs, default=0.0),
        "positions_compared": len(diffs),
    }


def measure_kv_dtype_agreement(model: str, num_prompts: int = 32, max_tokens: int = 32, kv_dtype: str = "fp8",
                               reference_kv_dtype: str = "float32", weights_dtype: HeldDtype = "float32",
                               prompt_lines: int = 12) -> KVDtypeAgreement:
    """Run ``model`` greedily on held-out prompts with each KV dtype and compare (module docstring).

    Args:
        model: a catalog name or checkpoint directory with a tokenizer.
        num_prompts: held-out prompts.
        max_tokens: tokens generated per prompt (EOS ignored, so every continuation has them all).
        kv_dtype, reference_kv_dtype: `$.kv.dtype` names.
        weights_dtype: the engine's dtype (weights and activations), the same in both runs.
        prompt_lines: lines of code per prompt.
    Returns:
        The agreement.
    Raises:
        ModelError: the model has no tokenizer here.
    """
    from disaggsdk.bench.code_corpus import held_out_windows
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.engine.tokenizer import load_tokenizer
    from disaggsdk.errors import ModelError

    tok = load_tokenizer(model)
    if tok is None:
        raise ModelError(f"{model} has no tokenizer on this machine: the agreement is measured on text prompts")
    prompts = [tok.encode(t) for t in held_out_windows(num_prompts, num_lines=prompt_lines)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=0)  # greedy: temperature 0
    page_size = 16
    pages = sum(-(-(len(p) + max_tokens) // page_size) for p in prompts)
    outputs = {}
    for dtype in (reference_kv_dtype, kv_dtype):
        config = EngineConfig(page_size=page_size, num_pages=pages, dtype=weights_dtype, kv_dtype=dtype, compile=False)
        with LLMEngine(model, config) as engine:
            outputs[dtype] = engine.generate(prompts, params)
    stats = compare_outputs(outputs[reference_kv_dtype], outputs[kv_dtype])
    return KVDtypeAgreement(
        model=model, kv_dtype=kv_dtype, reference_kv_dtype=reference_kv_dtype, weights_dtype=weights_dtype,
        num_prompts=len(prompts), max_tokens=max_tokens,
        prompt_tokens_mean=sum(map(len, prompts)) / len(prompts),
        token_agreement=round(stats["token_agreement"], 4), identical_outputs=int(stats["identical_outputs"]),
        mean_abs_logprob_diff=round(stats["mean_abs_logprob_diff"], 5),
        max_abs_logprob_diff=round(stats["max_abs_logprob_diff"], 5),
        positions_compared=int(stats["positions_compared"]),
    )


def main(argv: list[str] | None = None) -> None:
    """The command line: print the agreement as JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-coder-tiny")
    p.add_argument("--prompts", type=int, default=32, help="held-out prompts")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens generated per prompt")
    p.add_argument("--kv-dtype", default="fp8", choices=("fp8", "bfloat16", "float16"), help="the KV dtype measured")
    p.add_argument("--reference-kv-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="weights and activations")
    a = p.parse_args(argv)
    result = measure_kv_dtype_agreement(a.model, a.prompts, a.max_tokens, a.kv_dtype, a.reference_kv_dtype, a.dtype)
    print(json.dumps(asdict(result), indent=1))


if __name__ == "__main__":
    main()
