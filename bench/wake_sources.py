#!/usr/bin/env python3
"""The NVML event source's cost and latency (issue 41), on the stand-in libnvidia-ml with events.

    .venv/bin/python bench/wake_sources.py [--idle 60] [-n 200] [--flood 100000] [-o bench/results/wake-nvml.json]

Builds tests/wake/nvml_events_fake.c and runs `gpuwarden.wake.nvml.NvmlEvents` on it (defaults: wait 5 s,
heartbeat 30 s, window 1 s):
- idle: the agent's and the event child's CPU over `--idle` seconds with no event (the fake's wait sleeps
  its timeout as the real one blocks), and the child's memory (Rss; Pss: its pages shared with the agent split between them; Private_Dirty);
- latency: `-n` Xid events, one every 50 ms (window 10 ms: each a leading wake), trigger file -> Wake
  handed to emit (the fake polls its trigger every 5 ms: up to 5 ms of each figure are the fake's);
- flood: `--flood` Xid events at once: the wakes they make, the time to drain, the CPU of each side.
What a real driver adds (its own wait, its Xid path) is measured on the GPU host (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gpuwarden.root import HostRoot
from gpuwarden.wake.nvml import NvmlEvents

REPO = Path(__file__).resolve().parents[1]


def child_cpu_s(pid: int) -> float:
    """The child's time on a CPU (schedstat: nanoseconds; utime + stime count whole clock ticks)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def child_mem_kib(pid: int) -> dict[str, int]:
    """Rss (pages shared with the agent since the fork included), Pss (shared pages split between the two)
    and Private_Dirty (the child's own)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        fields = dict(ln.split(":", 1) for ln in f.read().splitlines()[1:] if ":" in ln)  # after the range line
    return {k.lower(): int(fields[k].split()[0]) for k in ("Rss", "Pss", "Private_Dirty")}


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def trigger(path: Path, text: str) -> float:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.rename(tmp, path)
    return time.time()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--flood", type=int, default=100_000)
    ap.add_argument("-o", default="")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gw-wake-bench-"))
    lib = work / "libnvidia-ml.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(lib),
                    str(REPO / "tests/wake/nvml_events_fake.c")], check=True)
    out: dict = {"machine": os.uname().machine, "cpus": os.cpu_count()}

    src = NvmlEvents(HostRoot("/"), str(lib))
    assert src.start(lambda w: None) is None, src.why
    pid = src.child_pid
    time.sleep(1.0)
    c0, p0 = child_cpu_s(pid), self_cpu_s()
    time.sleep(a.idle)
    c1, p1 = child_cpu_s(pid), self_cpu_s()
    out["idle"] = {"seconds": a.idle, "agent_cpu_ms_per_min": round((p1 - p0) * 60_000 / a.idle, 2),
                   "child_cpu_ms_per_min": round((c1 - c0) * 60_000 / a.idle, 2), "child_kib": child_mem_kib(pid),
                   "child_wait_returns_per_min": 60_000 // src.wait_ms, "agent_wakeups_per_min": 60 / src.tick_s}
    src.stop()

    event = work / "event"
    os.environ["FAKE_NVML_EVENT_FILE"] = str(event)
    got: list[tuple[float, object]] = []
    src = NvmlEvents(HostRoot("/"), str(lib), window_s=0.01)
    assert src.start(lambda w: got.append((time.time(), w))) is None, src.why
    lat, seen = [], []
    for i in range(a.n):
        n = len(got)
        t = trigger(event, f"{i % 2} 8 79\n")
        end = time.monotonic() + 2.0
        while len(got) == n and time.monotonic() < end:
            time.sleep(0.0005)
        if len(got) > n:
            lat.append((got[n][0] - t) * 1000)
            seen.append((got[n][1].seen - t) * 1000)
        time.sleep(0.05)
    q = statistics.quantiles(lat, n=100, method="inclusive")
    out["latency_ms"] = {"n": len(lat), "p50": round(statistics.median(lat), 2), "p99": round(q[98], 2),
                         "max": round(max(lat), 2), "seen_p50": round(statistics.median(seen), 2)}
    src.stop()

    got.clear()
    src = NvmlEvents(HostRoot("/"), str(lib))
    assert src.start(lambda w: got.append((time.time(), w))) is None
    pid = src.child_pid
    c0, p0, t0 = child_cpu_s(pid), self_cpu_s(), time.monotonic()
    trigger(event, f"0 8 48 {a.flood}\n")

    def counted() -> int:
        return sum(1 + (int(w.detail.rsplit("(+", 1)[1].split()[0]) if "(+" in w.detail else 0) for _, w in got)

    while counted() < a.flood and time.monotonic() - t0 < 600:
        time.sleep(0.05)
    took = time.monotonic() - t0
    c1, p1 = child_cpu_s(pid), self_cpu_s()
    out["flood"] = {"events": a.flood, "wakes": len(got), "counted": counted(), "drain_s": round(took, 2),
                    "agent_cpu_ms": round((p1 - p0) * 1000, 1), "child_cpu_ms": round((c1 - c0) * 1000, 1)}
    src.stop()
    text = json.dumps(out, indent=2)
    print(text)
    if a.o:
        Path(a.o).write_text(text + "\n")


if __name__ == "__main__":
    main()
