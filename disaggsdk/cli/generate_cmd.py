"""`disaggsdk generate`: offline generation with the engine, from text or token ids."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TypedDict, get_args

from disaggsdk.cli.options import add_hidden_alias
from disaggsdk.cli.runtime_options import add_runtime_options, with_runtime_options
from disaggsdk.errors import DisaggError
from disaggsdk.spec.engine_settings import BARE_NUM_PAGES, WeightDtype
from disaggsdk.spec.types import Spec

HELP = "Generate text offline with the engine (a tiny catalog model or a checkpoint directory)."


class GenerateArgsError(DisaggError):
    """Command-line arguments of `generate` that cannot be used."""


class _Output(TypedDict, total=False):
    """One prompt's result as `--json` prints it."""

    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None
    text: str  # where the model has a tokenizer
    logprobs: list[dict[str, object]]  # with --logprobs


_DEFAULT = Spec()  # the spec's defaults: a flag's default is the key's, declared once there

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `generate`."""
    parser.add_argument("--model", help="tiny catalog name or Hugging Face checkpoint directory")
    parser.add_argument("--spec", help="a deployment spec: run its processes (prefill -> KV transfer -> decode)")
    parser.add_argument("--tiny", action="store_true", help="with --spec: the spec's topology with its tiny model, on CPU")
    parser.add_argument("--colocated", action="store_true", help="with --spec: every instance mixed, no KV transfer")
    add_runtime_options(parser)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (processes)")
    parser.add_argument("--layout", choices=("HND", "NHD"), default="HND", help="KV page layout")
    parser.add_argument("--page-size", type=int, default=_DEFAULT.kv.page_size, help="tokens per KV page")
    parser.add_argument("--num-pages", type=int, default=BARE_NUM_PAGES, help="KV pages per rank")
    parser.add_argument("--prompt", action="append", default=[], help="prompt text (repeat for a batch)")
    parser.add_argument("--prompt-ids", action="append", default=[], help="prompt token ids, e.g. 1,2,3 (repeatable)")
    parser.add_argument("--output-len", type=int, default=16, help="tokens to generate per prompt (max_tokens)")
    add_hidden_alias(parser, "--max-tokens", dest="output_len", type=int)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass; 1 switches it off")
    parser.add_argument("--top-k", type=int, default=0, help="0 switches top-k off")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (per request)")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    parser.add_argument("--logprobs", type=int, default=None, metavar="N", help="return the top-N logprobs per token")
    parser.add_argument("--max-num-batched-tokens", type=int, default=_DEFAULT.engine.max_num_batched_tokens,
                        help="token budget per step (chunked prefill)")
    parser.add_argument("--device", default="cpu", help="torch device of the weights and KV pages")
    parser.add_argument("--dtype", default=_DEFAULT.engine.dtype, choices=get_args(WeightDtype), help="weight dtype")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument("--speculative", choices=("mtp", "ngram"), default=None,
                        help="speculative decoding: the model's MTP layer, or n-gram prompt lookup (--model only)")
    parser.add_argument("--num-speculative-tokens", type=int, default=1, metavar="K", help="drafts per step (1..4)")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise GenerateArgsError(f"--prompt-ids {text!r}: give comma-separated integers, e.g. 1,2,3") from None


def run(args: argparse.Namespace) -> int:
    """Build the engine, generate every prompt as one batch, print the results.

    Returns:
        0 on success.
    Raises:
        DisaggError: bad arguments, unknown model, or a prompt that does not fit.
    """
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.engine.speculative.config import SpeculativeConfig
    from disaggsdk.engine.tokenizer import load_tokenizer
    from disaggsdk.models import resolve_model

    if not args.prompt and not args.prompt_ids:
        raise GenerateArgsError("give at least one --prompt TEXT or --prompt-ids 1,2,3")
    if args.spec:
        if args.speculative:
            raise GenerateArgsError("--speculative runs with --model (colocated) so far, not with --spec")
        return _run_spec(args)
    if not args.model:
        raise GenerateArgsError("give --model NAME_OR_DIR, or --spec SPEC to run a deployment")
    resolve_model(args.model)  # an unknown name fails here with the catalog and the closest name
    tokenizer = load_tokenizer(args.model)
    prompts: list[list[int]] = []
    if args.prompt:
        if tokenizer is None:
            raise GenerateArgsError(f"{args.model} has no tokenizer here; pass --prompt-ids instead of --prompt")
        prompts = [tokenizer.encode(p, add_bos=True) for p in args.prompt]
    prompts += [_parse_ids(p) for p in args.prompt_ids]
    params = SamplingParams(
        max_tokens=args.output_len, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.seed, ignore_eos=args.ignore_eos, logprobs=args.logprobs,
    )
    config = EngineConfig(
        tp=args.tp, layout=args.layout, page_size=args.page_size, num_pages=args.num_pages,
        max_num_batched_tokens=args.max_num_batched_tokens, device=args.device, dtype=args.dtype,
        speculative=SpeculativeConfig(args.speculative, args.num_speculative_tokens) if args.speculative else None,
    )
    with LLMEngine(args.model, config) as engine:
        outputs = engine.generate(prompts, params)
        spec_stats = engine.spec_stats.to_json() if args.speculative else None
    results: list[_Output] = []
    for prompt, out in zip(prompts, outputs):
        item: _Output = {"prompt_ids": prompt, "token_ids": out.output_ids, "finish_reason": out.finish_reason}
        if tokenizer is not None:
            item["text"] = tokenizer.decode(out.output_ids)
        if args.logprobs is not None:
            item["logprobs"] = [
                {"token_id": lp.token_id, "logprob": lp.logprob, "top": [[t, v] for t, v in lp.top]}
                for lp in out.new_logprobs
            ]
        results.append(item)
    if args.json:
        doc = {"model": args.model, "outputs": results}
        if spec_stats is not None:
            doc["speculative"] = spec_stats
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        for i, item in enumerate(results):
            shown = item.get("text", item["token_ids"])
            print(f"[{i}] {shown!r}  ({len(item['token_ids'])} tokens, {item['finish_reason']})")
        if spec_stats is not None:
            print(f"speculative ({args.speculative}, {args.num_speculative_tokens} drafts/step): "
                  f"{spec_stats['acceptance_rate']:.0%} of drafts accepted, "
                  f"{spec_stats['mean_accepted_length']:.2f} tokens per verify step")
    return 0


def _run_spec(args: argparse.Namespace) -> int:
    """`generate --spec`: the spec's processes on this machine (disaggsdk.launch), then teardown."""
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.serve.backends.offline import generate_with_spec
    from disaggsdk.spec import load_spec

    params = SamplingParams(
        max_tokens=args.output_len, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.seed, ignore_eos=args.ignore_eos,
    )
    # SIGTERM unwinds through here (cli.main), closing the deployment like Ctrl-C does
    result = generate_with_spec(with_runtime_options(load_spec(args.spec), args),
                                [_parse_ids(p) for p in args.prompt_ids], params, texts=args.prompt, tiny=args.tiny,
                                colocated=args.colocated)
    if args.json:
        json.dump(result, sys.stdout)
        sys.stdout.write("\n")
    else:
        for i, item in enumerate(result["outputs"]):
            shown = item.get("text", item["token_ids"])
            print(f"[{i}] {shown!r}  ({len(item['token_ids'])} tokens, {item['finish_reason']}, {item['instance']})")
    return 0
