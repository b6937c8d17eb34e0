"""The demo's summary lines and its picture (a self-contained HTML page with inline SVG), from
the worker's summary.json, log.csv and throughput.csv."""

from __future__ import annotations

import csv
import html
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from .baselines import Baselines
from .svgplot import Series, chart

__all__ = ["read_summary", "summary_lines", "write_page"]

UNIFORM = 5.549  # ln(257): a model that guesses every byte (and the padding id) alike


def read_summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "summary.json").read_text()))


def summary_lines(s: dict[str, Any], base: Baselines | None = None) -> list[str]:
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
                     f" (uniform guess: {UNIFORM:.3f})")
    if ev and base is not None:
        last = ev[-1][1]
        gap = abs(base.bigram - last)
        verdict = (f"the model beats the bigram by {gap:.3f}" if last < base.bigram else
                   f"the model is {gap:.3f} above the bigram: not beaten (yet)")
        lines.append(f"same eval bytes, nats/byte: model {last:.3f} | byte bigram "
                     f"{base.bigram:.3f} | byte unigram {base.unigram:.3f} -> {verdict}")
    return lines


def _read_log(path: Path) -> tuple[list[tuple[int, int, float, float]], list[tuple[int, float]]]:
    """(train rows (epoch, step, loss, seconds), eval rows (step, loss)) from fit's log.csv."""
    train: list[tuple[int, int, float, float]] = []
    evals: list[tuple[int, float]] = []
    if not path.exists():
        return train, evals
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["kind"] == "train":
                train.append((int(row["epoch"]), int(row["step"]), float(row["loss"]),
                              float(row["seconds"])))
            else:
                evals.append((int(row["step"]), float(row["loss"])))
    return train, evals


def _read_tokens(path: Path) -> dict[int, int]:
    tokens: dict[int, int] = {}
    if path.exists():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                tokens[int(row["step"])] = int(row["tokens"])
    return tokens


def _epoch_means(train: list[tuple[int, int, float, float]]) -> list[tuple[float, float]]:
    """Mean training loss of each epoch as a flat segment over the epoch's steps: pairs of
    points (first step, mean), (last step, mean)."""
    by_epoch: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for epoch, step, loss, _ in train:
        by_epoch[epoch].append((step, loss))
    out: list[tuple[float, float]] = []
    for _, rows in sorted(by_epoch.items()):
        mean = sum(v for _, v in rows) / len(rows)
        out += [(float(rows[0][0] - 1), mean), (float(rows[-1][0]), mean)]
    return out


def _throughput(train: list[tuple[int, int, float, float]], tokens: dict[int, int],
                window: int = 10) -> list[tuple[float, float]]:
    """Rank 0's tokens/s over windows of `window` steps. A resumed run restarts its clock, so
    windows never span two runs."""
    out: list[tuple[float, float]] = []
    start = 0
    for i in range(1, len(train) + 1):
        end_run = i == len(train) or train[i][3] < train[i - 1][3]
        if i - start < window and not end_run:
            continue
        rows = train[start:i]
        t0 = train[start - 1][3] if start > 0 and train[start - 1][3] <= rows[0][3] else 0.0
        secs = rows[-1][3] - t0
        n = sum(tokens.get(step, 0) for _, step, _, _ in rows)
        if secs > 0 and n > 0:
            out.append((float(rows[-1][1]), n / secs))
        start = i
    return out


def write_page(out: Path, summary: dict[str, Any], base: Baselines | None) -> Path:
    """Write out/report.html: losses per step and per epoch with the baselines, throughput,
    and the summary lines. Inline SVG and CSS only: opens offline in any browser."""
    train, evals = _read_log(out / "log.csv")
    steps = [(float(s), v) for _, s, v, _ in train]
    lines: list[Series] = [
        Series("train, per step (rank 0)", steps, "#9ab7d8", width=1.0),
        Series("train, epoch mean", _epoch_means(train), "#1f4e99", "segments", width=2.5),
        Series("eval, exact (all ranks)", [(float(s), v) for s, v in evals], "#d1495b",
               "dots", width=2.0),
    ]
    if base is not None:
        lines += [Series(f"byte bigram {base.bigram:.2f}", [(0.0, base.bigram)], "#555",
                         "hline", width=1.2),
                  Series(f"byte unigram {base.unigram:.2f}", [(0.0, base.unigram)], "#aaa",
                         "hline", width=1.2)]
    ys = [v for _, v in steps] + [v for _, v in evals]
    top = min(max(ys, default=4.0), (base.unigram if base else 4.0) + 0.6)
    losses = chart(lines, title="Loss (nats per byte)", xlabel="optimizer step",
                   ylabel="nats per byte", ylim=(min(ys, default=0.0) - 0.05, top))
    rate = _throughput(train, _read_tokens(out / "throughput.csv"))
    speed = chart([Series("rank 0, 10-step windows", rate, "#59a14f", width=2.0)],
                  title="Throughput (tokens per second, one rank)", xlabel="optimizer step",
                  ylabel="tokens/s", height=260,
                  ylim=(0.0, max((v for _, v in rate), default=1.0) * 1.1))
    text = "\n".join(html.escape(x) for x in summary_lines(summary, base))
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>ddpguard demo</title>"
        "<style>body{font-family:sans-serif;margin:16px;color:#222}"
        "pre{background:#f6f6f6;padding:8px;font-size:13px;white-space:pre-wrap;max-width:760px}</style></head><body>"
        "<h2>ddpguard demo: a byte-level language model on the standard library's "
        "docstrings</h2>"
        f"<pre>{text}</pre>{losses}<br>{speed}</body></html>"
    )
    path = out / "report.html"
    path.write_text(page)
    return path
