"""A request's grammar on the decode engine: llguidance's matcher, the token mask of each verified
position, and the tokens the request keeps.

Why llguidance: it runs on the CPU with no dependencies beyond its wheel (xgrammar pulls torch
extensions and triton), computes a mask in tens of microseconds with its lexer slices, takes JSON
Schema, regex and Lark directly, and can roll back: what speculative decoding needs.

With drafts, position j of a step (the token after draft j) is masked with the matcher advanced
through drafts 1..j; drafts past the first one the grammar refuses are never accepted (their row's
mask already excludes them), so only that many are consumed, then rolled back, before the
request's accepted tokens are consumed for good.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError

if TYPE_CHECKING:
    import torch

GRAMMAR_FINISH_REASON = "stop"  # a completed grammar ends the request as an eos would


@functools.lru_cache(maxsize=8)
def ll_tokenizer(model: str) -> Any:
    """llguidance's view of ``model``'s tokenizer, with the model's vocabulary size and the eos ids
    the engine stops on (built once per process: about a second).

    Raises:
        StructuredOutputError: the model has no ``tokenizer.json`` (byte-level and full-size catalog
            models), so no grammar can be compiled for it.
    """
    from llguidance import LLTokenizer

    from disaggsdk.engine.stopping import model_eos_ids
    from disaggsdk.models import resolve_model
    from disaggsdk.models.shipped import checkpoint_directory

    directory = checkpoint_directory(model)
    path = directory / "tokenizer.json" if directory else None
    if path is None or not path.is_file():
        raise StructuredOutputError(f"{model} has no tokenizer.json, so structured output cannot be compiled "
                                    f"for it; use a checkpoint directory that has one")
    arch = resolve_model(model)
    eos = sorted(model_eos_ids(model, arch.hf_config))
    return LLTokenizer(path.read_text(), n_vocab=arch.vocab_size, eos_token=eos or None)


def check_structured(model: str, output: StructuredOutput) -> None:
    """Whether ``output`` compiles for ``model`` (what a server checks before admitting a request).

    Raises:
        StructuredOutputError: it does not, or the model has no tokenizer for grammars.
    """
    compile_grammar(output, ll_tokenizer(model))


def compile_grammar(output: StructuredOutput, tokenizer: Any) -> str:
    """``output`` as a grammar llguidance accepted for ``tokenizer``.

    Raises:
        StructuredOutputError: the schema, pattern or grammar is invalid or uses an unsupported
            feature (llguidance's message says which).
    """
    from llguidance import LLMatcher

    grammar = output.lark()
    problem = LLMatcher.validate_grammar(grammar, tokenizer)
    if problem and not problem.startswith("WARNING"):
        raise StructuredOutputError(f"structured output {output.kind}: {problem}")
    return grammar


class GrammarState:
    """One request's matcher.

    Args:
        output: the request's constraint.
        tokenizer: `ll_tokenizer` of the engine's model.
    Raises:
        StructuredOutputError: the constraint does not compile.
    """

    def __init__(self, output: StructuredOutput, tokenizer: Any):
        from llguidance import LLMatcher

        self.matcher = LLMatcher(tokenizer, compile_grammar(output, tokenizer), log_level=0)
        if self.matcher.is_error():
            raise StructuredOutputError(f"structured output {output.kind}: {self.matcher.get_error()}")

    def fill_masks(self, drafts: Sequence[int], bitmask: torch.Tensor) -> int:
        """Fill ``bitmask`` row j with the tokens allowed after drafts[:j], for every j the grammar
        reaches; rows it does not reach are left as they are. Returns that many valid drafts."""
        from llguidance.torch import fill_next_token_bitmask

        valid = self.matcher.validate_tokens(list(drafts)) if drafts else 0
        fill_next_token_bitmask(self.matcher, bitmask, 0)
        for j in range(valid):
            self.matcher.consume_token(drafts[j])
            fill_next_token_bitmask(self.matcher, bitmask, j + 1)
        if valid:
            self.matcher.rollback(valid)
        return valid

    def accept(self, token: int) -> bool:
        """Advance over a token the request keeps. False: the grammar refused it (the matcher is then
        in its error state and the request must end)."""
        return self.matcher.consume_token(token)

    @property
    def is_finished(self) -> bool:
        """The grammar is complete and allows nothing more (or is in error)."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        return self.matcher.get_error()


def apply_masks(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set the logits of tokens ``bitmask`` forbids to -inf, in place (rows align; bit t of word w
    is token 32 w + t). Eager torch rather than llguidance's helper, which is a ``torch.compile``d
    kernel: it compiles on the first structured request and pays graph guards on every call (~0.3 ms
    a call here, against tens of microseconds for these few ops)."""
    import torch

    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(bitmask.shape[0], -1)[:, : logits.shape[1]]
    with torch.inference_mode():  # the runner's logits are inference tensors
        logits.masked_fill_(allowed.to(logits.device) == 0, float("-inf"))


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A bitmask of ``rows`` rows that allows every token."""
    from llguidance.torch import allocate_token_bitmask

    return allocate_token_bitmask(rows, vocab_size)
