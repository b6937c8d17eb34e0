"""DDP032 the processes of one group are told different places to meet.

Every process of a group must name the same rendezvous: one address, one port. Ways a
program gives each process its own:

```python
def setup(rank, world_size, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    while s.connect_ex(("127.0.0.1", port)) == 0:   # taken: try the next one
        port += 1
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
```

- **A port each process finds for itself.** The port that `init_process_group` meets at
  (through `MASTER_PORT`, or a `tcp://` init_method) is probed in the very function that forms
  the group, so every rank probes on its own: a loop that moves the port while a socket's
  `connect_ex`/`bind` says it is taken, or a helper of the file that binds a socket and reads
  `getsockname()`. Rank 0's store starts listening on the port it found; a rank that probes
  after that finds that port taken and moves on (a bound port 0 gives every rank another port
  at once), so it waits at a port where nobody listens until the timeout. Not where the probe
  sits under a test of the environment (a launcher's port wins) or of the rank. Fix: pick the
  port once in the parent, before `mp.spawn`, and pass it to every process; under a launcher,
  leave `MASTER_PORT` to it.
- **A port each process draws.** The same port drawn at random in that function
  (`os.environ["MASTER_PORT"] = f"{9999 + random.randint(0, 9999)}"`, MAE-style set-ups'
  mpirun arm), from Python's `random` or NumPy's, which each process seeds from the OS: rank
  0's store listens on its own draw and every other rank waits at another port. Not where any
  file given seeds that generator, and the same silences as the probe. Fix: as for the probe.
- **The launcher's address overwritten.** `os.environ["MASTER_ADDR"] = "localhost"` (or an
  option whose default is `localhost`/`127.0.0.1`, assigned whether or not the user gave it),
  in a function that then takes its rank from torchrun (which exports the address): it reads
  `RANK`, or calls `init_process_group` with neither `rank=` nor `init_method=`. torchrun
  exported the first node's address; on every other node the group is looked for on the
  node's own host and init waits until the timeout. Not under any other test (an arm of a
  single-node launch), not `os.environ.setdefault`, and not in a file that sets `RANK` itself.
  Fix: set it only where the launcher did not (`os.environ.setdefault("MASTER_ADDR", ...)`).
- **The launcher's port overwritten.** `os.environ["MASTER_PORT"] = "12359"` (any value but
  the launcher's own) in the function that forms the group, when it takes its rank from
  torchrun as above. torchrun's agent holds the group's store at the port it exported, and
  every process, rank 0 too, connects to it there as a client: at a port of the program's own
  nobody listens, so init waits until the timeout, on one machine as well. Same silences as
  for the address. A test of this machine's GPUs (`if torch.cuda.device_count() > 1:`) is no
  arm of one launch, and `init_method="env://"` takes the rank from the launcher as the
  default does (corpus35x 3DC-Seg). Fix: `os.environ.setdefault("MASTER_PORT", ...)`.
- **Each task's own host under SLURM.** `os.environ["MASTER_ADDR"] = socket.gethostname()`
  (or `getfqdn()`, `platform.node()`, or a loopback address) in the block that takes the rank
  from SLURM (`SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NTASKS` read in that same block). srun
  starts the tasks on every node of the job, and each node's tasks look for the group on their
  own host: on more than one node init waits until the timeout. Not under a test of the node
  count, and not a host one rank picks and sends to the others. Fix: the job's first node
  (`scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`) on every task.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.bindings import names_in
from ..analysis.context import Func, ModuleInfo, is_main_guard, kwarg, option_names
from ..analysis.enclosing import enclosing
from ..analysis.provenance import dotted
from ..analysis.rank_kind import node_product
from ..analysis.ranks import TRUE, launch
from ..registry import Hit, rule

_PROBES = {"connect_ex", "bind", "connect"}
_LOOPBACK = {"localhost", "127.0.0.1", "0.0.0.0"}
_OWN_HOST = {"socket.gethostname", "socket.getfqdn", "platform.node"}
# What SLURM gives each task: set on every node of the job, one task per process.
_SLURM_TASK = {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"}


@rule('DDP032', 'rendezvous-mismatch', 'error',
      'each process probes its own rendezvous port, or the launcher\'s address or port is '
      'overwritten',
      'pick the port once before spawning; set MASTER_ADDR and MASTER_PORT only where the '
      'launcher did not')
def ddp032(info: ModuleInfo) -> Iterator[Hit]:
    probed = list(_own_ports(info))
    yield from probed
    yield from _overwritten_address(info)
    yield from _overwritten_port(info, {id(h[0]) for h in probed})


def _environ_key(node: ast.AST) -> object:
    """`"MASTER_PORT"` of `os.environ["MASTER_PORT"]`; None for anything else."""
    if isinstance(node, ast.Subscript) and dotted(node.value) in ("os.environ", "environ") \
            and isinstance(node.slice, ast.Constant):
        return node.slice.value
    return None


def _tests(chain: list[ast.AST], info: ModuleInfo | None = None,
           node: ast.AST | None = None) -> list[ast.expr]:
    """The tests on the way to the chain's end; given `info`, not the distributed arm of a
    test of the launch mode (`if args.local_rank != -1:`), which every process of a
    launched group takes (samtemp's val.py)."""
    out = []
    for i, n in enumerate(chain):
        if not isinstance(n, ast.If | ast.While):
            continue
        inner = chain[i + 1] if i + 1 < len(chain) else node
        if info is not None and isinstance(n, ast.If) and inner in n.body \
                and launch(info, n.test) == TRUE:
            continue
        out.append(n.test)
    return out


def _own_ports(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls_named("init_process_group"):
        func = rec.func
        ws = kwarg(rec.node, "world_size")
        if func is None or (isinstance(ws, ast.Constant) and ws.value == 1):
            continue
        uses: list[tuple[ast.AST, set[str]]] = []
        method = kwarg(rec.node, "init_method")
        if method is not None:
            uses.append((method, names_in(method)))
        for st in ast.walk(func):
            if isinstance(st, ast.Assign) and st.lineno < rec.node.lineno and any(
                    _environ_key(t) == "MASTER_PORT" for t in st.targets):
                uses.append((st, names_in(st.value)))
        for where, names in uses:
            chain = enclosing(func, info.tree, where)
            if chain is None or any(_env_or_rank(info, t) for t in _tests(chain)):
                continue
            probe = next((p for n in sorted(names) if (p := _probe(info, func, n))), None) \
                or next((p for c in ast.walk(where) if isinstance(c, ast.Call)
                         and (p := _helper_probe(info, c, c.lineno))), None)
            drawn = "" if probe else _drawn(info, func, where)
            if drawn:
                yield where, "DDP032", (
                    f"every rank runs {func.name}(), which forms the group, and each draws the "
                    f"rendezvous port for itself ({drawn}): rank 0's store listens on its own "
                    "draw, every other rank waits at another port where nobody listens until "
                    "the timeout; pick the port once before spawning (or leave MASTER_PORT to "
                    "the launcher) and pass it to every process")
                break
            if probe:
                yield where, "DDP032", (
                    f"every rank runs {func.name}(), which forms the group, and each probes the "
                    f"rendezvous port for itself ({probe}): rank 0's store listens on the port "
                    "it found, a rank that probes later finds it taken (or draws another free "
                    "port) and waits at a port where nobody listens until the timeout; pick the "
                    "port once before spawning and pass it to every process")
                break


# Random draws of a generator every process seeds on its own (from the OS at import) unless
# the program seeds it with a value, and the call that would seed each.
_DRAWS = {"random": "random.seed", "numpy.random": "numpy.random.seed"}
_DRAW_FUNCS = {"randint", "randrange", "choice", "random", "uniform"}


def _drawn(info: ModuleInfo, func: Func, where: ast.AST) -> str:
    """The port `where` assigns (or the init_method it builds) drawn at random in each process
    (`9999 + random.randint(0, 9999)`, or a name of `func` bound to such a draw before), where
    no file given seeds that generator; "" otherwise."""
    targets = [where]
    names = names_in(where.value if isinstance(where, ast.Assign) else where)
    for st in ast.walk(func):
        if isinstance(st, ast.Assign) and st is not where and any(
                isinstance(t, ast.Name) and t.id in names for t in st.targets) \
                and st.lineno < getattr(where, "lineno", 0):
            targets.append(st.value)
    for target in targets:
        for c in ast.walk(target):
            if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                    and c.func.attr in _DRAW_FUNCS):
                continue
            owner = info.qualify(c.func.value) or ""
            if owner in _DRAWS and not _seeded(info, _DRAWS[owner]):
                return (f"`{ast.unparse(c)}` at line {c.lineno}, from a generator that "
                        "nothing seeds, so each process draws another number")
    return ""


def _seeded(info: ModuleInfo, seed: str) -> bool:
    """Some file given seeds the generator (`random.seed(0)`): the draws may agree."""
    infos = getattr(info.file_set, "infos", None) or [info]
    last = seed.rsplit(".", 1)[-1]
    return any(r.last == last and (r.qual or i.qualify(r.node.func) or "") == seed
               for i in infos for r in i.calls)


def _env_or_rank(info: ModuleInfo, test: ast.expr) -> bool:
    return info.rank_level(test) > 0 or any(
        dotted(n) in ("os.environ", "environ", "os.getenv") or
        isinstance(n, ast.Constant) and n.value == "MASTER_PORT" for n in ast.walk(test))


def _probe(info: ModuleInfo, func: Func, name: str) -> str:
    """How `func` probes the port it assigns to `name`: a loop that moves it while a socket
    call says it is taken, or a call of a helper of this file that binds a socket and reads
    the port it got; "" for neither."""
    for st in ast.walk(func):
        if not (isinstance(st, ast.Assign | ast.AugAssign) and any(
                isinstance(t, ast.Name) and t.id == name
                for t in (st.targets if isinstance(st, ast.Assign) else [st.target]))):
            continue
        chain = enclosing(func, info.tree, st) or []
        if any(_env_or_rank(info, t) for t in _tests(chain)):
            continue
        for loop in chain:
            if isinstance(loop, ast.While | ast.For) and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                    and c.func.attr in _PROBES for c in ast.walk(loop)):
                return f"a loop at line {loop.lineno} moves `{name}` while a socket finds it taken"
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) \
                and (hit := _helper_probe(info, st.value, st.lineno)):
            return hit
    return ""


