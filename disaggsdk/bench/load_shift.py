"""A load that shifts: phases of different prompt and output lengths, back to back, against any
OpenAI-compatible server (ours with or without `serve.autoscale`, `vllm serve`), with each phase's
SLO attainment over its last half (when a policy has had time to act).

    python -m disaggsdk.bench.load_shift http://127.0.0.1:8000 --model M \\
        --phase short:30:8:32:96 --phase long:30:2:1024:8 --phase short:30:8:32:96 --ttft-ms 1000 --tpot-ms 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from disaggsdk.bench.dataset import RANDOM_TOKEN_ID_LIMIT
from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    import httpx

FIRST_TOKEN_ID = 10  # clear of the special ids a tiny vocabulary starts with


class PhaseResult(TypedDict):
    """One phase's line of the JSON document (`summarize`)."""

    phase: int
    name: str
    duration_s: float
    qps: float
    input_len: int
    output_len: int
    requests: int
    failed: int
    mean_ttft_ms: float | None
    mean_tpot_ms: float | None
    max_itl_ms: float | None  # the longest pause of any stream (a move's included)
    attainment: float | None
    attainment_last_half: float | None
    errors: list[str]


class SloLimits(TypedDict):
    ttft_ms: float
    tpot_ms: float


class LoadShiftResult(TypedDict):
    """The JSON document `run_load_shift` returns."""

    url: str
    model: str
    slo: SloLimits
    seed: int
    phases: list[PhaseResult]
    failed: int
    requests: int
    outputs: list[str]  # each request's output, in send order: greedy runs of one seed compare request by request


class LoadShiftError(DisaggError):
    """A phase that cannot be run (bad spelling, non-positive numbers)."""


@dataclass(frozen=True)
class Phase:
    """One stretch of the load."""

    name: str
    duration_s: float
    qps: float
    input_len: int
    output_len: int

    @classmethod
    def parse(cls, text: str) -> Phase:
        """``NAME:SECONDS:QPS:INPUT_LEN:OUTPUT_LEN``.

        Raises:
            LoadShiftError: another spelling, or a number that is not positive.
        """
        parts = text.split(":")
        try:
            name, seconds, qps, n_in, n_out = parts
            phase = cls(name, float(seconds), float(qps), int(n_in), int(n_out))
        except ValueError:
            raise LoadShiftError(f"phase {text!r}: write NAME:SECONDS:QPS:INPUT_LEN:OUTPUT_LEN, "
                                 "e.g. long:30:2:1024:8") from None
        if min(phase.duration_s, phase.qps, phase.input_len, phase.output_len) <= 0:
            raise LoadShiftError(f"phase {text!r}: seconds, rate and lengths must be positive")
        return phase


@dataclass
class Sent:
    """One request of the run and what came back (``time.monotonic()`` seconds)."""

    phase: int  # its phase's index
    offset_s: float  # when the schedule sends it, from the run's start (what phases and halves go by)
    sent_s: float
    token_times_s: list[float] = field(default_factory=list)
    error: str | None = None
    text: list[str] = field(default_factory=list)  # the output, chunk by chunk (greedy: comparable across servers)

    def meets(self, ttft_ms: float, tpot_ms: float) -> bool:
        if self.error is not None or not self.token_times_s:
            return False
        t = self.token_times_s
        tpot_ok = len(t) < 2 or (t[-1] - t[0]) * 1e3 / (len(t) - 1) <= tpot_ms
        return (t[0] - self.sent_s) * 1e3 <= ttft_ms and tpot_ok


def schedule(phases: list[Phase], seed: int) -> list[tuple[float, int, list[int]]]:
    """Every request's send offset (seconds from the start), phase index and prompt."""
    rng = random.Random(seed)
    out, start = [], 0.0
    for index, phase in enumerate(phases):
        t = start + rng.expovariate(phase.qps)
        while t < start + phase.duration_s:
            prompt = [rng.randrange(FIRST_TOKEN_ID, RANDOM_TOKEN_ID_LIMIT) for _ in range(phase.input_len)]
            out.append((t, index, prompt))
            t += rng.expovariate(phase.qps)
        start += phase.duration_s
    return out


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], phase: Phase, sent: Sent,
               headers: dict[str, str]) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": phase.output_len, "stream": True, "ignore_eos": True,
            "temperature": 0.0}
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                sent.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    sent.error = str(chunk["error"])
                    return
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    sent.token_times_s.append(time.monotonic())
                    sent.text.append(chunk["choices"][0]["text"])
    except Exception as exc:  # noqa: BLE001 - a failed request is a result of the run, not its end
        sent.error = f"{type(exc).__name__}: {exc}"


