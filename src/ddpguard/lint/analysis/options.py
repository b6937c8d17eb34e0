"""Command-line options of the program: where `args.<name>` comes from when the program only
ever parses it (`add_argument("--world_size", type=int, default=2)`) and never assigns it."""

from __future__ import annotations

import ast
from typing import NamedTuple

from .context import ModuleInfo, kwarg, option_names

__all__ = ["Option", "parsed_only", "project", "stored"]


class Option(NamedTuple):
    name: str          # the attribute the value is stored under (`world_size`)
    default: object    # the literal default
    where: str         # "train.py:495", the add_argument call


def project(info: ModuleInfo) -> list[ModuleInfo]:
    """`info` first, then the other files on the command line."""
    others: list[ModuleInfo] = getattr(info.file_set, "infos", None) or []
    return [info, *(i for i in others if i is not info)]


def parsed_only(info: ModuleInfo, attr: str) -> Option | None:
    """The option `attr` when the program declares it once with a literal default and no file
    stores anything else under that attribute (`args.world_size = ngpus * args.world_size`,
    `setattr(args, ...)`, a `vars(args)` update): its value is what the command line gave,
    else the default. The declaration of `info` itself is read first (a second program of the
    checkout may declare its own); another file's only where one file alone declares it."""
    per_file: list[list[Option]] = []
    own: list[Option] | None = None
    for m in project(info):
        if stored(m, attr):
            return None
        here: list[Option] = []
        for rec in m.calls_named("add_argument"):
            if attr in option_names(rec.node):
                default = kwarg(rec.node, "default")
                value = default.value if isinstance(default, ast.Constant) else _NOT_LITERAL
                here.append(Option(attr, value, f"{m.path.rsplit('/', 1)[-1]}:{rec.node.lineno}"))
        if here:
            per_file.append(here)
            own = here if m is info else own
    chosen = own if own is not None else (per_file[0] if len(per_file) == 1 else None)
    if chosen is None or len(chosen) != 1 or chosen[0].default is _NOT_LITERAL:
        return None
    return chosen[0]


_NOT_LITERAL = object()


def stored(m: ModuleInfo, attr: str) -> bool:
    """A file stores something under `attr`: an assignment to `x.<attr>`, a `setattr`, a
    config update of the options (`vars(args).update(cfg)`), `set_defaults`."""
    for node in ast.walk(m.tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "setattr":
            return True  # an attribute chosen at run time may be this one
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute) and el.attr == attr:
                    return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and _rewrites(node.func, node, attr):
            return True
    return False


def _rewrites(method: ast.Attribute, call: ast.Call, attr: str) -> bool:
    """`vars(args).update(cfg)` or `args.__dict__.update(cfg)` (a config file's values over
    the options), or `parser.set_defaults(world_size=...)`."""
    if method.attr == "set_defaults":
        return any(k.arg in (attr, None) for k in call.keywords)
    if method.attr != "update":
        return False
    owner = method.value
    return (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
            and owner.func.id == "vars") or (isinstance(owner, ast.Attribute)
                                             and owner.attr == "__dict__")
