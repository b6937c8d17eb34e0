"""Signs of life, read from another thread the way the guard reads the training thread:
work in C, I/O and code moving count; sleeping, blocking and a bare spinning loop do not."""

from __future__ import annotations

import os
import tempfile
import threading
import time

import pytest

from ddpguard.guard.life import LifeSignals

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")


_SPINNING = [True]


def _spin(stop):
    # No call inside the loop (stop.is_set() would be one): bytecode only, like `while True:`.
    n = 0
    _SPINNING[0] = True
    while _SPINNING[0]:
        n += 1


def _compute(stop):
    import torch

    a = torch.randn(200, 200)
    while not stop.is_set():
        a = torch.tanh(a @ a.T / 200)


def _sleep(stop):
    while not stop.is_set():
        time.sleep(0.05)


def _block(stop):
    stop.wait()


def _write(stop):
    with tempfile.TemporaryFile() as fh:
        while not stop.is_set():
            fh.write(b"x" * 65536)
            fh.flush()
            time.sleep(0.02)


def _helper(x):
    return x + 1


class _Config:
    """A project's config lookup, a recursive helper (corpus33f's busy-wait read one)."""

    def __init__(self):
        self.tree = {"trainer": {"lr": 0.1, "logging": {"every": 10}}}

    def _find(self, d, key):
        for k, v in d.items():
            if k == key:
                return v
            if isinstance(v, dict):
                found = self._find(v, key)
                if found is not None:
                    return found
        return None

    def get(self, key):
        return self._find(self.tree, key)


def _busy_wait(stop):
    # Waits for a flag nothing will set: each turn calls Python functions, no work is done.
    cfg = _Config()
    _SPINNING[0] = True
    while _SPINNING[0] and not cfg.get("epoch_logged"):
        pass


def _calls(stop):
    n = 0
    while not stop.is_set():
        n = _helper(n)


def _kinds(target, samples=6, interval=0.25):
    """Kinds seen while `target` runs as the training thread (the sampler's default look)."""
    return _whole_rank_kinds(target, samples=samples, interval=interval)


@pytest.mark.parametrize("target, at_least", [(_compute, 3), (_write, 3), (_calls, 2)])
def test_working_threads_show_life(target, at_least):
    # Any kind will do (torch's kernels also read, for instance). A loop of Python calls is
    # caught in one function or another at random: often enough that it is never quiet long.
    # On a loaded machine a working thread may get no CPU in a 0.25 s window; what the guard
    # needs (life within NO_LIFE seconds) is that it is never quiet for long.
    kinds = _kinds(target, samples=8)
    assert sum(k is not None for k in kinds) >= at_least, kinds
    if target is not _calls:
        quiet = "".join("." if k is None else "x" for k in kinds)
        assert "...." not in quiet, kinds


@pytest.mark.parametrize("target", [_spin, _sleep, _block, _busy_wait])
def test_stuck_threads_show_none(target):
    # The sampler runs in the test's own process, whose other threads (pytest-xdist's) may
    # work now and then on a loaded machine: two lively samples of eight are tolerated, a
    # run of two is not (the guard needs NO_LIFE seconds of quiet, not every sample).
    kinds = _kinds(target, samples=8)
    assert kinds.count(None) >= len(kinds) - 2, kinds
    quiet = "".join("." if k is None else "x" for k in kinds)
    assert "xx" not in quiet, kinds


def _big_kernels(stop):
    import torch

    t = torch.randn(768, 768)
    while not stop.is_set():
        t = torch.tanh(t @ t.T / 768)


@pytest.mark.parametrize("target", [_big_kernels, _block])
def test_a_kernel_starved_of_cpu_is_life_a_wait_is_not(target):
    # A 1,000 s window: the kernel's CPU is far below a fifth of it, as on a machine with
    # many more runnable threads than cores. Runnable inside a call into C is computing;
    # the same call sleeping (a wait) is not.
    import torch  # noqa: F401  imported here: an import's reads would count as the thread's I/O

    stop = threading.Event()
    t = threading.Thread(target=target, args=(stop,), daemon=True)
    t.start()
    time.sleep(0.3)
    life = LifeSignals(t.ident, t.native_id)
    life.sample(progress=0, now=time.monotonic())
    kinds = [life.sample(progress=0, now=time.monotonic() + 1000.0 * (i + 1))
             for i in range(6)]
    stop.set()
    t.join(10)
    if target is _block:
        assert kinds == [None] * 6, kinds
    else:
        # The guard needs a kernel never quiet for long, not life at every look: on a loaded
        # machine one sample may find the caller parked between kernels.
        assert kinds.count("cpu") >= 4, kinds
        quiet = "".join("." if k is None else "x" for k in kinds)
        assert ".." not in quiet, kinds


