"""The built wheel in fresh venvs: each extra alone runs its commands, a missing one is one line and exit 2.

Each venv is made with ``python -m venv`` (no system site packages) and gets the wheel through
pip, from the same place (index, mirror, links) this environment's packages came from, with the
versions this environment holds as constraints: the engine's torch stays the CPU build already
here instead of whatever newest torch the index offers. The commands run in a scratch folder
with the repository off sys.path, so only what the wheel installed is imported.

In the default run: the core-only venv (the wheel with no extra). Slow (``make test-all``): each
extra alone, and ``make demo``'s job from the wheel without the Makefile.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from importlib.metadata import distributions
from pathlib import Path

import pytest

from disaggsdk.cli.required_extras import EXTRA_MODULES, command_extras, install_hint

REPO = Path(__file__).resolve().parents[2]
SPEC = str(REPO / "specs" / "tiny_local.yaml")
INSTALL_TIMEOUT_S = 900  # torch's wheel unpacked on a busy 2-core machine
ONE_LINE_LAUNCH = ["launch", "--model", "qwen3-coder-tiny", "--device", "cpu", "--decoders", "2", "--port", "0"]

# a call of every command that needs an extra: the venvs without it must answer with one line
CALLS_NEEDING_EXTRAS = {
    "generate": ["generate", "--model", "qwen3-coder-tiny", "--prompt", "def fib(n):"],
    "serve": ["serve", "--model", "qwen3-coder-tiny", "--port", "0"],
    "launch": ONE_LINE_LAUNCH,
    "bench": ["bench", "http://127.0.0.1:9", "--num-prompts", "1"],
    "transfer-bench": ["transfer-bench"],
    "kv-bench": ["kv-bench", SPEC],
    "calibrate": ["calibrate"],
}


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built once per session, with its native extensions inside."""
    folder = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(folder),
                    str(REPO)], check=True, capture_output=True, timeout=INSTALL_TIMEOUT_S)
    (wheel,) = folder.glob("disaggsdk-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for extension in ("disaggsdk/transfer/_fabric", "disaggsdk/engine/attention/_cpu_kernels"):
        assert any(n.startswith(extension) and n.endswith(".so") for n in names), \
            f"{extension} is not in the wheel (libfabric-dev and a C compiler: `make sysdeps`)"
    assert "disaggsdk/models/checkpoints/qwen3-coder-tiny/model.safetensors" in names  # the demo's weights
    return wheel


def _constraints(folder: Path) -> Path:
    # the versions of this environment: a fresh venv resolves to them (already on this machine)
    # rather than to the index's newest (for torch: a CUDA build of several GB)
    pins = sorted({f"{d.metadata['Name']}=={d.version}" for d in distributions()
                   if d.metadata["Name"] and d.metadata["Name"].lower() != "disaggsdk"})
    path = folder / "constraints.txt"
    path.write_text("\n".join(pins) + "\n")
    return path


def make_venv(folder: Path, wheel: Path, extras: tuple[str, ...]) -> Path:
    """A fresh venv at ``folder`` with ``wheel[extras]`` installed; returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    bin_dir = folder / "bin"
    requirement = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "-q",
         "-c", str(_constraints(folder)), requirement],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return bin_dir


def run_cli(bin_dir: Path, cwd: Path, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``disaggsdk ARGS`` from the venv, in ``cwd``, with no PYTHONPATH reaching the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"  # wide tables: the assertions read whole words
    return subprocess.run([str(bin_dir / "disaggsdk"), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout_s)


def assert_needs_extras(result: subprocess.CompletedProcess[str], command: str, extras: tuple[str, ...]) -> None:
    """The command ended with exactly the one install line on stderr and exit 2, no traceback."""
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr == f"error: {install_hint(command, extras)}\n"
    assert f"pip install 'disaggsdk[{','.join(extras)}]'" in result.stderr
    assert result.returncode == 2


def assert_core_commands_run(bin_dir: Path, cwd: Path) -> None:
    """``validate`` and ``plan`` run on the core alone."""
    validated = run_cli(bin_dir, cwd, "validate", SPEC)
    assert validated.returncode == 0, validated.stderr
    planned = run_cli(bin_dir, cwd, "plan", SPEC)
    assert planned.returncode == 0, planned.stderr
    assert "prefill" in planned.stdout and "decode" in planned.stdout


def test_the_wheel_without_extras_plans_and_names_the_missing_extras(built_wheel, tmp_path):
    bin_dir = make_venv(tmp_path / "venv", built_wheel, ())
    assert_core_commands_run(bin_dir, tmp_path)
    assert_needs_extras(run_cli(bin_dir, tmp_path, *CALLS_NEEDING_EXTRAS["generate"]), "generate", ("engine",))
    assert_needs_extras(run_cli(bin_dir, tmp_path, *ONE_LINE_LAUNCH), "launch", ("engine", "transfer", "serve"))
    assert_needs_extras(run_cli(bin_dir, tmp_path, "transfer-bench"), "transfer-bench", ("transfer",))
    assert run_cli(bin_dir, tmp_path, "launch", "--help").returncode == 0


def panel_text(output: str, title: str) -> str:
    """The text inside the rich panel titled ``title`` in ``output``, borders and padding removed."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    body = []
    for line in lines[start + 1:]:
        if line.lstrip().startswith("╰"):
            break
        body.append(line.strip().strip("│").strip())
    return "\n".join(body).strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(cli: Path, tmp_path: Path) -> Iterator[str]:
    """`disaggsdk serve` of the tiny model by the console script ``cli``, until exit; yields its URL."""
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([str(cli), "serve", "--model", "qwen3-coder-tiny", "--port", str(port), "--no-live"],
                              stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the tiny server was not ready within 300 s"
            time.sleep(1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


@pytest.fixture
def tiny_server(tmp_path: Path) -> Iterator[str]:
    """The tiny model served from this (complete) environment: a server for the serve-only venv's client."""
    with serving(Path(sys.executable).parent / "disaggsdk", tmp_path) as url:
        yield url


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("extra", ["engine", "transfer", "serve"])
def test_each_extra_alone_runs_its_commands(built_wheel, tmp_path, extra, request):
    bin_dir = make_venv(tmp_path / "venv", built_wheel, (extra,))
    assert_core_commands_run(bin_dir, tmp_path)
    if extra == "engine":
        # the n-gram drafts import numpy: the import that had no extra before issue 38
        generated = run_cli(bin_dir, tmp_path, "generate", "--model", "qwen3-coder-tiny", "--prompt", "def fib(n):",
                            "--output-len", "8", "--speculative", "ngram", "--json", timeout_s=900)
        assert generated.returncode == 0, generated.stderr
        assert "Traceback" not in generated.stderr
        (output,) = json.loads(generated.stdout)["outputs"]
        assert len(output["token_ids"]) == 8 and output["text"].strip()
        assert "speculative" in json.loads(generated.stdout)  # the n-gram proposer ran
        calibrated = run_cli(bin_dir, tmp_path, "calibrate", "--rounds", "1", "--output", str(tmp_path / "profile.yaml"),
                             timeout_s=900)
        assert calibrated.returncode == 0, calibrated.stderr
        assert "matrix rate" in calibrated.stdout and (tmp_path / "profile.yaml").stat().st_size > 0
    elif extra == "transfer":
        measured = run_cli(bin_dir, tmp_path, "transfer-bench", "--sizes", "4K,64K", "--maps", "contiguous",
                           "--region-mib", "4", "--total-mib", "4", "--json", timeout_s=600)
        assert measured.returncode == 0, measured.stderr
        cells = json.loads(measured.stdout)
        assert [c["write_bytes"] for c in cells] == [4096, 65536]
        assert all(c["gb_per_s"] > 0 for c in cells)
    else:
        url = request.getfixturevalue("tiny_server")
        loaded = run_cli(bin_dir, tmp_path, "bench", url, "--num-prompts", "4", "--input-len", "32",
                         "--output-len", "8", "--output", str(tmp_path / "bench.json"), timeout_s=600)
        assert loaded.returncode == 0, loaded.stderr
        assert json.loads((tmp_path / "bench.json").read_text())["completed"] == 4
    installed = set(EXTRA_MODULES[extra])
    for command, call in CALLS_NEEDING_EXTRAS.items():
        # an extra whose modules the installed one brings too (transfer's cffi and msgspec come with
        # the engine) is not missing
        missing = tuple(e for e in command_extras(command) if not set(EXTRA_MODULES[e]) <= installed)
        if missing:
            assert_needs_extras(run_cli(bin_dir, tmp_path, *call), command, missing)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_wheel_runs_make_demos_job_without_the_makefile(built_wheel, tmp_path):
    # `make demo` installs engine, transfer, notebook, serve, ray and dev; its job needs these three
    bin_dir = make_venv(tmp_path / "venv", built_wheel, ("engine", "transfer", "serve"))
    planned = run_cli(bin_dir, tmp_path, "plan", SPEC)
    assert planned.returncode == 0, planned.stderr
    demo = run_cli(bin_dir, tmp_path, *ONE_LINE_LAUNCH, "--bench", "--no-live",
                   "--complete", "def fib(n):", "--complete", "class Stack:",
                   "--num-prompts", "24", "--qps", "6", "--input-len", "256", "--output-len", "32",
                   "--output", str(tmp_path / "demo.json"), timeout_s=1800)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "Traceback" not in demo.stdout + demo.stderr
    for prompt in ("def fib(n):", "class Stack:"):
        completion = panel_text(demo.stdout, f"completion of {prompt!r}")
        assert completion.startswith(prompt) and len(completion) > len(prompt) + 10, completion  # the model wrote
    assert "benchmark" in demo.stdout and "mean_ttft_ms" in demo.stdout
    result = json.loads((tmp_path / "demo.json").read_text())
    assert result["completed"] == 24 and result["failed"] == 0
    # the other commands these three extras serve, from the same venv
    kv = run_cli(bin_dir, tmp_path, "kv-bench", SPEC, "--input-len", "128", "--num-prompts", "2", timeout_s=900)
    assert kv.returncode == 0, kv.stderr[-3000:]
    assert {"streaming", "ablation", "exposed_ratio"} <= set(json.loads(kv.stdout))  # both modes measured
    with serving(bin_dir / "disaggsdk", tmp_path) as url:
        loaded = run_cli(bin_dir, tmp_path, "bench", url, "--num-prompts", "4", "--input-len", "32", "--output-len", "8",
                         "--output", str(tmp_path / "bench.json"), timeout_s=600)
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads((tmp_path / "bench.json").read_text())["completed"] == 4
