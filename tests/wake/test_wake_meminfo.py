"""MemAvailable falling fast wakes the memory topic (wake/meminfo.py): incident 4 on a node with plenty free,
where PSI stays silent (run 20's issue-41 scenario on the H200). A node tree's /proc/meminfo stands in for the
kernel's: the source only reads it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from gpuwarden.root.host import HostRoot
from gpuwarden.wake.meminfo import MemDropSource

GiB, MiB = 1 << 30, 1 << 20


def meminfo(avail: int, total: int = 128 * GiB) -> str:
    return (f"MemTotal:       {total >> 10} kB\nMemFree:        {avail >> 10} kB\n"
            f"MemAvailable:   {avail >> 10} kB\nBuffers:           1024 kB\n")


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(meminfo(100 * GiB))
    return tmp_path


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def stepped(tree, avails: list[int], dt: float = 1.0, **kw) -> tuple[MemDropSource, list]:
    """Drive the source's tick by hand: one reading per value, `dt` seconds apart (no thread, no sleeping)."""
    got: list = []
    clk = Clock()
    src = MemDropSource(HostRoot(str(tree)), mono=clk, **kw)
    src.fd = HostRoot(str(tree)).open_fd("/proc/meminfo", os.O_RDONLY)
    src._emit = got.append
    try:
        for a in avails:
            (tree / "proc" / "meminfo").write_text(meminfo(a))
            src.tick()
            clk.t += dt
    finally:
        os.close(src.fd)
    return src, got


def test_a_fast_fall_wakes_the_memory_topic_at_once_then_spaced(tree):
    # 40 GiB/min: 0.67 GiB a second, for 16 s: wakes 1, 3, 7 and 15 s in (the agent's fast sampling has long
    # taken over by then)
    avails = [100 * GiB - int(i * 0.67 * GiB) for i in range(17)]
    src, got = stepped(tree, avails)
    assert [(w.source, w.topic) for w in got] == [("meminfo", "memory")] * 4
    assert "GiB/min" in got[0].detail and got[0].seen > 0


def test_churn_all_day_costs_a_wake_every_half_minute_and_a_calm_spell_resets(tree):
    """A tenant allocating and freeing 2 GiB every 2 s: its falls are fast, each a possible leak; the spacing
    doubles to 30 s, so 10 minutes of it cost about 25 memory checks, not 300. After a minute of calm the next
    fall wakes at once again."""
    churn = [100 * GiB if i % 2 == 0 else 98 * GiB for i in range(600)]
    src, got = stepped(tree, churn)
    assert 15 <= len(got) <= 30 and src.spacing == 30.0
    _, got2 = stepped(tree, churn[:10] + [100 * GiB] * 70 + [97 * GiB])
    assert got2 and got2[-1].detail.startswith("MemAvailable fell 3072 MiB")


def test_a_slow_drift_and_an_idle_node_wake_nothing(tree):
    """The negative: MemAvailable steady, or falling slower than the growth threshold (1 GiB/min), or falling
    by less than the minimum drop (256 MiB) in the window: no wake, the periodic check covers it."""
    assert stepped(tree, [100 * GiB] * 20)[1] == []
    assert stepped(tree, [100 * GiB - i * 10 * MiB for i in range(20)])[1] == []  # 0.6 GiB/min
    assert stepped(tree, [100 * GiB - i * 40 * MiB for i in range(4)])[1] == []  # 2.3 GiB/min, 120 MiB < 256
    # page cache returning is a rise: nothing
    assert stepped(tree, [100 * GiB + i * GiB for i in range(6)])[1] == []


def test_it_stops_waking_when_the_fall_stops(tree):
    avails = [100 * GiB - i * GiB for i in range(4)] + [97 * GiB] * 10
    _, got = stepped(tree, avails)
    assert 1 <= len(got) <= 3 + 5  # the window (5 s) still holds the fall for a few readings, then silence
    _, got2 = stepped(tree, avails + [97 * GiB] * 10)
    assert len(got2) == len(got)


@pytest.mark.parametrize("text", ["garbage\x00\xff", "MemTotal: 1 kB\nMemAvailable: 99999999999 kB\n",
                                  "MemTotal: 1048576 kB\n"])
def test_garbage_or_impossible_meminfo_is_no_reading(tree, text):
    src = MemDropSource(HostRoot(str(tree)))
    (tree / "proc" / "meminfo").write_text(text)
    src.fd = HostRoot(str(tree)).open_fd("/proc/meminfo", os.O_RDONLY)
    try:
        assert src.read() is None and src.skipped.startswith("/proc/meminfo: ")
    finally:
        os.close(src.fd)


def test_a_fifo_or_a_link_out_of_the_root_is_never_read(tmp_path):
    (tmp_path / "proc").mkdir()
    os.mkfifo(tmp_path / "proc" / "meminfo")
    assert MemDropSource(HostRoot(str(tmp_path))).start(lambda w: None) == "/proc/meminfo: not a regular file"
    other = tmp_path / "b"
    (other / "proc").mkdir(parents=True)
    os.symlink("/proc/meminfo", other / "proc" / "meminfo")  # absolute: resolved beneath the root, not the host's
    assert "/proc/meminfo" in (MemDropSource(HostRoot(str(other))).start(lambda w: None) or "")


def test_the_thread_reads_and_wakes_and_stops(tree):
    """The real thread at a 50 ms period: a fall written to the file wakes it; stop joins it and closes the fd."""
    got: list = []
    seen = threading.Event()
    src = MemDropSource(HostRoot(str(tree)), period_s=0.05, window_s=1.0)

    def emit(w):
        got.append(w)
        seen.set()
    assert src.start(emit) is None
    try:
        time.sleep(0.2)
        assert got == [] and src.reads >= 2
        (tree / "proc" / "meminfo").write_text(meminfo(90 * GiB))
        assert seen.wait(2.0) and got[0].topic == "memory"
    finally:
        src.stop()
    assert src.fd == -1 and not src._poller


def test_a_root_without_files_says_why():
    class NoFiles:
        live = False
    assert MemDropSource(NoFiles()).start(lambda w: None) == "this root has no files to read"
