"""The steps of `tools/gpu_check.sh` that want Python: what the machine has, what the `gpu` tests did,
a disaggregated deployment's greedy tokens against the CPU engine's, and the one JSON summary.

Standard library only, so the script can run it before anything is installed; the deployment and its
CPU reference run as ``disaggsdk`` processes. Each step prints one JSON document on stdout:

    python tools/gpu_check.py environment
    python tools/gpu_check.py gpu-tests JUNIT_XML [--log PYTEST_LOG]
    python tools/gpu_check.py deploy SPEC [--prompt TEXT ...] [--output-len N] [--dtype D --compare first-token]
    python tools/gpu_check.py summary ENVIRONMENT_JSON GPU_TESTS_JSON DEPLOY_JSON... --elapsed-s S

``deploy`` runs on a CPU spec too (tests/tools/test_gpu_check.py runs it on specs/tiny_pd.yaml): the
path is the same one, only the spec's device differs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

# A gpu test may skip on a GPU machine only for want of hardware the check cannot ask for ("needs 2
# GPUs"); any other skip (a missing package, no CUDA in torch, a libfabric without FI_HMEM) means the
# piece was not verified, so the check fails.
HARDWARE_SHORTAGE_SKIP = re.compile(r"needs (at least )?\d+ (NVIDIA )?GPUs", re.IGNORECASE)
DEFAULT_PROMPTS = ("def fib(n):", "class Stack:", "import numpy as np\n")
READY_LINE = re.compile(r"ready in .*(http://[\w.\-]+:\d+)/v1")
DISTRIBUTIONS = {"torch": "torch", "flashinfer": "flashinfer-python", "cuda_python": "cuda-python",
                 "disaggsdk": "disaggsdk"}


# environment


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What this machine offers: the GPU's name and driver (nvidia-smi), the installed versions of
    torch, flashinfer-python, cuda-python and disaggsdk, torch's CUDA version and whether torch sees a GPU.

    Returns:
        ``{"gpu_name", "driver", "gpu_count", "torch", "torch_cuda", "torch_sees_cuda", "flashinfer",
        "cuda_python", "disaggsdk"}`` (None where a thing is absent).
    """
    found: dict[str, Any] = {"gpu_name": None, "driver": None, "gpu_count": 0}
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
        rows = [[c.strip() for c in line.split(",")] for line in listed.stdout.splitlines() if line.strip()]
        if listed.returncode == 0 and rows:
            found.update(gpu_name=rows[0][0], driver=rows[0][-1], gpu_count=len(rows))
    found.update({key: _version(dist) for key, dist in DISTRIBUTIONS.items()})
    found["torch_cuda"], found["torch_sees_cuda"] = None, False
    if found["torch"]:
        probe = subprocess.run([sys.executable, "-c", "import torch, json; print(json.dumps("
                                "[torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count()]))"],
                               capture_output=True, text=True, timeout=120)
        if probe.returncode == 0:
            found["torch_cuda"], found["torch_sees_cuda"], torch_count = json.loads(probe.stdout)
            found["gpu_count"] = max(found["gpu_count"], torch_count)
    return found


# the gpu tests


def gpu_test_results(junit_xml: Path) -> dict[str, Any]:
    """Each test of a ``pytest --junitxml`` report, its outcome and, for a skip, whether it counts.

    Args:
        junit_xml: the report of ``pytest -m gpu``.
    Returns:
        ``{"tests": {test_id: {"outcome": passed|failed|error|skipped, "reason"?: str}}, "passed",
        "failed", "skipped", "skipped_for_hardware", "ok"}``; ``ok`` when at least one test ran, none
        failed and every skip is for hardware the machine lacks (`HARDWARE_SHORTAGE_SKIP`).
    Raises:
        FileNotFoundError, xml.etree.ElementTree.ParseError: no report, or not one.
    """
    tests: dict[str, dict[str, str]] = {}
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        result: dict[str, str] = {"outcome": "passed"}
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                result = {"outcome": outcome, "reason": (child.get("message") or "").strip()[:300]}
                break
        tests[test_id] = result
    return _counted(tests)


# a test's line in ``pytest -v`` output: "tests/a.py::test_b[x] SKIPPED (needs 2 GPUs) [ 50%]"
VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \((.*)\))?")


def unfinished_gpu_test_results(pytest_log: Path) -> dict[str, Any]:
    """What a ``pytest -v`` run that wrote no report (stopped at the check's time limit) said of each test it
    reached. Never ``ok``: the tests it did not reach were not verified.

    Returns:
        as `gpu_test_results`, with ``"error"`` saying the run did not finish.
    Raises:
        OSError: no log.
    """
    tests: dict[str, dict[str, str]] = {}
    for line in pytest_log.read_text(errors="replace").splitlines():
        found = VERBOSE_LINE.match(line)
        if found:
            outcome = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "error"}.get(
                found.group(2), "skipped")
            tests[found.group(1)] = {"outcome": outcome, **({"reason": found.group(3)} if found.group(3) else {})}
    return {**_counted(tests), "ok": False, "error": f"pytest wrote no report (stopped?); {pytest_log} has the rest"}


