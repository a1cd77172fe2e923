"""How fast a server answers after it is started, and how fast it answers once it settled: one command.

    python -m disaggsdk.bench.first_start --port 8393 --duration-s 180 -- disaggsdk launch --model M ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import httpx

COMPILED_MARKERS = ("compiled in", "did not compile")


def run(command: list[str], port: int, model: str | None, prompt: str, max_tokens: int, duration_s: float,
        window: int, startup_timeout_s: float) -> dict[str, object]:
    """Start ``command``, time its completions for ``duration_s`` from its start, stop it; the figures
    as a JSON-ready dict (see the module docstring)."""
    started_s = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[tuple[float, str]] = []

    def read_output() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - started_s, line.rstrip()))

    threading.Thread(target=read_output, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    completions: list[dict[str, float]] = []
    first_answer_s: float | None = None
    try:
        with httpx.Client(timeout=startup_timeout_s) as client:
            while model is None and time.monotonic() - started_s < startup_timeout_s and proc.poll() is None:
                try:
                    model = client.get(f"{url}/v1/models", timeout=2).json()["data"][0]["id"]
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    time.sleep(0.2)
            if model is None:
                raise SystemExit(f"{command[0]} did not answer on port {port} in {startup_timeout_s:g} s: "
                                 + "\n".join(line for _, line in lines[-20:]))
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            while time.monotonic() - started_s < duration_s and proc.poll() is None:
                sent_s = time.monotonic()
                answer = client.post(f"{url}/v1/completions", json=body)
                done_s = time.monotonic()
                if answer.status_code != 200:
                    raise SystemExit(f"completion failed ({answer.status_code}): {answer.text[:300]}")
                if first_answer_s is None:
                    first_answer_s = done_s - started_s
                completions.append({"at_s": round(sent_s - started_s, 2), "latency_s": round(done_s - sent_s, 4)})
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    latencies = [c["latency_s"] for c in completions]
    return {
        "command": " ".join(command), "max_tokens": max_tokens,
        "first_completion_s": None if first_answer_s is None else round(first_answer_s, 2),
        "completions": len(completions),
        "median_latency_first_s": statistics.median(latencies[:window]) if latencies else None,
        "median_latency_last_s": statistics.median(latencies[-window:]) if latencies else None,
        "compiled_lines": [f"{t:.1f} s: {line}" for t, line in lines if any(m in line for m in COMPILED_MARKERS)],
        "latencies": completions,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run, print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="where the command serves")
    parser.add_argument("--model", help="the model name to ask for (default: the first of /v1/models)")
    parser.add_argument("--prompt", default="def fib(n):")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=180.0, help="from the start, how long to send")
    parser.add_argument("--window", type=int, default=10, help="completions in each median")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server's command line after --")
    print(json.dumps(run(command, args.port, args.model, args.prompt, args.max_tokens, args.duration_s,
                         args.window, args.startup_timeout_s), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
