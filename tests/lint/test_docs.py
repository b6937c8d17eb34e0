"""The rule reference in docs/lint.md is the registry's, every rule's example is reported by
it, and each rule is a module of its own named after it that imports no other rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ddpguard.lint import RULES, Selection, lint_source
from ddpguard.lint.docs import main, updated
from ddpguard.lint.rules import MODULES

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "lint.md"


def test_docs_lint_md_matches_the_registry():
    text = PAGE.read_text(encoding="utf-8")
    assert updated(text) == text, "docs/lint.md differs: run python -m ddpguard.lint.docs"
    assert main(["--check", "--page", str(PAGE)]) == 0


def test_a_changed_rule_makes_the_check_fail(tmp_path):
    page = tmp_path / "lint.md"
    page.write_text(PAGE.read_text(encoding="utf-8").replace("`missing-set-epoch`", "`x`"))
    assert main(["--check", "--page", str(page)]) == 1


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.RULE.code)
def test_each_rule_reports_its_own_example(module):
    codes = {f.code for f in lint_source(module.EXAMPLE, "train.py", Selection(select=("ALL",)))}
    assert module.RULE.code in codes


def test_one_module_per_rule_named_after_it_importing_no_other_rule():
    assert sorted(m.RULE.code for m in MODULES) == sorted(c for c in RULES if c != "DDP000")
    for m in MODULES:
        path = Path(m.__file__)
        assert path.stem == f"{m.RULE.code.lower()}_{m.RULE.name.replace('-', '_')}"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(i.startswith(("ddp", "rules", ".ddp")) or "rules" in i
                       for i in imported), (path.name, imported)
