"""Render a guard report: one lane per rank over time, as a self-contained HTML page (inline SVG
and CSS, no script, no network), a PNG (with matplotlib), and a Chrome trace for Perfetto.

A rank's lanes are segments [t0, t1, kind, label] in unix seconds (see KINDS). Reports written
before lanes existed still render: the old progress plot (with matplotlib) or a note.
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

__all__ = ["KINDS", "t_start", "lanes", "merge_equal", "coarsen", "render_html", "render_png"]

Segment = tuple[float, float, str, str]

# kind -> (colour, legend text). Colours stay apart for the common colour-vision deficiencies.
KINDS: dict[str, tuple[str, str]] = {
    "computing": ("#59a14f", "computing"),
    "loader": ("#4e79a7", "waiting for data"),
    "collective": ("#f28e2b", "in a collective"),
    "exited": ("#bab0ac", "exited"),
    "crashed": ("#e15759", "crashed"),
    "dead": ("#3b0a0a", "dead / killed"),
    "unknown": ("#e4e4e4", "unknown"),
}

W, LEFT, RIGHT = 1280, 150, 290
PLOT = W - LEFT - RIGHT
MAX_RECTS = 12000  # across all lanes: keeps a days-long report's page a few MB at most


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def lanes(rec: dict[str, Any]) -> list[Segment]:
    """A rank's segments, cleaned: finite floats, sorted, non-overlapping, known kinds only.
    A report is evidence from a dying job: a malformed segment is skipped, never fatal."""
    out: list[Segment] = []
    for s in rec.get("lanes") or []:
        try:
            t0, t1, kind = float(s[0]), float(s[1]), str(s[2])
            label = str(s[3]) if len(s) > 3 else kind
        except (TypeError, ValueError, IndexError):
            continue
        if math.isfinite(t0) and math.isfinite(t1):
            out.append((t0, max(t0, t1), kind if kind in KINDS else "unknown", label))
    out.sort(key=lambda s: s[0])
    clean: list[Segment] = []
    for t0, t1, kind, label in out:
        if clean and t0 < clean[-1][1]:  # overlap: the later segment starts where the last ends
            t0 = clean[-1][1]
            if t1 <= t0:
                continue
        clean.append((t0, t1, kind, label))
    return clean


def t_start(report: dict[str, Any]) -> float:
    """The report's time zero: its t_start, else the first lane, else the first heartbeat.
    Never after a segment's start, so no time in the picture or the trace is negative."""
    firsts = [seg[0] for r in report["ranks"] for seg in lanes(r)[:1]]
    given = report.get("t_start")
    if isinstance(given, (int, float)) and math.isfinite(given):
        return min([float(given), *firsts])
    if firsts:
        return min(firsts)
    return min((float(p[0]) for r in report["ranks"] for p in (r.get("timeline") or [])),
               default=float(report["created"]))


def merge_equal(segs: list[Segment], gap: float = 1e-3) -> list[Segment]:
    """Join neighbours of the same kind and label separated by at most `gap` seconds."""
    out: list[Segment] = []
    for s in segs:
        if out and out[-1][2:] == s[2:] and s[0] - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], s[1]), s[2], s[3])
        else:
            out.append(s)
    return out


def _summary(run: list[Segment]) -> Segment:
    time_by: dict[str, float] = {}
    for t0, t1, kind, _ in run:
        time_by[kind] = time_by.get(kind, 0.0) + t1 - t0
    ranked = sorted(time_by.items(), key=lambda kv: -kv[1])
    total = sum(time_by.values()) or 1.0
    mix = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in ranked)
    return (run[0][0], run[-1][1], ranked[0][0],
            f"{len(run)} short segments ({mix}); zoom in the trace for each one")


def coarsen(segs: list[Segment], quantum: float) -> list[Segment]:
    """Fold runs of consecutive segments shorter than `quantum` seconds into one summary segment
    each (kind: the one that took most of the run's time), so a lane draws at most about
    2 x span / quantum rectangles however many segments a long run has."""
    out: list[Segment] = []
    run: list[Segment] = []

    def flush() -> None:
        if run:
            out.append(run[0] if len(run) == 1 else _summary(run))
            run.clear()

    for s in segs:
        if s[1] - s[0] >= quantum:
            flush()
            out.append(s)
            continue
        if run and (s[0] - run[-1][1] > quantum or s[1] - run[0][0] > quantum):
            flush()
        run.append(s)
    flush()
    return out


def _dur(d: float) -> str:
    if d < 1:
        return f"{d * 1000:.0f} ms"
    if d < 60:
        return f"{d:.1f} s"
    if d < 3600:
        return f"{int(d // 60)}m {int(d % 60):02d}s"
    return f"{int(d // 3600)}h {int(d % 3600 // 60):02d}m"


