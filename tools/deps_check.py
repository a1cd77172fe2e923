"""Run the dependency smoke tests in a fresh venv at the newest or the oldest versions pyproject.toml allows.

    python -m tools.deps_check latest    # `make test-latest`: no constraint file, what pip picks today
    python -m tools.deps_check oldest    # `make test-oldest`: every dependency at its lower bound

Every version bound in pyproject.toml must be one a run used (docs/install.md records the runs).
`make test` runs against the pinned development torch (constraints-cpu.txt), which says nothing of
the torch a user's ``pip install`` picks: the newest once broke the compiled step. Both venvs get
every extra (engine, transfer, serve, notebook, trace, ray, gpu, kernels) and what the smoke tests need
(dev); the smoke tests are the ones marked ``deps_smoke``: generate (eager and compiled, dense,
MoE, MLA + MTP), tokens against transformers, a P/D launch served to the openai client and
benchmarked, a launch on a Ray cluster of its own, the notebooks' imports and the GPU libraries'
call signatures.

"latest" installs with pip's own configuration ignored (``PIP_CONFIG_FILE=/dev/null``): a machine's
global constraint file (the development machines cap torch) is not a user's. torch comes from the
CPU wheel index where it has the newest version and the index answers, else from PyPI (a CUDA
build: several GB). "oldest" pins each direct dependency to its lower bound (``name==bound``, as
``uv --resolution lowest-direct`` does); the transitive ones are what pip picks for them.

Prints one JSON document: the mode, the venv, the versions that ran (torch, transformers, numpy,
...), the pytest command and its outcome. Exit code: pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = "engine,transfer,serve,notebook,trace,ray,gpu,kernels,dev"  # every extra (trace: a notebook draws a traced request)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SMOKE_MARKER = "deps_smoke"
REPORTED = ("torch", "transformers", "numpy", "safetensors", "tokenizers", "llguidance", "msgspec", "cffi",
            "fastapi", "uvicorn", "httpx", "openai", "attrs", "cattrs", "pyyaml", "rich", "matplotlib", "pandas",
            "pytest", "mypy", "ruff")
# lower bounds a run could not install on this Python, and what it installs instead (say why)
OLDEST_OVERRIDES: dict[str, str] = {}


def _run(argv: list[str], env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join(argv), file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=ROOT, env=env, text=True, capture_output=True)
    if check and done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}")
    return done


def pip_env() -> dict[str, str]:
    """pip as a user's machine has it: no configuration file (no global constraint, no local wheel
    folder), no PIP_* settings of this shell."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def lower_bounds(pyproject: Path, extras: str) -> dict[str, str]:
    """Each direct dependency of the core and ``extras`` with its ``>=`` bound: name -> version.

    Raises:
        SystemExit: a dependency has no lower bound (it could not be pinned to one).
    """
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras.split(","):
        requirements += project["optional-dependencies"][extra]
    bounds: dict[str, str] = {}
    for requirement in requirements:
        found = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)$", requirement.split(";")[0].strip())
        assert found is not None, requirement
        name, specifier = found.group(1).lower(), found.group(3)
        lower = re.search(r">=\s*([0-9][^,\s]*)", specifier)
        if lower is None:
            raise SystemExit(f"{requirement}: no lower bound in pyproject.toml")
        bounds[name] = OLDEST_OVERRIDES.get(name, lower.group(1))
    return bounds


def released_versions(python: str, env: dict[str, str], name: str) -> list[str]:
    """The versions of ``name`` pip finds on the index for this venv's Python, newest first."""
    done = _run([python, "-m", "pip", "index", "versions", name], env=env)
    found = re.search(r"^Available versions: (.+)$", done.stdout, re.MULTILINE)
    if found is None:
        raise SystemExit(f"pip found no {name}: {done.stdout[-500:]}")
    return [version.strip() for version in found.group(1).split(",")]


def oldest_release(python: str, env: dict[str, str], name: str, bound: str) -> str:
    """The oldest release of ``name`` at or above ``bound`` (``pytest-timeout>=2.3`` is 2.3.1: there
    is no 2.3.0), as ``uv --resolution lowest-direct`` picks it. Versions are compared by the venv's
    ``packaging`` (``wheel`` brings it), not by this Python's, which may lack it."""
    code = ("import sys\n"
            "from packaging.version import InvalidVersion, Version\n"
            "def parsed(v):\n"
            "    try: return Version(v)\n"
            "    except InvalidVersion: return None\n"
            "bound = Version(sys.argv[1])\n"
            "found = [v for v in map(parsed, sys.argv[2:]) if v is not None and not v.is_prerelease and v >= bound]\n"
            "print(min(found) if found else '')")
    oldest = _run([python, "-c", code, bound, *released_versions(python, env, name)]).stdout.strip()
    if not oldest:
        raise SystemExit(f"{name}>={bound}: no release at or above the bound for this Python")
    return oldest


