"""Draw the training curves of the shipped tiny checkpoints: docs/images/tiny_training_loss.png.

    python -m tools.train_tiny.plot_loss [--out PATH]

Left: training loss per step (nats per token, a 50-step moving average over the raw points), the
MTP layer's next-next-token loss dashed. Right: held-out bits per byte at each evaluation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tools.train_tiny.train import HF_CONFIG

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "images" / "tiny_training_loss.png"
SMOOTH_STEPS = 50


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each value and the up to ``window - 1`` before it."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot(logs: dict[str, list[dict]], out: Path) -> None:
    """Save the figure of ``logs`` (model name -> its loss.jsonl records) to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, bpb_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for name, log in logs.items():
        steps = [r["step"] for r in log]
        line, = loss_ax.plot(steps, moving_average([r["loss"] for r in log], SMOOTH_STEPS), label=name)
        if "mtp_loss" in log[0]:
            loss_ax.plot(steps, moving_average([r["mtp_loss"] for r in log], SMOOTH_STEPS), linestyle="--",
                         color=line.get_color(), label=f"{name} MTP (next-next token)")
        evals = [r for r in log if "held_out_bits_per_byte" in r]
        bpb_ax.plot([r["step"] for r in evals], [r["held_out_bits_per_byte"] for r in evals], marker="o",
                    color=line.get_color(), label=name)
    loss_ax.set(xlabel="step", ylabel="training loss (nats/token)", title="training loss", ylim=(0, None))
    bpb_ax.set(xlabel="step", ylabel="bits per byte", title="held-out bits per byte", ylim=(0, None))
    for ax in (loss_ax, bpb_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("tiny checkpoints trained on the Python standard library (2 CPU cores, about 30 minutes each)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    from disaggsdk.models.shipped import shipped_checkpoint

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    logs = {}
    for name in HF_CONFIG:
        directory = shipped_checkpoint(name)
        if directory is not None:
            logs[name] = [json.loads(line) for line in (directory / "loss.jsonl").read_text().splitlines()]
    plot(logs, a.out)
    print(json.dumps({"out": str(a.out), "models": sorted(logs)}))


if __name__ == "__main__":
    main()
