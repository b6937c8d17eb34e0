"""Lint a folder of real training scripts and count findings per rule.

The corpus lives outside the project (third-party code is never copied into it); a
`manifest.json` beside the scripts, when present, maps each file to its repository and commit
so the output can feed the hand-review table in docs/benchmarks/lint_real.md.

    python bench/lint_real.py CORPUS_DIR            # per-rule counts + findings
    python bench/lint_real.py CORPUS_DIR --json out.json
    python bench/lint_real.py DIR --review review.json      # precision from hand verdicts

A review file is a JSON list of {"file", "line", "code", "verdict", "reason"} with verdict
true/false/debatable; findings without a verdict are reported as unreviewed.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ddpguard.lint import Selection, discover, lint_paths  # noqa: E402


def _manifest(folder: Path) -> dict[str, dict[str, str]]:
    path = folder / "manifest.json"
    if not path.is_file():
        return {}
    return {row["file"]: row for row in json.loads(path.read_text(encoding="utf-8"))}


def run(folder: Path) -> tuple[list[dict[str, object]], int, float, float]:
    files = discover([folder])
    manifest = _manifest(folder)
    rows: list[dict[str, object]] = []
    # Best of 5 interleaved rounds, on this process's CPU time (the VM is shared).
    parse_s = lint_s = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for p in files:
            ast.parse(p.read_bytes())
        parse_s = min(parse_s, time.process_time() - t0)
        t0 = time.process_time()
        lint_paths(files, Selection(preview=True))  # what the CLI runs
        lint_s = min(lint_s, time.process_time() - t0)
    # All files together, as `ddpguard lint FOLDER` does (calls between them use
    # the callee's summary).
    by_path = {str(p): p for p in files}
    for f in lint_paths(files, Selection()):
        p = by_path.get(f.path, Path(f.path))
        meta = manifest.get(p.name, {})
        rows.append({"file": p.name, "repo": meta.get("repo", "?"),
                     "commit": meta.get("commit", "?"), "path": meta.get("path", p.name),
                     "line": f.line, "code": f.code, "severity": f.severity,
                     "message": f.message})
    return rows, len(files), parse_s, lint_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", type=Path, help="write the findings here")
    ap.add_argument("--review", type=Path, help="hand verdicts to score the findings against")
    ap.add_argument("--quiet", action="store_true", help="counts only")
    args = ap.parse_args(argv)
    rows, nfiles, parse_s, lint_s = run(args.folder)
    if not args.quiet:
        for r in rows:
            print(f"{r['file']}:{r['line']}: {r['code']} [{r['severity']}] {r['message']}")
    by_rule = Counter(str(r["code"]) for r in rows)
    print(f"\n{len(rows)} findings in {nfiles} files; lint {lint_s:.3f}s vs ast.parse "
          f"{parse_s:.3f}s ({lint_s / parse_s:.2f}x; lint includes its own parse)")
    for code, n in sorted(by_rule.items()):
        print(f"  {code}: {n}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    if args.review:
        _score(rows, json.loads(args.review.read_text(encoding="utf-8")))
    return 0


def _score(rows: list[dict[str, object]], review: list[dict[str, object]]) -> None:
    verdicts = {(v["file"], v["line"], v["code"]): v["verdict"] for v in review}
    table: dict[str, Counter[str]] = {}
    for r in rows:
        verdict = str(verdicts.get((r["file"], r["line"], r["code"]), "unreviewed"))
        table.setdefault(str(r["code"]), Counter())[verdict] += 1
    total: Counter[str] = Counter()
    print("\nrule     true false debatable unreviewed")
    for code, c in sorted(table.items()):
        total.update(c)
        print(f"{code}  {c['true']:5d} {c['false']:5d} {c['debatable']:9d} {c['unreviewed']:10d}")
    n = sum(total.values())
    if n:
        print(f"all      {total['true']:5d} {total['false']:5d} {total['debatable']:9d} "
              f"{total['unreviewed']:10d}   false = {100 * total['false'] / n:.1f}% of {n}")


if __name__ == "__main__":
    raise SystemExit(main())
