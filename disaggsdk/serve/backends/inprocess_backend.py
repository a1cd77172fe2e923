"""One colocated engine in this process, behind the `ServingBackend` contract.

`disaggsdk serve --model qwen3-coder-tiny` uses it: one `LLMEngine` in ``mixed`` mode steps in a
background thread; requests reach it through a thread-safe queue and tokens go back to each
caller's asyncio loop with ``loop.call_soon_threadsafe``. The engine is only ever touched by its
own thread, so it needs no locks.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError
from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.serve.backend import LaunchedUnits, TokenEvent
from disaggsdk.serve.model_tokenizer import encode_prompt

if TYPE_CHECKING:
    from disaggsdk.engine.compile_progress import CompileProgress
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.engine.sequence import RequestOutput

IDLE_WAIT_S = 0.05  # how long the idle engine thread blocks on its inbox before looking again


@dataclass
class _Subscriber:
    """Where one request's events go: an asyncio queue on the caller's loop."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[TokenEvent]


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    subscriber: _Subscriber


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass
class _Reset:
    """Reset the prefix cache on the engine thread; ``done`` is set once ``free_pages`` holds the result."""

    done: threading.Event
    free_pages: int = 0


class InProcessBackend:
    """A single ``mixed`` engine stepping in a thread.

    Args:
        model: a tiny catalog name or a checkpoint directory.
        config: engine settings (``mode`` is forced to ``mixed``).
        name: the instance name shown in stats, /metrics and the live views.
    Raises:
        ModelError, EngineError: the engine cannot be built.
    """

    supports_logprobs = True

    @property
    def max_model_len(self) -> int | None:
        """The longest request in tokens (prompt + output), checked at the HTTP edge: the engine's
        ``max_model_len``, else the model's context."""
        return self._engine.config.max_model_len or self._engine.arch.max_context_tokens

    def __init__(self, model: str, config: EngineConfig | None = None, name: str = "mixed-0",
                 on_compile: Callable[[CompileProgress], None] | None = None):
        from disaggsdk.engine.config import EngineConfig
        from disaggsdk.engine.llm_engine import LLMEngine
        from disaggsdk.engine.tokenizer import ByteTokenizer, load_tokenizer

        self.model_name = model
        self.name = name
        self._tokenizer = load_tokenizer(model) or ByteTokenizer()
        self._engine: LLMEngine = LLMEngine(model, replace(config or EngineConfig(), mode="mixed"), on_compile=on_compile)
        self._inbox: queue.SimpleQueue[_Add | _Abort | _Reset | None] = queue.SimpleQueue()
        self._subscribers: dict[str, _Subscriber] = {}  # engine thread only
        self._stats = InstanceStats(name, "mixed", kv_pages_total=self._engine.kv.num_pages)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)
        self._thread.start()

    # the ServingBackend contract

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as a prompt (BOS first where the model has one).

        Raises:
            PromptTooLong: ``text`` holds more than `max_model_len` tokens for certain.
        """
        return encode_prompt(self._tokenizer, text, self.max_model_len)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids`` (without special tokens unless asked)."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    async def generate(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams, client: str = "",
                       trace_context: Mapping[str, str] | None = None,
                       response_id: str = "") -> AsyncGenerator[TokenEvent, None]:
        """Stream the request's tokens; a refused request (or a closed backend) yields one ``error`` event.
        ``client`` is not used: a request that takes this engine down takes the server with it; nor are
        ``trace_context`` and ``response_id``: one engine in this process is not traced
        (`serve.tracing.request_tracing` traces a launched deployment)."""
        if self._closed.is_set():
            yield TokenEvent(request_id, [], True, "error", error="this backend is closed; start a new one",
                             instance=self.name)
            return
        sub = _Subscriber(asyncio.get_running_loop(), asyncio.Queue())
        self._inbox.put(_Add(request_id, list(prompt_ids), params, sub))
        finished = False
        try:
            while not finished:
                event = await sub.events.get()
                finished = event.finished
                yield event
        finally:
            if not finished:  # the consumer went away (client disconnect): free the pages
                self._inbox.put(_Abort(request_id))

    async def abort(self, request_id: str) -> None:
        """Stop a request; a late abort of a finished request does nothing."""
        self._inbox.put(_Abort(request_id))

    def reset_prefix_cache(self, timeout_s: float = 10.0) -> dict[str, int]:
        """Forget every cached page no request holds (on the engine thread); the free pages after,
        by instance name (empty when the engine did not answer within ``timeout_s``)."""
        cmd = _Reset(threading.Event())
        self._inbox.put(cmd)
        return {self.name: cmd.free_pages} if cmd.done.wait(timeout_s) else {}

    def stats(self, wait_s: float = 0.0) -> list[InstanceStats]:
        """A copy of the engine thread's latest snapshot (kept current each loop: nothing to wait for)."""
        return [replace(self._stats)]  # its counters are a fresh record at each snapshot

    def close(self) -> None:
        """Stop the engine thread (pending requests end with ``abort``) and the engine. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._stats.healthy = False
        self._inbox.put(None)
        self._thread.join(timeout=30)
        self._engine.close()

    def units(self) -> LaunchedUnits | None:
        """None: one engine in this process has no units to route, move, trace or wait for."""
        return None

    def __enter__(self) -> InProcessBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the engine thread

    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                if not self._drain_inbox(block=not self._engine.has_unfinished()):
                    break
                self._engine.take_compiled_step()  # told when the background compile ends, idle or not
                if self._engine.has_unfinished():
                    self._dispatch(self._engine.step())
                self._snapshot()
        except Exception as exc:  # a crashed engine must not leave callers waiting forever
            self._stats.healthy = False
            self._fail_all(f"engine crashed: {type(exc).__name__}: {exc}")
            raise
        finally:
            self._fail_all("server shutting down", reason="abort")

    def _drain_inbox(self, block: bool) -> bool:
        """Apply every queued command. Returns False when told to stop."""
        while True:
            try:
                cmd = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
            except queue.Empty:
                return True
            block = False
            if cmd is None:
                return False
            if isinstance(cmd, _Reset):
                self._engine.kv.reset_prefix_cache()
                cmd.free_pages = self._engine.kv.num_free_pages
                cmd.done.set()
                continue
            if isinstance(cmd, _Abort):
                if self._engine.abort(cmd.request_id):
                    self._send(cmd.request_id, TokenEvent(cmd.request_id, [], True, "abort", instance=self.name))
                continue
            self._add(cmd)

    def _add(self, cmd: _Add) -> None:
        self._subscribers[cmd.request_id] = cmd.subscriber
        try:
            self._engine.add_request(cmd.request_id, cmd.prompt_ids, cmd.params)
        except DisaggError as exc:
            event = TokenEvent(cmd.request_id, [], True, "error", error=str(exc), instance=self.name)
            self._send(cmd.request_id, event)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            if not out.new_token_ids and not out.finished:
                continue  # a prefill chunk that did not end the prompt
            event = TokenEvent(
                out.request_id, list(out.new_token_ids), out.finished, out.finish_reason,
                new_logprobs=list(out.new_logprobs or ()), error=out.error, instance=self.name,
                prompt_logprobs=out.prompt_logprobs, num_cached_tokens=out.num_cached_tokens,
            )
            self._send(out.request_id, event)

    def _send(self, request_id: str, event: TokenEvent) -> None:
        sub = self._subscribers.get(request_id)
        if sub is None:
            return  # late event for a request already ended: normal, drop it
        if event.finished:
            del self._subscribers[request_id]
        try:
            sub.loop.call_soon_threadsafe(sub.events.put_nowait, event)
        except RuntimeError:
            pass  # the caller's loop is closed: nobody is listening any more

    def _fail_all(self, error: str, reason: str = "error") -> None:
        for request_id in list(self._subscribers):
            self._engine.abort(request_id)
            self._send(request_id, TokenEvent(request_id, [], True, reason, error=error, instance=self.name))

    def _snapshot(self) -> None:
        sched = self._engine.scheduler
        self._stats.running = len(sched.running)
        self._stats.waiting = len(sched.waiting)
        self._stats.kv_pages_used = self._engine.kv.num_pages - self._engine.kv.num_free_pages
        self._stats.counters = self._engine.counters()