async def _run(url: str, model: str, phases: list[Phase], plan: list[tuple[float, int, list[int]]],
               api_key: str | None) -> list[Sent]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=64)
    results: list[Sent] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.monotonic()
        tasks = []
        for offset, index, prompt in plan:
            delay = start + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = Sent(index, offset, time.monotonic())
            results.append(sent)
            tasks.append(asyncio.create_task(_one(client, url, model, prompt, phases[index], sent, headers)))
        await asyncio.gather(*tasks)
    return results


def summarize(phases: list[Phase], results: list[Sent], ttft_ms: float, tpot_ms: float) -> list[PhaseResult]:
    """Per phase: requests, failures, mean TTFT and TPOT, the longest pause of a stream, and SLO
    attainment over its whole span and over its last half (requests scheduled in the second half of
    its time)."""
    rows, phase_start = [], 0.0
    for i, phase in enumerate(phases):
        mine = [r for r in results if r.phase == i]
        half = [r for r in mine if r.offset_s >= phase_start + phase.duration_s / 2]
        ok = [r for r in mine if r.error is None and r.token_times_s]
        ttfts = [(r.token_times_s[0] - r.sent_s) * 1e3 for r in ok]
        tpots = [(r.token_times_s[-1] - r.token_times_s[0]) * 1e3 / (len(r.token_times_s) - 1)
                 for r in ok if len(r.token_times_s) > 1]
        gaps = [(b - a) * 1e3 for r in ok for a, b in zip(r.token_times_s, r.token_times_s[1:])]
        rows.append(PhaseResult(
            phase=i, name=phase.name, duration_s=phase.duration_s, qps=phase.qps, input_len=phase.input_len,
            output_len=phase.output_len, requests=len(mine), failed=len(mine) - len(ok),
            mean_ttft_ms=sum(ttfts) / len(ttfts) if ttfts else None,
            mean_tpot_ms=sum(tpots) / len(tpots) if tpots else None,
            max_itl_ms=max(gaps) if gaps else None,
            attainment=sum(r.meets(ttft_ms, tpot_ms) for r in mine) / len(mine) if mine else None,
            attainment_last_half=sum(r.meets(ttft_ms, tpot_ms) for r in half) / len(half) if half else None,
            errors=sorted({r.error for r in mine if r.error})[:3],
        ))
        phase_start += phase.duration_s
    return rows


def run_load_shift(url: str, model: str, phases: list[Phase], ttft_ms: float, tpot_ms: float,
                   api_key: str | None = None, seed: int = 0) -> LoadShiftResult:
    """Run the phases against ``url`` and return the JSON document (see the module doc)."""
    plan = schedule(phases, seed)
    results = asyncio.run(_run(url.rstrip("/"), model, phases, plan, api_key))
    return LoadShiftResult(url=url, model=model, slo=SloLimits(ttft_ms=ttft_ms, tpot_ms=tpot_ms), seed=seed,
                           phases=summarize(phases, results, ttft_ms, tpot_ms),
                           failed=sum(r.error is not None for r in results), requests=len(results),
                           outputs=["".join(r.text) for r in results])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m disaggsdk.bench.load_shift", description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--model", required=True)
    parser.add_argument("--phase", action="append", required=True, metavar="NAME:SECONDS:QPS:IN:OUT")
    parser.add_argument("--ttft-ms", type=float, required=True)
    parser.add_argument("--tpot-ms", type=float, required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        phases = [Phase.parse(p) for p in args.phase]
    except LoadShiftError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(run_load_shift(args.url, args.model, phases, args.ttft_ms, args.tpot_ms, args.api_key,
                                    args.seed), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
