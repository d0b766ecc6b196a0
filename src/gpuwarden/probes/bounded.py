"""Run a command or a Python function in a killable child with a hard deadline.

A diagnostic that hangs like the thing it diagnoses is worthless: nvmlInit,
nvidia-smi and open() on a device node can block in the kernel (D state). The
caller never waits on such a child past its deadline: it is sent SIGKILL and
abandoned if it does not die within a short grace (a D-state process cannot die
until the kernel lets go; it is reaped later or by init).

`pickle`, `subprocess`, `select` and `signal` are imported where a child is started or waited on:
a check of a bundle or an example starts none and loads none of them (docs/performance.md §10).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from msgspec import Struct

#: how long to wait for a killed child to go away before abandoning it
KILL_GRACE_S = 0.5
MAX_OUTPUT = 16 << 20


class ChildResult(Struct, frozen=True):
    """What a bounded child (a command or a forked function) gave back. status: ok | timeout | error | notfound"""

    status: str
    elapsed_s: float
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _reap_later(pid: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            return True
        time.sleep(0.01)
    return False


def run_cmd(argv: list[str], timeout: float, env: dict[str, str] | None = None,
            max_output: int = MAX_OUTPUT, pass_fds: tuple[int, ...] = ()) -> ChildResult:
    """Run argv; kill its whole process group at the deadline. `pass_fds` stay open in the child
    under the same numbers (a socket opened beneath a root, connected to through /proc/self/fd)."""
    import select
    import signal
    import subprocess

    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, close_fds=True, pass_fds=pass_fds)
    except FileNotFoundError:
        return ChildResult("notfound", time.monotonic() - t0, detail=f"{argv[0]}: not found")
    except OSError as exc:
        return ChildResult("error", time.monotonic() - t0, detail=f"{argv[0]}: {exc}")
    out, err = bytearray(), bytearray()
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}  # type: ignore[union-attr]
    deadline = t0 + timeout
    while streams:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(list(streams), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                del streams[fd]
            elif len(streams[fd]) < max_output:
                streams[fd].extend(chunk)
    timed_out = bool(streams)
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    else:
        # streams closed; the process should exit promptly
        try:
            proc.wait(max(0.0, deadline - time.monotonic()) + KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for f in (proc.stdout, proc.stderr):
        if f:
            f.close()
    if timed_out:
        _reap_later(proc.pid, time.monotonic() + KILL_GRACE_S)
        proc.returncode = proc.returncode if proc.returncode is not None else -9
        return ChildResult("timeout", time.monotonic() - t0, stdout=out.decode("utf-8", "replace"),
                       stderr=err.decode("utf-8", "replace"), detail=f"{argv[0]} did not finish within {timeout:g}s (killed)")
    return ChildResult("ok" if proc.returncode == 0 else "error", time.monotonic() - t0,
                   stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
                   returncode=proc.returncode,
                   detail="" if proc.returncode == 0 else f"{argv[0]} exited {proc.returncode}")


class Pending:
    """A probe child already running; `result()` waits for it, never past its deadline.

    Starting the slow probes (NVML) first and collecting them when a rule needs them
    overlaps their latency with the rest of the check.
    """

    def __init__(self, pid: int, fd: int, t0: float, timeout: float, name: str) -> None:
        self.pid, self.fd, self.t0, self.timeout, self.name = pid, fd, t0, timeout, name
        self._outcome: ChildResult | None = None

    def result(self) -> ChildResult:
        if self._outcome is None:
            self._outcome = self._wait()
        return self._outcome

    def cancel(self) -> None:
        """Not needed after all: kill the child now (its result becomes an error)."""
        import signal

        if self._outcome is not None:
            return
        for kill in (os.killpg, os.kill):  # its own group once it has called setsid(); itself before
            try:
                kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.close(self.fd)
        _reap_later(self.pid, time.monotonic() + KILL_GRACE_S)
        self._outcome = ChildResult("error", time.monotonic() - self.t0, detail=f"{self.name}: cancelled")

    def _wait(self) -> ChildResult:
        import pickle
        import select
        import signal

        buf = bytearray()
        deadline = self.t0 + self.timeout
        eof = False
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                chunk = os.read(self.fd, 1 << 20)
                if not chunk:
                    eof = True
                    break
                buf.extend(chunk)
                if len(buf) > MAX_OUTPUT:
                    break
        finally:
            os.close(self.fd)
        if not eof:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap_later(self.pid, time.monotonic() + KILL_GRACE_S)
            return ChildResult("timeout", time.monotonic() - self.t0,
                           detail=f"{self.name} did not return within {self.timeout:g}s (child killed)")
        _reap_later(self.pid, time.monotonic() + KILL_GRACE_S)
        try:
            status, value = pickle.loads(bytes(buf))
        except Exception:
            return ChildResult("error", time.monotonic() - self.t0, detail="child exited without a result")
        if status == "ok":
            return ChildResult("ok", time.monotonic() - self.t0, value=value)
        return ChildResult("error", time.monotonic() - self.t0, detail=str(value))


def start_func(func: Callable[..., Any], *args: Any, timeout: float, env: dict[str, str] | None = None) -> Pending:
    """Fork a child that calls func(*args); its picklable return value comes back through a pipe.

    Forking (not spawning) keeps this cheap; the child must not touch the parent's
    threads' locks, so callers run probes before starting threads of their own or
    accept that risk for pure-syscall functions.
    """
    import pickle  # here, not in the child: nothing is imported after the fork

    t0 = time.monotonic()

    def child(w: int) -> None:
        if env:
            os.environ.update(env)
        try:
            payload = pickle.dumps(("ok", func(*args)))
        except BaseException as exc:  # report, don't raise, across the fork
            payload = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
        _write_all(w, payload)

    pid, r = _fork(child)
    return Pending(pid, r, t0, timeout, getattr(func, "__name__", "probe"))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fork(body: Callable[[int], None]) -> tuple[int, int]:
    """(pid, read end) of a child in its own session that runs body(write end) and exits."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            os.setsid()
            body(w)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def run_func(func: Callable[..., Any], *args: Any, timeout: float, env: dict[str, str] | None = None) -> ChildResult:
    """start_func(...).result(): call func in a killable child and wait for it, up to the deadline."""
    return start_func(func, *args, timeout=timeout, env=env).result()


