"""Every entry of bench/lint_mutations.py patches text that is in the code today: an entry
whose text an edit rewrote tests nothing (the bench reports it as "pattern not found"), and
sixteen such entries once went unnoticed for rounds. Kept out of tests/lint and of the
bench's own test glob (`tests/test_lint*.py`): under a mutation it would fail by design."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutation_entry_patches_text_the_code_still_holds() -> None:
    entries = runpy.run_path(str(ROOT / "bench/lint_mutations.py"), run_name="bench")["M"]
    lint = ROOT / "src/ddpguard/lint"
    stale = [name for name, path, old, _new in entries if old not in (lint / path).read_text()]
    assert stale == []
    names = [e[0] for e in entries]
    assert len(names) == len(set(names)), "two entries share a name"
