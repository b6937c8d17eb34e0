"""DDP051 the rendezvous written into the program as one machine's address.

`init_process_group(init_method="tcp://192.168.123.134:2024", ...)`, or
`os.environ["MASTER_ADDR"] = "10.0.0.23"`: the group meets at the host the author trained on.
Rank 0 starts the group's store by listening at that address, which no other machine owns,
so on any other machine its init fails ("failed to listen"), and the ranks on the other nodes
(or the ones a launcher leaves running) wait there for a store nobody holds until the
timeout. Under torchrun the program also throws away the address the launcher exported.

Reported for an IPv4 address written out in full in the program: the `tcp://` init method
given as a string (directly or through the one name the function assigns it), or the value
assigned to `os.environ["MASTER_ADDR"]`, in a file that forms a process group. Not a loopback
or wildcard address (`127.0.0.1`, `0.0.0.0`: every machine has them), not
`os.environ.setdefault` (the launcher's value wins), not an option's default (a documented
placeholder the user replaces: the ImageNet example's `--dist-url`), and not a host name.
Fix: take the address from the launcher (`init_method="env://"`, which reads `MASTER_ADDR`),
or from an option.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..analysis.context import ModuleInfo, dotted, kwarg
from ..registry import Hit, rule

_IP = re.compile(r"(?:tcp://)?((\d{1,3})\.\d{1,3}\.\d{1,3}\.\d{1,3})(?::\d+)?/?")


@rule('DDP051', 'fixed-rendezvous-address', 'warning',
      "the group meets at one machine's IP address written into the program: on any other "
      "machine rank 0 cannot listen there and the others wait until the timeout",
      'take the address from the launcher (init_method="env://", MASTER_ADDR) or an option')
def ddp051(info: ModuleInfo) -> Iterator[Hit]:
    if not info.distributed:
        return
    for rec in info.calls_named("init_process_group"):
        method = kwarg(rec.node, "init_method")
        if method is None and len(rec.node.args) > 1:
            method = rec.node.args[1]
        value = _literal(info, method, rec.func)
        ip = _foreign(value) if value is not None else None
        if ip is not None and method is not None:
            yield method, "DDP051", _message(f"init_method={value!r}", ip)
    if "MASTER_ADDR" not in info.spelled:   # the walk noted the string
        return
    for st in ast.walk(info.tree):
        if type(st) is ast.Assign and len(st.targets) == 1 and _master_addr(st.targets[0]) \
                and type(st.value) is ast.Constant and isinstance(st.value.value, str):
            ip = _foreign(st.value.value)
            if ip is not None:
                yield st.value, "DDP051", _message(
                    f'os.environ["MASTER_ADDR"] = {st.value.value!r}', ip)


def _message(what: str, ip: str) -> str:
    return (f"{what}: the group meets at {ip}, one machine's address written into the "
            "program. On any other machine rank 0 cannot listen there, so its init fails, "
            "and the ranks of the other nodes wait for a store nobody holds until the timeout "
            "(under torchrun the address it exported is thrown away too)")


def _literal(info: ModuleInfo, node: ast.expr | None, func: object) -> str | None:
    """A string written out at `node`, or in the one assignment of that name in the
    function (`dist_url = "tcp://..."`; a name also bound elsewhere is not known)."""
    if type(node) is ast.Constant and isinstance(node.value, str):
        return node.value
    if type(node) is ast.Name and func is not None:
        lo, hi = func.lineno, func.end_lineno or func.lineno  # type: ignore[attr-defined]
        values = [v for line, v in info.assigns.get(node.id, []) if lo <= line <= hi]
        if len(values) == 1 and type(values[0]) is ast.Constant and \
                isinstance(values[0].value, str):
            return values[0].value
    return None


def _foreign(text: str) -> str | None:
    """The IPv4 address `text` names (`tcp://10.0.0.2:23456`, `10.0.0.2`), unless it is a
    loopback or wildcard one."""
    m = _IP.fullmatch(text.strip())
    if m is None or m.group(2) == "127" or m.group(1) == "0.0.0.0":
        return None
    if any(int(part) > 255 for part in m.group(1).split(".")):
        return None
    return m.group(1)


def _master_addr(target: ast.expr) -> bool:
    """`os.environ["MASTER_ADDR"]` (or `environ[...]` after `from os import environ`)."""
    return type(target) is ast.Subscript and type(target.slice) is ast.Constant and \
        target.slice.value == "MASTER_ADDR" and dotted(target.value) in ("os.environ", "environ")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import os

import torch.distributed as dist

dist.init_process_group(
    "nccl", init_method="tcp://192.168.1.20:23456",  # the author's first node
    rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
"""

RULE = ddp051