def _helper_probe(info: ModuleInfo, call: ast.Call, line: int) -> str:
    """`call` calls a function of this file that binds a socket and reads the port it got."""
    callee = info.callee_last(call)
    for helper in info.funcs.get(callee, []):
        calls = {c.func.attr for c in ast.walk(helper) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Attribute)}
        if "getsockname" in calls and "bind" in calls:
            return f"{callee}() at line {line} binds a socket to find a free port"
    return ""


def _overwritten_address(info: ModuleInfo) -> Iterator[Hit]:
    if "MASTER_ADDR" not in info.spelled:
        return
    for node in ast.walk(info.tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and _environ_key(node.targets[0]) == "MASTER_ADDR"):
            continue
        value = _loopback(info, node.value) or _own_host(info, node.value)
        if not value:
            continue
        func = next((f for fs in info.funcs.values() for f in fs
                     if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)
                     and enclosing(f, info.tree, node) is not None), None)
        chain = enclosing(func, info.tree, node)
        if chain is None:
            continue
        if (slurm := _slurm_block(info, func, chain, node)):
            yield node, "DDP032", (
                f"os.environ['MASTER_ADDR'] = {ast.unparse(node.value)} ({value}) in the set-up "
                f"that takes the rank from SLURM ({slurm}), which starts a task on every node of "
                "the job: each node's tasks look for the group on their own host, so on more "
                "than one node init waits until the timeout; set it to the job's first node "
                "(`scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`) on every task")
            continue
        if any(not _same_value(t, node.value) and not is_main_guard(t) and not _gpu_test(t)
               for t in _tests(chain, info, node)):
            continue
        launcher = _launcher_after(info, func, node.lineno)
        if launcher:
            yield node, "DDP032", (
                f"os.environ['MASTER_ADDR'] = {ast.unparse(node.value)} ({value}) overwrites "
                f"the address the launcher exported, while {launcher}: on every node but the "
                "first, the group is looked for on the node's own host and init waits until "
                "the timeout; set it only where the launcher did not (os.environ.setdefault)")
        elif value != "this process's own host" and (nodes := _spans_nodes(info, func)):
            yield node, "DDP032", (
                f"os.environ['MASTER_ADDR'] = {ast.unparse(node.value)} ({value}) in a "
                f"program that spans nodes by itself ({nodes}): on every node but the first, "
                "the processes look for the group on their own host and init waits until the "
                "timeout; pass the first node's address (an option without a loopback "
                "default, or the launcher's MASTER_ADDR through os.environ.setdefault)")