def test_progress_counts_as_life_and_quiet_time_grows():
    stop = threading.Event()
    t = threading.Thread(target=_block, args=(stop,), daemon=True)
    t.start()
    life = LifeSignals(t.ident, t.native_id)
    life.sample(progress=1, now=100.0)
    assert life.sample(progress=2, now=101.0) == "progress"
    assert life.sample(progress=2, now=105.0) is None
    assert life.quiet_for(now=105.0) == pytest.approx(4.0)
    stop.set()
    t.join(5)


# -- life of the whole rank: the training thread waits, the work happens elsewhere -------------
# Each "training thread" below waits inside a call into C (a pool, a subprocess, a future, a
# socket read) while the guard (this test's thread) samples the whole process.

def _burn(seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(i * i for i in range(1000))
    return n


def _pool_map(stop):
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_burn, [1.0] * 8, chunksize=1)  # ~4 s of tokenizing-like work on 2 workers


def _subprocess(stop):
    import subprocess
    import sys

    # The child works until the test has sampled (its stdin closes), not for a fixed time: on
    # a loaded machine the samples can outlast any fixed span, and a child done early is
    # rightly no life.
    child = subprocess.Popen([sys.executable, "-c", "import os, select, sys, time, zlib\n"
                              "end = time.monotonic() + 60\n"
                              "while time.monotonic() < end and not select.select("
                              "[sys.stdin], [], [], 0)[0]:\n"
                              "    zlib.compress(os.urandom(1 << 20), 9)"],
                             stdin=subprocess.PIPE)
    closer = threading.Thread(target=lambda: (stop.wait(), child.stdin.close()), daemon=True)
    closer.start()
    try:
        # A blocking wait, as subprocess.run without a timeout: with one, Popen.wait polls in
        # a sleep loop, a different thing (test_a_sleep_poll_is_not_cpu).
        child.wait()
    finally:
        child.kill()
        child.wait()


def _write_for(seconds):
    end = time.monotonic() + seconds
    with tempfile.TemporaryFile() as fh:
        while time.monotonic() < end:
            fh.write(b"x" * 65536)
            if fh.tell() > 64 << 20:
                fh.seek(0)
            time.sleep(0.01)


def _executor_writes(stop):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        ex.submit(_write_for, 4.0).result()


def _sleeping_child(stop):
    import subprocess

    p = subprocess.Popen(["sleep", "30"])
    try:
        while not stop.is_set() and p.poll() is None:
            stop.wait(0.5)  # like Popen.wait(): blocked in C
    finally:
        p.kill()
        p.wait()


def _deadlocked(lock):
    lock.acquire()
    lock.acquire()  # never released: no CPU, no I/O


def _deadlocked_child(stop):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_deadlocked, args=(threading.Lock(),), daemon=True)
    p.start()
    try:
        while not stop.is_set() and p.is_alive():
            stop.wait(0.5)
    finally:
        p.kill()
        p.join(5)


def _idle_helpers(stop):
    # What a waiting rank holds: threads that wake often for nothing, a thread blocked on a
    # lock, torch's intra-op pool right after a parallel region (OpenMP workers spin a while
    # before they sleep).
    import torch

    lock = threading.Lock()
    lock.acquire()
    helpers = [threading.Thread(target=_poll_sleep, args=(stop,), daemon=True) for _ in range(4)]
    helpers.append(threading.Thread(target=lambda: lock.acquire(timeout=10), daemon=True))
    for h in helpers:
        h.start()
    a = torch.randn(512, 512)
    for _ in range(20):
        a = torch.tanh(a @ a / 512)
    _SETTLED.set()  # the work is done: from here on this rank only waits
    stop.wait()
    lock.release()
    for h in helpers:
        h.join(5)


_idle_helpers.settles = True  # type: ignore[attr-defined]
_SETTLED = threading.Event()


