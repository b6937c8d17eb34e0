"""The report: every rank's record (state, last heartbeat, stacks, lanes, where it issued what
it waits for), the diagnosis, and the settings, from what the stopping rank gathered. No store,
no threads: the stop protocol (failing.py) hands over what it collected."""

from __future__ import annotations

import linecache
import sys
import time
from collections.abc import Mapping

from .config import GuardConfig
from .diagnose import diagnose
from .fault import fault_notes, read_fault
from .heartbeat import Heartbeat
from .peers import PeerTable
from .records import RankDump, RankRecord, Report
from .rules import Decision
from .stacks import Frame, is_library_file, user_frame
from .unwinding import from_notes

__all__ = ["assemble"]


def _lightning_module_files() -> list[str]:
    """The files of the program's LightningModule classes (their training_step: a rank that
    returned None there is on no stack once Lightning ended it). Only where the program
    imported Lightning; read from this process, which runs the same program."""
    out: list[str] = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        mod = sys.modules.get(name)
        base = getattr(mod, "LightningModule", None)
        todo: list[type] = list(base.__subclasses__()) if isinstance(base, type) else []
        while todo:
            cls = todo.pop()
            todo.extend(cls.__subclasses__())
            path = getattr(sys.modules.get(cls.__module__), "__file__", None)
            if path and not is_library_file(path) and path not in out:
                out.append(path)
    return out


def assemble(decision: Decision, peers: Mapping[int, Heartbeat],
             dumps: Mapping[int, RankDump], *, rank: int, world_size: int,
             own: Heartbeat, table: PeerTable, run_id: str,
             config: GuardConfig) -> Report:
    """The JSON report of the rank `rank` that stops the job."""
    now = time.monotonic()
    interval = config.heartbeat_interval
    records: list[RankRecord] = []
    for r in range(world_size):
        dump: RankDump = dumps.get(r) or {}
        hb = dump.get("hb") or peers.get(r)
        if r == rank:
            hb = own
        state = (hb or {}).get("state", "missing")
        if hb is None:
            state = "missing"
        elif (r != rank and not dump and state == "running"
              and table.stale_for(r, now) > 3 * interval):
            # (A rank that said it exited or crashed is silent because it is gone: its last
            # word stands.)
            # Its guard stopped answering: what it last said it was doing is stale.
            hb = {**hb, "kind": "unknown", "blocked": False, "pending": [],
                  "doing": f"not answering for {table.stale_for(r, now):.0f} s "
                           "(process stopped or frozen?)"}
        elif state == "running" and r != rank:
            gone, _ = table.gone(r, hb, now)
            if gone:
                state = "dead"
        unwound = dump.get("unwinding")
        if unwound is None and state == "dead":
            # Aborted by the transport in a collective it issued while unwinding an error: the
            # words are in its fault log (a rank of this machine; issued.py wrote them).
            unwound = from_notes(fault_notes(read_fault((hb or {}).get("fault"))))
        records.append({"rank": r, "state": state, "hb": hb or {},
                        "error": (hb or {}).get("error"), "stacks": dump.get("stacks"),
                        "issued": dump.get("issued") or {},
                        "ddp_training": dump.get("ddp_training"),
                        "sequence": dump.get("sequence") or [],
                        "lanes": dump.get("lanes") or [],
                        "unwinding": unwound})
    sources: dict[str, list[str]] = {}
    for rec in records:
        main: list[Frame] = next(iter((rec["stacks"] or {}).values()), [])
        uf = user_frame(main)
        if uf is not None:
            sources[uf["file"]] = linecache.getlines(uf["file"])
        # The loops each rank iterates a loader in (align.py: is a rank still inside it?).
        for site in ((rec["hb"] or {}).get("loaders") or {}):
            path = str(site).rpartition(":")[0]
            if path and path not in sources:
                sources[path] = linecache.getlines(path)
        # Lightning's synced self.log lines and should_stop sets (metric_sync.py), and the
        # lines that ran forwards through the wrapper: under Lightning the module's file
        # (its training_step, loops.framework_skip) is on no stack once a rank left the step.
        hb = rec["hb"] or {}
        for line in [*(hb.get("synced_logs") or {}), *(hb.get("stop_requests") or {}),
                     *(hb.get("forward_lines") or {})]:
            path = str(line).rpartition(":")[0]
            if path:
                sources.setdefault(path, linecache.getlines(path))
        # Where each rank issued its recent collectives (parting.py: under a rank test?).
        for where in [*rec["issued"].values(), *(e["line"] for e in rec["sequence"])]:
            path = str(where or "").rsplit(" in ", 1)[0].rsplit(":", 1)[0]
            if path and path != "?":
                sources.setdefault(path, linecache.getlines(path))
    for path in _lightning_module_files():
        sources.setdefault(path, linecache.getlines(path))
    diag = diagnose(records, sources, decision.cause, decision.reason, list(decision.culprits))
    starts = [float(s[0]) for rec in records for s in rec["lanes"][:1]]
    return {"event": "training hang detected" if decision.proof
            else "training stalled with no sign of life",
            "reason": decision.reason, "proof": decision.proof,
            "created": time.time(), "t_start": min(starts) if starts else time.time(),
            "run_id": run_id, "reporter_rank": rank,
            "world_size": world_size, "diagnosis": diag, "ranks": records,
            "config": {k: getattr(config, k) for k in config.__dataclass_fields__}}
