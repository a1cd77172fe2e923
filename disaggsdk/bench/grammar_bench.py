"""What structured output costs a decode step: a batch of 8, half constrained by a JSON Schema,
against the same batch unconstrained.

    python -m disaggsdk.bench.grammar_bench [--model qwen3-coder-tiny] [--batch 8] [--steps 48]
        [--speculative mtp|ngram] [--num-tokens 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

SCHEMA = {"type": "array", "minItems": 200, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
    "required": ["name", "n"], "additionalProperties": False}}


@contextlib.contextmanager
def _timed(targets: list[tuple[Any, str]], total: list[float]) -> Iterator[None]:
    """Add the time spent in each ``(owner, name)`` to ``total[0]`` while inside; restored after."""
    reals = [(owner, name, getattr(owner, name)) for owner, name in targets]

    def timing(real: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                total[0] += time.perf_counter() - start
        return timed

    for owner, name, real in reals:
        setattr(owner, name, timing(real))
    try:
        yield
    finally:
        for owner, name, real in reals:
            setattr(owner, name, real)


def run_grammar_bench(model: str, batch: int = 8, steps: int = 48, method: str | None = None,
                      num_tokens: int = 2) -> dict[str, Any]:
    """The comparison (see the module docstring)."""
    from disaggsdk.engine import step_outputs
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.engine.speculative.config import SpeculativeConfig
    from disaggsdk.engine.structured import grammar
    from disaggsdk.engine.structured.output import StructuredOutput
    from disaggsdk.engine.tokenizer import load_tokenizer
    from disaggsdk.errors import ModelError

    grammar_s = [0.0]
    # the bench's own instrumentation, around the grammar's calls
    targets = [(grammar.GrammarState, "fill_masks"), (grammar.GrammarState, "accept"), (step_outputs, "apply_masks")]
    tok = load_tokenizer(model)
    if tok is None:
        raise ModelError(f"{model} has no tokenizer on this machine: the bench encodes a text prompt")
    prompt = tok.encode("records = ")
    spec = SpeculativeConfig(method, num_tokens) if method else None
    result: dict[str, Any] = {"model": model, "batch": batch, "steps": steps, "speculative": method}
    with _timed(targets, grammar_s), LLMEngine(model, EngineConfig(num_pages=64 * batch, speculative=spec,
                                                                          compile_in_background=False)) as engine:
        for label, constrained in (("free", 0), ("mixed", batch // 2), ("free", 0), ("mixed", batch // 2)):
            params = [SamplingParams(max_tokens=steps, ignore_eos=True,
                                     structured=StructuredOutput.json_schema(SCHEMA) if i < constrained else None)
                      for i in range(batch)]
            engine.generate([prompt] * batch, [SamplingParams(max_tokens=2)] * batch)  # warm-up
            grammar_s[0], calls = 0.0, 0
            start = time.perf_counter()
            for i, p in enumerate(params):
                engine.add_request(f"{label}-{i}", prompt, p)
            if constrained:  # each constrained request compiles its schema once, when it is added
                result["grammar_compile_ms_per_request"] = round((time.perf_counter() - start) / batch * 1e3, 3)
            start = time.perf_counter()
            while engine.has_unfinished():
                engine.step()
                calls += 1
            seconds = time.perf_counter() - start
            result[f"{label}_ms_per_step"] = round(seconds / calls * 1e3, 3)  # the second run of each is kept
            if constrained:
                result["grammar_ms_per_step"] = round(grammar_s[0] / calls * 1e3, 3)
                result["constrained_requests"] = constrained
    result["step_overhead"] = round(result["mixed_ms_per_step"] / result["free_ms_per_step"] - 1, 3)
    result["grammar_share_of_free_step"] = round(result["grammar_ms_per_step"] / result["free_ms_per_step"], 3)
    return result


def main(argv: list[str] | None = None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-coder-tiny")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--speculative", choices=("mtp", "ngram"), default=None)
    p.add_argument("--num-tokens", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(json.dumps(run_grammar_bench(a.model, a.batch, a.steps, a.speculative, a.num_tokens), indent=1))


if __name__ == "__main__":
    main()
