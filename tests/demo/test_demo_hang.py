"""`ddpguard demo --hang KIND`: each classic bug, on 2 real gloo ranks under the guard, ends
with exit code 17, the named cause, the lanes picture and the line about plain torchrun."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import child_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

# kind -> the guard's cause key, and what the report must name
CASES = {
    "uneven": ("uneven_batches", "rank 0: "),
    "rank0-collective": ("conditional_collective", "broken_train.py:"),
    "crash": ("crashed_rank", "bad record in batch 3"),
    "bn-eval": ("forward_on_some_ranks", "broadcast #"),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_hang_kind_is_stopped_by_the_guard(kind: str, tmp_path: Path) -> None:
    cause, named = CASES[kind]
    out = tmp_path / "demo"
    env = child_env(DDPGUARD_CACHE=str(tmp_path / "cache"))
    t0 = time.monotonic()
    res = run_cli("demo", "--hang", kind, "--out", str(out), "--corpus-bytes", "40000",
                  timeout=120, env=env)
    took = time.monotonic() - t0
    assert res.returncode == 17, (res.returncode, res.stdout[-2000:], res.stderr[-4000:])
    reports = sorted((out / "reports").glob("*.json"))
    assert reports, res.stderr[-3000:]
    rep = json.loads(reports[0].read_text())
    assert rep["diagnosis"]["cause"] == cause, (rep["diagnosis"], res.stderr[-3000:])
    whole = json.dumps(rep) + res.stderr + res.stdout
    assert named in whole, (named, res.stderr[-3000:])
    assert "the guard's lanes picture" in res.stdout
    assert Path(reports[0].with_suffix(".html")).read_text().count('<g class="lane') == 2
    assert "without the guard (measured once, docs/demo.md): plain torchrun" in res.stdout
    assert took < 100, f"{kind} took {took:.0f} s"


def test_hang_rejects_an_unknown_kind(tmp_path: Path) -> None:
    res = run_cli("demo", "--hang", "nonsense", "--out", str(tmp_path), timeout=60)
    assert res.returncode == 2 and "nonsense" in res.stderr
