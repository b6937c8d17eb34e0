"""The demo's summary lines and loss plot, from the worker's summary.json and log.csv."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

__all__ = ["read_summary", "summary_lines", "plot"]


def read_summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "summary.json").read_text()))


def summary_lines(s: dict[str, Any]) -> list[str]:
    ev = s["eval_loss"]
    secs = max(s["seconds"], 1e-9)
    lines = [
        f"ranks: {s['world_size']} ({s['backend']}), epochs done: {s['epochs']}, "
        f"optimizer steps: {s['steps']}",
        f"tokens trained this run: {s['tokens']:,} in {secs:.1f} s = "
        f"{s['tokens'] / secs:,.0f} tokens/s",
    ]
    if s.get("resumed_from"):
        lines.append(f"resumed from: {s['resumed_from']}")
    if ev:
        lines.append(f"eval loss (nats/byte): first {ev[0][1]:.3f} -> last {ev[-1][1]:.3f}"
                     f" (uniform guess: {5.549:.3f})")
    return lines


def _read_log(path: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    train: list[tuple[int, float]] = []
    evals: list[tuple[int, float]] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            point = (int(row["step"]), float(row["loss"]))
            (train if row["kind"] == "train" else evals).append(point)
    return train, evals


def plot(out: Path) -> tuple[Path | None, str]:
    """Write out/loss.png; (None, why) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install 'ddpguard[plot]'): no plot"
    train, evals = _read_log(out / "log.csv")
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train, strict=True), lw=0.8, alpha=0.7, label="train (per step, rank 0)")
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="eval (exact, all ranks)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title("ddpguard demo: byte-level LM on the standard library's docstrings")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = out / "loss.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png, ""
