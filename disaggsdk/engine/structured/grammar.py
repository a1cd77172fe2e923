"""A request's grammar on the decode engine: llguidance's matcher, the token mask of each verified
position, and the tokens the request keeps.

Why llguidance: it runs on the CPU with no dependencies beyond its wheel (xgrammar pulls torch
extensions and triton), computes a mask in tens of microseconds with its lexer slices, takes JSON
Schema, regex and Lark directly, and can roll back: what speculative decoding needs.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from disaggsdk.engine.structured.byte_level_vocab import byte_level_ll_tokenizer, is_byte_level
from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError

if TYPE_CHECKING:
    import torch
    from llguidance import LLMatcher, LLParserLimits, LLTokenizer

GRAMMAR_FINISH_REASON = "stop"  # a completed grammar ends the request as an eos would


@functools.lru_cache(maxsize=8)
def ll_tokenizer(model: str) -> LLTokenizer:
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
    text = path.read_text()
    if eos and is_byte_level(json.loads(text)):  # special tokens' text in a grammar stays text
        return byte_level_ll_tokenizer(path, arch.vocab_size, eos)
    return LLTokenizer(text, n_vocab=arch.vocab_size, eos_token=eos or None)


# The limits every matcher of this package is built with, at the HTTP edge and in a unit alike:
# what a server admits, a unit can build. llguidance asserts that a grammar has fewer
# than u16::MAX - 10 = 65,525 symbols and panics past it (a rule of 70,000 string alternatives, as
# choice lists were compiled then); its own symbol limit, kept below that, turns such a grammar
# into an error before the assertion is reached.
MAX_GRAMMAR_SYMBOLS = 60_000
# llguidance text of one constraint: a schema, a pattern, a choice list or a Lark grammar, as given
# and as compiled. Compiling grows with it (a rule of 250 KB of alternatives: 0.5 s on one core;
# 830 KB: 8 s); 128 KiB holds tool and JSON schemas hundreds of times larger than usual ones.
MAX_GRAMMAR_BYTES = 128 * 1024
MAX_ERROR_CHARS = 2000  # of llguidance's message in an error that reaches a client
GRAMMAR_TIME_LIMIT_S = 2.0  # a unit refuses a build that runs longer (it finishes on its worker thread)
EMPTY_MASK_ERROR = "NoExtensionBias"  # llguidance's error when a mask allows no token (its grammar cannot go on)


def parser_limits() -> LLParserLimits:
    """The `llguidance.LLParserLimits` every matcher is built with (`MAX_GRAMMAR_SYMBOLS`; the
    lexer's fuel and the parser's items at llguidance's defaults). Errors are terse: a verbose one
    carries the parser state and the whole grammar, 120 KB for a large choice list, into the
    client's error body and the logs."""
    from llguidance import LLParserLimits

    return LLParserLimits(max_grammar_size=MAX_GRAMMAR_SYMBOLS, verbose_errors=False)


def check_grammar_bytes(output: StructuredOutput, num_bytes: int) -> None:
    """Refuse a constraint whose text is over `MAX_GRAMMAR_BYTES`, before anything compiles it.

    Raises:
        StructuredOutputError: it is.
    """
    if num_bytes > MAX_GRAMMAR_BYTES:
        raise StructuredOutputError(
            f"structured output {output.kind}: {num_bytes} bytes of grammar is over the limit of "
            f"{MAX_GRAMMAR_BYTES} bytes; send a smaller schema, pattern or choice list")


def check_value_bytes(output: StructuredOutput) -> None:
    """`check_grammar_bytes` on the text the request gave, before it is turned into a grammar.

    Raises:
        StructuredOutputError: it is over `MAX_GRAMMAR_BYTES`.
    """
    check_grammar_bytes(output, len(output.value.encode("utf-8", "surrogatepass")))


def build_matcher(output: StructuredOutput, tokenizer: LLTokenizer) -> LLMatcher:
    """A fresh `llguidance.LLMatcher` for ``output``: exactly what a unit's engine builds for a
    request, with `parser_limits` and `MAX_GRAMMAR_BYTES`. Compiled matchers are kept (`_compiled`)
    and copied, so the unit's engine, building it again after the unit's own check, pays ~20 us.

    Args:
        output: the request's constraint.
        tokenizer: `ll_tokenizer` of the engine's model.
    Returns:
        a matcher at the start of the grammar.
    Raises:
        StructuredOutputError: the text is over `MAX_GRAMMAR_BYTES`; the schema, pattern or grammar
            is invalid, uses an unsupported feature or is over `parser_limits` (llguidance's
            message says which); or llguidance panicked building it.
    """
    return _compiled(output, tokenizer).deep_copy()


@functools.lru_cache(maxsize=64)  # a process-wide cache, as `ll_tokenizer`: a matcher is never handed out
def _compiled(output: StructuredOutput, tokenizer: LLTokenizer) -> LLMatcher:
    from llguidance import LLMatcher

    check_value_bytes(output)
    grammar = output.lark()
    check_grammar_bytes(output, len(grammar.encode("utf-8", "surrogatepass")))
    try:  # drops the GIL while it builds: other threads run meanwhile
        matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=parser_limits())
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - pyo3's PanicException is a BaseException
        raise StructuredOutputError(f"structured output {output.kind}: the grammar cannot be built "
                                    f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if matcher.is_error():  # llguidance reports refusals, limits and caught panics this way
        raise StructuredOutputError(f"structured output {output.kind}: {matcher.get_error()[:MAX_ERROR_CHARS]}")
    _check_first_mask(output, matcher)
    return matcher


def _check_first_mask(output: StructuredOutput, matcher: LLMatcher) -> None:
    """Refuse a constraint no output can match, as far as llguidance can tell from its first mask.

    llguidance builds a grammar whose language is empty (a schema that only refers to itself, a
    ``$ref`` cycle, a pattern that matches no string) without complaint; only its first mask finds
    no token that starts an output, and the request would then end at once with an empty text and
    ``finish_reason: stop``. A grammar that dead-ends after some tokens is the engine's to end with
    an error (`GrammarState.failed`).

    Raises:
        StructuredOutputError: the first mask fails.
    """
    probe = matcher.deep_copy()  # the kept matcher stays at its start, unmasked
    probe.compute_bitmask()
    if not probe.is_error():
        return
    reason = probe.get_error()
    if EMPTY_MASK_ERROR in reason:
        raise StructuredOutputError(f"structured output {output.kind}: no output can match it (no token can start "
                                    "one: a schema that only refers to itself, a $ref cycle, or a pattern that "
                                    "matches no string)")
    raise StructuredOutputError(f"structured output {output.kind}: {reason[:MAX_ERROR_CHARS]}")


def check_structured(model: str, output: StructuredOutput) -> None:
    """Whether ``output`` builds for ``model`` as a unit builds it: what a server checks before
    admitting a request (`grammar_compiler.GrammarCompiler.check`: what fails within a tenth of a
    second is refused here; a longer build is admitted, and the unit that builds it, with the same
    limits, answers that request with its error).

    Raises:
        StructuredOutputError: it is over `MAX_GRAMMAR_BYTES`, or does not build; or the model has
            no tokenizer for grammars.
    """
    from disaggsdk.engine.structured.grammar_compiler import grammar_compiler

    grammar_compiler(model).check(output)


class GrammarState:
    """One request's matcher.

    Args:
        output: the request's constraint.
        tokenizer: `ll_tokenizer` of the engine's model.
    Raises:
        StructuredOutputError: the constraint does not build (`build_matcher`).
    """

    def __init__(self, output: StructuredOutput, tokenizer: LLTokenizer):
        self.matcher = build_matcher(output, tokenizer)

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
    def failed(self) -> bool:
        """The grammar cannot go on: no token extends what it matched (its last mask allowed only the
        eos, which does not complete it). The request must end with an error, not as if complete."""
        return self.matcher.is_error()

    @property
    def error(self) -> str:
        """Why the matcher stopped (llguidance's message, at most `MAX_ERROR_CHARS`)."""
        return self.matcher.get_error()[:MAX_ERROR_CHARS]


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