def install(mode: str, venv: Path, torch: str | None = None) -> dict[str, str]:
    """Make ``venv`` afresh and install the package with ``EXTRAS`` at ``mode``'s versions (``torch``:
    this torch instead of the newest, in "latest"); returns how torch was found ("cpu index" or
    "pypi") and the bounds pinned."""
    env = pip_env()
    _run([sys.executable, "-m", "venv", "--clear", str(venv)])
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools", "wheel", "cffi"], env=env)
    facts: dict[str, str] = {}
    if mode == "oldest":
        bounds = {name: oldest_release(python, env, name, bound)
                  for name, bound in lower_bounds(ROOT / "pyproject.toml", EXTRAS).items()}
        constraints = venv / "lower-bounds.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(bounds.items())))
        facts["constraints"] = str(constraints)
        torch_version = bounds["torch"]
    else:
        torch_version = torch or released_versions(python, env, "torch")[0]
    # the CPU build where the CPU index has it (hundreds of MB, not several GB of CUDA wheels)
    cpu = _run([python, "-m", "pip", "install", "-q", f"torch=={torch_version}", "--index-url", CPU_INDEX,
                "--timeout", "20", "--retries", "0"], env=env, check=False)
    if cpu.returncode == 0:
        facts["torch_from"] = "cpu index"
    else:
        _run([python, "-m", "pip", "install", "-q", f"torch=={torch_version}"], env=env)
        facts["torch_from"] = "pypi (the CPU index did not answer or lacks it)"
    extra_args = ["-c", facts["constraints"]] if mode == "oldest" else []
    # no build isolation: the native kernels build with the venv's setuptools and cffi just installed
    _run([python, "-m", "pip", "install", "-q", "--no-build-isolation", *extra_args, "-e", f".[{EXTRAS}]"], env=env)
    return facts


def installed_versions(python: str) -> dict[str, str]:
    """The versions `REPORTED` names, as the venv has them."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: out[name] = None\n"
            "print(json.dumps(out))")
    return json.loads(_run([python, "-c", code, *REPORTED]).stdout)


def main(argv: list[str] | None = None) -> int:
    """Build the venv, run the smoke tests, print the JSON; returns pytest's exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("latest", "oldest"))
    parser.add_argument("--venv", type=Path, help="where the venv goes (default: build/venv-MODE)")
    parser.add_argument("--reuse", action="store_true", help="keep the venv if it exists (skip the install)")
    parser.add_argument("--torch", help="latest: this torch release instead of the newest (e.g. 2.14.1)")
    args = parser.parse_args(argv)
    if args.torch and args.mode != "latest":
        parser.error("--torch goes with latest (oldest takes the lower bound)")
    venv = args.venv or ROOT / "build" / (f"venv-torch-{args.torch}" if args.torch else f"venv-{args.mode}")
    started_s = time.monotonic()
    facts: dict[str, str] = {}
    if not (args.reuse and (venv / "bin" / "python").exists()):
        facts = install(args.mode, venv, args.torch)
    install_s = time.monotonic() - started_s
    python = str(venv / "bin" / "python")
    pytest_argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", SMOKE_MARKER]
    env = {**os.environ, "DISAGGSDK_COMPILE": "1"}  # the compiled step is where a new torch breaks first
    tests = subprocess.run(pytest_argv, cwd=ROOT, env=env, text=True, capture_output=True)
    sys.stderr.write(tests.stdout[-6000:] + tests.stderr[-3000:])
    summary = (tests.stdout.strip().splitlines() or [""])[-1]
    print(json.dumps({"mode": args.mode, "venv": str(venv), "versions": installed_versions(python), **facts,
                      "python": sys.version.split()[0], "install_s": round(install_s, 1),
                      "pytest": " ".join(pytest_argv[1:]), "pytest_exit_code": tests.returncode,
                      "summary": summary, "date": time.strftime("%Y-%m-%d")}, indent=1))
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main())
