"""Render a guard report: per-rank progress over time and where each rank ended, as a PNG and
a self-contained HTML page (the PNG inlined, stacks folded)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

__all__ = ["render_png", "render_html"]


def _figure_png(report: dict[str, Any]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.5 * len(report["ranks"])))
    t0 = min((p[0] for r in report["ranks"] for p in (r.get("timeline") or [])),
             default=report["created"])
    positions = report["diagnosis"]["positions"]
    for r in report["ranks"]:
        tl = r.get("timeline") or []
        hb = r.get("hb") or {}
        xs = [p[0] - t0 for p in tl] or [(hb.get("t") or report["created"]) - t0]
        ys = [p[2] + p[3] for p in tl] or [hb.get("batches", 0) + hb.get("steps", 0)]
        # Flat to the report time: a rank that stopped progressing shows as a long plateau.
        xs, ys = [*xs, report["created"] - t0], [*ys, ys[-1]]
        line = ax.step(xs, ys, where="post", label=f"rank {r['rank']} ({r['state']})")[0]
        where = positions.get(str(r["rank"]), {}).get("user", "?").split(" in ")[0]
        ax.annotate(f"r{r['rank']}: {where}", (xs[-2], ys[-1]), fontsize=7,
                    color=line.get_color(), xytext=(4, 4), textcoords="offset points")
    ax.axvline(report["created"] - t0, color="red", linestyle=":", label="report")
    ax.set_xlabel("seconds since the first heartbeat")
    ax.set_ylabel("batches + optimizer steps")
    ax.set_title(f"ddpguard: {report['diagnosis']['title']}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def render_png(report: dict[str, Any], path: str) -> str:
    with open(path, "wb") as fh:
        fh.write(_figure_png(report))
    return path


def render_html(report: dict[str, Any], path: str) -> str:
    d = report["diagnosis"]
    img = base64.b64encode(_figure_png(report)).decode()
    esc = html.escape
    rows = []
    for r in report["ranks"]:
        p = d["positions"].get(str(r["rank"]), {})
        hb = r.get("hb") or {}
        rows.append(
            f"<tr><td>{r['rank']}</td><td>{esc(r['state'])}</td><td>{esc(p.get('doing', '?'))}"
            f"</td><td><code>{esc(p.get('user', '?'))}</code></td><td><code>"
            f"{esc(p.get('innermost', '?'))}</code></td><td>{hb.get('epoch', '?')}</td>"
            f"<td>{hb.get('steps', '?')}</td></tr>")
    stacks = []
    for r in report["ranks"]:
        for name, frames in (r.get("stacks") or {}).items():
            text = "\n".join(f"{f['file']}:{f['line']} in {f['func']}\n    {f['code']}"
                             for f in frames)
            stacks.append(f"<details><summary>rank {r['rank']}: {esc(name)}</summary>"
                          f"<pre>{esc(text)}</pre></details>")
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>ddpguard report: {esc(d['title'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{border:1px solid #ccc;padding:4px}}
table{{border-collapse:collapse}}pre{{background:#f6f6f6;padding:8px;overflow:auto}}</style>
</head><body>
<h1>ddpguard: {esc(report['event'])}</h1>
<p><b>Likely cause:</b> {esc(d['title'])}</p><p>{esc(d['explanation'])}</p>
<p><b>What to do:</b> {esc(d['fix'])}</p>
<img alt="per-rank progress" src="data:image/png;base64,{img}">
<h2>Where each rank is</h2>
<table><tr><th>rank</th><th>state</th><th>doing</th><th>user line</th><th>innermost</th>
<th>epoch</th><th>steps</th></tr>{''.join(rows)}</table>
<h2>Stacks (all threads)</h2>{''.join(stacks) or '<p>none collected</p>'}
<p>run {esc(str(report['run_id']))}, reported by rank {report['reporter_rank']}</p>
</body></html>"""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path