def _overwritten_port(info: ModuleInfo, probed: set[int]) -> Iterator[Hit]:
    """`os.environ["MASTER_PORT"] = "12359"` under torchrun: the launcher's agent holds the
    group's store at the port it exported, and every process (rank 0 too) connects to it as a
    client; a port of the program's own is one nobody listens on, on one machine as well."""
    for rec in info.calls_named("init_process_group"):
        func = rec.func
        if func is None:
            continue
        for st in ast.walk(func):
            if not (isinstance(st, ast.Assign) and len(st.targets) == 1
                    and _environ_key(st.targets[0]) == "MASTER_PORT"
                    and st.lineno < rec.node.lineno) or id(st) in probed \
                    or _from_environ(st.value):
                continue
            chain = enclosing(func, info.tree, st)
            if chain is None or any(not _same_value(t, st.value) and not _gpu_test(t)
                                    for t in _tests(chain)):
                continue
            launcher = _launcher_after(info, func, st.lineno)
            if launcher:
                yield st, "DDP032", (
                    f"os.environ['MASTER_PORT'] = {ast.unparse(st.value)} overwrites the port "
                    f"the launcher exported, while {launcher}: under torchrun (and "
                    "torch.distributed.launch) the launcher's agent holds the group's store at "
                    "the port it exported and every process connects to it there, so each "
                    "waits at a port where nobody listens until the timeout, on one machine "
                    "too; set it only where the launcher did not (os.environ.setdefault)")
            break  # one finding per set-up


