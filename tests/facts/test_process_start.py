"""A process's start time on a live node is good to a clock tick, not to btime's whole second.

btime (/proc/stat) is rounded down: a start dated from it alone is up to 1 s early, and GPU-K8S-012 then
counted a failure the previous plugin logged within a second of its restart as the new one's (GPU machine,
2026-11-27). The boot time from /proc/uptime, where it agrees with btime, dates it to ~10 ms."""

from __future__ import annotations

import subprocess
import time

from gpuwarden.facts.node import NodeFacts
from gpuwarden.root import HostRoot


def _uptime_agrees_with_btime() -> bool:
    """False where /proc/uptime is not the kernel's (a container's virtualised uptime): btime is used there."""
    with open("/proc/stat") as f:
        btime = int(next(ln for ln in f if ln.startswith("btime ")).split()[1])
    with open("/proc/uptime") as f:
        boot = time.time() - float(f.read().split()[0])
    return btime - 0.05 <= boot < btime + 1.05


def test_a_live_process_start_is_dated_within_a_tick_or_two() -> None:
    early = 0.05 if _uptime_agrees_with_btime() else 1.05  # else btime's second, as before
    t0 = time.time()
    p = subprocess.Popen(["sleep", "30"])
    t1 = time.time()
    try:
        table = NodeFacts(HostRoot("/")).get("processes")
        started = table.start_time(NodeFacts(HostRoot("/")), p.pid)
        assert started is not None
        assert t0 - early <= started <= t1 + 0.05, (started - t0, t1 - t0)
    finally:
        p.kill()
        p.wait()


def test_a_bundle_keeps_btime(tmp_path) -> None:
    """Not live: the captured /proc/uptime is not read against this machine's clock."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/stat").write_text("cpu  1 2 3 4\nbtime 1700000000\n")
    (tmp_path / "proc/uptime").write_text("12345.67 1.00\n")
    (tmp_path / "proc/4242").mkdir()
    (tmp_path / "proc/4242/cmdline").write_bytes(b"nvidia-device-plugin\0")
    (tmp_path / "proc/4242/stat").write_text("4242 (nvidia-device-p) S " + " ".join(["0"] * 18) + " 500 0 0\n")
    facts = NodeFacts(HostRoot(str(tmp_path)))
    table = facts.get("processes")
    assert table.boot_time == 1700000000
    assert table.start_time(facts, 4242) == 1700000000 + 5.0
