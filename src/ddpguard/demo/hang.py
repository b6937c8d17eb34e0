"""`ddpguard demo --hang KIND`: the demo's job with one classic DDP bug switched on, run under
the hang guard exactly as `ddpguard run` runs a script, then the guard's lanes picture.

The buggy script is written next to the output (`broken_train.py`, a copy of
`ddpguard/demo/broken.py`) so that the report's file:line is a file the reader can open, and
so that they can run it themselves with plain torchrun to compare.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

from ..guard.config import EXIT_CODE

__all__ = ["KINDS", "WITHOUT_GUARD", "run_hang"]

# What each bug does, and what plain torchrun did with it on this project's 2-core machine
# (measured once with a 120 s limit, see docs/demo.md; not re-run each time).
KINDS: dict[str, str] = {
    "uneven": "rank 1 filters its hand-made shard and has fewer batches than rank 0",
    "rank0-collective": "a barrier() inside rank 0's `if rank == 0:` checkpoint block",
    "crash": "rank 1 raises on a bad record mid-epoch while rank 0 waits",
    "bn-eval": "rank 0 evaluates a BatchNorm model through the DDP wrapper",
}
WITHOUT_GUARD: dict[str, str] = {
    "uneven": "plain torchrun failed after 60 s with gloo's 'Connection closed by peer' on "
              "rank 0 when rank 1 ran out of batches and left; nothing said the shards were "
              "uneven",
    "rank0-collective": "plain torchrun printed nothing and was still hanging when stopped at "
                        "120 s (gloo's default timeout is 30 minutes, NCCL's 10)",
    "crash": "plain torchrun exited with code 1 after 27 s, the real ValueError printed next to "
             "rank 0's 'Connection closed by peer' traceback",
    "bn-eval": "plain torchrun printed nothing and was still hanging when stopped at 120 s "
               "(gloo's default timeout is 30 minutes, NCCL's 10)",
}


def _script(out: Path) -> Path:
    """Copy the broken job next to the output; the guard names its lines."""
    out.mkdir(parents=True, exist_ok=True)
    dest = out / "broken_train.py"
    # Located, never imported: importing the script would run it.
    spec = importlib.util.find_spec("ddpguard.demo.broken")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("ddpguard/demo/broken.py is missing from this installation")
    shutil.copyfile(spec.origin, dest)
    return dest


def _newest_report(folder: Path, since: float) -> Path | None:
    found = [p for p in folder.glob("*.json") if p.stat().st_mtime >= since]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_hang(kind: str, out: Path, train: Path, val: Path, nproc: int | None) -> int:
    """Run the broken job under the guard; EXIT_CODE when the guard stopped it (the report is
    rendered), 1 when the job failed another way, 0 if the bug did not bite (it should)."""
    from ..launch import main as ddpguard_run

    if kind not in KINDS:
        raise ValueError(f"--hang {kind!r}: choose one of {', '.join(KINDS)}")
    script = _script(out)
    reports = out / "reports"
    os.environ.setdefault("DDPGUARD_REPORT_DIR", str(reports))
    # The broken script is plain gloo on the CPU, and its bugs need a rank 1: 2 ranks, not
    # the GPU count (one GPU would give one rank, and the bug would never bite).
    nproc = nproc or 2
    print(f"ddpguard demo --hang {kind}: {KINDS[kind]}\n"
          f"  the script: {script} (search for 'the BUG')\n"
          f"  running it on {nproc} ranks under the hang guard ...", flush=True)
    opts = [f"--nproc-per-node={nproc}"]
    started = time.time()
    # Exactly what `ddpguard run` does: the launcher prints the verdict and returns its code.
    code = ddpguard_run([*opts, str(script), "--bug", kind, "--train", str(train),
                         "--val", str(val)])
    code = EXIT_CODE if code == EXIT_CODE else (1 if code else 0)
    took = time.time() - started
    report = _newest_report(Path(os.environ["DDPGUARD_REPORT_DIR"]), started - 1)
    if report is not None:
        code = EXIT_CODE  # the guard stopped the job, whichever rank's exit torchrun saw first
        _render(report)
    print(f"\nddpguard demo --hang {kind}: exit code {code} after {took:.0f} s"
          f"{' (the guard stopped the job)' if code == EXIT_CODE else ''}")
    print(f"  without the guard (measured once, docs/demo.md): {WITHOUT_GUARD[kind]}")
    if code == 0:
        print("  the bug did not bite this time (it should): please report it", file=sys.stderr)
    return code


def _render(report: Path) -> None:
    from ..guard.report import load
    from ..reporting.render import render_html

    page = render_html(load(str(report)), str(report.with_suffix(".html")))
    print(f"  the guard's lanes picture (one lane per rank): {page}")
    print(f"  the full report: {report} (ddpguard report {report.name} adds a Perfetto trace)")
