"""NVML events (Xid, ECC, GPU lost) as wakes, read from a killable child that dies with the agent.

The driver pushes these events the moment it has them; polling NVML would cost a check each time.
The calls that can hang (nvmlInit, the event wait: incident 5) run only in a forked child
(`wake.nvml_child`) in its own session, killed with the agent (PR_SET_PDEATHSIG). The agent's side is
one thread that reads the child's lines from a pipe, non-blocking, and turns them into
`Wake(source="nvml", topic="gpu")` through a `Burst` (a flood of Xids is a few wakes, with a count).

- init has a hard deadline: a child that has not said `ready` by then is killed and that hang is
  itself a wake ("nvmlInit did not return within 5s"); so is a child silent past its heartbeat.
- a child that dies, hangs or finds NVML gone is restarted with backoff (1 s doubling to 60 s); a
  child the kernel will not let die (D state) is abandoned, and after `max_stuck` of them no more are
  started: the periodic check's NVML probe reports the hang.
- `start` returns why the source cannot run (not a live root, no driver, no library, no GPU accepts
  event registration) and then nothing is emitted: the periodic check covers NVML.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

from gpuwarden.probes.nvml import ENV_LIBRARY
from gpuwarden.root import Missing
from gpuwarden.wake import nvml_child as proto
from gpuwarden.wake.base import Emit
from gpuwarden.wake.burst import Burst

BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0
#: how long a killed child may take to go before it is left to be reaped later
KILL_GRACE_S = 0.5
#: a child reads at most this many bytes a read; a line longer than proto.MAX_LINE is garbage
READ_BYTES = 1 << 16
_KIND = ((proto.XID, "xid {data}"), (proto.DOUBLE_BIT_ECC, "ecc double-bit"), (proto.SINGLE_BIT_ECC, "ecc single-bit"),
         (proto.GPU_UNAVAILABLE, "unavailable (GPU lost)"), (proto.RECOVERY_ACTION, "recovery action {data}"),
         (proto.PSTATE, "pstate change"))


def describe(line: str) -> tuple[str, float | None] | None:
    """A child's line as a Wake's detail and the time it was seen; None for lines that wake nothing."""
    w = line.split(" ")
    try:
        if w[0] == "event" and len(w) == 6:
            bits, data = int(w[4]), int(w[5])
            kind = next((k for b, k in _KIND if bits & b), f"event {bits:#x}").format(data=data)
            gpu = w[2] if w[3] == "-" else f"{w[2]} ({w[3]})"
            return f"gpu {gpu} {kind}", float(w[1])
        if w[0] == "lost" and len(w) == 4:
            who = "a GPU" if w[2] == "-" else f"gpu {w[2]}"
            return f"{who} is lost (NVML_ERROR_GPU_IS_LOST from {w[3]})", float(w[1])
        if w[0] == "error" and len(w) >= 4:
            return f"NVML event wait failed: {' '.join(w[3:])} (NVML error {int(w[2])})", float(w[1])
    except ValueError:
        return None
    return None


class _Child:
    """One forked event child: its pid and the read end of its pipe."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd, self.t0 = pid, fd, time.monotonic()
        self.buf = bytearray()

    def lines(self) -> list[str] | None:
        """What the child wrote since the last call, whole lines only; None at EOF (the child is gone)."""
        try:
            chunk = os.read(self.fd, READ_BYTES)
        except BlockingIOError:
            return []
        if not chunk:
            return None
        self.buf.extend(chunk)
        *whole, rest = self.buf.split(b"\n")
        self.buf = bytearray(rest if len(rest) <= proto.MAX_LINE else b"")  # a line without end: dropped
        return [ln.decode("ascii", "replace") for ln in whole if len(ln) <= proto.MAX_LINE]