def _poll_sleep(stop):
    while not stop.is_set():
        time.sleep(0.005)


def _spin_while_helper_works(stop):
    # A busy helper thread must not hide a training thread stuck in `while True:`.
    helper = threading.Thread(target=_compute, args=(stop,), daemon=True)
    helper.start()
    try:
        _spin(stop)
    finally:
        stop.set()
        helper.join(5)


def _named_torch_thread_works(stop):
    # gloo's and NCCL's threads move the job's own bytes: never counted, whatever they do.
    def work():
        import ctypes

        ctypes.CDLL(None).prctl(15, b"pt_gloo_runloop", 0, 0, 0)  # PR_SET_NAME
        _write(stop)

    helper = threading.Thread(target=work, daemon=True)
    helper.start()
    stop.wait()
    helper.join(5)


def _whole_rank_kinds(target, samples=10, interval=0.3, waiting=False, on_stop=None):
    """Kinds seen while `target` runs as the training thread; `on_stop` releases it."""
    stop = threading.Event()
    _SETTLED.clear()
    t = threading.Thread(target=target, args=(stop,), daemon=True)
    t.start()
    time.sleep(0.2)
    # A target that computes first is sampled once it is done: on a loaded machine its work
    # can outlast the first samples, and that work is rightly life.
    if getattr(target, "settles", False):
        assert _SETTLED.wait(60), "the target never finished its work"
    life = LifeSignals(t.ident, t.native_id)
    kinds = []
    try:
        for _ in range(samples):
            time.sleep(interval)
            kinds.append(life.sample(progress=0, waiting=waiting))
    finally:
        stop.set()
        _SPINNING[0] = False
        if on_stop is not None:
            on_stop()
        t.join(30)
    return kinds


@pytest.mark.parametrize("target, kind", [(_pool_map, "children"), (_subprocess, "children"),
                                          (_executor_writes, "threads")])
def test_work_the_training_thread_waits_for_is_life(target, kind):
    kinds = _whole_rank_kinds(target)
    # The first window or two only starts the work (and sustained work needs two windows).
    assert kinds[3:].count(kind) >= len(kinds[3:]) - 1, kinds


@pytest.mark.parametrize("target", [_sleeping_child, _deadlocked_child, _idle_helpers,
                                    _spin_while_helper_works, _named_torch_thread_works])
def test_idle_or_stuck_helpers_are_not_life(target):
    kinds = _whole_rank_kinds(target)
    assert kinds[1:].count(None) == len(kinds[1:]), kinds


def _sleep_poll_on_child(stop):
    import subprocess
    import sys

    # Popen.wait with a timeout polls in a sleep loop in Python: the thread wakes every 50 ms
    # and is runnable for a moment each time. The child sleeps: nothing here works.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    closer = threading.Thread(target=lambda: (stop.wait(), child.kill()), daemon=True)
    closer.start()
    try:
        child.wait(timeout=150)
    finally:
        child.kill()
        child.wait()


def test_a_sleep_poll_on_a_sleeping_child_is_not_life():
    # As test_stuck_threads_show_none: the sampler's own process may be busy now and then on
    # a loaded machine; a lone lively sample is tolerated, two in a row are not.
    kinds = _whole_rank_kinds(_sleep_poll_on_child, samples=8)
    assert kinds[1:].count(None) >= len(kinds[1:]) - 1, kinds
    quiet = "".join("." if k is None else "x" for k in kinds[1:])
    assert "xx" not in quiet, kinds


def test_waiting_in_a_collective_ignores_the_rest_of_the_rank():
    # The same busy pool, but the training thread waits in a collective (the caller says so
    # from the ledger): the rank is blocked, whatever its helpers do.
    kinds = _whole_rank_kinds(_pool_map, waiting=True)
    assert kinds[1:].count(None) == len(kinds[1:]), kinds


class _Trickle:
    """A local TCP server: sends `chunk` bytes every `every` seconds to whoever connects (a
    slow download), or nothing at all when chunk is 0 (a read on which nothing arrives)."""

    def __init__(self, chunk, every=0.1):
        import socket

        self.chunk, self.every = chunk, every
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.addr = self.srv.getsockname()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.srv.accept()
        with conn:
            while not self.done.wait(self.every):
                if self.chunk:
                    conn.sendall(b"d" * self.chunk)

    def close(self):
        if self.done.is_set():
            return
        self.done.set()
        self.thread.join(5)
        self.srv.close()


