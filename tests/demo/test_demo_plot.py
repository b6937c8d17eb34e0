"""The demo's picture without matplotlib: tick arithmetic, the SVG chart, the HTML page from a
real log written by fit()'s CSV format (no ranks needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpguard.demo.baselines import Baselines, byte_baselines
from ddpguard.demo.report import write_page
from ddpguard.demo.svgplot import Series, chart, nice_ticks


@pytest.mark.parametrize("lo, hi", [(0, 394), (1.3, 3.97), (0, 8800), (2.0, 2.0), (-1, 1)])
def test_ticks_are_round_and_cover_the_range(lo: float, hi: float) -> None:
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and len(ticks) >= 2
    gaps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(gaps) == 1


def test_ticks_reject_non_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        nice_ticks(0.0, float("inf"))


def test_chart_draws_every_series_inside_its_frame() -> None:
    svg = chart([Series("a", [(0, 3.0), (10, 2.0)], "#000"),
                 Series("b", [(0, 2.5), (5, 2.5), (5, 2.2), (10, 2.2)], "#111", "segments"),
                 Series("c", [(0, 2.6)], "#222", "hline"), Series("empty", [], "#333")],
                title="t", xlabel="x", ylabel="y")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 1 and "stroke-dasharray" in svg
    assert ">a<" in svg and ">empty<" not in svg


def test_page_from_a_two_run_log(tmp_path: Path) -> None:
    # A first run (steps 1-3) and a resumed one (4-5) whose clock restarts: as fit() writes it.
    (tmp_path / "log.csv").write_text(
        "kind,epoch,step,loss,lr,seconds\neval,0,0,5.5,,0.000\n"
        "train,0,1,4.0,0.001,0.5\ntrain,0,2,3.5,0.001,1.0\ntrain,0,3,3.0,0.001,1.5\n"
        "eval,0,3,3.1,,1.6\ntrain,1,4,2.8,0.001,0.4\ntrain,1,5,2.6,0.001,0.8\n"
        "eval,1,5,2.7,,0.9\n")
    (tmp_path / "throughput.csv").write_text("step,tokens\n1,500\n2,500\n3,500\n4,400\n5,400\n")
    summary = {"world_size": 2, "backend": "gloo", "steps": 5, "epochs": 2, "tokens": 2300,
               "seconds": 2.0, "eval_loss": [[0, 5.5], [3, 3.1], [5, 2.7]],
               "resumed_from": "ckpt-00000003.pt"}
    page = write_page(tmp_path, summary, Baselines(3.4, 2.9, 8.0, 100)).read_text()
    assert page.count("<svg") == 2 and "<script" not in page
    assert "beats the bigram by 0.200" in page and "resumed from" in page


def test_baselines_on_a_tiny_corpus(tmp_path: Path) -> None:
    train, val = tmp_path / "t.jsonl", tmp_path / "v.jsonl"
    train.write_text('{"text": "abababababab"}\n{"text": "abab"}\n')
    val.write_text('{"text": "ababab"}\n')
    b = byte_baselines(train, val)
    # "b" always follows "a" and vice versa: the bigram is far below the unigram's ~ln 2.
    assert b.eval_bytes == 5 and b.bigram < 0.2 < 0.6 < b.unigram
    val.write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match="v.jsonl"):
        byte_baselines(train, val)
