"""Stopping a job: the first rank to decide writes the report with every rank's stacks and
lanes, the others add theirs and follow; every rank ends its own child processes (DataLoader
workers) before it exits, so nothing of the job is left running."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

from . import channel, procs
from .assemble import assemble
from .ddpstate import ddp_training
from .fault import fault_stacks, parse_fault, read_fault
from .handles import GuardHandle
from .heartbeat import Heartbeat
from .records import RankDump, Report, Trigger
from .report import announce, report_path, write_json
from .rules import Decision
from .sequence import add_lines, recent
from .stacks import Frame, capture_all
from .unwinding import unwinding

__all__ = ["Failure"]

log = logging.getLogger("ddpguard.guard")


class Failure:
    def __init__(self, guard: GuardHandle) -> None:
        self.g = guard
        self._once = threading.Lock()
        # Set once this rank is stopping the job: its training thread must not report a
        # connection error caused by the stop as a crash of its own.
        self.active = False
        self._answered: list[int] = []
        # Set by the crash path (crash.py) before it stops the job from the training thread:
        # the error's own stack (the live one is now inside the crash handling) and, when this
        # rank's error ended the job, the error.
        self._crash: tuple[list[Frame], str | None] | None = None

    def crashed(self, frames: list[Frame], error: str | None = None) -> None:
        """The training thread raised: report `frames` as its stack and, with `error`, this
        rank as crashed of it."""
        self._crash = (frames, error)

    def _dump(self) -> RankDump:
        g = self.g
        stacks = capture_all(skip_ident=threading.current_thread().ident)
        if self._crash is not None and self._crash[0]:
            main = threading.main_thread()
            stacks.pop(f"{main.name} ({main.ident})", None)
            stacks = {f"{main.name} ({main.ident}) at its error": self._crash[0], **stacks}
        return {"stacks": stacks, "lanes": g.lanes.export(), "hb": g.heartbeat(),
                "issued": self._issued(),
                "ddp_training": ddp_training(threading.main_thread().ident),
                # This rank's recent collectives placed in its loop, for the alignment.
                "sequence": recent(g.ledger, g.progress.timeline, threading.main_thread().ident,
                                   site_for=g.issue_sites.site_for),
                "unwinding": unwinding(threading.main_thread().ident)}

    def _issued(self) -> dict[str, str]:
        """Where this rank issued the collectives it waits for, when it waits for them
        somewhere else (Work.wait, a poll, a synchronise): matched by creation time to the
        asynchronous calls the guard saw (issued.py)."""
        g = self.g
        wanted = {(str(e[0]), int(e[1])) for e in g.pending_entries() if e[1] >= 0}
        if not wanted or not g.waiting_call():
            return {}
        try:
            created = g.ledger.created_ns(wanted)
        except Exception as exc:
            log.debug("no recorder creation times: %s", exc)
            return {}
        out = {}
        for (group, seq), ns in created.items():
            site = g.issue_sites.site_for(ns)
            if site is not None:
                out[f"{group}/{seq}"] = site
        return out

    def fail(self, decision: Decision, peers: dict[int, Heartbeat],
             store_lost: bool = False) -> None:
        if not self._once.acquire(blocking=False):
            time.sleep(3600)  # another thread of this rank is already stopping it
        self.active = True
        self._hold_exceptions()
        g = self.g
        me = g.rank
        decision = self._own_side_thread(decision)
        dumps: dict[int, RankDump] = {}
        mine: RankDump | None = None
        if not store_lost:
            try:
                won = g.store_first("trigger", {"by": me, "cause": decision.cause,
                                                "reason": decision.reason})
                if won.get("by") != me:
                    self._follow(won)
                    return
                mine = self._dump()
                with contextlib.suppress(Exception):  # a report exists from here on, even if
                    # this rank dies while collecting: the launcher prints it (report.py)
                    # A dead peer's fault log is a local read: its place goes in at once, or
                    # the launcher's SIGTERM may leave a report that lacks it.
                    write_json(report_path(g.config.report_dir, g.run_id, me), {**self.build(
                        decision, peers, {me: mine, **self._last_words(peers, {me: mine})}),
                        "partial": True})
                if decision.cause == "peer_gone" and any(
                        (peers.get(c) or {}).get("state") != "exited" for c in decision.culprits):
                    # A peer died: the alignment may name a collective this rank has left
                    # behind, by its line. Slow (seconds): after the partial report, and only
                    # here (a hang's report is due within seconds of the proof).
                    add_lines(g.ledger, mine.get("sequence") or [])
                g.store_set(f"dump/{me}", mine)
                dumps = self._collect(peers)
                peers = g.read_peers()
                self._answered = sorted(dumps)
                dumps.update(self._last_words(peers, dumps))
            except Exception as exc:
                log.debug("store failed while collecting stacks: %s", exc)
        dumps[me] = mine if mine is not None else self._dump()
        rep = self.build(decision, peers, dumps)
        path = None
        try:
            path = write_json(report_path(g.config.report_dir, g.run_id, me), rep)
        except OSError as exc:
            channel.write(f"ddpguard: could not write the report: {exc}")
        try:
            announce(rep, path)
            if not store_lost:
                g.store_set("reported", {"path": path})
                self._end_stopped(peers)
                self._await_followers(peers)
        except Exception as exc:
            log.debug("could not announce the report: %s", exc)
        finally:
            self.exit()

    def _own_side_thread(self, decision: Decision) -> Decision:
        """A peer died or a collective failed, and a thread of this rank other than the
        training thread had a collective fail: the group paired that collective with a
        peer's training collective (the transport aborted the peer on the difference). That
        thread is the cause, whatever the peer died of; the thread has ended, so only its
        error, noted when it ended (fault.py), says so."""
        side = self.g.fault_log.side
        if decision.cause not in ("peer_gone", "mismatch") or not side:
            return decision
        name, op, site, _ = side[0]
        return Decision("second_thread", (
            f"rank {self.g.rank}'s thread {name} issued torch.distributed.{op} at {site} and "
            "it failed: collectives are numbered in the order a rank issues them, whatever "
            "the thread, so it paired with another rank's training collective; "
            f"{decision.reason}"), (self.g.rank,))

    def follow(self, trigger: Trigger, peers: dict[int, Heartbeat]) -> None:
        """Another rank decided to stop the job: add this rank's stacks, wait for its report
        to be written, then leave."""
        if not self._once.acquire(blocking=False):
            time.sleep(3600)
        self.active = True
        self._hold_exceptions()
        self._follow(trigger)

    def _follow(self, trigger: Trigger) -> None:
        g = self.g
        try:
            g.store_set(f"dump/{g.rank}", self._dump())
            deadline = time.monotonic() + g.config.dump_wait + 10.0
            reported = None
            while time.monotonic() < deadline and reported is None:
                reported = g.store_get_many(["reported"]).get("reported")
                time.sleep(0.05)
            where = (reported or {}).get("path") or f"see rank {trigger.get('by')}"
            channel.write(f"ddpguard: rank {g.rank} stopped: rank {trigger.get('by')} found "
                          f"{trigger.get('reason', 'a hang')} (report: {where})")
            g.store_set(f"left/{g.rank}", 1)
        except Exception as exc:
            log.debug("could not follow the failing rank: %s", exc)
        finally:
            self.exit()

    def _await_followers(self, peers: dict[int, Heartbeat]) -> None:
        """The reporting rank leaves last, so a launcher that stops every rank once one has
        exited does not cut the others off before they ended their own workers."""
        g = self.g
        # Only ranks that answered with their stacks will also leave: a frozen one cannot.
        # A rank that said it exited may still be leaving (leaving.on_leave): it follows this
        # stop, and must read it before this rank takes the store down.
        want = [r for r in peers if r != g.rank and (r in self._answered or (
            peers[r].get("state") == "exited" and peers[r].get("host") == g.host
            and procs.pid_alive(int(peers[r].get("pid", 0)))))]
        deadline = time.monotonic() + 5.0
        while want and time.monotonic() < deadline:
            got = g.store_get_many([f"left/{r}" for r in want])
            want = [r for r in want if f"left/{r}" not in got
                    and not (peers[r].get("host") == g.host
                             and not procs.pid_alive(int(peers[r].get("pid", 0))))]
            time.sleep(0.05)

    def _hold_exceptions(self) -> None:
        """From here on the peers leave and this rank's own collectives fail ("Connection
        closed by peer"). An exception that reaches the top of the training thread must not
        end the process with the script's exit code (1) before this thread ends it with the
        guard's (17): without a launcher of ours, that code is all torchrun reports."""
        if threading.current_thread() is threading.main_thread():
            return  # the stop runs on the training thread itself: it exits the process
        wait = self.g.config.dump_wait + 20.0

        def hold(*_exc: object) -> None:
            time.sleep(wait)  # the guard thread calls os._exit(17) long before

        sys.excepthook = hold

    def _end_stopped(self, peers: dict[int, Heartbeat]) -> None:
        """A rank stopped by SIGSTOP (or a debugger) on this host can neither follow nor
        handle the launcher's SIGTERM, so the job would outlive the verdict by the launcher's
        grace period (30 s for torchrun) or forever. It is part of this job and the verdict
        is in: end it, and what it started."""
        g = self.g
        for r, hb in peers.items():
            pid = int(hb.get("pid", 0) or 0)
            if (r != g.rank and r not in self._answered and hb.get("host") == g.host
                    and pid > 0 and procs.stopped(pid)):
                channel.write(f"ddpguard: ending rank {r} (pid {pid}): it is stopped and "
                              "cannot leave by itself")
                procs.kill_tree(pid, include_self=True, wait=1.0)

    def exit(self) -> None:
        # The training thread may be stuck inside a C-level collective: no exception can reach
        # it, so the process ends here and the launcher ends (or restarts) the job.
        try:
            self.g.fault_log.stop()
            procs.kill_tree(os.getpid(), wait=1.0)
        finally:
            os._exit(self.g.config.exit_code)

    def _collect(self, peers: dict[int, Heartbeat]) -> dict[int, RankDump]:
        g = self.g
        now = time.monotonic()
        want = [r for r in range(g.world_size) if r != g.rank and r in peers
                and not g.peers.gone(r, peers[r], now)[0]]
        out: dict[int, RankDump] = {}
        deadline = time.monotonic() + g.config.dump_wait
        while want and time.monotonic() < deadline:
            got = g.store_get_many([f"dump/{r}" for r in want])
            for k, v in got.items():
                r = int(k.rsplit("/", 1)[1])
                out[r] = v
                want.remove(r)
            time.sleep(0.05)
        return out

    def _last_words(self, peers: dict[int, Heartbeat],
                    dumps: dict[int, RankDump]) -> dict[int, RankDump]:
        """The stacks a dead rank on this host left in its fault log (native crash), in place
        of the dump it can no longer send."""
        g = self.g
        out: dict[int, RankDump] = {}
        for r, hb in peers.items():
            if r == g.rank or r in dumps or hb.get("host") != g.host or not hb.get("fault"):
                continue
            text = read_fault(hb.get("fault"))
            # A fatal signal's dump is final even while the process is still being torn down
            # (an abort that writes a core file takes a while on a loaded machine); without
            # one, a live rank's log says nothing yet.
            if not parse_fault(text, None)[0] and procs.pid_alive(int(hb.get("pid", 0) or 0)):
                continue
            stacks = fault_stacks(hb.get("fault"), hb.get("main"), text=text)
            if stacks:
                out[r] = {"stacks": stacks, "hb": hb}
        return out

    def build(self, decision: Decision, peers: dict[int, Heartbeat],
              dumps: dict[int, RankDump]) -> Report:
        g = self.g
        own = g.heartbeat()
        if self._crash is not None and self._crash[1]:
            own = {**own, "state": "crashed", "error": self._crash[1]}
        return assemble(decision, peers, dumps, rank=g.rank, world_size=g.world_size,
                        own=own, table=g.peers, run_id=g.run_id, config=g.config)
