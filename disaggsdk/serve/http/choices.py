"""One HTTP request, several choices: ``n`` samples of each of a batch of prompts, each a
`RequestRun` of its own in the backend, answered as one OpenAI response.

Choice ``k`` is prompt ``k // n``'s sample ``k % n`` (OpenAI's order). All runs start at once (their
prefills overlap) and stream concurrently: SSE chunks carry one choice each, with its index, as
its tokens come. The usage counts each prompt once (its tokens, and those of them a prefix cache
served, as its first sample found them) and every choice's tokens. A client that leaves
aborts every run; a run that fails ends the whole answer with its error, as a single one does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from disaggsdk.engine.sampling_params import MAX_SEED
from disaggsdk.serve.backend import TokenEvent
from disaggsdk.serve.http import openai_response as resp
from disaggsdk.serve.http.error_bodies import BadRequestError, ErrorBody
from disaggsdk.serve.http.openai_json import JsonObject
from disaggsdk.serve.http.openai_request import ParsedRequest
from disaggsdk.serve.http.request_run import RequestRun

DISCONNECT_POLL_S = 0.5  # how often a request checks that its client is still there


def _sse(data: JsonObject | ErrorBody | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class Choices:
    """The runs of one HTTP request and what they share.

    Args:
        runs: one per choice, in choice order.
        response_id: the response's ``id`` (the runs' own ids are unique per choice).
        prompt_tokens: the prompts' token count, each prompt once.
        n: samples per prompt (runs ``k * n`` .. ``k * n + n - 1`` are prompt ``k``'s).
    """

    def __init__(self, runs: Sequence[RequestRun], response_id: str, prompt_tokens: int, n: int = 1):
        self.runs = list(runs)
        self.response_id = response_id
        self.prompt_tokens = prompt_tokens
        self.n = n
        self.cached_tokens = 0  # of prompt_tokens, those a prefix cache served; known once the runs started
        self.chat = self.runs[0].req.chat

    def body(self, choices: list[JsonObject], chunk: bool, usage: JsonObject | None = None) -> JsonObject:
        first = self.runs[0]
        return resp.body(self.chat, self.response_id, first.created, first.model, choices, chunk=chunk, usage_=usage)

    def usage(self) -> JsonObject:
        return resp.usage(self.prompt_tokens, sum(r.completion_tokens for r in self.runs), self.cached_tokens)

    def error(self) -> str | None:
        return next((r.error or "the request failed" for r in self.runs if r.finish_reason == "error"), None)

    async def start(self, request: Request) -> list[TokenEvent] | None:
        """Every run's first event, or None when the client left first (every run is then aborted).

        Raises:
            BadRequestError: a run was refused before its first token (the others are aborted).
        """
        tasks = [asyncio.ensure_future(r.start()) for r in self.runs]
        try:
            while not all(t.done() for t in tasks):
                await asyncio.wait(tasks, timeout=DISCONNECT_POLL_S, return_when=asyncio.FIRST_EXCEPTION)
                failure = next((e for t in tasks if t.done() and (e := t.exception()) is not None), None)
                if failure is not None:
                    raise failure
                if not all(t.done() for t in tasks) and await request.is_disconnected():
                    raise ConnectionAbortedError
        except BaseException as exc:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for r in self.runs:  # started or not: abort it in the backend, close its stream
                await r.abandon()
            if isinstance(exc, ConnectionAbortedError):
                return None
            raise
        firsts = [t.result() for t in tasks]
        # an engine fixes a request's cached tokens when it admits it, so its first event has them;
        # each prompt counts once, as in prompt_tokens: its first sample's
        self.cached_tokens = sum(f.num_cached_tokens for f in firsts[::self.n])
        return firsts

    async def stream(self, firsts: list[TokenEvent]) -> AsyncIterator[str]:
        """SSE chunks; starlette cancels this generator when the client goes away (-> abort all)."""
        queue: asyncio.Queue[JsonObject | None] = asyncio.Queue()

        async def pump(index: int, run: RequestRun, first: TokenEvent) -> None:
            try:
                async for piece in run.pieces(first):
                    await queue.put({**piece.choice, "index": index})
            finally:
                await queue.put(None)

        tasks = [asyncio.ensure_future(pump(k, r, f)) for k, (r, f) in enumerate(zip(self.runs, firsts))]
        try:
            ended = 0
            while ended < len(tasks):
                choice = await queue.get()
                if choice is None:
                    ended += 1
                    continue
                yield _sse(self.body([choice], chunk=True))
            error = self.error()
            if error:
                yield _sse(BadRequestError(error, status=500, kind="server_error").body())
            if self.runs[0].req.include_usage:
                yield _sse(self.body([], chunk=True, usage=self.usage()))
            yield _sse("[DONE]")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def whole(self, request: Request, firsts: list[TokenEvent]) -> Response:
        """Collect every answer while watching for the client leaving (then abort them all)."""
        collected: list[tuple[list[int], list[resp.LogprobsObject]]] = [([], []) for _ in self.runs]

        async def collect(k: int, run: RequestRun, first: TokenEvent) -> None:
            token_ids, logprobs = collected[k]
            async for piece in run.pieces(first):
                token_ids.extend(piece.token_ids)
                if piece.logprobs:
                    logprobs.append(piece.logprobs)

        tasks = [asyncio.ensure_future(collect(k, r, f)) for k, (r, f) in enumerate(zip(self.runs, firsts))]
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=DISCONNECT_POLL_S)
            if not all(t.done() for t in tasks) and await request.is_disconnected():
                for t in tasks:
                    t.cancel()  # run.pieces' cleanup aborts each request in the backend
                await asyncio.gather(*tasks, return_exceptions=True)
                return Response(status_code=499)
        for t in tasks:
            t.result()
        error = self.error()
        if error:
            err = BadRequestError(error, status=500, kind="server_error")
            return JSONResponse(err.body(), status_code=500)
        choices = []
        for k, (run, (token_ids, logprobs)) in enumerate(zip(self.runs, collected)):
            choice = resp.choice(run.req.chat, run.text, run.finish_reason, resp.merge_logprobs(logprobs, run.req.chat),
                                 token_ids if run.req.return_token_ids else None, delta=False,
                                 tool_calls=run.tool_calls)
            choices.append({**choice, "index": k})
        return JSONResponse(self.body(choices, chunk=False, usage=self.usage()))


def expand_choices(req: ParsedRequest) -> list[ParsedRequest]:
    """One request per choice, in OpenAI's order (prompt-major, then sample): sample i of a seeded
    request draws with seed + i, so ``n`` samples differ from each other and repeat run to run."""
    out = []
    for prompt in (req.prompt_ids, *req.more_prompts):
        for i in range(req.n):
            seed = None if req.params.seed is None else (req.params.seed + i) % (MAX_SEED + 1)
            out.append(dataclasses.replace(req, prompt_ids=prompt, more_prompts=(), n=1,
                                           params=dataclasses.replace(req.params, seed=seed)))
    return out

