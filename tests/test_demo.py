"""`ddpguard demo` end to end through the CLI (short run), then `--resume`."""

from __future__ import annotations

import json
from pathlib import Path

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
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["world_size"] == 2 and summary["tokens"] > 0
    assert (out / "loss.png").stat().st_size > 1000
    assert (out / "checkpoints" / "ckpt-00000005.pt").exists()
    # The corpus really is the standard library's docstrings.
    corpus = next((tmp_path / "cache" / "demo").glob("stdlib-*/train.jsonl")).read_text()
    assert "Return" in corpus

    again = run_cli("demo", *common, "--max-steps", "8", "--resume", timeout=240, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-5000:]
    assert "resumed from:" in again.stdout and "ckpt-00000005.pt" in again.stdout
    assert json.loads((out / "summary.json").read_text())["steps"] == 8


def test_demo_resume_without_checkpoint(tmp_path: Path) -> None:
    res = run_cli("demo", "--out", str(tmp_path / "none"), "--resume", timeout=60)
    assert res.returncode == 2 and "no checkpoint" in res.stderr
