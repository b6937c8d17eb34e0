"""DDP016 dist.reduce result read on every rank.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from helpers import (
    fixture_lines,
    snippet_codes,
)


def test_guard_after_early_return_in_reduce_helper() -> None:
    src = """
    def mean(t):
        dist.reduce(t, dst=0)
        if dist.get_rank() != 0:
            return None
        return t.item()
    """
    assert snippet_codes(src) == []
    assert "DDP016" in snippet_codes(
        src.replace("        if dist.get_rank() != 0:\n            return None\n", "")
    )


def test_reduced_value_read_only_behind_the_callees_guard() -> None:
    name = "DDP016_reduce_read_in_callee.py"
    assert fixture_lines(name) == []
    assert fixture_lines(name, "        if not is_main():\n            return None\n", "") == [
        ("DDP016", 20)
    ]
    # Handed to a builtin that reads it right there, on every rank.
    assert fixture_lines(name, "return self.summarize(stats)", "return float(stats)") == [
        ("DDP016", 20)
    ]