class NvmlEvents:
    """The NVML event source (a `wake.base.Source`)."""

    name = "nvml"
    #: `start` waits for the child's first word (up to init_timeout_s + 5 s): the event loop starts it aside
    slow_start = True

    def __init__(self, root: Any, library: str | None = None, *, init_timeout_s: float = 5.0, wait_ms: int = 5000,
                 tick_s: float = 30.0, mask: int = proto.FAULTS, window_s: float = 1.0, per_s: int = 50,
                 backoff_max_s: float = BACKOFF_MAX_S, max_stuck: int = 3, log: Any = None) -> None:
        self.root, self.library, self.log = root, library, log
        self._library: str | None = None  # what start found: `library`, else GPUWARDEN_NVML_LIBRARY, else the soname
        self.init_timeout_s, self.wait_ms, self.tick_s, self.mask = init_timeout_s, wait_ms, tick_s, mask
        self.window_s, self.per_s, self.backoff_max_s, self.max_stuck = window_s, per_s, backoff_max_s, max_stuck
        self.state = "stopped"  # starting | ready | retrying | stuck | unavailable | stopped
        self.why = ""  # why the source is not ready (the latest reason)
        self.restarts = 0
        self.child_pid: int | None = None
        self._stuck: list[int] = []  # killed children the kernel has not let go yet
        self._burst: Burst | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._first = threading.Event()
        self._first_why: str | None = None

    # -- Source ------------------------------------------------------------------------------------
    def start(self, emit: Emit) -> str | None:
        if not getattr(self.root, "live", False):
            return "not a live root: NVML events are read on the node itself"
        library = self.library or os.environ.get(ENV_LIBRARY) or None
        if library is None and isinstance(self.root.stat("/proc/driver/nvidia"), Missing):
            return "no NVIDIA driver: /proc/driver/nvidia is absent"
        self._library = library
        self._burst = Burst(emit, "nvml", "gpu", self.window_s)
        self._stop.clear()
        self._first.clear()
        self._first_why = None
        self._wake_r, self._wake_w = os.pipe()
        self.state = "starting"
        self._thread = threading.Thread(target=self._supervise, name="wake-nvml", daemon=True)
        self._thread.start()
        self._first.wait(self.init_timeout_s + 5.0)
        if self._first_why is not None:
            self.stop()
            self.state, self.why = "unavailable", self._first_why
            return self._first_why
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
        if self._burst is not None:
            self._burst.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        self.state = "stopped"

    @property
    def _silence_s(self) -> float:
        """A ready child silent this long is hung in the wait (it says `tick` every tick_s)."""
        return self.tick_s * 3 + self.wait_ms / 1000

    # -- the supervisor thread ---------------------------------------------------------------------
    def _supervise(self) -> None:
        backoff, first, was_ready = 0.0, True, False
        try:
            while not self._stop.is_set():
                self._reap_stuck()
                if len(self._stuck) >= self.max_stuck:
                    self.state = "stuck"
                    self.why = f"{len(self._stuck)} NVML event children stuck in the kernel: no more are started"
                    self._first.set()
                    self._sleep(self.backoff_max_s)
                    continue
                child = self._fork()
                outcome, detail = self._follow(child, first)
                self._end(child)
                if outcome == "stopped":
                    return
                if outcome == "unavailable" and first:
                    self._first_why = detail
                    return
                if outcome == "ready-then-died":
                    backoff = 0.0  # it ran: start again soon
                if outcome in ("hung", "lost-heartbeat"):
                    self._emit(detail)
                elif outcome == "unavailable" and was_ready:
                    self._emit(f"NVML events stopped: {detail}")
                was_ready = outcome == "ready-then-died"
                first = False
                self._first.set()
                self.state, self.why = "retrying", detail
                self.restarts += 1
                backoff = min(self.backoff_max_s, max(BACKOFF_MIN_S, backoff * 2))
                if self.log is not None:
                    self.log.warn("wake-nvml-restart", outcome=outcome, detail=detail, next_s=round(backoff, 1))
                self._sleep(backoff)
        finally:
            self._first.set()

    def _sleep(self, seconds: float) -> None:
        import select

        select.select([self._wake_r], [], [], seconds)

    def _emit(self, detail: str, seen: float | None = None, count: int = 1) -> None:
        if self._burst is not None:
            self._burst.offer(detail, count, seen)

    def _fork(self) -> _Child:
        r, w = os.pipe()
        parent = os.getpid()
        args = (self._library, self.mask, self.wait_ms, self.tick_s, self.per_s)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                gc.disable()  # a collection would touch every object it shares with the agent (copy-on-write)
                os.close(r)
                os.setsid()
                _die_with_parent()
                if os.getppid() != parent:
                    os._exit(0)
                os.closerange(3, w)  # the agent's sockets and files: a long-lived child must not hold them
                os.closerange(w + 1, os.sysconf("SC_OPEN_MAX"))
                proto.run(w, *args)
            finally:
                os._exit(0)
        os.close(w)
        os.set_blocking(r, False)
        self.child_pid = pid
        return _Child(pid, r)

    def _follow(self, child: _Child, first: bool) -> tuple[str, str]:
        """Read the child until it ends: (outcome, detail). Lines before `ready` are held: if the child
        then finds nothing to watch on the first start, `start` says why and nothing is emitted."""
        import select

        ready, held, last = False, [], "NVML events"
        deadline = child.t0 + self.init_timeout_s
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                if not ready:
                    return "hung", f"nvmlInit did not return within {self.init_timeout_s:g}s (event child killed)"
                return "lost-heartbeat", f"the NVML event wait did not return within {self._silence_s:g}s (event child killed)"
            got, _, _ = select.select([child.fd, self._wake_r], [], [], left)
            if child.fd not in got:
                continue
            lines = child.lines()
            if lines is None:
                return ("ready-then-died", "the NVML event child exited") if ready else (
                    "unavailable", "the NVML event child exited before it was ready")
            if lines and ready:
                deadline = time.monotonic() + self._silence_s
            for line in lines:
                if line.startswith("unavailable "):
                    return "unavailable", line.removeprefix("unavailable ")
                if line.startswith("ready "):
                    ready, self.state, self.why = True, "ready", ""
                    deadline = time.monotonic() + self._silence_s
                    self._first_why = None
                    self._first.set()
                    for detail, seen in held:
                        self._emit(detail, seen)
                    held = []
                elif line.startswith("dropped ") and line[8:].isdigit():
                    self._emit(last, count=int(line[8:]))  # counted with the latest event they followed
                elif (got_d := describe(line)) is not None:
                    last = got_d[0]
                    if ready or not first:
                        self._emit(*got_d)
                    elif len(held) < 8:
                        held.append(got_d)
        return "stopped", ""

    def _end(self, child: _Child) -> None:
        """Kill the child's session and reap it; one that will not go (D state) is kept to reap later."""
        import signal

        for kill in (os.killpg, os.kill):
            try:
                kill(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        os.close(child.fd)
        if not _reaped(child.pid, KILL_GRACE_S):
            self._stuck.append(child.pid)
        self.child_pid = None

    def _reap_stuck(self) -> None:
        left = []
        for pid in self._stuck:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if not done:
                left.append(pid)
        self._stuck = left


def _reaped(pid: int, within: float) -> bool:
    """Wait up to `within` seconds for a killed child to be reaped."""
    end = time.monotonic() + within
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): the child goes when the thread that forked it (the supervisor) goes."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
