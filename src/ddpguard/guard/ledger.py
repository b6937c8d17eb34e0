"""Each rank's collective ledger, read from torch's flight recorder, and the pure comparisons
that turn several ranks' ledgers into proof of a deadlock or a desync.

The flight recorder (`torch._C._distributed_c10d._dump_fr_trace`) keeps, per process group, the
last enqueued and completed collective sequence numbers and a ring of recent entries (op,
input sizes and dtypes, retired or not). It is readable from the guard thread while the
training thread is blocked inside a collective. It is a private API: everything here checks for
it by feature and degrades to `available = False`, and the monitor then falls back to reading
Python stacks.

An entry, as published between ranks, is a small list (`Entry`): [group, seq, op, sizes,
dtypes, done], and on NCCL its state.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "Ledger",
    "Status",
    "Entry",
    "compact",
    "signature",
    "first_pending",
    "waiting_on_peers",
    "pending_mismatch",
    "cross_wait",
    "desync",
    "describe_entry",
    "entry_key",
    "FR_DEFAULT_SIZE",
]

log = logging.getLogger("ddpguard.guard")

# A small ring keeps each read in the low milliseconds (2,000 entries, torch's default on gloo,
# take ~50 ms to dump and far longer to parse); 256 still covers many seconds of training.
FR_DEFAULT_SIZE = "256"

# Ops whose input sizes and dtypes must agree on every rank of the group. Others (gather,
# scatter, all_to_all with splits, object collectives' payloads) legitimately differ.
_SYMMETRIC = {"all_reduce", "broadcast", "allreduce_coalesced", "all_reduce_coalesced",
              "reduce", "all_gather", "_allgather_base", "allgather", "allgather_coalesced",
              "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced",
              "barrier"}

# group name -> (last enqueued, last completed) sequence numbers.
Status = dict[str, tuple[int, int]]
Entry = list[Any]
"""One flight-recorder entry (`compact`), as it travels in heartbeats and digests (a JSON
list, so a list here too): position 0 the group's name (str; waiting.SETUP_GROUP for a
set-up wait), 1 its sequence number in that group (int; -1 for a set-up wait), 2 the op
('all_reduce'), 3 the input sizes (list of shapes), 4 the input dtypes (list of str),
5 retired (bool), and on NCCL 6 the device state ('scheduled' | 'started' | 'completed').
`entry_key` gives (group, seq), what lines entries up across ranks."""


def entry_key(entry: Sequence[Any]) -> tuple[str, int]:
    """(group, seq): the same collective on every rank of the group."""
    return entry[0], entry[1]


def _op_name(profiling_name: str) -> str:
    # "gloo:all_reduce", "nccl:all_reduce" -> "all_reduce"
    return profiling_name.split(":", 1)[-1] if profiling_name else "?"


def compact(raw: Mapping[str, Any]) -> Entry | None:
    """One flight-recorder entry as [group, seq, op, sizes, dtypes, done]; None for p2p."""
    if raw.get("is_p2p"):
        return None
    pg = raw.get("process_group") or ("?", "")
    name = str(pg[0]) if isinstance(pg, list | tuple) else str(pg)
    prof = str(raw.get("profiling_name", ""))
    entry = [name, int(raw.get("collective_seq_id", -1)), _op_name(prof),
             [list(s) for s in raw.get("input_sizes") or []],
             list(raw.get("input_dtypes") or []), bool(raw.get("retired"))]
    if not prof.startswith("gloo:") and raw.get("state"):
        # NCCL tracks each entry on the device: scheduled (queued behind earlier work),
        # started (running, waiting for the peers), completed. gloo leaves it 'scheduled'.
        entry.append(str(raw["state"]))
    return entry


def signature(entry: Sequence[Any]) -> tuple[Any, ...]:
    """What must agree across ranks for one sequence number of one group."""
    op = entry[2]
    if op in _SYMMETRIC:
        return (op, str(entry[3]), str(entry[4]))
    return (op,)


def describe_entry(entry: Sequence[Any]) -> str:
    """'all_reduce #57 (group 0) [12] Float' for reports."""
    if entry[0] == "set-up":  # waiting.SETUP_GROUP: a wait the flight recorder does not list
        return f"{entry[2]} (process-group set-up)"
    state = f" [{entry[6]}]" if len(entry) > 6 and entry[6] else ""
    sizes = entry[3]
    dt = entry[4]
    shape = ""
    if sizes:
        shape = " " + ",".join("x".join(str(d) for d in s) or "scalar" for s in sizes[:3])
        if len(sizes) > 3:
            shape += f",+{len(sizes) - 3}"
        if dt:
            shape += f" {dt[0]}"
    return f"{entry[2]} #{entry[1]} (group {entry[0]}){shape}{state}"


class Ledger:
    """Reads this process's flight recorder. Cheap status every tick; entries on demand."""

    def __init__(self, enabled: bool = True) -> None:
        self._dump: Any = None
        self._dump_json: Any = None
        if enabled:
            try:
                import torch._C._distributed_c10d as c10d

                self._dump = getattr(c10d, "_dump_fr_trace", None)
                self._dump_json = getattr(c10d, "_dump_fr_trace_json", None)
            except ImportError:
                pass
        self.available = False
        self.started: dict[str, int] = {}
        if self._dump is not None or self._dump_json is not None:
            try:
                self.status()
                self.available = True
            except Exception as exc:  # a torch whose recorder differs: use the fallback
                log.debug("flight recorder unreadable, falling back to stacks: %s", exc)

    def _read(self, entries: bool) -> dict[str, Any]:
        if self._dump is not None:
            return pickle.loads(self._dump(entries, False, False))  # noqa: S301 (our process)
        import json

        return json.loads(self._dump_json(entries, False))

    def status(self) -> Status:
        """Per group, the last enqueued and completed sequence numbers. As a side result,
        `started` holds the last one the device started, where the backend tracks it (NCCL
        with timing on; -1 elsewhere)."""
        data = self._read(False)
        out: Status = {}
        started: dict[str, int] = {}
        for name, st in (data.get("pg_status") or {}).items():
            q = int(st.get("last_enqueued_collective", -1))
            c = int(st.get("last_completed_collective", -1))
            out[str(name)] = (q, c)
            started[str(name)] = int(st.get("last_started_collective", -1))
        self.started = started
        return out

    def frames_for(self, wanted: set[tuple[str, int]], only_active: bool = False
                   ) -> dict[tuple[str, int], str]:
        """The user's file:line that issued each wanted (group, seq), from the recorder's own
        stack traces. Symbolizing every entry is slow (a second or more): only for a report;
        `only_active` symbolizes just the collectives not completed yet (milliseconds)."""
        from .stacks import is_library_file

        if self._dump is None:
            return {}
        data = pickle.loads(self._dump(True, True, only_active))  # noqa: S301 (our process)
        out = {}
        for raw in data.get("entries") or []:
            e = compact(raw)
            if e is None or entry_key(e) not in wanted:
                continue
            frames = raw.get("frames") or []
            user = next((f for f in frames if not is_library_file(f.get("filename", ""))),
                        frames[0] if frames else None)
            if user is not None:
                out[entry_key(e)] = (f"{user.get('filename')}:{user.get('line')} in "
                                      f"{user.get('name')}")
        return out

    def created_ns(self, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """When the recorder created each wanted (group, seq) entry (wall-clock ns)."""
        out = {}
        for raw in self._read(True).get("entries") or []:
            e = compact(raw)
            if e is not None and entry_key(e) in wanted and raw.get("time_created_ns"):
                out[entry_key(e)] = int(raw["time_created_ns"])
        return out

    def origins(self) -> list[tuple[Entry, int, int]]:
        """Every collective entry still in the ring, oldest first, with when it was created
        (wall-clock ns) and the ident of the thread that issued it (0 where not recorded)."""
        out = []
        for raw in self._read(True).get("entries") or []:
            e = compact(raw)
            if e is not None:
                try:
                    tid = int(raw.get("thread_id") or 0)
                except (TypeError, ValueError):
                    tid = 0
                out.append((e, int(raw.get("time_created_ns") or 0), tid))
        return out

    def entries(self) -> list[Entry]:
        """Every collective entry still in the ring, oldest first (p2p left out)."""
        data = self._read(True)
        out = []
        for raw in data.get("entries") or []:
            e = compact(raw)
            if e is not None:
                out.append(e)
        return out


def ensure_recorder_env(env: dict[str, str] | os._Environ[str] | None = None) -> None:
    """Turn the flight recorder on with a small ring unless the user chose a size (before the
    first process group is created; read once by torch)."""
    env = os.environ if env is None else env
    if "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        env["TORCH_FR_BUFFER_SIZE"] = FR_DEFAULT_SIZE
    # NCCL records when the device starts a collective only with timing on: that is what
    # tells a rank waiting for its peers from one whose device is still busy before it.
    env.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")


# ---------------------------------------------------------------------------------------------
# pure comparisons over several ranks' views


def waiting_on_peers(status: Status, started: Mapping[str, int]) -> bool:
    """A collective is pending that the device has started (or, where starts are not
    tracked, that was enqueued): the rank waits for its peers. An enqueued collective the
    device has not started means the device is still busy with earlier work."""
    for group, (q, c) in status.items():
        s = started.get(group, -1)
        if q > c and (s < 0 or s > c):
            return True
    return False


def started_on_device(status: Status, started: Mapping[str, int]) -> bool:
    """A pending collective that the device itself reports started (NCCL tracks starts; gloo
    does not): the device waits in it for the peers, whatever the host thread does next, so
    no look at the thread's stack is needed (an NCCL hang often shows on the host only as an
    implicit synchronisation somewhere in the user's code)."""
    return any(q > c and started.get(g, -1) > c for g, (q, c) in status.items())


def first_pending(pending: Sequence[Entry]) -> Entry | None:
    """The oldest pending entry (lowest sequence number of the first group that has one)."""
    return min(pending, key=lambda e: (e[1], e[0])) if pending else None


def pending_mismatch(blocked: Mapping[int, Sequence[Entry]]
                     ) -> tuple[int, int, Entry, Entry] | None:
    """Two blocked ranks pending on the same (group, seq) with different ops or sizes: they
    can never complete together. Returns (rank_a, rank_b, entry_a, entry_b)."""
    seen: dict[tuple[str, int], tuple[int, Entry]] = {}
    for rank in sorted(blocked):
        for e in blocked[rank]:
            if e[1] < 0:
                continue  # a set-up wait has no sequence number to line up
            key = entry_key(e)
            if key in seen:
                r0, e0 = seen[key]
                if signature(e0) != signature(e):
                    return r0, rank, e0, e
            else:
                seen[key] = (rank, e)
    return None


def cross_wait(blocked: Mapping[int, Sequence[Entry]], members: Mapping[str, Sequence[int]],
               world_size: int) -> dict[int, Entry] | None:
    """Every rank blocked, and not all on one and the same collective: nobody can move.
    `members` maps a group name to its ranks (absent: the whole world). Returns each rank's
    oldest pending entry when proven, else None."""
    if len(blocked) < world_size or any(not v for v in blocked.values()):
        return None
    firsts = {r: first_pending(v) for r, v in blocked.items()}
    keys = {entry_key(e) + signature(e) for e in firsts.values() if e is not None}
    if len(keys) <= 1:
        return None  # all wait on the same collective: slow, not provably stuck
    # Ranks forming a group wait for its other members, whom a stack does not name: several
    # ranks in the same set-up while others wait in collectives may be a subgroup still
    # connecting. Only a rank alone in its set-up, with every other rank elsewhere, is proof.
    for e in firsts.values():
        if e is not None and e[1] < 0:
            same = sum(1 for f in firsts.values() if f is not None and f[1] < 0
                       and f[0] == e[0] and f[2] == e[2])
            if 1 < same < len(firsts):
                return None
    # Proof needs, for some rank's oldest pending (g, s), a member of g that is not pending on
    # (g, s) with the same signature: that member waits elsewhere and cannot join.
    for r, e in firsts.items():
        if e is None:
            continue
        ranks = members.get(e[0]) or range(world_size)
        for m in ranks:
            if m == r or m not in blocked:
                continue
            if not any(p[0] == e[0] and p[1] == e[1] and signature(p) == signature(e)
                       for p in blocked[m]):
                return {k: v for k, v in firsts.items() if v is not None}
    return None


def desync(digests: Mapping[int, Sequence[Entry]]) -> tuple[int, int, Entry, Entry] | None:
    """Recent entries of several ranks: the first (group, seq) where two ranks recorded
    different collectives. Retired or not does not matter: a pair of different collectives
    that 'completed' together exchanged data that belongs to neither."""
    by_key: dict[tuple[str, int], list[tuple[int, Entry]]] = {}
    for rank, entries in digests.items():
        for e in entries:
            by_key.setdefault(entry_key(e), []).append((rank, e))
    for key in sorted(by_key, key=lambda k: (k[1], k[0])):
        items = by_key[key]
        base_rank, base = items[0]
        for rank, e in items[1:]:
            if signature(e) != signature(base):
                return base_rank, rank, base, e
    return None
