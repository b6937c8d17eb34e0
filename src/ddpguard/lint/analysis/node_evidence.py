"""Whether the program shows it runs on more than one node (DDP025's question before it says
that a rank kind is mixed up: on one node the global and the local rank are the same number).

`ModuleInfo.multi_node` cannot answer it: any `get_rank()` sets it. The evidence here is what
only a program meant for several nodes holds, in the file or in a file one import away (either
way: the trainer imports the set-up, or a launcher imports the trainer): a launcher variable
of a node (`NODE_RANK`, `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`), an option for the node count
or the node's rank (`--nnodes`, `--node_rank`), a product with a count per node
(`ngpus_per_node * args.world_size`, MoCo's), `MASTER_ADDR` set to an address that is not this
machine's, or the Determined cluster launcher. A one-node pin (`--nnodes=1`, `localhost`) is
no evidence. Read only where a mix-up was found (most files have none).
"""

from __future__ import annotations

import ast
import re

from .context import ModuleInfo, dotted

_NODE_STRINGS = {
    "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_NODEID", "SLURM_NTASKS",
    # (not a bare "num_nodes": graph code's key for a graph's node count)
    "OMPI_COMM_WORLD_RANK", "PMI_RANK", "nnodes", "node_rank",
    "--nnodes", "--num_nodes", "--num-nodes", "--nodes", "--node_rank", "--node-rank", "--nr",
    "--machine_rank", "--machine-rank", "--num_machines", "--num-machines",
}
_PROCESS_WORDS = ("gpu", "proc", "world", "device", "rank", "per_node")
# An IPv4 address, bare or in a tcp:// URL: a host other than this machine's.
_ADDRESS = re.compile(r"^(?:tcp://)?(\d{1,3})\.\d{1,3}\.\d{1,3}\.\d{1,3}(?::\d+)?$")


def several_nodes(info: ModuleInfo) -> str:
    """What shows the program runs on several nodes (`reads SLURM_PROCID (train.py:12)`), or
    "" for nothing."""
    key = ("several_nodes", 0)
    if key not in info._memo:
        found = _evidence(info)
        fs = info.file_set
        for m in _neighbours(info) if not found and fs is not None else ():
            found = _evidence(m)
            if found:
                break
        info._memo[key] = found
    return str(info._memo[key])


def _neighbours(info: ModuleInfo) -> list[ModuleInfo]:
    """The files `info` imports and the files that import it, among those given."""
    fs = info.file_set
    imported = fs.imported  # type: ignore[attr-defined]
    return [m for m in getattr(fs, "infos", None) or []
            if m is not info and (info in imported(m) or m in imported(info))]


def _evidence(info: ModuleInfo) -> str:
    key = ("node_evidence", 0)
    if key not in info._memo:
        info._memo[key] = _scan(info)
    return str(info._memo[key])


def _scan(info: ModuleInfo) -> str:
    where = info.path.rsplit("/", 1)[-1]
    for n in ast.walk(info.tree):
        if isinstance(n, ast.Constant) and type(n.value) is str:
            if n.value in _NODE_STRINGS:
                return f"it reads `{n.value}` at {where}:{n.lineno}"
            m = _ADDRESS.match(n.value)
            if m and m.group(1) not in ("127", "0"):
                return f"it meets at the address `{n.value}` at {where}:{n.lineno}"
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
            names = [(dotted(x) or "").lower() for x in (n.left, n.right)]
            # processes per node times nodes (`ngpus_per_node * args.world_size`); not a
            # graph's node count times anything (`node_num * self.aug_strength`)
            if all(names) and any("node" in x for x in names) and any(
                    w in x for x in names for w in _PROCESS_WORDS):
                return (f"it multiplies by a count per node, `{ast.unparse(n)}` at "
                        f"{where}:{n.lineno}")
        elif isinstance(n, ast.Import | ast.ImportFrom):
            mods = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
            if any(x.split(".")[0] == "determined" for x in mods):
                return f"it runs under the Determined cluster launcher at {where}:{n.lineno}"
    return ""