def _frames(buf: bytearray) -> list[Any]:
    """Complete length-prefixed pickles at the front of buf (removed from it)."""
    import pickle

    out = []
    while len(buf) >= 4:
        n = int.from_bytes(buf[:4], "little")
        if len(buf) < 4 + n:
            break
        out.append(pickle.loads(bytes(buf[4:4 + n])))
        del buf[:4 + n]
    return out


def map_func(func: Callable[[Any], Any], items: list[Any], *, timeout: float, per_item: float,
             max_stuck: int = 8) -> tuple[dict[int, Any], list[int], bool]:
    """func(item) for each item in a killable child: (results by index, stuck indexes, finished).

    The child sends each result as it has it. One item that blocks (a read of a D-state process's
    /proc/<pid>/cmdline) costs `per_item` seconds: the child is killed and a new one goes on with
    the next item, so one stuck item never loses the others. After `max_stuck` stuck items or the
    overall `timeout`, the rest is left out (`finished` False).
    """
    import pickle
    import select
    import signal

    t_end = time.monotonic() + timeout
    results: dict[int, Any] = {}
    stuck: list[int] = []
    start = 0
    while start < len(items) and len(stuck) <= max_stuck and time.monotonic() < t_end:
        def child(w: int, first: int = start) -> None:
            for i in range(first, len(items)):
                try:
                    value = ("ok", func(items[i]))
                except Exception as exc:  # report, don't raise, across the fork
                    value = ("error", f"{type(exc).__name__}: {exc}")
                data = pickle.dumps((i, value))
                _write_all(w, len(data).to_bytes(4, "little") + data)

        pid, r = _fork(child)
        buf = bytearray()
        nxt, eof = start, False
        try:
            while nxt < len(items):
                left = min(per_item, t_end - time.monotonic())
                ready = select.select([r], [], [], max(0.0, left))[0] if left > 0 else []
                if not ready:
                    break
                chunk = os.read(r, 1 << 20)
                if not chunk:
                    eof = True
                    break
                buf.extend(chunk)
                for i, (status, value) in _frames(buf):
                    if status == "ok":
                        results[i] = value
                    nxt = i + 1
        finally:
            os.close(r)
            if not eof and nxt < len(items):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _reap_later(pid, time.monotonic() + KILL_GRACE_S)
        if nxt >= len(items) or eof:
            return results, stuck, nxt >= len(items)
        if time.monotonic() >= t_end:
            break
        stuck.append(nxt)  # blocked on this one: skip it, go on with the next
        start = nxt + 1
    return results, stuck, start >= len(items)
