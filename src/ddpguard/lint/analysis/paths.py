"""Write paths and contents as rank-dependent or shared (DDP007, DDP010)."""

from __future__ import annotations

import ast

from .context import ModuleInfo, dotted
from .provenance import NONE, value_level


def per_rank_path(info: ModuleInfo, dest: ast.expr, depth: int = 0) -> bool:
    """`f"queue{rank}.pth"`, `os.path.join(d, f"shard_{args.rank}")`, a name assigned such a
    path, or a loop variable over `range(rank, n, world_size)`: one file per rank."""
    for n in ast.walk(dest):
        if not isinstance(n, ast.Name | ast.Attribute | ast.Call):
            continue
        if value_level(info, n) != NONE:
            return True
        d = dotted(n) if not isinstance(n, ast.Call) else None
        if d is None:
            continue
        if "rank" in d.rsplit(".", 1)[-1].lower() or d in _rank_loop_vars(info):
            return True
        if depth < 2 and any(per_rank_path(info, v, depth + 1)
                             for _, v in info.assigns.get(d, [])):
            return True
    return False


def _rank_loop_vars(info: ModuleInfo) -> set[str]:
    """Targets of loops whose iterable depends on the rank (`for i in range(rank, n, ws)`)."""
    hit = info._memo.get(("rank_loop_vars", 0))
    if hit is None:
        hit = found = set[str]()
        for lrec in info.loops:
            node = lrec.node
            if isinstance(node, ast.For | ast.AsyncFor) and any(
                    value_level(info, n) != NONE for n in ast.walk(node.iter)
                    if isinstance(n, ast.Name | ast.Attribute | ast.Call)):
                found.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        info._memo[("rank_loop_vars", 0)] = hit
    return hit  # type: ignore[return-value]


def rank_dependent(info: ModuleInfo, obj: ast.expr) -> bool:
    """What a pickle/np write stores differs per rank: it names the rank, a shard or a
    local (per-process) value (`local_memory_embeddings`, `shard`)."""
    for n in ast.walk(obj):
        if isinstance(n, ast.Name | ast.Attribute):
            d = dotted(n) or ""
            last = d.rsplit(".", 1)[-1].lower()
            if value_level(info, n) != NONE or any(h in last for h in ("local", "shard",
                                                                          "rank")):
                return True
    return False


_SEP = "/"


def path_key(info: ModuleInfo, node: ast.expr) -> tuple[str, ...]:
    """A path expression as the string it builds, piece by piece: `os.path.join(d, n + ".pt")`,
    `os.path.join(d, n) + ".pt"`, `f"{d}/{n}.pt"` and `Path(d) / f"{n}.pt"` have one key. Literal
    text is merged, any other piece is its AST dump."""
    out: list[str] = []
    _pieces(info, node, out)
    merged: list[str] = []
    for p in out:
        if merged and p.startswith("'") and merged[-1].startswith("'"):
            merged[-1] += p[1:]
        else:
            merged.append(p)
    return tuple(merged)


def _pieces(info: ModuleInfo, node: ast.expr, out: list[str]) -> None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        out.append("'" + node.value)
    elif isinstance(node, ast.JoinedStr):
        for v in node.values:
            if isinstance(v, ast.FormattedValue) and v.format_spec is None and v.conversion < 0:
                _pieces(info, v.value, out)
            else:
                _pieces(info, v, out)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Div):
        _pieces(info, node.left, out)
        if isinstance(node.op, ast.Div):
            out.append("'" + _SEP)
        _pieces(info, node.right, out)
    elif isinstance(node, ast.Call) and node.args and not node.keywords and (
            info.qualify(node.func) or "") in ("os.path.join", "str", "Path", "pathlib.Path"):
        for i, a in enumerate(node.args):
            if i:
                out.append("'" + _SEP)
            _pieces(info, a, out)
    else:
        out.append(ast.dump(node))
