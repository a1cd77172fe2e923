"""AIConfigurator, NVIDIA's disaggregated-layout search tool, as a peer to measure against."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from typing import Literal

import attrs

COMMAND = "aiconfigurator"
TIMEOUT_S = 180.0  # `cli default` takes ~12 s on a 2-core machine, `cli estimate` ~3 s


@attrs.frozen
class AicDefault:
    """``aiconfigurator cli default``: the best disaggregated over the best aggregated tokens/s/gpu."""

    model_path: str
    system: str
    backend: str
    total_gpus: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float

    def argv(self) -> list[str]:
        """The command's arguments after the executable."""
        return ["cli", "default", "--model-path", self.model_path, "--total-gpus", str(self.total_gpus),
                "--system", self.system, "--backend", self.backend, "--isl", str(self.isl), "--osl", str(self.osl),
                "--ttft", f"{self.ttft_ms:g}", "--tpot", f"{self.tpot_ms:g}"]


@attrs.frozen
class AicEstimate:
    """``aiconfigurator cli estimate`` of one phase (``static_ctx``: prefill, ``static_gen``: decode) of one layout
    at ``batch_size`` requests per attention rank, as tokens per second per node."""

    model_path: str
    system: str
    backend: str
    mode: Literal["static_ctx", "static_gen"]
    isl: int
    osl: int
    batch_size: int
    tp: int
    dp: int
    etp: int
    ep: int
    gpus_per_node: int = 8

    def argv(self) -> list[str]:
        """The command's arguments after the executable."""
        return ["cli", "estimate", "--model-path", self.model_path, "--system", self.system, "--backend", self.backend,
                "--estimate-mode", self.mode, "--isl", str(self.isl), "--osl", str(self.osl),
                "--bs", str(self.batch_size), "--tp", str(self.tp), "--dp", str(self.dp), "--etp", str(self.etp),
                "--ep", str(self.ep)]

    @property
    def nodes(self) -> float:
        return self.tp * self.dp / self.gpus_per_node


AicQuery = AicDefault | AicEstimate


@attrs.frozen
class Prediction:
    """AIConfigurator's answer to one query: its value, or None and why; ``note`` says what it ran."""

    value: float | None
    note: str


def find_command() -> str | None:
    """The ``aiconfigurator`` executable on PATH, or None where it is not installed."""
    return shutil.which(COMMAND)


def predict(query: AicQuery, executable: str, timeout_s: float = TIMEOUT_S) -> Prediction:
    """Run ``executable`` (`find_command`'s) on ``query`` and read its prediction.

    The command runs in a temporary directory, so nothing it might save lands in the caller's.
    """
    shown = " ".join([COMMAND, *query.argv()])
    try:
        with tempfile.TemporaryDirectory(prefix="aiconfigurator-") as cwd:
            done = subprocess.run([executable, *query.argv()], cwd=cwd, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return Prediction(None, f"`{shown}` did not finish in {timeout_s:g} s")
    except OSError as exc:
        return Prediction(None, f"`{shown}` could not start: {exc}")
    text = done.stdout + done.stderr
    error = _error_line(text)
    if done.returncode != 0 or error:
        return Prediction(None, f"`{shown}` stopped: {error or f'exit status {done.returncode}'}")
    value, why = parse_default(text) if isinstance(query, AicDefault) else parse_estimate(text, query)
    return Prediction(value, f"`{shown}`: {why}")


def _error_line(text: str) -> str | None:
    return next((line[len("Error:"):].strip() for line in text.splitlines() if line.startswith("Error:")), None)


# cli default

def parse_default(text: str) -> tuple[float | None, str]:
    """The disaggregated over aggregated rank-1 tokens/s/gpu of a ``cli default`` run, and what it read.

    Returns:
        (ratio, words); ratio None where a mode met no SLA or a table is missing.
    """
    best: dict[str, float] = {}
    for mode in ("agg", "disagg"):
        if re.search(rf"^No configurations for {mode} met", text, re.MULTILINE):
            return None, f"no {mode} layout met the SLA"
        row = _first_row(text, f"{mode} Top Configurations")
        if row is None or "tokens/s/gpu" not in row:
            return None, f"no \"{mode} Top Configurations\" table in its output"
        best[mode] = float(row["tokens/s/gpu"])
    ratio = best["disagg"] / best["agg"]
    return ratio, f"disagg {best['disagg']:g} over agg {best['agg']:g} tok/s per GPU"


def _first_row(text: str, title: str) -> dict[str, str] | None:
    """The header and the first data row of the ``+---+`` table printed under ``title``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(title):
            rows = [ln for ln in lines[i + 1:i + 8] if ln.startswith("|")]
            if len(rows) < 2:
                return None
            header, first = ([cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows[:2])
            return dict(zip(header, first)) if len(header) == len(first) else None
    return None


# cli estimate

_FIELD = re.compile(r"^\s*(seq/s|tokens/s/gpu|tokens/s|TTFT|TPOT):\s+([\d,.]+)", re.MULTILINE)


def parse_estimate(text: str, query: AicEstimate) -> tuple[float | None, str]:
    """Tokens per second per node of a ``cli estimate`` run, and what it read.

    Returns:
        (value, words): prompt tokens (seq/s x ISL) per node for static_ctx, output tokens (tokens/s/gpu x GPUs
        a node) for static_gen; None where its "Performance Estimate" block lacks the field.
    """
    fields = {name: float(value.replace(",", "")) for name, value in _FIELD.findall(text)}
    if query.mode == "static_ctx":
        if "seq/s" not in fields:
            return None, "no seq/s in its estimate"
        value = fields["seq/s"] * query.isl / query.nodes
        ttft = f", TTFT {fields['TTFT']:g} ms" if "TTFT" in fields else ""
        return value, f"{fields['seq/s']:g} seq/s x {query.isl} tokens over {query.nodes:g} nodes{ttft}"
    if "tokens/s/gpu" not in fields:
        return None, "no tokens/s/gpu in its estimate"
    value = fields["tokens/s/gpu"] * query.gpus_per_node
    tpot = f", TPOT {fields['TPOT']:g} ms" if "TPOT" in fields else ""
    return value, f"{fields['tokens/s/gpu']:g} tok/s per GPU x {query.gpus_per_node}{tpot}"
