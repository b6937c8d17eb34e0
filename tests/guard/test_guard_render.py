"""The report's picture: one lane per rank (HTML/SVG, PNG) and the Chrome trace. Pure: no
training processes (one optional headless-browser check)."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from ddpguard.commands import report as report_cmd
from ddpguard.guard.report import load
from ddpguard.reporting import render
from ddpguard.reporting import trace as trace_mod

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DEADLOCK = FIXTURES / "guard_report_deadlock_2ranks.json"
KILLED = FIXTURES / "guard_report_killed_8ranks.json"
OLD = FIXTURES / "guard_report_old_format.json"
EVIL = '<script>alert("x")</script> & "quoted"'


class Page(HTMLParser):
    """What a browser's parser would see: elements with their classes, and the text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str], int]] = []  # (tag, attrs, lane index)
        self.lane = -1
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "g" and "lane" in a.get("class", "").split():
            self.lane += 1
        self.tags.append((tag, a, self.lane))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, tag: str, cls: str) -> list[tuple[dict[str, str], int]]:
        return [(a, lane) for t, a, lane in self.tags
                if t == tag and cls in a.get("class", "").split()]


def html_of(report: dict[str, Any], tmp_path: Path) -> str:
    return Path(render.render_html(report, str(tmp_path / "r.html"))).read_text("utf-8")


def synthetic(world: int, segments: int, span: float) -> dict[str, Any]:
    """A long run: `segments` alternating computing/collective segments per rank over `span` s,
    then rank 0 computes alone to the end (the culprit)."""
    t0, dt = 1.7e9, span / (segments + 1)
    ranks = []
    for r in range(world):
        lanes = [[t0 + i * dt, t0 + (i + 1) * dt, ("computing", "collective")[i % 2],
                  f"all_reduce #{i} (group 0)" if i % 2 else "computing at train.py:88"]
                 for i in range(segments)]
        lanes.append([t0 + segments * dt, t0 + span, "computing" if r == 0 else "collective",
                      "stuck at train.py:130" if r == 0 else f"all_reduce #{segments} (group 0)"])
        ranks.append({"rank": r, "state": "running", "hb": {}, "stacks": None, "lanes": lanes})
    return {"event": "training hang detected", "created": t0 + span, "run_id": "long",
            "reporter_rank": 1, "world_size": world, "t_start": t0, "ranks": ranks,
            "diagnosis": {"cause": "stall", "title": "no sign of life on rank 0",
                          "explanation": "e", "fix": "f", "culprits": [0], "positions": {}}}


# -- HTML -----------------------------------------------------------------------------------


def test_one_lane_per_rank_with_every_segment_and_the_culprit_marked(tmp_path):
    rep = load(str(KILLED))
    page = Page(html_of(rep, tmp_path))
    lanes = page.having("g", "lane")
    assert [a["data-rank"] for a, _ in lanes] == [str(r) for r in range(8)]
    assert [int(a["data-rank"]) for a, _ in page.having("g", "culprit")] == [5]
    segs = page.having("rect", "seg")
    for i, rec in enumerate(rep["ranks"]):
        want = render.merge_equal(render.lanes(rec))
        mine = [a for a, lane in segs if lane == i]
        assert len(mine) == len(want) > 20
        # Colour by kind: each rect's class names the segment's kind, in time order.
        assert [a["class"].split()[1] for a in mine] == [f"k-{s[2]}" for s in want]
    # The killed rank's last segment is drawn as dead; the survivors' as a collective.
    assert [a for a, lane in segs if lane == 5][-1]["class"] == "seg k-dead"
    assert [a for a, lane in segs if lane == 0][-1]["class"] == "seg k-collective"
    legend = {a.get("class") for t, a, _ in page.tags if t == "i"}
    assert {"k-computing", "k-loader", "k-collective", "k-dead"} <= legend
    assert "k-crashed" not in legend  # the legend lists the kinds present, no more


def test_report_instant_line_and_axis_are_placed_in_time(tmp_path):
    rep = load(str(DEADLOCK))
    page = Page(html_of(rep, tmp_path))
    t0 = render.t_start(rep)
    t_end = max(rep["created"], max(s[1] for r in rep["ranks"] for s in render.lanes(r)))
    span = (t_end - t0) * 1.02
    (line, _), = page.having("line", "now")
    assert float(line["x1"]) == pytest.approx(render.LEFT + (rep["created"] - t0) / span
                                              * render.PLOT, abs=0.1)
    # The line marks the report, not the end of the lanes (a peer's last heartbeat may be later).
    rep["created"] -= 5
    (line, _), = Page(html_of(rep, tmp_path)).having("line", "now")
    assert float(line["x1"]) == pytest.approx(render.LEFT + (rep["created"] - t0) / span
                                              * render.PLOT, abs=0.1)
    ticks = ["".join(page.text)]
    assert "0 s" in ticks[0] and "45 s" in ticks[0]
    # A segment's tooltip says what and for how long.
    assert "barrier #45 (group 0)\nin a collective for 5.8 s" in "".join(page.text)


