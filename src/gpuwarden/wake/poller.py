"""One daemon thread polling a source's non-blocking fds; stopped through a pipe, never by a timeout.

A handler reads a bounded amount per call and returns: a readable fd that stays readable is polled
again, so a flood is consumed in slices and `stop` is always heard between two of them. A handler that
raises ends the thread, and `failed` says why (the agent logs it; the periodic check still covers it).
"""

from __future__ import annotations

import os
import select
import threading
import time
from typing import Callable, Iterable

Handler = Callable[[int], None]  # called with the poll event mask


class Poller:
    def __init__(self, name: str, pace_s: float = 0.005) -> None:
        self.name = name
        #: a pause after each handler call: a storm's events pile up and are read (and emitted) together,
        #: at most 1/pace_s reads a second; the first event of a quiet spell is read at once
        self.pace_s = pace_s
        self._handlers: dict[int, Handler] = {}
        self._masks: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._dropped: set[int] = set()
        self.failed = ""  # why the thread ended early ("" while it runs or after a clean stop)
        #: called between polls when the poll timed out (a source's own clock, e.g. PSI re-arming); ms
        self.idle: tuple[int, Callable[[], None]] | None = None

    def add(self, fd: int, mask: int, handler: Handler) -> None:
        self._handlers[fd] = handler
        self._masks[fd] = mask

    def drop(self, fd: int) -> None:
        """From a handler: poll this fd no more (it was closed or went away)."""
        self._dropped.add(fd)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"gpuwarden-wake-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        p = select.poll()
        p.register(self._r, select.POLLIN)
        for fd, mask in self._masks.items():
            p.register(fd, mask)
        timeout = self.idle[0] if self.idle else None
        try:
            while True:
                ready = p.poll(timeout)
                if not ready and self.idle:
                    self.idle[1]()
                for fd, ev in ready:
                    if fd == self._r:
                        return
                    self._handlers[fd](ev)
                    if fd in self._dropped:
                        p.unregister(fd)
                        self._dropped.discard(fd)
                if ready and self.pace_s:
                    time.sleep(self.pace_s)
        except Exception as exc:  # a source's bug ends the source, never the agent
            self.failed = f"{type(exc).__name__}: {exc}"

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Wake the thread, join it; the pipe is closed. The fds added stay the caller's to close."""
        try:
            os.write(self._w, b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1


class Polled:
    """What every fd-read source shares: one Poller thread on its fds (`_listen`), why it died (`failed`,
    which the agent logs once), and its stop (`_unlisten`; the fds stay the source's to close)."""

    name: str
    _poller: Poller | None = None

    def _listen(self, fds: Iterable[tuple[int, int, Handler]]) -> None:
        self._poller = Poller(self.name)
        for fd, mask, handler in fds:
            self._poller.add(fd, mask, handler)
        self._poller.start()

    @property
    def failed(self) -> str:
        return self._poller.failed if self._poller else ""

    def _unlisten(self) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None
