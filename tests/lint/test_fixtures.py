"""Every fixture in tests/lint/fixtures/, read by one test.

A fixture is named by the rule it is about (`DDPnnn_<what>.py`; `seeds_<name>.py` for a
script of the seeds that shows several). Its markers say what the linter must do:

- `# expect: CODE[, CODE]` on a line: exactly those findings there;
- `# forbid: CODE[, CODE]` on a line: none of those there (the silence the fixture is about);
- `# lint: FLAGS` as a whole line: the selection (`--select`, `--extend-select`, `--ignore`,
  `--preview`). Without it: the default and preview rules, plus every code the markers name.

Every finding must be expected: a fixture is exact, so an unmarked line stays silent too.
"""

from __future__ import annotations

import re
import shlex

import pytest
from helpers import LINT_FIXTURES, lint_with_defaults

from ddpguard.lint import RULES, Selection

_MARK = re.compile(r"#\s*(expect|forbid):\s*(DDP\d{3}(?:\s*,\s*DDP\d{3})*)")
_FLAGS = re.compile(r"^#\s*lint:\s*(.*)$")
_NAME = re.compile(r"^(DDP\d{3}|seeds)_[a-z0-9_]+\.py$")

FIXTURES = sorted(p.name for p in LINT_FIXTURES.glob("*.py"))


def markers(source: str) -> tuple[set[tuple[str, int]], set[tuple[str, int]], list[str]]:
    """(expected, forbidden) (code, line) pairs and the `# lint:` flags of a fixture."""
    expect: set[tuple[str, int]] = set()
    forbid: set[tuple[str, int]] = set()
    flags: list[str] = []
    for i, line in enumerate(source.splitlines(), 1):
        if m := _FLAGS.match(line.strip()):
            flags += shlex.split(m.group(1))
        for kind, codes in _MARK.findall(line):
            pairs = {(c.strip(), i) for c in codes.split(",")}
            (expect if kind == "expect" else forbid).update(pairs)
    return expect, forbid, flags


def selection(flags: list[str], named: set[str]) -> Selection:
    """The fixture's own selection, or the default one that also runs what its markers name."""
    if not flags:
        extra = tuple(sorted(c for c in named if not RULES[c].default))
        return Selection(extend_select=extra, preview=True)
    opts: dict[str, tuple[str, ...]] = {"select": (), "extend_select": (), "ignore": ()}
    preview = False
    it = iter(flags)
    for flag in it:
        if flag == "--preview":
            preview = True
        else:
            key = flag.lstrip("-").replace("-", "_")
            assert key in opts, f"unknown flag {flag}"
            opts[key] += tuple(next(it).split(","))
    return Selection(select=opts["select"], extend_select=opts["extend_select"],
                     ignore=opts["ignore"], preview=preview)


def test_fixture_names() -> None:
    """Each fixture is found by its rule's code alone."""
    assert FIXTURES
    bad = [n for n in FIXTURES if not _NAME.match(n) or
           (n.startswith("DDP") and n[:6] not in RULES)]
    assert bad == []


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture(name: str) -> None:
    source = (LINT_FIXTURES / name).read_text(encoding="utf-8")
    expect, forbid, flags = markers(source)
    assert not expect & forbid, "a line both expects and forbids a code"
    named = {c for c, _ in expect | forbid}
    found = lint_with_defaults(source, name, selection(flags, named))
    got = {(f.code, f.line) for f in found}
    assert len(got) == len(found), "two findings of one rule on one line"
    assert sorted(got & forbid) == []
    assert sorted(got) == sorted(expect)
