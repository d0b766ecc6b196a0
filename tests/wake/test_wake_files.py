"""inotify sources on a node tree: the kernel log files followed, the seeds' directories watched, PSI refused.

Every directory is opened beneath the root: a link out of the tree is not watched; a flood of lines or
an inotify storm becomes a handful of wakes; a trigger is never written into a tree's copy of a
pressure file.
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

import pytest

from gpuwarden.root import HostRoot
from gpuwarden.wake.inotify import Inotify
from gpuwarden.wake.logfile import LogFileSource
from gpuwarden.wake.psi import PsiSource
from gpuwarden.wake.watch import Watch, WatchSource

XID79 = "[ 123.456] NVRM: Xid (PCI:0000:00:06): 79, pid=1234, GPU has fallen off the bus.\n"


def _wait(cond, timeout: float = 5.0) -> bool:
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < timeout:
        time.sleep(0.002)
    return cond()


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    (root / ".gpuwarden/logs").mkdir(parents=True)
    (root / ".gpuwarden/logs/kmsg.txt").write_text("6,1,1,-;Linux version 6.8\n")
    (root / "var/log").mkdir(parents=True)
    for d in ("var/lib/kubelet/device-plugins", "var/lib/kubelet/plugins_registry", "etc/cdi", "dev"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "dev/nvidia-uvm").write_text("")
    return root


# -- the kernel log of a tree ----------------------------------------------------------------------

def test_an_appended_xid_line_wakes_with_the_line(tmp_path):
    root = _tree(tmp_path)
    got: list = []
    src = LogFileSource(HostRoot(str(root)))
    assert src.start(got.append) is None
    try:
        with open(root / ".gpuwarden/logs/kmsg.txt", "a") as f:
            f.write("6,2,2,-;eth0: link up\n")
        time.sleep(0.1)
        assert got == []  # a line no kernel signature anchors wakes nothing
        with open(root / ".gpuwarden/logs/kmsg.txt", "a") as f:
            f.write(XID79)
        assert _wait(lambda: got)
        assert (got[0].source, got[0].topic) == ("logfile", "log") and "Xid" in got[0].detail
    finally:
        src.stop()


def test_a_log_created_after_start_and_a_rotated_one_are_read(tmp_path):
    root = _tree(tmp_path)
    got: list = []
    src = LogFileSource(HostRoot(str(root)))
    assert src.start(got.append) is None
    try:
        (root / "var/log/kern.log").write_text(XID79)
        assert _wait(lambda: got)
        got.clear()
        (root / "var/log/kern.log.new").write_text("Dec  2 kernel: " + XID79)
        os.rename(root / "var/log/kern.log.new", root / "var/log/kern.log")  # rotated: a new inode, read from 0
        assert _wait(lambda: got)
    finally:
        src.stop()


def test_a_flood_of_lines_is_a_handful_of_wakes(tmp_path):
    root = _tree(tmp_path)
    got: list = []
    src = LogFileSource(HostRoot(str(root)))
    assert src.start(got.append) is None
    try:
        line = "6,5,5,-;" + XID79
        with open(root / ".gpuwarden/logs/kmsg.txt", "a") as f:
            t0 = time.monotonic()
            for _ in range(100):  # 100,000 lines in 100 writes
                f.write(line * 1000)
                f.flush()
        took = time.monotonic() - t0
        time.sleep(0.3)
        assert got and len(got) <= 100, (len(got), took)
    finally:
        src.stop()


def test_no_log_directory_on_the_root_is_unavailable(tmp_path):
    (tmp_path / "empty").mkdir()
    why = LogFileSource(HostRoot(str(tmp_path / "empty"))).start(lambda w: None)
    assert why is not None and "no kernel log directory" in why


def test_a_log_directory_linked_out_of_the_root_is_not_watched(tmp_path):
    outside = tmp_path / "outside"
    (outside / "logs").mkdir(parents=True)
    root = tmp_path / "node"
    (root / ".gpuwarden").mkdir(parents=True)
    os.symlink(str(outside / "logs"), root / ".gpuwarden/logs")  # absolute: resolved beneath the root, absent
    got: list = []
    src = LogFileSource(HostRoot(str(root)))
    assert src.start(got.append) is not None  # nothing of the tree to follow: the link leads nowhere in it
    (outside / "logs/kmsg.txt").write_text(XID79)
    time.sleep(0.1)
    assert got == []


# -- the seeds' directories ------------------------------------------------------------------------

def test_each_watched_change_wakes_its_topic(tmp_path):
    root = _tree(tmp_path)
    got: list = []
    src = WatchSource(HostRoot(str(root)))
    assert src.start(got.append) is None
    assert "/var/lib/kubelet/plugins" in src.missing and "/dev" in src.watched
    try:
        os.unlink(root / "dev/nvidia-uvm")
        assert _wait(lambda: any(w.topic == "devices" for w in got))
        (root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock").write_text("")
        assert _wait(lambda: any(w.topic == "plugins" for w in got))
        (root / "etc/cdi/nvidia.yaml").write_text("cdiVersion: 0.6.0\n")
        assert _wait(lambda: any(w.topic == "cdi" for w in got))
        det = {w.topic: w.detail for w in got}
        assert det["devices"] == "/dev/nvidia-uvm" and det["cdi"] == "/etc/cdi/nvidia.yaml"
        got.clear()
        (root / "dev/tty9").write_text("")  # not an NVIDIA node: /dev is filtered to nvidia*
        time.sleep(0.1)
        assert got == []
    finally:
        src.stop()


def test_using_a_device_node_wakes_nothing_making_or_removing_one_does(tmp_path):
    """Every CUDA process (and the agent's own NVML probe) opens /dev/nvidia* read-write and closes it: no
    change of the node. On the GPU host a watch that woke on that close fed itself (a wake-up's check ran
    the probe, whose close woke the next): 507 wake-ups a minute on an idle node (run 19). Only a node
    made, removed or renamed wakes the agent; a chmod is left to the periodic check."""
    root = _tree(tmp_path)
    (root / "dev/nvidia0").write_text("")
    got: list = []
    src = WatchSource(HostRoot(str(root)))
    assert src.start(got.append) is None
    try:
        for _ in range(20):
            with open(root / "dev/nvidia0", "r+") as f:  # opened read-write, written, closed
                f.write("x")
            os.utime(root / "dev/nvidia0")
        time.sleep(0.2)
        assert got == []
        os.rename(root / "dev/nvidia0", root / "dev/nvidia0.old")
        assert _wait(lambda: any(w.topic == "devices" for w in got))
        got.clear()
        (root / "dev/nvidia1").write_text("")
        assert _wait(lambda: [w.detail for w in got] == ["/dev/nvidia1"])
    finally:
        src.stop()


def test_an_inotify_storm_is_bounded_and_folds_per_read(tmp_path):
    root = _tree(tmp_path)
    got: list = []
    src = WatchSource(HostRoot(str(root)))
    assert src.start(got.append) is None
    try:
        d = root / "var/lib/kubelet/device-plugins"
        for i in range(5000):
            (d / f"s{i}.sock").write_text("")
            os.unlink(d / f"s{i}.sock")
        assert _wait(lambda: src.events >= 10_000 or src.overflows > 0)
        time.sleep(0.2)
        # one emit per topic per read, and reads paced (Poller.pace_s): a few, never one per event
        assert 0 < len(got) <= src.events / 10, (len(got), src.events)
    finally:
        src.stop()


def test_an_overflow_asks_for_everything(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    got: list = []
    src = WatchSource(HostRoot(str(root)), (Watch("/dev", "devices"),))
    src._emit = got.append
    from gpuwarden.wake import inotify as ino

    src._ino = type("I", (), {"read": lambda self: iter([ino.Event((-1, ino.IN_Q_OVERFLOW, ""))])})()
    src._ready(select.POLLIN)
    assert [w.topic for w in got] == ["all"] and src.overflows == 1


def test_kubelet_root_moves_the_kubelet_watches(tmp_path):
    src = WatchSource(HostRoot(str(tmp_path)), kubelet_root="/data/kubelet")
    assert "/data/kubelet/device-plugins" in [w.path for w in src.watches]
    assert not any(w.path.startswith("/var/lib/kubelet") for w in src.watches)


def test_a_bundle_has_nothing_to_watch():
    from gpuwarden.examples import open_example

    assert WatchSource(open_example("healthy")).start(lambda w: None) is not None


def test_inotify_watches_what_the_fd_names(tmp_path):
    ino = Inotify()
    try:
        fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
        try:
            ino.watch_fd(fd, 0x100)  # IN_CREATE
        finally:
            os.close(fd)
        (tmp_path / "x").write_text("")
        assert _wait(lambda: bool(select.select([ino.fd], [], [], 0)[0]))
        assert [e.name for e in ino.read()] == ["x"]
        assert list(ino.read()) == []  # non-blocking: nothing pending, nothing returned
    finally:
        ino.close()


# -- memory pressure --------------------------------------------------------------------------------

def test_a_trees_pressure_file_is_never_written(tmp_path):
    p = tmp_path / "proc/pressure"
    p.mkdir(parents=True)
    (p / "memory").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    before = (p / "memory").read_bytes()
    why = PsiSource(HostRoot(str(tmp_path))).start(lambda w: None)
    assert why is not None and "not the kernel's pressure file" in why
    assert (p / "memory").read_bytes() == before


def _psi_settable() -> bool:
    try:
        fd = os.open("/proc/pressure/memory", os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _psi_settable(), reason="PSI UNAVAILABLE: /proc/pressure/memory cannot be opened for a trigger")
def test_a_trigger_is_set_on_the_node_and_a_crossing_wakes_memory():
    got: list = []
    src = PsiSource(HostRoot("/"))
    assert src.start(got.append) is None, src.why
    try:
        assert src.triggers["/proc/pressure/memory"] in ("some 150000 1000000", "some 500000 2000000")
        [fd] = [fd for fd, p in src.fds.items() if p == "/proc/pressure/memory"]
        src._ready(fd, select.POLLPRI)  # what the kernel's POLLPRI calls: a crossing
        assert [(w.source, w.topic) for w in got] == [("psi", "memory")]
    finally:
        src.stop()
    assert src.fds == {}