def _ticks(span: float) -> tuple[float, list[float]]:
    steps = [k * 10.0 ** e for e in range(-3, 2) for k in (1, 2, 5)] + [
        60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800]
    step = next((s for s in steps if span / s <= 10), steps[-1] * math.ceil(span / 864000))
    return step, [i * step for i in range(int(span // step) + 1)]


def _tick_label(v: float, step: float) -> str:
    if step < 60:
        return f"{v:.{max(0, -math.floor(math.log10(step)))}f} s"
    h, m = int(v // 3600), int(v % 3600 // 60)
    if not h:
        return f"{m} min" if m else "0"
    return f"{h} h {m:02d}" if m else f"{h} h"


def _culprits(report: dict[str, Any]) -> set[int]:
    out = set()
    for c in report["diagnosis"].get("culprits") or []:
        try:
            out.add(int(c))
        except (TypeError, ValueError):
            continue
    return out


def _svg(report: dict[str, Any], per_rank: list[list[Segment]]) -> str:
    t0 = t_start(report)
    created = float(report["created"])
    t_end = max([created] + [s[-1][1] for s in per_rank if s])
    span = max(t_end - t0, 1e-3) * 1.02
    n = len(per_rank)
    lane_h = 30 if n <= 8 else max(8, 360 // n)
    pitch = lane_h + (6 if n <= 16 else 2)
    top, height = 22, 22 + n * pitch + 40

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * PLOT

    culprits = _culprits(report)
    quantum = span / PLOT * max(1.5, n * PLOT / MAX_RECTS)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="lanes" viewBox="0 0 {W} {height}" '
             f'width="100%" role="img" aria-label="one lane per rank over time">']
    step, ticks = _ticks(span)
    for v in ticks:
        xv = LEFT + v / span * PLOT
        parts.append(f'<line class="grid" x1="{xv:.1f}" x2="{xv:.1f}" y1="{top - 4}" '
                     f'y2="{height - 36}"/><text class="tick" x="{xv:.1f}" y="{height - 22}">'
                     f'{_tick_label(v, step)}</text>')
    parts.append(f'<text class="axis" x="{LEFT + PLOT / 2:.0f}" y="{height - 4}">time since '
                 f'the first lane started (hover a segment for what and how long)</text>')
    for i, (rec, segs) in enumerate(zip(report["ranks"], per_rank, strict=True)):
        rank, y = rec.get("rank", i), top + i * pitch
        bad = rank in culprits
        parts.append(f'<g class="lane{" culprit" if bad else ""}" data-rank="{_esc(rank)}">'
                     f'<rect class="bg" x="{LEFT}" y="{y}" width="{PLOT}" height="{lane_h}"/>')
        big = lane_h >= 20
        ty = y + (lane_h * 0.45 if big else lane_h - 1)
        parts.append(f'<text class="rank" x="{LEFT - 8}" y="{ty:.0f}">'
                     f'{"⚠ " if bad else ""}rank {_esc(rank)}</text>')
        if big:
            parts.append(f'<text class="state" x="{LEFT - 8}" y="{y + lane_h - 2}">'
                         f'{_esc(rec.get("state", "?"))}{" · culprit" if bad else ""}</text>')
        if not segs:
            parts.append(f'<text class="nodata" x="{LEFT + 6}" y="{y + lane_h * 0.7:.0f}">'
                         'no lane data for this rank</text>')
        for s in coarsen(merge_equal(segs), quantum):
            x0 = x(s[0])
            w = max(x(s[1]) - x0, 1.2)  # a blip shorter than a pixel still shows
            tip = (f"rank {rank}: {s[3]}\n{KINDS[s[2]][1]} for {_dur(s[1] - s[0])} "
                   f"(from {s[0] - t0:.2f} s to {s[1] - t0:.2f} s)")
            parts.append(f'<rect class="seg k-{s[2]}" x="{x0:.1f}" y="{y}" width="{w:.1f}" '
                         f'height="{lane_h}"><title>{_esc(tip)}</title></rect>')
        if segs:  # what the rank was doing at the end, and for how long: the answer at a glance
            last = segs[-1]
            short = last[3] if len(last[3]) <= 46 else last[3][:44] + "…"
            parts.append(f'<text class="last" x="{LEFT + PLOT + 8}" y="{ty:.0f}">{_esc(short)}'
                         f'<title>{_esc(last[3])}</title></text>')
            if big:
                parts.append(f'<text class="since" x="{LEFT + PLOT + 8}" y="{y + lane_h - 2}">'
                             f'for {_dur(last[1] - last[0])}, since {_dur(last[0] - t0)}</text>')
        parts.append("</g>")
    xr = x(created)
    parts.append(f'<line class="now" x1="{xr:.1f}" x2="{xr:.1f}" y1="{top - 8}" '
                 f'y2="{height - 36}"><title>report written at {created - t0:.2f} s</title></line>'
                 f'<text class="nowlabel" x="{xr:.1f}" y="{top - 10}">report</text>')
    parts.append("</svg>")
    return "".join(parts)


CSS = """body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;max-width:1400px}
h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.1em;margin-top:1.6em}
.cause{background:#fff4e5;border-left:6px solid #f28e2b;padding:.6em 1em;margin:.6em 0}
.cause .title{font-size:1.15em;font-weight:600}.fix{margin-top:.4em}
.legend span{display:inline-block;margin-right:1.2em;font-size:.9em}
.legend i{display:inline-block;width:14px;height:14px;vertical-align:-2px;margin-right:4px;
border:1px solid #888}
svg.lanes text{font-size:12px;fill:#333}svg.lanes .rank{text-anchor:end;font-weight:600}
svg.lanes .state{text-anchor:end;font-size:10px;fill:#666}
svg.lanes .culprit .rank,svg.lanes .culprit .state{fill:#c0392b}
svg.lanes .bg{fill:#f7f7f7}svg.lanes .culprit .bg{fill:#fde8e8;stroke:#c0392b;stroke-width:2}
svg.lanes .seg:hover{stroke:#000;stroke-width:1}svg.lanes .grid{stroke:#ddd}
svg.lanes .tick{text-anchor:middle;font-size:11px;fill:#555}
svg.lanes .axis{text-anchor:middle;font-size:11px;fill:#777}
svg.lanes .now{stroke:#c0392b;stroke-width:2;stroke-dasharray:5 3}
svg.lanes .nowlabel{text-anchor:middle;fill:#c0392b;font-size:11px;font-weight:600}
svg.lanes .nodata{fill:#999;font-style:italic}svg.lanes .last{font-size:11px}
svg.lanes .since{font-size:10px;fill:#777}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;font-size:.9em}
table{border-collapse:collapse}tr.culprit td{background:#fde8e8}
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:.85em}.note{color:#666}
""" + "".join(f"svg.lanes .k-{k}{{fill:{c}}}.legend .k-{k}{{background:{c}}}"
              for k, (c, _) in KINDS.items())


def _table(report: dict[str, Any], per_rank: list[list[Segment]]) -> str:
    d, culprits = report["diagnosis"], _culprits(report)
    rows = []
    for rec, segs in zip(report["ranks"], per_rank, strict=True):
        p = (d.get("positions") or {}).get(str(rec["rank"]), {})
        hb = rec.get("hb") or {}
        doing = p.get("doing", "?") if not segs else segs[-1][3]
        err = f"<br><b>{_esc(rec['error'])}</b>" if rec.get("error") else ""
        rows.append(
            f'<tr{" class=culprit" if rec["rank"] in culprits else ""}><td>{_esc(rec["rank"])}'
            f'</td><td>{_esc(rec.get("state", "?"))}{err}</td><td>{_esc(doing)}</td>'
            f'<td><code>{_esc(p.get("user", "?"))}</code></td><td><code>'
            f'{_esc(p.get("innermost", "?"))}</code></td><td>{_esc(hb.get("epoch", "?"))}</td>'
            f'<td>{_esc(hb.get("steps", "?"))}</td></tr>')
    return ("<table><tr><th>rank</th><th>state</th><th>doing / waiting on</th><th>user line</th>"
            f"<th>innermost frame</th><th>epoch</th><th>steps</th></tr>{''.join(rows)}</table>")


def _stacks(report: dict[str, Any]) -> str:
    culprits, out = _culprits(report), []
    for r in report["ranks"]:
        for i, (name, frames) in enumerate((r.get("stacks") or {}).items()):
            text = "\n".join(f"{f.get('file')}:{f.get('line')} in {f.get('func')}\n"
                             f"    {f.get('code', '')}" for f in frames)
            opened = " open" if i == 0 and r["rank"] in culprits else ""
            out.append(f"<details{opened}><summary>rank {_esc(r['rank'])}: {_esc(name)}"
                       f"</summary><pre>{_esc(text)}</pre></details>")
    return "".join(out) or "<p class=note>none collected</p>"


def _old_picture(report: dict[str, Any]) -> str:
    note = ("<p class=note>This report has no lane data (it was written by an older ddpguard); "
            "the table below says where each rank ended.</p>")
    if not any(r.get("timeline") for r in report["ranks"]):
        return note
    try:
        img = base64.b64encode(_progress_png(report)).decode()
    except ImportError:
        return note
    return note + f'<img alt="per-rank progress" src="data:image/png;base64,{img}">'


def render_html(report: dict[str, Any], path: str) -> str:
    d = report["diagnosis"]
    per_rank = [lanes(r) for r in report["ranks"]]
    if any(per_rank):
        present = {s[2] for segs in per_rank for s in segs}
        legend = "".join(f'<span><i class="k-{k}"></i>{_esc(text)}</span>'
                         for k, (_, text) in KINDS.items() if k in present)
        picture = (f'<div class="legend">{legend}<span><i style="background:#fde8e8;'
                   f'border-color:#c0392b"></i>culprit rank</span></div>{_svg(report, per_rank)}')
    else:
        picture = _old_picture(report)
    reason = f"<p class=note>{_esc(report['reason'])}</p>" if report.get("reason") else ""
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>ddpguard report: {_esc(d['title'])}</title><style>{CSS}</style></head><body>
<h1>ddpguard: {_esc(report.get('event', 'report'))}</h1>
<div class="cause"><div class="title">{_esc(d['title'])}</div><div>{_esc(d['explanation'])}</div>
<div class="fix"><b>What to do:</b> {_esc(d['fix'])}</div></div>{reason}
<h2>What each rank did, in time</h2>{picture}
<h2>Where each rank is</h2>{_table(report, per_rank)}
<h2>Stacks (all threads)</h2>{_stacks(report)}
<p class=note>run {_esc(report.get('run_id', '?'))}, reported by rank
{_esc(report.get('reporter_rank', '?'))} of {_esc(report.get('world_size', '?'))}</p>
</body></html>"""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path


# -- PNG (matplotlib, optional) -------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib  # ImportError here tells the caller the `plot` extra is missing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png_bytes(fig: Any, plt: Any) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _progress_png(report: dict[str, Any]) -> bytes:
    """The pre-lanes picture: batches + steps over time per rank, from the heartbeat timeline."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.5 * len(report["ranks"])))
    t0 = t_start(report)
    for r in report["ranks"]:
        tl = r.get("timeline") or []
        xs = [p[0] - t0 for p in tl] or [report["created"] - t0]
        ys = [p[2] + p[3] for p in tl] or [0]
        ax.step([*xs, report["created"] - t0], [*ys, ys[-1]], where="post",
                label=f"rank {r['rank']} ({r['state']})")
    ax.axvline(report["created"] - t0, color="red", linestyle=":", label="report")
    ax.set_xlabel("seconds since the first heartbeat")
    ax.set_ylabel("batches + optimizer steps")
    ax.set_title(f"ddpguard: {report['diagnosis']['title']}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return _png_bytes(fig, plt)


def _lanes_png(report: dict[str, Any], per_rank: list[list[Segment]]) -> bytes:
    plt = _pyplot()
    t0, n = t_start(report), len(per_rank)
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.45 * n))
    span = max([float(report["created"])] + [s[-1][1] for s in per_rank if s]) - t0
    culprits = _culprits(report)
    for i, segs in enumerate(per_rank):
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for s in coarsen(merge_equal(segs), max(span, 1e-3) / 2000):
            by_kind.setdefault(s[2], []).append((s[0] - t0, max(s[1] - s[0], span / 2000)))
        for kind, bars in by_kind.items():
            ax.broken_barh(bars, (n - 1 - i - 0.4, 0.8), facecolors=KINDS[kind][0])
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r['rank']} ({r.get('state', '?')})"
                        + (" ⚠" if r["rank"] in culprits else "")
                        for r in reversed(report["ranks"])], fontsize=8)
    for lab, r in zip(ax.get_yticklabels(), reversed(report["ranks"]), strict=True):
        lab.set_color("#c0392b" if r["rank"] in culprits else "#222")
    ax.axvline(float(report["created"]) - t0, color="#c0392b", linestyle="--", label="report")
    present = {s[2] for segs in per_rank for s in segs}
    for k, (c, text) in KINDS.items():
        if k in present:
            ax.barh([0], [0], color=c, label=text)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25 if n < 4 else -0.1),
              ncol=8, frameon=False)
    ax.set_xlabel("seconds since the first lane started")
    ax.set_title(f"ddpguard: {report['diagnosis']['title']}", fontsize=9)
    return _png_bytes(fig, plt)


def render_png(report: dict[str, Any], path: str) -> str:
    """Raises ImportError without matplotlib (the `plot` extra)."""
    per_rank = [lanes(r) for r in report["ranks"]]
    data = _lanes_png(report, per_rank) if any(per_rank) else _progress_png(report)
    with open(path, "wb") as fh:
        fh.write(data)
    return path