def _from_environ(value: ast.expr) -> bool:
    """The launcher's own value passed on (`os.environ.get("MASTER_PORT", "29500")`)."""
    return any(isinstance(n, ast.Constant) and n.value == "MASTER_PORT" for n in ast.walk(value))


def _loopback(info: ModuleInfo, node: ast.expr) -> str:
    """`"localhost"`, or an option whose default is a loopback address (`args.master_addr`
    with `add_argument("--master-addr", default="localhost")`)."""
    if isinstance(node, ast.Constant):
        return "the loopback address" if node.value in _LOOPBACK else ""
    d = dotted(node)
    if d is None or "." not in d:
        return ""
    opt = d.rsplit(".", 1)[-1]
    for rec in info.calls_named("add_argument"):
        default = kwarg(rec.node, "default")
        if opt in option_names(rec.node) and isinstance(default, ast.Constant) \
                and default.value in _LOOPBACK:
            return f"an option whose default is {default.value!r}, given or not"
    return ""


def _own_host(info: ModuleInfo, node: ast.expr) -> str:
    """`socket.gethostname()` (or `getfqdn()`, `platform.node()`, and `gethostbyname` of one):
    the name of the host that runs this process, a different one on each node."""
    if not isinstance(node, ast.Call):
        return ""
    q = info.qualify(node.func) or ""
    if q == "socket.gethostbyname" and node.args:
        return _own_host(info, node.args[0])
    return "this process's own host" if q in _OWN_HOST else ""


