"""The coalescing queue between the sources and the agent: one pending wake per topic, however many arrive.

A flood (100,000 kernel lines a second, an inotify storm) costs one dict update per wake under a lock
and leaves one pending entry per topic: the check that follows reads everything the burst changed, so
nothing is lost by folding. Memory is bounded by the number of topics, never by the burst.
"""

from __future__ import annotations

import threading
import time

from msgspec import Struct

from gpuwarden.wake.base import Wake


class Pending(Struct):
    """What one topic's wakes since the last take add up to. `first` is the earliest: the latency of a
    fault is measured from the first time any source saw a change on the topic."""

    first: Wake
    last: Wake
    count: int = 1


class WakeQueue:
    """Thread-safe; `put` never blocks and never grows past one entry per (topic); `take` hands the
    whole pending batch to the one consumer."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._pending: dict[str, Pending] = {}
        self.received = 0  # wakes put since start (a metric's source)
        self.folded = 0  # wakes that joined one already pending

    def put(self, wake: Wake) -> None:
        if not wake.seen:
            from msgspec.structs import replace

            wake = replace(wake, seen=time.time())
        with self._cv:
            self.received += 1
            p = self._pending.get(wake.topic)
            if p is None:
                self._pending[wake.topic] = Pending(wake, wake)
                self._cv.notify()
            else:
                self.folded += 1
                p.count += 1
                p.last = wake
                if wake.seen < p.first.seen:
                    p.first = wake

    __call__ = put  # the queue is the sources' Emit

    def take(self, timeout: float | None) -> dict[str, Pending]:
        """Every pending topic (empty after `timeout` seconds with none); the queue is empty afterwards."""
        with self._cv:
            if not self._pending and (timeout is None or timeout > 0):
                self._cv.wait(timeout)
            out, self._pending = self._pending, {}
            return out

    def wake_up(self) -> None:
        """Return a waiting `take` now (stop, or a timer the consumer keeps itself)."""
        with self._cv:
            self._cv.notify_all()

    def __len__(self) -> int:
        with self._cv:
            return len(self._pending)
