"""Who am I in the job: rank arithmetic from the launcher's environment, and process-group set-up.

`detect()` is the only place in ddpguard that reads launcher variables, and it takes them as a
mapping so every launcher (torchrun, SLURM, a plain `python`) is testable in one process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "World",
    "DistributedSetupError",
    "detect",
    "expand_nodelist",
    "init_process_group",
    "destroy_process_group",
    "nccl_env_defaults",
    "get_logger",
    "setup_logging",
]

DEFAULT_PORT = 29500
# Variables people set from old blog posts. The first two were renamed; the last never existed
# (blog posts recommend it): NCCL's own timeouts are NCCL_IB_TIMEOUT and a few socket ones.
DEPRECATED_VARIABLES: dict[str, str] = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}
NONEXISTENT_VARIABLES: dict[str, str] = {
    "NCCL_TIMEOUT": "pass timeout= to ddpguard.init() or torch.distributed.init_process_group()",
}
# What we set for NCCL when the user has not: tear down on a failed collective (3 = abort
# without cleanup, which cannot hang on a broken communicator) and dump the flight recorder.
NCCL_DEFAULTS: dict[str, str] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


class DistributedSetupError(RuntimeError):
    """The process group could not be formed; the message says which rank, why, and what to do."""


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place in the job. Immutable: `init()` returns a copy with backend, device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    launcher: str = "single"
    # torchrun's agent already serves the store on MASTER_PORT; ranks must join it as clients.
    agent_store: bool = False
    # Which torchrun attempt this is: the agent's store outlives a failed attempt, so each
    # attempt's keys live under their own prefix or restarted ranks read dead ranks' addresses.
    restart_count: int = 0
    backend: str | None = None
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank {self.rank} is outside the world of size {self.world_size} "
                f"(valid ranks: 0..{self.world_size - 1})"
            )
        if self.local_world_size < 1:
            raise ValueError(f"local_world_size must be >= 1, got {self.local_world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank {self.local_rank} is outside the node's {self.local_world_size} "
                f"processes (valid: 0..{self.local_world_size - 1})"
            )
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {self.master_port}")

    @property
    def is_main(self) -> bool:
        """Rank 0 of the whole job: the one that writes checkpoints and logs."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """Rank 0 on this node: the one that builds per-node caches (e.g. a dataset index)."""
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)

    def print(self, *args: Any, force: bool = False, **kwargs: Any) -> None:
        """`print` on rank 0 only; `force=True` prints on every rank, prefixed with the rank."""
        if not (force or self.rank == 0):
            return
        sep = kwargs.pop("sep", " ")
        text = sep.join(str(a) for a in args)
        if force and self.world_size > 1:
            text = f"[rank {self.rank}] {text}"
        kwargs.setdefault("flush", True)
        # One write per call, so lines from different ranks do not interleave mid-line.
        print(text, **kwargs)

    def describe(self) -> str:
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}) "
            f"via {self.launcher}, master {self.master_addr}:{self.master_port}"
            + (f", backend {self.backend}, device {self.device}" if self.backend else "")
        )


# ---------------------------------------------------------------------------------------------
# detection (pure)


def _int_var(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _first_count(spec: str, name: str) -> int:
    """SLURM writes per-node counts as '4', '4(x2)' or '4(x2),2'; the first node's count is ours
    only on homogeneous jobs, which is what DDP needs anyway."""
    m = re.match(r"\s*(\d+)", spec)
    if not m:
        raise ValueError(f"{name}={spec!r} is not a SLURM task count such as '4' or '4(x2)'")
    return int(m.group(1))


def _split_top_level(spec: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list {spec!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list {spec!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_range_list(body: str, spec: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if "-" in item:
            lo, hi = item.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {item!r} in node list {spec!r}")
            width = len(lo)  # keep zero padding: node[01-04] -> node01..node04
            out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
        elif item:
            out.append(item)
    return out


def expand_nodelist(spec: str) -> list[str]:
    """Expand a SLURM host list: 'node[01-04,07],gpu-a[1-2]-x' -> ['node01', ..., 'gpu-a2-x']."""
    hosts: list[str] = []
    for part in _split_top_level(spec):
        expansions = [""]
        pos = 0
        for m in re.finditer(r"\[([^\]]*)\]", part):
            prefix = part[pos : m.start()]
            choices = _expand_range_list(m.group(1), spec)
            expansions = [e + prefix + c for e in expansions for c in choices]
            pos = m.end()
        hosts.extend(e + part[pos:] for e in expansions)
    if not hosts:
        raise ValueError(f"node list {spec!r} names no host")
    return hosts


def _master_from(env: Mapping[str, str], *, world_size: int, where: str) -> tuple[str, int]:
    addr = env.get("MASTER_ADDR")
    port_raw = env.get("MASTER_PORT")
    if world_size > 1 and where == "torchrun" and (not addr or not port_raw):
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not env.get(n)]
        raise ValueError(
            f"{' and '.join(missing)} not set while WORLD_SIZE={world_size}: every rank needs the "
            "address of rank 0. Launch with `ddpguard run` / torchrun, or export both."
        )
    port = _int_var(env, "MASTER_PORT") if port_raw else DEFAULT_PORT
    return addr or "127.0.0.1", port


def _detect_torchrun(env: Mapping[str, str]) -> World:
    present = [n for n in ("RANK", "WORLD_SIZE") if n in env]
    if len(present) != 2:
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        have = ", ".join(f"{n}={env[n]!r}" for n in names if n in env)
        missing = [n for n in ("RANK", "WORLD_SIZE") if n not in env]
        raise ValueError(
            f"half-set distributed environment: {have} but {' and '.join(missing)} unset. "
            "Launch with `ddpguard run` / torchrun, which sets all of them, or unset the rest."
        )
    rank = _int_var(env, "RANK")
    world_size = _int_var(env, "WORLD_SIZE")
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE={env['WORLD_SIZE']!r} must be at least 1")
    if not 0 <= rank < world_size:
        raise ValueError(
            f"RANK={rank} is not below WORLD_SIZE={world_size}: valid ranks are 0..{world_size - 1}"
        )
    local_rank = _int_var(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    local_world_size = (
        _int_var(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world_size
    )
    if not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world_size}"
        )
    addr, port = _master_from(env, world_size=world_size, where="torchrun")
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    restarts = (
        _int_var(env, "TORCHELASTIC_RESTART_COUNT") if env.get("TORCHELASTIC_RESTART_COUNT") else 0
    )
    return World(
        rank, world_size, local_rank, local_world_size, addr, port, "torchrun",
        agent_store=agent, restart_count=restarts,
    )


def _detect_slurm(env: Mapping[str, str]) -> World:
    if "SLURM_NTASKS" not in env:
        raise ValueError(
            f"SLURM_PROCID={env['SLURM_PROCID']!r} is set but SLURM_NTASKS is not: start the job "
            "with srun (which sets both), or unset SLURM_PROCID"
        )
    rank = _int_var(env, "SLURM_PROCID")
    world_size = _int_var(env, "SLURM_NTASKS")
    if not 0 <= rank < world_size:
        raise ValueError(f"SLURM_PROCID={rank} is not below SLURM_NTASKS={world_size}")
    local_rank = _int_var(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    per_node_var = next(
        (n for n in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if env.get(n)), None
    )
    local_world_size = (
        _first_count(env[per_node_var], per_node_var) if per_node_var else world_size
    )
    if not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"SLURM_LOCALID={local_rank} is not below the {local_world_size} tasks per node "
            f"({per_node_var or 'SLURM_NTASKS'})"
        )
    addr = env.get("MASTER_ADDR")
    if not addr:
        nodelist_var = next(
            (n for n in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(n)), None
        )
        if nodelist_var is None:
            if world_size > 1:
                raise ValueError(
                    "SLURM job with SLURM_NTASKS>1 but neither MASTER_ADDR nor "
                    "SLURM_JOB_NODELIST is set: cannot tell where rank 0 runs"
                )
            addr = "127.0.0.1"
        else:
            addr = expand_nodelist(env[nodelist_var])[0]
    if env.get("MASTER_PORT"):
        port = _int_var(env, "MASTER_PORT")
    elif env.get("SLURM_JOB_ID", "").isdigit():
        # Same on every task of the job, different between jobs sharing a node.
        port = 15000 + int(env["SLURM_JOB_ID"]) % 20000
    else:
        port = DEFAULT_PORT
    return World(rank, world_size, local_rank, local_world_size, addr, port, "slurm")


def detect(env: Mapping[str, str] | None = None) -> World:
    """Decide this process's place from launcher variables: torchrun first, then SLURM, else alone.

    Pure in `env` (defaults to `os.environ`). Raises ValueError naming the variable for a
    half-set or inconsistent environment instead of guessing.
    """
    env = os.environ if env is None else env
    if any(n in env for n in ("RANK", "WORLD_SIZE")):
        return _detect_torchrun(env)
    # An interactive allocation (`salloc` then `python train.py`) is one process, not a job step.
    if "SLURM_PROCID" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return _detect_slurm(env)
    return World()


# ---------------------------------------------------------------------------------------------
# process group (impure: talks to the network and the GPU)


def _pick_backend(world: World, backend: str | None) -> str:
    if backend is not None:
        if backend not in ("gloo", "nccl", "mpi", "ucc", "xccl") and ":" not in backend:
            raise ValueError(f"backend={backend!r} is not a torch.distributed backend")
        return backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def _bind_device(world: World, backend: str) -> torch.device:
    if backend == "nccl" or (backend != "gloo" and torch.cuda.is_available()):
        n = torch.cuda.device_count()
        if world.local_rank >= n:
            raise DistributedSetupError(
                f"rank {world.rank}: LOCAL_RANK={world.local_rank} but this node has {n} visible "
                f"GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
                "Start at most one process per GPU (--nproc-per-node)."
            )
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)
    return torch.device("cpu")


def nccl_env_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """Pure: the NCCL variables ddpguard adds to `env` (NCCL_DEFAULTS minus what the user set).

    A user's value wins, also under the deprecated name: torch reads `TORCH_NCCL_X` before
    `NCCL_X`, so setting ours would silently override a user's `NCCL_ASYNC_ERROR_HANDLING`.
    """
    old_names = {new: old for old, new in DEPRECATED_VARIABLES.items()}
    # No None lookup: os.environ raises on a None key where a dict just says no.
    return {
        name: value for name, value in NCCL_DEFAULTS.items()
        if name not in env and (name not in old_names or old_names[name] not in env)
    }


def _warn_bad_variables(env: Mapping[str, str], log: logging.Logger) -> None:
    for old, new in DEPRECATED_VARIABLES.items():
        if old in env:
            log.warning("%s is deprecated and only read as a fallback; set %s instead", old, new)
    for name, instead in NONEXISTENT_VARIABLES.items():
        if name in env:
            log.warning("%s is not read by NCCL or PyTorch and does nothing; %s", name, instead)


def _explain_setup_failure(world: World, exc: BaseException, init_timeout: timedelta) -> str:
    text = str(exc)
    where = f"{world.master_addr}:{world.master_port}"
    low = text.lower()
    if "address already in use" in low or "eaddrinuse" in low:
        cause = (
            f"port {world.master_port} on {world.master_addr} is already in use (another job or a "
            "leftover process); set MASTER_PORT to a free port, or use `ddpguard run` which "
            "picks one"
        )
    elif "timed out" in low or "timeout" in low or "connect" in low or "refused" in low:
        cause = (
            f"could not reach rank 0's store at MASTER_ADDR:MASTER_PORT={where} within "
            f"{init_timeout.total_seconds():.0f} s, or not every rank joined in time. Check that "
            "rank 0 started, that the address is reachable from this node, and that all "
            f"{world.world_size} ranks were launched"
        )
    else:
        cause = "see the underlying error below"
    return f"rank {world.rank}/{world.world_size}: process group set-up failed: {cause}.\n  {text}"


def init_process_group(
    world: World,
    *,
    backend: str | None = None,
    init_timeout: timedelta = timedelta(minutes=10),
    timeout: timedelta = timedelta(minutes=5),
    env: Mapping[str, str] | None = None,
) -> World:
    """Form the process group for `world` and return it with backend and device filled in.

    `init_timeout` bounds the rendezvous and the first barrier (ranks may start minutes apart on a
    busy cluster); `timeout` then replaces it for training collectives, so a desync fails sooner.
    A single-process world forms no group.
    """
    log = logging.getLogger("ddpguard")
    env = os.environ if env is None else env
    _warn_bad_variables(env, log)
    chosen = _pick_backend(world, backend)
    if not world.distributed:
        dev = _bind_device(world, chosen) if chosen == "nccl" else torch.device("cpu")
        return dataclasses.replace(world, backend=chosen, device=dev)
    if dist.is_initialized():
        raise DistributedSetupError(
            f"rank {world.rank}: a default process group already exists; call "
            "ddpguard.shutdown() before initializing again"
        )
    device = _bind_device(world, chosen)
    if chosen == "nccl":
        # torch reads the process environment, so that is where the user's choice lives.
        os.environ.update(nccl_env_defaults(os.environ))
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    store = None
    try:
        # An explicit TCPStore rather than init_method="env://" so that MASTER_* coming from
        # SLURM (not the environment) work, and so the store timeout is exactly init_timeout.
        store = dist.TCPStore(
            world.master_addr,
            world.master_port,
            world.world_size,
            is_master=world.rank == 0 and not world.agent_store,
            timeout=init_timeout,
            wait_for_workers=not world.agent_store,
            multi_tenant=True,
        )
        dist.init_process_group(
            chosen,
            store=dist.PrefixStore(f"/ddpguard/attempt_{world.restart_count}", store),
            rank=world.rank,
            world_size=world.world_size,
            timeout=init_timeout,
            **kwargs,
        )
        dist.barrier()
    except (RuntimeError, ValueError, TimeoutError) as exc:
        if dist.is_initialized():
            _destroy_bounded(timedelta(seconds=5))
        raise DistributedSetupError(_explain_setup_failure(world, exc, init_timeout)) from exc
    if timeout != init_timeout:
        try:
            dist.distributed_c10d._set_pg_timeout(timeout)
        except (AttributeError, RuntimeError) as exc:  # private API: degrade, never fail set-up
            log.debug("could not shorten the collective timeout: %s", exc)
    return dataclasses.replace(world, backend=chosen, device=device)


def _destroy_bounded(limit: timedelta) -> bool:
    """destroy_process_group in a daemon thread: NCCL teardown can block on a dead peer."""
    done = threading.Event()

    def target() -> None:
        try:
            dist.destroy_process_group()
        except Exception:  # already torn down by an error path; nothing left to free
            pass
        finally:
            done.set()

    t = threading.Thread(target=target, name="ddpguard-destroy", daemon=True)
    t.start()
    return done.wait(limit.total_seconds())


def destroy_process_group(limit: timedelta = timedelta(seconds=30)) -> None:
    """Tear down the default group if there is one. Safe twice, alone, and after a peer died."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if not _destroy_bounded(limit):
        logging.getLogger("ddpguard").warning(
            "destroy_process_group did not return within %.0f s (a peer is probably gone); "
            "leaving it to process exit",
            limit.total_seconds(),
        )


# ---------------------------------------------------------------------------------------------
# logging


class _RankFilter(logging.Filter):
    def __init__(self, world: World, all_ranks: bool) -> None:
        super().__init__()
        self.rank = world.rank
        self.all_ranks = all_ranks

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        # Non-zero ranks stay quiet below WARNING unless asked: N copies of every line help nobody.
        return self.all_ranks or self.rank == 0 or record.levelno >= logging.WARNING


def setup_logging(
    world: World, level: int = logging.INFO, *, all_ranks: bool = False, name: str = "ddpguard"
) -> logging.Logger:
    """Configure logger `name` so each record carries `[rank N]`; idempotent."""
    log = logging.getLogger(name)
    log.setLevel(level)
    for h in list(log.handlers):
        if getattr(h, "_ddpguard", False):
            log.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[rank %(rank)s] %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RankFilter(world, all_ranks))
    handler._ddpguard = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.propagate = False
    return log


def get_logger(name: str = "ddpguard") -> logging.Logger:
    return logging.getLogger(name)
