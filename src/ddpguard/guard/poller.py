"""A daemon thread that does one small job every interval while a launcher waits for its job
(following the ranks' stderr files, announcing restarted attempts), and once more when it is
stopped, so nothing written just before the end is missed."""

from __future__ import annotations

import threading

__all__ = ["Poller"]


class Poller:
    def __init__(self, name: str, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop, after one last tick."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.tick()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()
