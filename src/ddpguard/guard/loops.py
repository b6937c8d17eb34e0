"""Where a rank left its step or its loop, read from the script's own lines. Pure.

A rank that skipped a backward or broke out of its loop has usually moved on by the time the
guard reports (another loader, a later batch, or gone), so its stack no longer shows the
statement. The loop's source still does: the statements between a forward and a backward
that leave the step, a loop's one `continue` before its backward, its one way out. Each is
named only when the lines leave no choice; the report never guesses between two.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["RANK_TEST", "is_loop_head", "inside_loop", "left_at", "skip_before", "way_out",
           "framework_skip"]

# Errors a framework raises on the rank that skipped a step, where plain DDP would hang:
# Lightning refuses a `training_step` that returns None under DDP.
_FRAMEWORK_SKIP = ("returning None in distributed training is not supported",)


def inside_loop(source: list[str], for_line: int, line: int) -> bool:
    """Is `line` inside the body of the `for` at `for_line` (1-based, same file)?"""
    if not 0 < for_line < line <= len(source):
        return False
    text = source[for_line - 1]
    indent = len(text) - len(text.lstrip())
    for n in range(for_line + 1, line + 1):
        s = source[n - 1]
        if s.strip() and not s.strip().startswith("#") and len(s) - len(s.lstrip()) <= indent:
            return False
    return True


_LEAVE = re.compile(r"^\s*(?:(?:if|elif|else)\b[^#]*:\s*)?(continue|break|return|raise)\b")


def left_at(sources: Mapping[str, list[str]], forward: tuple[str, int] | None,
            backward: tuple[str, int] | None) -> str | None:
    """'file:line `continue`': the first statement between a forward's line and a backward's
    line (same file) that leaves the step."""
    if not forward or not backward or forward[0] != backward[0] or forward[1] >= backward[1]:
        return None
    src = sources.get(forward[0]) or []
    for n in range(forward[1] + 1, min(backward[1], len(src) + 1)):
        if _LEAVE.match(src[n - 1]):
            return f"{forward[0]}:{n} `{src[n - 1].strip()}`"
    return None


_HEAD = re.compile(r"^\s*(?:async\s+)?(?:for|while)\b|\bfor\b.+\bin\b")


def is_loop_head(text: str) -> bool:
    """Does this line iterate (a `for` or `while` statement, a comprehension)? The line of
    `next(iter(loader))` does not: it takes one batch."""
    return bool(_HEAD.search(text.split("#", 1)[0]))


_SKIP = re.compile(r"^\s*(?:(?:if|elif|else)\b[^#]*:\s*)?continue\b")
_LOOP = re.compile(r"^\s*(?:async\s+)?(?:for|while)\b")


def skip_before(sources: Mapping[str, list[str]],
                backward: tuple[str, int] | None, anywhere: bool = False) -> str | None:
    """'file:line `continue`': the one `continue` of the innermost loop around the backward's
    line that comes before it; None when there is none or more than one. With `anywhere`,
    `backward` is any line of the loop and the `continue` is the one before some line of the
    loop that calls `.backward(` (a step with two models, each with its own backward)."""
    if not backward:
        return None
    src = sources.get(backward[0]) or []
    line = backward[1]
    if not 0 < line <= len(src):
        return None
    indent = len(src[line - 1]) - len(src[line - 1].lstrip())
    head = None
    for n in range(line - 1, 0, -1):
        text = src[n - 1]
        if not text.strip() or text.strip().startswith("#"):
            continue
        ind = len(text) - len(text.lstrip())
        if ind < indent:
            if _LOOP.match(text):
                head = n
                break
            if re.match(r"^\s*(?:async\s+)?(?:def|class)\b", text):
                return None
            indent = ind
    if head is None:
        return None
    end = line
    if anywhere:
        body = [n for n in range(head + 1, len(src) + 1) if inside_loop(src, head, n)]
        calls = [n for n in body if ".backward(" in src[n - 1]]
        if not calls:
            return None
        end = max(calls)
    body = [n for n in range(head + 1, end)
            if inside_loop(src, head, n) and not _in_inner_loop(src, head, n)]
    found = [n for n in body if _SKIP.match(src[n - 1])]
    if not found:
        # No `continue`: a `return` (a step function's loop left on a bad loss) or a `break`
        # before the backward is the way past it, when it is the only one.
        found = [n for n in body if _exit_word(src[n - 1]) in ("return", "break")]
    return f"{backward[0]}:{found[0]} `{src[found[0] - 1].strip()}`" if len(found) == 1 else None


def _in_inner_loop(src: list[str], head: int, line: int) -> bool:
    """Is `line` inside a loop nested in the loop at `head` (its `continue` is that loop's)?"""
    return any(_LOOP.match(src[n - 1]) and inside_loop(src, n, line)
               for n in range(head + 1, line))


# A test of which rank this is: `rank`, `self.global_rank`, `args.gpu == 0` (the GPU index
# is the local rank in the tutorials that spawn one process per GPU), `is_master()`,
# Lightning's `trainer.is_global_zero`, Accelerate's `process_index`, ...
RANK_TEST = re.compile(r"\b(?:el)?if\b.*(\w*rank\b|\bis_main\w*|\bis_local_main\w*|\bget_rank\b|"
                   r"\bmaster_process\b|\bmain_process\b|\bis_master\w*|\bis_primary\w*|"
                   r"\bgpu(?:_id)?\s*(?:==|!=|\bin\b)|\bis_leader\b|\w*global_zero\b|"
                   r"\w*process_index\b|\brank_?0\b|\w*rank_zero\w*)", re.IGNORECASE)

_EXIT = re.compile(r"^\s*(?:(?:if|elif|else)\b[^#]*:\s*)?(break|return|raise)\b")


def way_out(sources: Mapping[str, list[str]], site: str) -> str | None:
    """'file:line `if ...: break`': the one statement in the body of the `for` at `site` that
    leaves the loop before its end; None when there is no such line or more than one (the
    report then does not guess which)."""
    path, _, num = site.rpartition(":")
    src = sources.get(path)
    if src is None or not num.isdigit():
        return None
    found = [n for n in range(int(num) + 1, len(src) + 1)
             if inside_loop(src, int(num), n) and _EXIT.match(src[n - 1])
             and not (_breaks(src[n - 1]) and _in_inner_loop(src, int(num), n))]
    if len(found) > 1:
        # Several ways out: the one under a test of which rank this is, if only one is.
        ranked = [n for n in found if _rank_guarded(src, int(num), n)]
        found = ranked if len(ranked) == 1 else found
    return f"{path}:{found[0]} `{src[found[0] - 1].strip()}`" if len(found) == 1 else None


def _exit_word(text: str) -> str | None:
    """'break', 'return' or 'raise' for a line that leaves (under its own one-line `if`)."""
    m = _EXIT.match(text)
    return m.group(1) if m else None


def _breaks(text: str) -> bool:
    """A `break` leaves only its own innermost loop (a `return` or `raise` leaves them all)."""
    return _exit_word(text) == "break"


def _rank_guarded(src: list[str], head: int, line: int) -> bool:
    """Is the statement at `line` under a rank test: its own one-line `if`, or an `if`/`elif`
    that encloses it inside the loop at `head`?"""
    if RANK_TEST.search(src[line - 1]):
        return True
    indent = len(src[line - 1]) - len(src[line - 1].lstrip())
    for n in range(line - 1, head, -1):
        text = src[n - 1]
        here = len(text) - len(text.lstrip())
        if text.strip() and here < indent:
            if re.match(r"\s*(el)?if\b", text) and RANK_TEST.search(text):
                return True
            indent = here
    return False


def framework_skip(error: str, sources: Mapping[str, list[str]]) -> str | None:
    """For an error that says the rank skipped a step (Lightning's), 'file:line `return None`'
    (the one `return None` / bare `return` of a `training_step` in the given sources), or ''
    when the error says so but no single line does; None for any other error."""
    if not any(m in error for m in _FRAMEWORK_SKIP):
        return None
    found = []
    for path, src in sources.items():
        for n, text in enumerate(src, 1):
            if re.match(r"^\s*def training_step\b", text):
                # inside_loop reads any block by its indentation: a def's body too.
                found += [f"{path}:{k} `{src[k - 1].strip()}`" for k in range(n + 1, len(src) + 1)
                          if inside_loop(src, n, k) and re.match(
                              r"^\s*return(\s+None)?\s*(#.*)?$", src[k - 1])]
    return found[0] if len(found) == 1 else ""
