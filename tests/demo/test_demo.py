"""`ddpguard demo` end to end through the CLI (short run), then `--resume`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
from helpers import child_env, run_cli


def test_demo_short_run_then_resume(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = child_env(DDPGUARD_CACHE=str(tmp_path / "cache"))
    common = ["--out", str(out), "--checkpoint-every", "3", "--corpus-bytes", "40000",
              "--max-tokens", "2048"]
    first = run_cli("demo", *common, "--max-steps", "5", timeout=240, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
    assert "ddpguard demo finished" in first.stdout
    assert "optimizer steps: 5" in first.stdout and "tokens/s" in first.stdout
    assert "eval loss (nats/byte): first" in first.stdout
    # The count baselines are computed and printed next to the model's loss.
    assert "byte bigram" in first.stdout and "byte unigram" in first.stdout
    assert "the model beats the bigram by" in first.stdout or "not beaten" in first.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["world_size"] == 2 and summary["tokens"] > 0
    # The picture needs no optional extra: one self-contained HTML page with inline SVG.
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 2 and "<polyline" in page and "http" not in page.split(
        "<svg", 1)[1].replace("http://www.w3.org/2000/svg", "")
    assert "byte bigram" in page and "tokens/s" in page
    assert (out / "checkpoints" / "ckpt-00000005.pt").exists()
    # The corpus really is the standard library's docstrings.
    corpus = next((tmp_path / "cache" / "demo").glob("stdlib-*/train.jsonl")).read_text()
    assert "Return" in corpus

    again = run_cli("demo", *common, "--max-steps", "8", "--resume", timeout=240, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-5000:]
    assert "resumed from:" in again.stdout and "ckpt-00000005.pt" in again.stdout
    assert json.loads((out / "summary.json").read_text())["steps"] == 8
    # The page shows both runs: one continuous step axis, 8 steps of training losses.
    rows = (out / "log.csv").read_text().splitlines()
    assert sum(r.startswith("train,") for r in rows) == 8

    # Exactly: the same 8 steps in one go give the same losses and the same weights.
    straight = tmp_path / "straight"
    res = run_cli("demo", *common[2:], "--out", str(straight), "--max-steps", "8",
                  timeout=240, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    # (The interrupted run also evaluated at step 5, where it stopped.)
    assert _losses(straight) == [r for r in _losses(out) if r[:2] != ("eval", "5")]
    a = torch.load(straight / "checkpoints" / "ckpt-00000008.pt", weights_only=False)["model"]
    b = torch.load(out / "checkpoints" / "ckpt-00000008.pt", weights_only=False)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _losses(out: Path) -> list[tuple[str, str, str]]:
    """(kind, step, loss) rows of log.csv: wall times differ between runs, losses must not."""
    with open(out / "log.csv", newline="") as f:
        return [(r["kind"], r["step"], r["loss"]) for r in csv.DictReader(f)]


def test_demo_resume_without_checkpoint(tmp_path: Path) -> None:
    res = run_cli("demo", "--out", str(tmp_path / "none"), "--resume", timeout=60)
    assert res.returncode == 2 and "no checkpoint" in res.stderr
