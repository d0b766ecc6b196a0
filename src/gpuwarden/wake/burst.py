"""A flood of events becomes a few wakes: the first at once, then at most one a window, with a count.

The first event after a quiet window is emitted at once (it carries the latency). Events within the
window after it are only counted; when the window ends one trailing wake says the latest of them and
how many it stands for, so an event in the middle of a burst is never lost yet 5,000 failing pods or
a storm of Xids wake the agent two or three times, not 5,000. The trailing wake is sent by a timer
armed only while events are pending: an idle source has no thread of its own here.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from gpuwarden.wake.base import Emit, Wake

#: a Wake's detail is at most this long (the contract)
MAX_DETAIL = 256
WINDOW_S = 1.0


def clip(text: str, limit: int = MAX_DETAIL) -> str:
    """One line of at most `limit` characters (control characters replaced): details come from outside."""
    text = "".join(c if c.isprintable() else " " for c in text[: limit * 2])
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Burst:
    """Leading-edge emit, then one trailing wake a window carrying the count of what it stands for."""

    def __init__(self, emit: Emit, source: str, topic: str, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.emit, self.source, self.topic, self.window_s, self.clock = emit, source, topic, window_s, clock
        self.events = 0  # offered
        self.wakes = 0  # emitted
        self._lock = threading.Lock()
        self._quiet_at = 0.0  # monotonic: the window of the latest wake ends here
        self._pending = 0
        self._last = ""
        self._first_seen = 0.0
        self._timer: threading.Timer | None = None
        self._closed = False

    def offer(self, detail: str, count: int = 1, seen: float | None = None) -> None:
        """One event (or `count` of them, already coalesced upstream) that `detail` describes."""
        seen = self.clock() if seen is None else seen
        with self._lock:
            if self._closed:
                return
            self.events += count
            now = time.monotonic()
            if now >= self._quiet_at and not self._pending:
                self._quiet_at = now + self.window_s
                wake = self._wake(detail, count, seen)
            else:
                if not self._pending:
                    self._first_seen = seen
                self._pending += count
                self._last = detail
                self._arm(self._quiet_at - now)
                return
        self.emit(wake)

    def _wake(self, detail: str, count: int, seen: float) -> Wake:
        self.wakes += 1
        more = f" (+{count - 1} more)" if count > 1 else ""
        return Wake(self.source, self.topic, clip(clip(detail, MAX_DETAIL - len(more)) + more), seen)

    def _arm(self, delay: float) -> None:
        if self._timer is None:
            self._timer = threading.Timer(max(0.0, delay), self._flush)
            self._timer.daemon = True
            self._timer.start()

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            if self._closed or not self._pending:
                return
            wake = self._wake(self._last, self._pending, self._first_seen)
            self._pending = 0
            self._quiet_at = time.monotonic() + self.window_s
        self.emit(wake)

    def close(self) -> None:
        """No more wakes (what is pending is dropped: the source is stopping); the timer is cancelled."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            if timer is not threading.current_thread():
                timer.join(1.0)