def test_labels_and_every_text_from_user_code_are_escaped(tmp_path):
    rep = load(str(DEADLOCK))
    rep["ranks"][1]["lanes"][-1][3] = EVIL
    rep["ranks"][1]["state"] = EVIL
    rep["ranks"][0]["stacks"]["MainThread"][0]["code"] = EVIL
    rep["diagnosis"]["title"] = EVIL
    rep["diagnosis"]["positions"]["0"]["user"] = EVIL
    rep["run_id"] = EVIL
    rep["ranks"][1]["rank"] = EVIL  # lands in an attribute (data-rank)
    text = html_of(rep, tmp_path)
    page = Page(text)
    assert not [t for t, _, _ in page.tags if t == "script"]
    assert "<script>" not in text
    shown = "".join(page.text)
    assert shown.count(EVIL) >= 5  # the text survives, as text
    # Attribute values stay attributes: no quote breaks out of one.
    assert all(set(a) <= {"class", "x", "y", "x1", "x2", "y1", "y2", "width", "height",
                          "data-rank", "viewbox", "xmlns", "role", "aria-label", "open", "alt",
                          "src", "style", "charset"} for _, a, _ in page.tags)


def test_long_run_is_capped_and_sub_pixel_segments_still_show(tmp_path, monkeypatch):
    rep = synthetic(world=8, segments=20000, span=6 * 3600)
    assert len(html_of(rep, tmp_path)) < 3_000_000
    monkeypatch.setattr(render, "MAX_RECTS", 2000)  # the cap binds at 8 lanes of 830 px
    page = Page(html_of(rep, tmp_path))
    segs = page.having("rect", "seg")
    assert len(segs) <= render.MAX_RECTS + 8 * 4
    for lane in range(8):
        mine = [a for a, i in segs if i == lane]
        assert len(mine) > 100  # folded, not collapsed into one block
        assert min(float(a["width"]) for a in mine) >= 1.0
        # Coverage: the lane still spans from the first to the last segment.
        assert float(mine[0]["x"]) == pytest.approx(render.LEFT, abs=0.5)
        end = float(mine[-1]["x"]) + float(mine[-1]["width"])
        assert end == pytest.approx(render.LEFT + render.PLOT / 1.02, abs=1.0)
    assert "stuck at train.py:130" in "".join(page.text)
    # A 2 ms blip in a 6 h run is wider than zero.
    tiny = synthetic(world=1, segments=2, span=6 * 3600)
    tiny["ranks"][0]["lanes"].insert(1, [tiny["t_start"] + 100, tiny["t_start"] + 100.002,
                                         "loader", "blip"])
    tiny["ranks"][0]["lanes"][0][1] = tiny["t_start"] + 100
    blip = [a for a, _ in Page(html_of(tiny, tmp_path)).having("rect", "k-loader")]
    assert len(blip) == 1 and float(blip[0]["width"]) >= 1.0


def test_old_report_without_lanes_still_renders(tmp_path, monkeypatch):
    rep = load(str(OLD))
    assert all("lanes" not in r for r in rep["ranks"]) and "t_start" not in rep
    text = html_of(rep, tmp_path)
    assert "no lane data" in text and 'class="lanes"' not in text
    assert rep["diagnosis"]["title"] in text and "train.py:91 in main" in text
    assert "data:image/png;base64," in text  # the old progress plot, matplotlib being here
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plot extra were missing
    text = html_of(rep, tmp_path)
    assert "no lane data" in text and "data:image/png" not in text
    for r in rep["ranks"]:
        r["timeline"] = []
    assert "no lane data" in html_of(rep, tmp_path)


def test_a_rank_without_lanes_gets_an_empty_lane(tmp_path):
    rep = load(str(KILLED))
    rep["ranks"][5]["lanes"] = []
    page = Page(html_of(rep, tmp_path))
    assert len(page.having("g", "lane")) == 8
    assert not [a for a, lane in page.having("rect", "seg") if lane == 5]
    assert "no lane data for this rank" in "".join(page.text)


