"""The NVML event child: registers for the GPUs' fault events and writes one short line per event.

It runs in a forked child (`wake.nvml`), never in the agent: nvmlInit and the event wait are calls
into the driver that can block forever (incident 5). Each line is ASCII, at most MAX_LINE bytes, and
at most `per_s` of them are written a second (the rest are counted in a `dropped N` line), so a flood
of Xids costs the parent a bounded read. The protocol, one line each:

    ready <gpus> <registered>             init and registration done
    unavailable <why>                     nothing to watch here; the child exits
    event <epoch> <index> <bus id|-> <type bits> <data>
    lost <epoch> <index|-> <call>         NVML_ERROR_GPU_IS_LOST from a handle or the wait
    error <epoch> <rc> <text>             the wait failed otherwise (edge-triggered, as `lost`)
    dropped <n>                           lines not written in the last second
    tick                                  alive (every `tick_s` while idle)
"""

from __future__ import annotations

import os
import time
from typing import Any

#: nvml.h event types (nvmlEventType*)
SINGLE_BIT_ECC, DOUBLE_BIT_ECC, PSTATE, XID = 0x1, 0x2, 0x4, 0x8
GPU_UNAVAILABLE, RECOVERY_ACTION = 0x4000, 0x8000
#: what is registered by default: the faults. PState changes come with every job on an idle GPU: opt-in
FAULTS = XID | SINGLE_BIT_ECC | DOUBLE_BIT_ECC | GPU_UNAVAILABLE | RECOVERY_ACTION
#: nvml.h return codes
NOT_SUPPORTED, TIMEOUT, GPU_IS_LOST = 3, 10, 15
MAX_LINE = 200


class Lines:
    """The child's side of the pipe: bounded lines, at most `per_s` a second."""

    def __init__(self, fd: int, per_s: int) -> None:
        self.fd, self.per_s = fd, per_s
        self._sec, self._n, self.dropped = 0, 0, 0

    def put(self, line: str) -> None:
        self.flush()
        if self._n >= self.per_s:
            self.dropped += 1
            return
        self._n += 1
        self._write(line)

    def flush(self) -> None:
        """Start a new second: say how many lines the last one dropped."""
        sec = int(time.monotonic())
        if sec != self._sec:
            self._sec, self._n = sec, 0
            if self.dropped:
                self._write(f"dropped {self.dropped}")
                self.dropped = 0

    def _write(self, line: str) -> None:
        data = line.encode("ascii", "replace")[: MAX_LINE - 1] + b"\n"
        while data:
            data = data[os.write(self.fd, data):]


def run(fd: int, library: str | None, mask: int, wait_ms: int, tick_s: float, per_s: int) -> None:
    """The child's whole life: init, register, wait in a loop. Returns only when there is nothing to watch."""
    import ctypes

    from gpuwarden.probes.nvml import LIBRARY_NOT_FOUND, Nvml

    out = Lines(fd, per_s)
    try:
        n = Nvml(library)
    except OSError as exc:
        out.put(f"unavailable {LIBRARY_NOT_FOUND}: {exc}")
        return
    rc = n.init()
    if rc != 0:
        out.put(f"unavailable nvmlInit failed: {n.error(rc)}")
        return
    fn = lambda name: getattr(n.lib, name, None)  # noqa: E731
    create, register = fn("nvmlEventSetCreate"), fn("nvmlDeviceRegisterEvents")
    wait = fn("nvmlEventSetWait_v2") or fn("nvmlEventSetWait")
    supported = fn("nvmlDeviceGetSupportedEventTypes")
    if create is None or register is None or wait is None:
        out.put("unavailable this NVML has no event API (nvmlEventSetCreate, nvmlEventSetWait)")
        return
    evset = ctypes.c_void_p()
    rc = create(ctypes.byref(evset))
    if rc != 0:
        out.put(f"unavailable nvmlEventSetCreate failed: {n.error(rc)}")
        return
    register.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p]
    count = n.uint("nvmlDeviceGetCount_v2") or 0
    gpus: dict[int, tuple[int, str]] = {}  # handle -> (index, bus id)
    lost: list[str] = []
    for i in range(count):
        h, rc = n.handle(i)
        if h is None:
            if rc == GPU_IS_LOST:
                lost.append(str(i))
                out.put(f"lost {time.time():.3f} {i} nvmlDeviceGetHandleByIndex")
            continue
        types = ctypes.c_ulonglong(mask)
        rc = supported(h, ctypes.byref(types)) if supported is not None else 0
        want = types.value & mask if rc == 0 else 0
        if want:
            rc = register(h, want, evset)
            if rc == 0:
                gpus[int(h.value or 0)] = (i, n.bus_id(h) or "-")
        if rc == GPU_IS_LOST:
            lost.append(str(i))
            call = "nvmlDeviceRegisterEvents" if want else "nvmlDeviceGetSupportedEventTypes"
            out.put(f"lost {time.time():.3f} {i} {call}")
    if not gpus:
        gone = f"; lost: GPU {', '.join(lost)}" if lost else ""
        out.put(f"unavailable none of {count} GPU(s) accepts event registration (mask {mask:#x}){gone}")
        return
    out.put(f"ready {count} {len(gpus)}")
    _wait_loop(out, n, wait, evset, gpus, wait_ms, tick_s)


def _wait_loop(out: Lines, n: Any, wait: Any, evset: Any, gpus: dict[int, tuple[int, str]], wait_ms: int,
               tick_s: float) -> None:
    import ctypes

    class EventData(ctypes.Structure):  # nvmlEventData_t (the _v2 wait's; the v1 wait fills the first three)
        _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    data = EventData()
    failing = 0  # the wait's last failure (edge-triggered: a lost GPU answers every wait at once)
    last_tick = time.monotonic()
    while True:
        rc = wait(evset, ctypes.byref(data), ctypes.c_uint(wait_ms))
        now = time.time()
        if rc == 0:
            failing = 0
            index, bus = gpus.get(int(data.device or 0), ("-", "-"))
            out.put(f"event {now:.3f} {index} {bus} {int(data.eventType)} {int(data.eventData)}")
        elif rc == TIMEOUT:
            failing = 0
        else:
            if rc != failing:
                out.put(f"lost {now:.3f} - nvmlEventSetWait" if rc == GPU_IS_LOST
                        else f"error {now:.3f} {rc} {' '.join(n.error(rc).split())}")
            failing = rc
            time.sleep(wait_ms / 1000)  # the wait answers at once while it fails: keep the cadence
        out.flush()
        if time.monotonic() - last_tick >= tick_s:
            last_tick = time.monotonic()
            out.put("tick")
