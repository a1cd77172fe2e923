"""Text a grammar forces that spells a special token ("<tool_call>", "<|im_end|>") is written with
ordinary tokens: the mask never offers the special token, which the grammar would then refuse (the
request ended with "the output's grammar cannot continue", a 500)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llguidance")

from disaggsdk.engine.structured.grammar import GrammarState, ll_tokenizer, new_bitmask  # noqa: E402
from disaggsdk.engine.structured.output import StructuredOutput  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402
from disaggsdk.models import resolve_model  # noqa: E402

MODEL = "qwen3-coder-tiny"


def greedy_walk(output: StructuredOutput) -> list[int]:
    """The lowest allowed token at every step until the grammar ends; fails on a refusal or an empty mask."""
    vocab = resolve_model(MODEL).vocab_size
    grammar = GrammarState(output, ll_tokenizer(MODEL))
    bits = torch.arange(32, dtype=torch.int32)
    tokens = []
    while not grammar.is_finished:
        mask = new_bitmask(1, vocab)
        grammar.fill_masks([], mask)
        allowed = ((mask.unsqueeze(-1) >> bits) & 1).reshape(-1)[:vocab].nonzero().flatten().tolist()
        assert allowed, f"empty mask after {tokens}: {grammar.error}"
        assert grammar.accept(allowed[0]), f"the mask offered token {allowed[0]}, then refused it: {grammar.error}"
        tokens.append(allowed[0])
        assert len(tokens) < 64
    return tokens


@pytest.mark.parametrize("output,text", [
    (StructuredOutput.json_schema({"const": "<tool_call>"}), '"<tool_call>"'),
    (StructuredOutput.json_schema({"enum": ["<|im_end|>"]}), '"<|im_end|>"'),
    (StructuredOutput("regex", "<tool_call>x"), "<tool_call>x"),
])
def test_forced_special_token_text_is_spelled_with_ordinary_tokens(output, text):
    tok = load_tokenizer(MODEL)
    special = set(ll_tokenizer(MODEL).eos_tokens) | {tok.encode("<tool_call>")[0]}
    tokens = greedy_walk(output)
    assert not special & set(tokens[:-1])  # the last one may be the end (eos)
    assert tok.decode(tokens, skip_special_tokens=True) == text
