"""After a step's forward pass: choose each sampling request's tokens, advance the requests, report them.

A chunk that samples without drafts takes one token from `sample` (all such rows in one call, so
a request's seeded stream is the same with or without speculation elsewhere in the batch). A
chunk with drafts has one logits row per token and keeps what `verify_drafts` accepts plus the
target's own next token; its rejected positions are dropped from the request's computed tokens
(their KV slots are overwritten later) and pages past the new end go back to the pool.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from disaggsdk.engine.logits_processors import process_rows
from disaggsdk.engine.prompt_logprobs import prompt_rows, record_prompt_logprobs
from disaggsdk.engine.sampling import sample
from disaggsdk.engine.sampling_params import TokenLogprobs
from disaggsdk.engine.scheduler import ScheduledChunk, Scheduler
from disaggsdk.engine.sequence import RequestOutput
from disaggsdk.engine.speculative.stats import SpecStats
from disaggsdk.engine.speculative.verify import verify_drafts
from disaggsdk.engine.stopping import stop_reason
from disaggsdk.engine.structured.grammar import EMPTY_MASK_ERROR, GRAMMAR_FINISH_REASON, GrammarState, apply_masks, new_bitmask

log = logging.getLogger(__name__)


def logits_rows(chunk: ScheduledChunk, ends_prefill: bool) -> int:
    """Rows of logits a chunk needs (its last ones): one per verified position when it samples, one
    at the end of a prefill (its hidden state and logits are the context a prefill unit ships), and
    from the first prompt token it scores on when it asks for prompt logprobs."""
    own = 1 + len(chunk.draft_ids) if chunk.sample else int(ends_prefill)
    return max(own, prompt_rows(chunk))


@dataclass
class StepSettings:
    """What postprocessing needs to know about its engine."""

    mode: str
    return_hidden_states: bool
    eos_ids: frozenset[int]


def _process_logits(chunks: Sequence[ScheduledChunk], first_row: Sequence[int], logits: torch.Tensor,
                    eos_ids: frozenset[int]) -> None:
    """Penalties, logit bias and min_tokens on the rows of every request that asks for them, in place;
    verified row j of a request counts the drafts before it as output."""
    for i, c in enumerate(chunks):
        params = c.request.params
        if c.sample and params.processes_logits:
            out = c.request.output_ids
            outputs = [out + list(c.draft_ids[:j]) for j in range(len(c.draft_ids) + 1)]
            process_rows(logits[first_row[i] : first_row[i] + len(outputs)], params, c.request.prompt_ids,
                         outputs, eos_ids)


def _mask_grammars(chunks: Sequence[ScheduledChunk], first_row: Sequence[int], logits: torch.Tensor) -> None:
    """Mask the logits rows of every request with a grammar, in place, before anything is chosen
    (one mask for the step: rows of requests without a grammar allow everything)."""
    constrained = [(i, c, c.request.grammar) for i, c in enumerate(chunks)
                   if c.sample and c.request.grammar is not None]
    if not constrained:
        return
    bitmask = new_bitmask(logits.shape[0], logits.shape[1])
    for i, c, grammar in constrained:
        grammar.fill_masks(c.draft_ids, bitmask[first_row[i] : first_row[i] + len(c.draft_ids) + 1])
    apply_masks(logits, bitmask)


def _choose(chunks: Sequence[ScheduledChunk], first_row: Sequence[int], logits: torch.Tensor,
            stats: SpecStats) -> dict[int, tuple[list[int], list[TokenLogprobs | None], int]]:
    """chunk index -> (tokens, their logprobs, drafts accepted) for every sampling chunk."""
    plain = [i for i, c in enumerate(chunks) if c.sample and not c.draft_ids]
    chosen: dict[int, tuple[list[int], list[TokenLogprobs | None], int]] = {}
    if plain:
        ids, lps = sample(logits[[first_row[i] for i in plain]], [chunks[i].request.params for i in plain],
                          [chunks[i].request.generator for i in plain])
        chosen = {i: ([t], [lp], 0) for i, t, lp in zip(plain, ids, lps)}
    for i, c in enumerate(chunks):
        if c.sample and c.draft_ids:
            k = len(c.draft_ids)
            v = verify_drafts(logits[first_row[i] : first_row[i] + k + 1], c.draft_ids, c.request.params,
                              c.request.generator)
            stats.record(k, v.num_accepted)
            c.request.num_draft_tokens += k
            c.request.num_accepted_tokens += v.num_accepted
            logprobs: list[TokenLogprobs | None] = list(v.logprobs) if v.logprobs else [None] * len(v.token_ids)
            chosen[i] = (v.token_ids, logprobs, v.num_accepted)
    return chosen


def postprocess(chunks: Sequence[ScheduledChunk], rows: Sequence[int], hidden: torch.Tensor, logits: torch.Tensor,
                scheduler: Scheduler, settings: StepSettings, stats: SpecStats) -> list[RequestOutput]:
    """Advance every request of the step and report it.

    Args:
        chunks: the step's chunks; rows: logits rows of each (`logits_rows`).
        hidden, logits: the runner's rows, in chunk order.
    """
    starts = list(itertools.accumulate(rows, initial=0))
    scored = {i for i, c in enumerate(chunks) if record_prompt_logprobs(c, logits[starts[i] : starts[i] + rows[i]])}
    # a sampling chunk's own rows are its last 1 + len(drafts): those before score the prompt
    first_row = [s + r - 1 - len(c.draft_ids) for s, r, c in zip(starts, rows, chunks)]
    _process_logits(chunks, first_row, logits, settings.eos_ids)
    _mask_grammars(chunks, first_row, logits)
    chosen = _choose(chunks, first_row, logits, stats)
    outputs = []
    for i, chunk in enumerate(chunks):
        req = chunk.request
        out = RequestOutput(req.request_id, [], req.output_ids, False)
        if i in scored or (req.params.prompt_logprobs is not None and len(req.prompt_ids) == 1
                           and not req.output_ids and chunk.sample):
            out.prompt_logprobs = list(req.prompt_logprobs)  # complete now (a 1-token prompt: at once)
        if rows[i] and settings.return_hidden_states:
            out.hidden_state = hidden[starts[i] + rows[i] - 1].float().cpu()
            out.logits = logits[starts[i] + rows[i] - 1].cpu()
        if i in chosen:
            tokens, lps, accepted = chosen[i]
            # the verified positions: the last known token and the accepted drafts
            req.num_computed_tokens += chunk.num_tokens - len(chunk.draft_ids) + accepted
            for token, lp in zip(tokens, lps):
                reason = stop_reason(req.params, len(req.output_ids) + 1, token, settings.eos_ids)
                # an eos or stop token ends it anyway, unless the grammar failed: its mask then
                # allowed only the eos, and the request must not end as if its output matched
                if req.grammar is not None and (reason != "stop" or req.grammar.failed):
                    done, req.error = _follow_grammar(req.grammar, token)
                    if done == "error":  # never emit a token the grammar refused
                        scheduler.finish(req, done)
                        break
                    reason = reason or done
                req.output_ids.append(token)
                out.new_token_ids.append(token)
                if lp is not None:
                    req.output_logprobs.append(lp)
                    out.new_logprobs.append(lp)
                if reason:
                    scheduler.finish(req, reason)
                    break
            if chunk.draft_ids and not req.is_finished:
                scheduler.trim_pages(req)
        else:
            req.num_computed_tokens += chunk.num_tokens
            if settings.mode == "prefill_only" and req.num_computed_tokens >= scheduler.target_tokens(req):
                scheduler.finish(req, "prefilled", keep_pages=True)
        req.draft_ids = []
        out.num_computed_tokens = req.num_computed_tokens
        out.num_cached_tokens = req.num_cached_tokens
        out.output_ids = list(req.output_ids)
        out.finished, out.finish_reason, out.error = req.is_finished, req.finish_reason, req.error
        outputs.append(out)
    return outputs


def _follow_grammar(grammar: GrammarState, token: int) -> tuple[str | None, str | None]:
    """Advance a request's grammar over a kept token: (finish reason, error). "stop" when the grammar
    is complete (nothing but the end may follow); "error" with the matcher's reason when it refused
    the token, which the mask makes impossible unless no token at all could continue it (the
    request ends rather than emit text its grammar forbids)."""
    if grammar.failed or not grammar.accept(token):
        log.warning("grammar refused token %d (%s); ending the request", token, grammar.error)
        reason = grammar.error if EMPTY_MASK_ERROR not in grammar.error else ""  # llguidance's word for it
        return "error", f"the output's grammar cannot continue: {reason or 'no token can extend it'}"
    return (GRAMMAR_FINISH_REASON if grammar.is_finished else None), None
