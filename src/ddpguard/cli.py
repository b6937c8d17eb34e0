"""The `ddpguard` command. Each sub-command lives in `ddpguard/commands/<name>.py` and is found
by discovery, so adding one never touches this file.

A command module defines NAME, HELP, `add_arguments(parser)` and `main(args) -> int`; with
`RAW = True` it receives its arguments untouched as a list (for `run`, whose options belong to
torchrun). Command modules import heavy libraries inside `main`, so `ddpguard --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

from . import __version__, commands


def _command_modules() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(commands.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        found[mod.NAME] = mod
    return dict(sorted(found.items()))


def build_parser(mods: dict[str, ModuleType]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpguard",
        description="PyTorch DDP training that cannot hang silently.",
    )
    parser.add_argument("--version", action="version", version=f"ddpguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in mods.items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        if getattr(mod, "RAW", False):
            p.add_argument("argv", nargs=argparse.REMAINDER, help="passed through")
        else:
            mod.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mods = _command_modules()
    # RAW commands get their words verbatim: argparse would eat options meant for torchrun.
    if argv and argv[0] in mods and getattr(mods[argv[0]], "RAW", False):
        return int(mods[argv[0]].main(argv[1:]))
    parser = build_parser(mods)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(mods[args.command].main(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
