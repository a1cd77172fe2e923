"""The MTP acceptance the simulator uses: a measured one, read from a benchmark run, or a number given.

The simulator models MTP with one draft token per step (what DeepSeek-R1's one MTP layer drafts
without chaining), so the figure it needs is the **first-draft** acceptance: the share of verify
steps whose first draft the target kept. `disaggsdk bench SPEC --output FILE` on a spec with
`speculative: {method: mtp}` writes it (``speculative.per_position_acceptance[0]``), as does
``python -m disaggsdk.bench.spec_bench`` (per batch size; the batches' mean is taken).
"""

from __future__ import annotations

import json
from pathlib import Path

from disaggsdk.errors import SpecError, printable


def read_acceptance(text: str) -> tuple[float, str]:
    """(first-draft acceptance in [0, 1], where it came from) for ``--mtp-acceptance TEXT``.

    Args:
        text: a number, or the path of a `bench` or `spec_bench` JSON file with acceptance figures.
    Raises:
        SpecError: neither a number in [0, 1] nor a readable JSON file with a speculative section.
    """
    try:
        value = float(text)
    except ValueError:
        return _from_file(Path(text))
    if not 0.0 <= value <= 1.0:
        raise SpecError(f"--mtp-acceptance {text}: a fraction of draft tokens accepted, in [0, 1]")
    return value, "given"


def _from_file(path: Path) -> tuple[float, str]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        why = exc.strerror if isinstance(exc, OSError) else " ".join(str(exc).split())
        raise SpecError(f"--mtp-acceptance {printable(str(path))}: neither a number nor a readable JSON file "
                        f"({why})") from None
    firsts = []
    if isinstance(doc, dict) and isinstance(doc.get("speculative"), dict):  # disaggsdk bench --output
        firsts = doc["speculative"].get("per_position_acceptance", [])[:1]
    elif isinstance(doc, dict) and isinstance(doc.get("batches"), list):  # python -m disaggsdk.bench.spec_bench
        firsts = [b["acceptance"]["per_position_acceptance"][0] for b in doc["batches"]
                  if b.get("acceptance", {}).get("per_position_acceptance")]
    if not firsts:
        raise SpecError(f"--mtp-acceptance {path}: no acceptance figures in it; benchmark a spec with "
                        f"`speculative: {{method: mtp}}` (disaggsdk bench SPEC --output FILE) and pass that file")
    return sum(firsts) / len(firsts), f"measured ({path.name})"