def test_time_zero_falls_back_in_order():
    rep = load(str(DEADLOCK))
    assert render.t_start(rep) == rep["t_start"]
    rep["t_start"] += 3  # never after a segment: no negative time in the picture or the trace
    assert render.t_start(rep) == min(r["lanes"][0][0] for r in rep["ranks"])
    del rep["t_start"]
    assert render.t_start(rep) == min(r["lanes"][0][0] for r in rep["ranks"])
    old = load(str(OLD))
    assert render.t_start(old) == min(p[0] for r in old["ranks"] for p in r["timeline"])
    for r in old["ranks"]:
        r["timeline"] = []
    assert render.t_start(old) == old["created"]


def test_segments_are_cleaned_merged_and_folded():
    rec = {"lanes": [[5, 6, "loader", "b"], [0, 2, "computing", "a"], [1, 3, "bogus", "x"],
                     [2, float("nan"), "computing", "a"], "junk", [3, 5, "computing", "a"]]}
    assert render.lanes(rec) == [(0.0, 2.0, "computing", "a"), (2.0, 3.0, "unknown", "x"),
                                 (3.0, 5.0, "computing", "a"), (5.0, 6.0, "loader", "b")]
    segs = [(float(i), i + 1.0, "computing", "a") for i in range(5)] + [(5.0, 6.0, "loader", "b")]
    assert render.merge_equal(segs) == [(0.0, 5.0, "computing", "a"), (5.0, 6.0, "loader", "b")]
    # Same kind, another label (the next collective), or a gap: kept apart.
    apart = [(0.0, 1.0, "collective", "all_reduce #1"), (1.0, 2.0, "collective", "all_reduce #2"),
             (3.0, 4.0, "collective", "all_reduce #2")]
    assert render.merge_equal(apart) == apart
    many = [(i * 0.01, (i + 1) * 0.01, ("computing", "loader", "computing")[i % 3], str(i))
            for i in range(10000)]
    folded = render.coarsen(many, 1.0)
    assert len(folded) <= 2 * 100 + 1
    assert folded[0][0] == 0 and folded[-1][1] == pytest.approx(100.0)
    assert all(a[1] <= b[0] for a, b in zip(folded, folded[1:], strict=False))
    assert {s[2] for s in folded} == {"computing"}  # two thirds of each run's time
    assert "computing 67%, loader 33%" in folded[0][3]
    assert render.coarsen(segs, 0.5) == segs  # nothing shorter than the quantum: untouched


# -- PNG ------------------------------------------------------------------------------------


def test_png_draws_lanes_and_old_reports(tmp_path):
    pytest.importorskip("matplotlib")
    for src in (KILLED, OLD):
        out = render.render_png(load(str(src)), str(tmp_path / "x.png"))
        assert Path(out).read_bytes()[:4] == b"\x89PNG"


# -- Chrome trace ---------------------------------------------------------------------------


def check_trace(trace: dict[str, Any]) -> None:
    """The Trace Event Format as Perfetto and chrome://tracing read it, strictly."""
    json.dumps(trace, allow_nan=False)  # NaN / Infinity are not JSON: both viewers refuse them
    assert set(trace) <= {"traceEvents", "displayTimeUnit", "otherData"}
    assert trace["displayTimeUnit"] in ("ms", "ns")
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    seen_data = False
    last_ts = -math.inf
    ends: dict[tuple[int, int], float] = {}
    for e in events:
        assert isinstance(e["name"], str) and e["ph"] in ("M", "X", "i")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert not seen_data, "metadata comes first"
            assert e["name"] in ("process_name", "process_sort_index", "thread_name")
            assert isinstance(e["args"], dict)
            continue
        seen_data = True
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        assert e["ts"] >= last_ts, "events sorted by time"
        last_ts = e["ts"]
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            assert e["cat"] in render.KINDS
            key = (e["pid"], e["tid"])
            assert e["ts"] >= ends.get(key, 0) - 1e-3, "complete events on a thread overlap"
            ends[key] = e["ts"] + e["dur"]
        else:
            assert e["s"] in ("g", "p", "t")


