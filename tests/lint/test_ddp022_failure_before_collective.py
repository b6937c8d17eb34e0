"""DDP022 a failure before a collective on some ranks only.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from helpers import (
    ALL_BUT_PRINT,
    HEAD_DIST,
    inline_lines,
    lint_with_defaults,
    snippet_codes,
    snippet_lines,
)


def test_exit_in_callee_is_not_the_callers_exit() -> None:
    src = """
    def log(x):
        if x is None:
            return
        torch.save(x, f"log{dist.get_rank()}.pt")
    def f(t, rank):
        if rank == 0:
            log(t)
        dist.broadcast(t, 0)
    """
    assert snippet_codes(src) == []
    assert snippet_lines(src.replace("log(t)", "assert t.sum() > 0")) == [("DDP022", 8)]


RESUME = """\
def sync_path(path):
    box = [path]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def main(args, exists):
    if dist.get_rank() == 0 and exists and not args.resume:
        raise ValueError("the run exists")
    if args.resume:
        sync_path(args.path)
"""


def test_exclusive_flag_also_holds_through_a_helper() -> None:
    assert inline_lines(RESUME) == []
    assert inline_lines(
        RESUME.replace(
            "    if args.resume:\n        sync_path", "    if args.sync:\n        sync_path"
        )
    ) == [("DDP022", 9)]


def test_an_exit_names_the_first_collective_it_does_abandon() -> None:
    [f] = lint_with_defaults(HEAD_DIST + RESUME + "    dist.barrier()\n", "t.py", ALL_BUT_PRINT)
    assert (f.code, f.line - 4) == ("DDP022", 9)
    assert "barrier() at line 16" in f.message and "broadcast" not in f.message
