"""The guard's narrow handle on the rendezvous store: JSON values under one run prefix, and
reads that cost one or two round trips however many keys they ask for.

TCPStore's `multi_get` blocks until every key exists, and `check` answers for a whole list at
once (true only if all exist). A read of many keys therefore asks `check` once for the list and
reads them together; only a caller that accepts a partial answer (the failure path, which
collects whatever arrived) pays one `check` per key, and only when some are missing. An empty
value means "not set": the guard creates its control keys empty at start so that every rank
can read them together with one `multi_get`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["GuardStore", "Counter"]


class Counter:
    """Round trips made through one handle (read by the scale benchmark and the tests)."""

    def __init__(self) -> None:
        self.requests = 0


class GuardStore:
    """`store` may be attached later (`attach`), once the guard connects at start."""

    def __init__(self, store: Any, prefix: str, counter: Counter | None = None) -> None:
        self._store = store
        self.prefix = prefix
        self._lock = threading.Lock()
        self.counter = counter or Counter()

    def attach(self, store: Any) -> None:
        self._store = store

    @property
    def connected(self) -> bool:
        return self._store is not None

    def _full(self, key: str) -> str:
        return self.prefix + key

    def set(self, key: str, value: Any) -> None:
        data = json.dumps(value, default=str, separators=(",", ":"))
        with self._lock:
            self.counter.requests += 1
            self._store.set(self._full(key), data)

    def create_empty(self, keys: Sequence[str]) -> None:
        """Make `keys` exist (empty) unless a rank already set them."""
        with self._lock:
            for k in keys:
                self.counter.requests += 1
                self._store.compare_set(self._full(k), "", "")

    def get_many(self, keys: Sequence[str], partial: bool = True) -> dict[str, Any]:
        """The keys that are set, decoded. With partial=False, {} unless all are set (two
        round trips at most); with partial=True, whatever is there."""
        full = [self._full(k) for k in keys]
        if not full:
            return {}
        with self._lock:
            self.counter.requests += 1
            if self._store.check(full):
                present = full
            elif not partial:
                return {}
            else:
                self.counter.requests += len(full)
                present = [k for k in full if self._store.check([k])]
            if not present:
                return {}
            self.counter.requests += 1
            vals = self._store.multi_get(present)
        return self._decode(present, vals)

    def get_existing(self, keys: Sequence[str]) -> dict[str, Any]:
        """Keys known to exist (created at start): one round trip."""
        full = [self._full(k) for k in keys]
        with self._lock:
            self.counter.requests += 1
            vals = self._store.multi_get(full)
        return self._decode(full, vals)

    def _decode(self, keys: Sequence[str], vals: Sequence[Any]) -> dict[str, Any]:
        n = len(self.prefix)
        out = {}
        for k, v in zip(keys, vals, strict=True):
            raw = bytes(v)
            if raw:
                out[k[n:]] = json.loads(raw.decode())
        return out

    def first(self, key: str, value: Any) -> Any:
        """Set `key` unless another rank did first; returns the value that won."""
        data = json.dumps(value, default=str, separators=(",", ":"))
        with self._lock:
            self.counter.requests += 1
            won = self._store.compare_set(self._full(key), "", data)
        return json.loads(bytes(won).decode())

    def add(self, key: str, n: int) -> int:
        with self._lock:
            self.counter.requests += 1
            return int(self._store.add(self._full(key), n))

    def delete(self, key: str) -> None:
        with self._lock:
            self.counter.requests += 1
            self._store.delete_key(self._full(key))