def _counted(tests: dict[str, dict[str, str]]) -> dict[str, Any]:
    """``tests`` with their counts, and ``ok``: some ran, none failed, every skip was for missing hardware."""
    outcomes = [t["outcome"] for t in tests.values()]
    for_hardware = [t for t in tests.values()
                    if t["outcome"] == "skipped" and HARDWARE_SHORTAGE_SKIP.search(t.get("reason", ""))]
    counts = {"passed": outcomes.count("passed"), "failed": outcomes.count("failed") + outcomes.count("error"),
              "skipped": outcomes.count("skipped"), "skipped_for_hardware": len(for_hardware)}
    ok = bool(tests) and counts["failed"] == 0 and counts["skipped"] == counts["skipped_for_hardware"]
    return {"tests": tests, **counts, "ok": ok}


# the deployment


def _stream_completion(url: str, prompt: str, output_len: int, timeout_s: float) -> dict[str, Any]:
    """One greedy streamed completion: its token ids and the seconds to its first token."""
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start_s = time.monotonic()
    ttft_s, token_ids = None, []
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data:"):]).get("choices", []):
                new_ids = choice.get("token_ids") or []
                if new_ids and ttft_s is None:
                    ttft_s = time.monotonic() - start_s
                token_ids.extend(new_ids)
    return {"token_ids": token_ids, "ttft_s": ttft_s}


def _stop(proc: subprocess.Popen[str], grace_s: float = 20.0) -> None:
    """SIGTERM the launch's process group (it cleans its units and shared memory up), SIGKILL after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
    try:  # the units may outlive their launcher's exit: the group goes in any case
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _spec_model(spec: Path) -> str:
    """The spec's `model` (a top-level YAML key; read without a YAML parser, as the script has none yet)."""
    for line in spec.read_text().splitlines():
        found = re.match(r"model:\s*(\S+)", line)
        if found:
            return found.group(1).strip("'\"")
    raise ValueError(f"{spec} has no top-level model: key")