def _slurm_block(info: ModuleInfo, func: Func | None, chain: list[ast.AST],
                 node: ast.Assign) -> str:
    """The SLURM task variable that the block holding `node` reads (its rank's source: SLURM
    starts a task on every node), when no test around it is of the node count (`if
    int(os.environ["SLURM_NNODES"]) == 1:`); "" otherwise."""
    for test in _tests(chain):
        if any("node" in (dotted(n) or str(getattr(n, "value", ""))).lower()
               for n in ast.walk(test)):
            return ""
    holder: ast.AST | None = chain[-1] if chain else (func or info.tree)
    blocks = [getattr(holder, f, None) for f in ("body", "orelse", "handlers", "finalbody")]
    block = next((b for b in blocks if isinstance(b, list) and node in b), None)
    for st in block or []:
        for n in ast.walk(st):
            if isinstance(n, ast.Constant) and n.value in _SLURM_TASK:
                return f"it reads {n.value} at line {n.lineno}"
    return ""


def _gpu_test(test: ast.expr) -> bool:
    """A test of this machine's GPUs (`torch.cuda.is_available() and torch.cuda.device_count()
    > 1`, corpus35x 3DC-Seg): the multi-GPU path of every node, not an arm of one launch."""
    calls = [n for n in ast.walk(test) if isinstance(n, ast.Call)]
    return bool(calls) and all(isinstance(c.func, ast.Attribute) and c.func.attr in (
        "is_available", "device_count") and (dotted(c.func.value) or "").endswith("cuda")
        for c in calls) and all(n.id == "torch" for n in ast.walk(test)
                                if isinstance(n, ast.Name))


def _spans_nodes(info: ModuleInfo, func: Func | None) -> str:
    """The world size that `func` (or the module's own statements) computes from a node count
    (`args.world_size = args.gpus * args.nodes`, or passes so to `init_process_group`), as the
    message names it: the program starts its processes on several nodes by itself; "" for
    none."""
    def here(line: int) -> bool:
        if func is not None:
            return func.lineno <= line <= (func.end_lineno or func.lineno)
        return not any(f.lineno <= line <= (f.end_lineno or f.lineno)
                       for fs in info.funcs.values() for f in fs)

    values = [(line, v) for d, vs in info.assigns.items()
              if d.rsplit(".", 1)[-1].lower() in ("world_size", "world") for line, v in vs]
    values += [(r.node.lineno, ws) for r in info.calls_named("init_process_group")
               if (ws := kwarg(r.node, "world_size")) is not None]
    for line, v in values:
        if here(line) and node_product(info, v, func):
            return f"the world size `{ast.unparse(v)}` at line {line} counts its nodes"
    return ""


def _same_value(test: ast.expr, value: ast.expr) -> bool:
    """`if args.master_addr:` tests the option that always has its default: no real test."""
    return ast.dump(test) == ast.dump(value)


def _launcher_after(info: ModuleInfo, func: Func | None, line: int) -> str:
    """What in `func`, after `line`, takes the rank from torchrun (which exports
    MASTER_ADDR): a read of RANK, or init_process_group with neither `rank=` nor an
    `init_method=` other than "env://" (the rank from RANK); not in a file that writes RANK
    itself."""
    if any(isinstance(n, ast.Assign) and any(_environ_key(t) == "RANK" for t in n.targets)
           or isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
           and n.func.attr in ("setdefault", "update") and any(
               isinstance(c, ast.Constant) and c.value == "RANK" or
               isinstance(c, ast.keyword) and c.arg == "RANK" for c in ast.walk(n))
           for n in ast.walk(info.tree)):
        return ""
    scope: ast.AST = func if func is not None else info.tree
    for n in ast.walk(scope):
        if isinstance(n, ast.Constant) and n.value == "RANK" and n.lineno > line:
            return f"it reads the launcher's RANK at line {n.lineno}"
    for rec in info.calls_named("init_process_group"):
        if rec.func is func and rec.node.lineno > line and len(rec.node.args) < 3 and not any(
                k.arg in ("rank", "store") or k.arg == "init_method" and not (
                    isinstance(k.value, ast.Constant) and k.value.value == "env://")
                for k in rec.node.keywords):
            return (f"init_process_group() at line {rec.node.lineno} takes its rank from the "
                    "launcher's RANK")
    return ""


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
def setup(rank, world_size, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    while s.connect_ex(("127.0.0.1", port)) == 0:
        port += 1
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
"""

RULE = ddp032
