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


def _calls(stop):
    n = 0
    while not stop.is_set():
        n = _helper(n)


def _kinds(target, samples=6, interval=0.25):
    stop = threading.Event()
    t = threading.Thread(target=target, args=(stop,), daemon=True)
    t.start()
    time.sleep(0.2)
    life = LifeSignals(t.ident, t.native_id)
    kinds = []
    try:
        for _ in range(samples):
            time.sleep(interval)
            kinds.append(life.sample(progress=0))
    finally:
        stop.set()
        _SPINNING[0] = False
        t.join(5)
    return kinds


@pytest.mark.parametrize("target, at_least", [(_compute, 5), (_write, 5), (_calls, 2)])
def test_working_threads_show_life(target, at_least):
    # Any kind will do (torch's kernels also read, for instance). A loop of Python calls is
    # caught in one function or another at random: often enough that it is never quiet long.
    kinds = _kinds(target, samples=8)
    assert sum(k is not None for k in kinds) >= at_least, kinds


@pytest.mark.parametrize("target", [_spin, _sleep, _block])
def test_stuck_threads_show_none(target):
    kinds = _kinds(target)
    assert kinds.count(None) >= len(kinds) - 1, kinds


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