def cpu_reference(model: str, prompts: list[str], output_len: int, timeout_s: float) -> list[list[int]]:
    """The greedy tokens of the CPU engine in float32 (``disaggsdk generate``) for each prompt.

    Raises:
        RuntimeError: the command failed (its stderr is the message).
    """
    command = [sys.executable, "-m", "disaggsdk.cli.main", "generate", "--model", model, "--device", "cpu",
               "--dtype", "float32", "--output-len", str(output_len), "--ignore-eos", "--json"]
    for prompt in prompts:
        command += ["--prompt", prompt]
    # eager: the reference is a few short prompts, and compiling them would cost minutes of the check
    env = {**os.environ, "DISAGGSDK_COMPILE": "0"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"disaggsdk generate exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return [out["token_ids"] for out in json.loads(done.stdout)["outputs"]]


def spec_in_dtype(spec: Path, dtype: str, out_dir: Path) -> Path:
    """A copy of ``spec`` whose weights, activations and KV pages are ``dtype``, written into ``out_dir``.

    Raises:
        disaggsdk.errors.SpecError: ``spec`` does not validate, or not in ``dtype``.
    """
    import attrs

    from disaggsdk.spec import load_spec, save_spec

    loaded = load_spec(spec)
    changed = attrs.evolve(loaded, engine=attrs.evolve(loaded.engine, dtype=dtype), kv=attrs.evolve(loaded.kv, dtype=dtype))
    path = out_dir / f"{spec.stem}_{dtype}.yaml"
    save_spec(changed, path)
    return path


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """How many tokens two greedy continuations share before they part (all of the shorter if they never do)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def deploy(spec: Path, prompts: list[str], output_len: int, log_dir: Path, timeout_s: float,
           dtype: str | None = None, compare: str = "exact") -> dict[str, Any]:
    """Launch ``spec`` (``disaggsdk launch``), complete every prompt greedily at once over HTTP, shut it
    down, and compare the tokens with the CPU engine's in float32.

    Args:
        spec: a disaggregated spec (a prefill and a decode unit).
        prompts: the completions' prompts.
        output_len: tokens per completion (``ignore_eos``: exactly this many).
        log_dir: where the launch's output and the units' logs go.
        timeout_s: how long the launch may take to be ready, and each completion.
        dtype: run the spec with its weights, activations and KV in this dtype (None: as it says).
        compare: ``exact``: every token must equal the CPU engine's (a float32 deployment);
            ``first-token``: each prompt's first token must (a bfloat16 deployment, whose later tokens
            may part from float32's at a near tie and then differ for good: `common_prefix_tokens` says where).
    Returns:
        ``{"spec", "dtype", "compare", "tokens_equal", "first_tokens_equal", "common_prefix_tokens", "ttft_s"
        (the slowest first token), "ttft_s_each", "elapsed_s", "deployment_tokens", "cpu_tokens", "ok", "error"?}``.
    """
    start_s = time.monotonic()
    log_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"spec": str(spec), "dtype": dtype, "compare": compare, "tokens_equal": False,
                              "ok": False}
    try:
        launched = spec_in_dtype(spec, dtype, log_dir) if dtype else spec
    except Exception as exc:  # noqa: BLE001 - the check's answer, not a traceback
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    launch_log = log_dir / "launch.out"
    command = [sys.executable, "-m", "disaggsdk.cli.main", "launch", str(launched), "--port", "0", "--no-live",
               "--log-dir", str(log_dir)]
    # its own process group: every unit it starts is stopped with it, whatever happens here
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = _wait_ready(proc, launch_log, timeout_s)
        answers: list[dict[str, Any] | Exception] = [RuntimeError("no answer")] * len(prompts)

        def complete(i: int) -> None:
            try:
                answers[i] = _stream_completion(url, prompts[i], output_len, timeout_s)
            except Exception as exc:  # noqa: BLE001 - reported in the result, the others still run
                answers[i] = exc

        threads = [threading.Thread(target=complete, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [f"prompt {i}: {a}" for i, a in enumerate(answers) if isinstance(a, Exception)]
        if failed:
            raise RuntimeError("; ".join(failed))
        served = [a for a in answers if isinstance(a, dict)]
        result["deployment_tokens"] = [a["token_ids"] for a in served]
        result["ttft_s_each"] = [a["ttft_s"] for a in served]
        result["ttft_s"] = max((t for t in result["ttft_s_each"] if t is not None), default=None)
    except Exception as exc:  # noqa: BLE001 - any failure is the check's answer, not a traceback
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        _stop(proc)
    if "error" not in result:
        try:
            result.update(compare_tokens(result["deployment_tokens"],
                                         cpu_reference(_spec_model(spec), prompts, output_len, timeout_s),
                                         output_len, compare))
        except Exception as exc:  # noqa: BLE001
            result["error"] = f"{type(exc).__name__}: {exc}"
    result["elapsed_s"] = round(time.monotonic() - start_s, 1)
    return result


def compare_tokens(deployed: list[list[int]], cpu: list[list[int]], output_len: int, compare: str) -> dict[str, Any]:
    """A deployment's greedy tokens against the CPU engine's, prompt by prompt.

    Args:
        deployed, cpu: each prompt's tokens from the deployment and from the CPU engine.
        output_len: the tokens each completion had to give.
        compare: ``exact`` or ``first-token`` (see `deploy`).
    Returns:
        ``{"cpu_tokens", "tokens_equal", "first_tokens_equal", "common_prefix_tokens", "ok"}``; ``ok`` when every
        completion is ``output_len`` long and the comparison holds.
    Raises:
        ValueError: an unknown ``compare``.
    """
    if compare not in ("exact", "first-token"):
        raise ValueError(f"compare must be exact or first-token, not {compare!r}")
    first_tokens_equal = len(deployed) == len(cpu) and all(d[:1] == c[:1] and d for d, c in zip(deployed, cpu))
    tokens_equal = deployed == cpu
    full_length = all(len(d) == output_len for d in deployed)
    return {"cpu_tokens": cpu, "tokens_equal": tokens_equal, "first_tokens_equal": first_tokens_equal,
            "common_prefix_tokens": [common_prefix_len(d, c) for d, c in zip(deployed, cpu)],
            "ok": full_length and (tokens_equal if compare == "exact" else first_tokens_equal)}


def _wait_ready(proc: subprocess.Popen[str], launch_log: Path, timeout_s: float) -> str:
    """The base URL the launch prints once ready; its output goes on into ``launch_log`` (a thread copies it).

    Raises:
        RuntimeError: it exited or said nothing ready within ``timeout_s`` (the last lines are the message).
    """
    assert proc.stdout is not None, "the launch is started with a pipe"
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def copy() -> None:
        with launch_log.open("w") as log:
            for line in proc.stdout:  # type: ignore[union-attr]
                log.write(line)
                log.flush()
                lines.append(line)
                ready = READY_LINE.search(line)
                if ready and not url:
                    url.append(ready.group(1))
                    found.set()
        found.set()  # the output ended: ready or not

    threading.Thread(target=copy, daemon=True).start()
    if not found.wait(timeout_s) or not url:
        tail = "".join(lines[-15:]).strip()
        state = f"exited {proc.poll()}" if proc.poll() is not None else f"not ready in {timeout_s:.0f} s"
        raise RuntimeError(f"disaggsdk launch {state}: {tail}")
    return url[0]


# the summary


def summary(env: dict[str, Any], gpu_tests: dict[str, Any], deployments: list[dict[str, Any]], elapsed_s: float,
            log_dir: str | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    """The check's one JSON document: the machine, each gpu test, the deployments, and ``ok`` when all passed.

    Args:
        env: `environment`'s result.
        gpu_tests: `gpu_test_results`'s (or ``{"ok": False, "error": ...}`` when pytest gave no report).
        deployments: `deploy`'s results (or ``{"ok": False, "error": ...}``), the float32 one first.
        elapsed_s: the whole check's seconds.
        log_dir: where the steps' output is.
        notes: what the script installed, or failed to.
    Returns:
        the document; ``tokens_equal`` says whether every exact-compared deployment gave the CPU engine's
        tokens, ``ttft_s`` is the first deployment's.
    """
    exact = [d for d in deployments if d.get("compare", "exact") == "exact"]
    document = {
        "ok": bool(gpu_tests.get("ok")) and bool(deployments) and all(d.get("ok") for d in deployments),
        "gpu_name": env.get("gpu_name"), "driver": env.get("driver"), "gpu_count": env.get("gpu_count"),
        "torch": env.get("torch"), "torch_cuda": env.get("torch_cuda"), "flashinfer": env.get("flashinfer"),
        "cuda_python": env.get("cuda_python"), "disaggsdk": env.get("disaggsdk"),
        "gpu_tests": gpu_tests,
        "deployments": deployments,
        "tokens_equal": bool(exact) and all(d.get("tokens_equal") for d in exact),
        "ttft_s": deployments[0].get("ttft_s") if deployments else None,
        "elapsed_s": round(elapsed_s, 1),
        "log_dir": log_dir,
        "notes": notes or [],
    }
    if not document["ok"]:
        failed = ["gpu tests"] if not gpu_tests.get("ok") else []
        failed += [f"the deployment in {d['dtype']}" if d.get("dtype") else "the deployment in the spec's dtype"
                   for d in deployments if not d.get("ok")]
        document["reason"] = f"{' and '.join(failed) or 'no deployment'} did not pass"
    return document


def _read_json(path: str, what: str) -> dict[str, Any]:
    try:
        loaded = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"no {what} result: {exc}"}
    return loaded if isinstance(loaded, dict) else {"ok": False, "error": f"{what}: not a JSON object"}


def main(argv: list[str] | None = None) -> int:
    """Run one step (see the module doc) and print its JSON; exit 0 when the step passed, 1 when not."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("environment")
    tests = steps.add_parser("gpu-tests")
    tests.add_argument("junit_xml", type=Path)
    tests.add_argument("--log", type=Path, help="the run's `pytest -v` output, read when it wrote no report")
    run = steps.add_parser("deploy")
    run.add_argument("spec", type=Path)
    run.add_argument("--prompt", action="append", dest="prompts")
    run.add_argument("--output-len", type=int, default=16)
    run.add_argument("--log-dir", type=Path, default=Path("gpu_check_logs"))
    run.add_argument("--timeout-s", type=float, default=240.0)
    run.add_argument("--dtype", help="run the spec in this dtype (weights, activations, KV)")
    run.add_argument("--compare", choices=("exact", "first-token"), default="exact")
    total = steps.add_parser("summary")
    total.add_argument("environment_json")
    total.add_argument("gpu_tests_json")
    total.add_argument("deploy_json", nargs="+")
    total.add_argument("--elapsed-s", type=float, required=True)
    total.add_argument("--log-dir")
    total.add_argument("--notes", default="", help="lines of notes (what was installed)")
    args = parser.parse_args(argv)
    if args.step == "environment":
        document = environment()
    elif args.step == "gpu-tests":
        try:
            document = gpu_test_results(args.junit_xml)
        except (OSError, ElementTree.ParseError) as exc:
            document = {"ok": False, "error": f"no pytest report: {exc}"}
            if args.log and args.log.is_file():
                document = unfinished_gpu_test_results(args.log)
    elif args.step == "deploy":
        # SIGTERM (the script's cleanup, its timeout) unwinds through deploy's finally, which stops the launch
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
        document = deploy(args.spec, args.prompts or list(DEFAULT_PROMPTS), args.output_len, args.log_dir,
                          args.timeout_s, args.dtype, args.compare)
    else:
        document = summary(_read_json(args.environment_json, "environment"),
                           _read_json(args.gpu_tests_json, "gpu tests"),
                           [_read_json(path, "deployment") for path in args.deploy_json], args.elapsed_s, args.log_dir,
                           [line for line in args.notes.splitlines() if line.strip()])
    print(json.dumps(document))
    return 0 if document.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