def test_trace_is_valid_with_one_process_per_rank(tmp_path):
    rep = load(str(KILLED))
    trace = trace_mod.chrome_trace(rep)
    check_trace(trace)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r["rank"]: f"rank {r['rank']} ({r['state']})" for r in rep["ranks"]}
    t0 = render.t_start(rep)
    for rec in rep["ranks"]:
        want = render.merge_equal(render.lanes(rec), gap=0.0)
        got = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rec["rank"]]
        assert [(e["name"], e["cat"]) for e in got] == [(s[3], s[2]) for s in want]
        assert got[0]["ts"] == pytest.approx((want[0][0] - t0) * 1e6)
        assert got[-1]["dur"] == pytest.approx((want[-1][1] - want[-1][0]) * 1e6, rel=1e-6)
    (inst,) = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert inst["name"] == rep["diagnosis"]["title"] and inst["s"] == "g"
    assert inst["ts"] == pytest.approx((rep["created"] - t0) * 1e6)
    path = trace_mod.render_trace(rep, str(tmp_path / "t.json"))
    assert json.loads(Path(path).read_text()) == json.loads(json.dumps(trace))


def test_trace_of_old_reports_and_huge_runs_stays_valid(monkeypatch):
    old = trace_mod.chrome_trace(load(str(OLD)))
    check_trace(old)
    assert [e["ph"] for e in old["traceEvents"] if e["ph"] != "M"] == ["i"]
    monkeypatch.setattr(trace_mod, "MAX_TRACE_EVENTS", 5000)
    big = trace_mod.chrome_trace(synthetic(world=4, segments=20000, span=3600))
    check_trace(big)
    assert 1000 < sum(e["ph"] == "X" for e in big["traceEvents"]) <= 2 * 5000 + 8


# -- the command ----------------------------------------------------------------------------


def run_report(file: Path, out: Path | None, capsys) -> tuple[int, str, str]:
    rc = report_cmd.main(argparse.Namespace(file=str(file), out=str(out) if out else None))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_cli_writes_html_trace_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rc, out, _ = run_report(KILLED, tmp_path / "r", capsys)
    assert rc == 0
    assert "likely cause: a rank crashed or exited while the others wait for it" in out
    for ext in (".html", ".trace.json", ".png"):
        assert f"wrote {tmp_path / 'r'}{ext}" in out and (tmp_path / f"r{ext}").stat().st_size
    check_trace(json.loads((tmp_path / "r.trace.json").read_text()))


def test_cli_without_matplotlib_writes_html_and_trace_and_says_why(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, out, _ = run_report(DEADLOCK, tmp_path / "r", capsys)
    assert rc == 0
    assert (tmp_path / "r.html").exists() and (tmp_path / "r.trace.json").exists()
    assert not (tmp_path / "r.png").exists()
    assert "no PNG: it needs matplotlib (pip install 'ddpguard[plot]')" in out


def test_cli_default_output_sits_next_to_the_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    src = tmp_path / "ddpguard-run-rank0.json"
    shutil.copy(DEADLOCK, src)
    assert run_report(src, None, capsys)[0] == 0
    assert (tmp_path / "ddpguard-run-rank0.html").exists()
    assert (tmp_path / "ddpguard-run-rank0.trace.json").exists()


@pytest.mark.parametrize("content", [None, "not json {", '{"diagnosis": {}}', "[1, 2]",
                                     '{"diagnosis": 3, "ranks": 4}'])
def test_cli_refuses_what_is_not_a_report_with_exit_2(tmp_path, capsys, content):
    f = tmp_path / "x.json"
    if content is not None:
        f.write_text(content)
    rc, out, err = run_report(f, tmp_path / "r", capsys)
    assert rc == 2 and out == ""
    assert f"ddpguard report: cannot read {f}" in err or "is a damaged ddpguard report" in err
    assert not (tmp_path / "r.html").exists() or content == '{"diagnosis": 3, "ranks": 4}'


# -- a real browser -------------------------------------------------------------------------

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(b)), None)


@pytest.mark.skipif(BROWSER is None, reason="no headless chromium installed "
                    "(apt-get install chromium) to check the page in a real browser")
def test_page_renders_in_headless_chromium(tmp_path):
    rep = load(str(DEADLOCK))
    rep["ranks"][1]["lanes"][-1][3] = EVIL
    path = render.render_html(rep, str(tmp_path / "r.html"))
    res = subprocess.run(
        [str(BROWSER), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"file://{path}"],
        capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    # The browser built the SVG: both lanes, every segment, the report line, no injected script.
    assert dom.count('<g class="lane') == 2 and 'class="lane culprit" data-rank="0"' in dom
    want = len(Page(Path(path).read_text("utf-8")).having("rect", "seg"))
    assert dom.count('<rect class="seg ') == want > 200
    assert '<line class="now"' in dom and "<script" not in dom
    assert "Uncaught" not in res.stderr
