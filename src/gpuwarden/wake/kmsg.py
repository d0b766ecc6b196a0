"""The kernel log as it is written: /dev/kmsg of a live node, followed from its end with its sequence cursor.

Opened beneath the root (`root.open_fd`), non-blocking, and only when it is the kernel's character
device (1:11): a node tree has a regular file or nothing there, and its captured log is followed by
`logfile` instead. Each read returns one record ("prio,seq,usec,flags;message"); the cursor starts at
the end, so history stays the periodic scan's. A record the ring overwrote before it was read makes
read() fail with EPIPE: the kernel moved the cursor to the oldest record, and the gap is counted.

Bounded: a poll wake-up reads at most BATCH records, and at most MAX_RECORDS_PER_S records are looked at
in a second; beyond that (a flood) the cursor jumps to the end and one wake says so, the check then
reading the log whole. Only lines holding a kernel signature's anchor wake the agent.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import select
import stat
import time
from typing import Any

from gpuwarden.wake.base import Emit, Wake, clip
from gpuwarden.wake.poller import Polled

BATCH = 1024
MAX_RECORDS_PER_S = 50_000
#: what the kernel signatures look for when their table cannot be read (they should agree: tests say so)
FALLBACK_ANCHORS = (b"Xid ", b"NVRM: ", b"NV_ERR_RESET_REQUIRED", b"firmware load for nvidia/", b"probe of",
                    b"PCIe Bus Error", b"blocked for more than", b"[10de:")


@functools.lru_cache(maxsize=1)
def kernel_words() -> re.Pattern[bytes]:
    """One bytes pattern of every anchor of the kernel-log signatures (data/log_signatures.yaml)."""
    anchors: set[bytes] = set()
    try:
        from gpuwarden import datafiles

        doc = datafiles.parse(datafiles.read_text("log_signatures.yaml"), "gpuwarden.log-signatures/v1", "signatures")
        for s in doc.get("signatures") or []:
            if isinstance(s, dict) and "kernel" in (s.get("logs") or []) and isinstance(s.get("anchor"), str):
                anchors.add(s["anchor"].encode())
    except (OSError, ValueError):
        pass
    anchors.update(FALLBACK_ANCHORS)
    return re.compile(b"|".join(re.escape(a) for a in sorted(anchors, key=len, reverse=True)))


def message(record: bytes) -> bytes:
    """The text of one /dev/kmsg record (after the header's ';', before continuation lines)."""
    head, _, rest = record.partition(b";")
    return rest.split(b"\n", 1)[0] if rest else head


class KmsgSource(Polled):
    name = "kmsg"

    def __init__(self, root: Any, path: str = "/dev/kmsg", clock: Any = time.time,
                 words: re.Pattern[bytes] | None = None) -> None:
        self.root = root
        self.path = path
        self.clock = clock
        self.fd = -1
        self._emit: Emit | None = None
        self.records = 0  # records looked at
        self.overwritten = 0  # EPIPE: records the ring dropped before they were read
        self.floods = 0  # times the cursor jumped to the end
        self._second = 0
        self._in_second = 0
        #: what wakes the agent (the kernel signatures' anchors; the bench's benign marker)
        self._words = words or kernel_words()

    def start(self, emit: Emit) -> str | None:
        if not getattr(self.root, "live", False) or not hasattr(self.root, "open_fd"):
            return "not a live root"
        try:
            fd = self.root.open_fd(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            return f"{self.path}: {exc.strerror or exc}"
        st = os.fstat(fd)
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (1, 11):
            os.close(fd)
            return f"{self.path} is not the kernel's log device (a node tree: its captured log is followed)"
        try:
            os.lseek(fd, 0, os.SEEK_END)  # history is the periodic scan's
        except OSError as exc:
            os.close(fd)
            return f"{self.path}: cannot seek to its end ({exc.strerror or exc})"
        self.fd, self._emit = fd, emit
        self._listen([(fd, select.POLLIN, self._ready)])
        return None

    def _ready(self, _ev: int) -> None:
        hit = b""
        now = int(time.monotonic())
        if now != self._second:
            self._second, self._in_second = now, 0
        for _ in range(BATCH):
            if self._in_second >= MAX_RECORDS_PER_S:
                os.lseek(self.fd, 0, os.SEEK_END)
                self.floods += 1
                self._wake(b"kernel log flood: over %d records/s, followed from its end; the check scans the log"
                           % MAX_RECORDS_PER_S)
                time.sleep(0.05)  # the rest of this second's flood is the check's to read, not ours
                return
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overwritten += 1
                    continue
                raise
            if not rec:
                break
            self.records += 1
            self._in_second += 1
            if not hit:
                msg = message(rec)
                if self._words.search(msg):
                    hit = msg
        if hit:
            self._wake(hit)

    def _wake(self, detail: bytes) -> None:
        if self._emit is not None:
            self._emit(Wake(self.name, "log", clip(detail), self.clock()))

    def stop(self) -> None:
        self._unlisten()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