def _reader(addr):
    def read(stop):
        import socket

        time.sleep(0.4)  # connects after the guard started: not one of the job's own
        with socket.create_connection(addr) as s:
            s.settimeout(None)
            while not stop.is_set():
                if not s.recv(4096):  # recv(): not in /proc/.../io, unlike read()
                    break
    return read


@pytest.mark.parametrize("chunk", [200, 0])
def test_bytes_arriving_on_a_socket_are_life_and_silence_is_not(chunk):
    srv = _Trickle(chunk)
    try:
        kinds = _whole_rank_kinds(_reader(srv.addr), on_stop=srv.close)
    finally:
        srv.close()
    if chunk:
        assert kinds[2:].count("socket") >= len(kinds[2:]) - 1, kinds
    else:
        assert kinds[1:].count(None) == len(kinds[1:]), kinds


def test_the_jobs_own_sockets_are_not_life():
    # A connection that exists before the guard starts (gloo's, the store's) moves bytes
    # while the training thread waits on something else: not life.
    import socket

    srv = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    stop_pump = threading.Event()

    def pump():
        while not stop_pump.wait(0.05):
            peer.sendall(b"g" * 1000)
            ours.recv(65536)

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    try:
        kinds = _whole_rank_kinds(_block)
    finally:
        stop_pump.set()
        pumper.join(5)
        for s in (ours, peer, srv):
            s.close()
    assert kinds[1:].count(None) == len(kinds[1:]), kinds


def _reader_in_helper(addr):
    def wait(stop):
        # The training thread waits on a lock; a helper thread reads the socket (a status
        # poller, a metrics client): occasional bytes there are not the training's progress.
        helper = threading.Thread(target=_reader(addr), args=(stop,), daemon=True)
        helper.start()
        stop.wait()
        helper.join(10)
    return wait


@pytest.mark.parametrize("in_training_thread", [True, False])
def test_a_slow_trickle_counts_only_while_the_training_thread_reads(in_training_thread):
    # A chunk every 0.9 s: most 0.3 s windows see nothing. While the training thread is
    # blocked reading, each chunk is progress of what it waits for; elsewhere bytes must be
    # sustained (two windows in a row) to count.
    srv = _Trickle(200, every=0.9)
    target = _reader(srv.addr) if in_training_thread else _reader_in_helper(srv.addr)
    try:
        kinds = _whole_rank_kinds(target, samples=14, on_stop=srv.close)
    finally:
        srv.close()
    if in_training_thread:
        assert kinds.count("socket") >= 2, kinds
    else:
        assert kinds.count(None) == len(kinds), kinds


def test_after_a_gap_two_fresh_samples_are_needed():
    # While the training thread shows life of its own the rest of the rank is not looked at
    # (skip()); the sample after such a gap spans the training thread's last op and the
    # OpenMP spin-down after it: it is neither life nor the first of two.
    from ddpguard.guard.rank_life import RankLife

    stop = threading.Event()
    t = threading.Thread(target=_pool_map, args=(stop,), daemon=True)
    t.start()
    try:
        time.sleep(0.3)
        rank = RankLife(None)
        got = []
        for skip in (False, False, False, True, False, False):
            if skip:
                rank.skip()
            time.sleep(0.3)
            got.append(rank.sample())
    finally:
        t.join(30)
    assert got[1:3] == ["children", "children"], got
    assert got[3:] == [None, None, "children"], got


def test_poll_head_reads_busy_waits_from_the_source(tmp_path):
    from ddpguard.guard.polls import poll_head

    src = tmp_path / "train.py"
    src.write_text(
        "while not cfg.get('ready'):\n"        # 1  a busy-wait: its body only passes
        "    pass\n"                           # 2
        "while not os.path.exists(p):\n"       # 3  a poll with a sleep
        "    time.sleep(0.5)  # wait\n"        # 4
        "while loss.item() >= best: pass\n"    # 5  one line
        "while not done():\n"                  # 6  twin: its body works
        "    step()\n"                         # 7
        "for x in items:\n"                    # 8  twin: a for loop
        "    pass\n")                          # 9
    f = str(src)
    assert [poll_head(f, n) for n in range(1, 10)] == [1, 1, 3, 3, 5, None, None, None, None]
