"""/dev/kmsg followed from its end: a marker line wakes, history does not, EPIPE and floods are bounded.

The live device is read here (the tests run as root on a real kernel); only benign marker lines
(`gpuwarden-test: marker N`) are ever written to it, never a made-up driver line: the marker is what
the source is told to look for. The record handling (EPIPE, a flood) is driven through a fake read.
"""

from __future__ import annotations

import errno
import os
import re
import time

import pytest

from gpuwarden.root import HostRoot
from gpuwarden.wake import kmsg as kmsg_mod
from gpuwarden.wake.kmsg import KmsgSource, kernel_words, message


def _kmsg_usable() -> bool:
    try:
        fd = os.open("/dev/kmsg", os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)
        return True
    except OSError:
        return False


live = pytest.mark.skipif(not _kmsg_usable(), reason="KMSG UNAVAILABLE: /dev/kmsg cannot be read and written here")


def _mark(n: str) -> None:
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, f"gpuwarden-test: marker {n}\n".encode())
    finally:
        os.close(fd)


def _wait(got: list, n: int = 1, timeout: float = 5.0) -> None:
    t0 = time.monotonic()
    while len(got) < n and time.monotonic() - t0 < timeout:
        time.sleep(0.002)


@live
def test_a_line_written_after_start_wakes_and_one_before_does_not():
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    _mark(f"{tag}-before")
    got: list = []
    src = KmsgSource(HostRoot("/"), words=re.compile(rb"gpuwarden-test: marker " + tag.encode()))
    assert src.start(got.append) is None
    try:
        time.sleep(0.1)
        assert got == []  # the cursor starts at the end: history is the periodic scan's
        t0 = time.time()
        _mark(f"{tag}-after")
        _wait(got)
        assert len(got) == 1
        w = got[0]
        assert (w.source, w.topic) == ("kmsg", "log") and w.detail.endswith(f"{tag}-after")
        assert w.seen - t0 < 1.0
    finally:
        src.stop()
    assert src.fd == -1


@live
def test_unrelated_kernel_lines_do_not_wake():
    got: list = []
    src = KmsgSource(HostRoot("/"))  # the real anchors: a marker holds none
    assert src.start(got.append) is None
    try:
        _mark("unrelated")
        time.sleep(0.2)
        assert got == [] and src.records >= 1
    finally:
        src.stop()


def test_a_tree_without_the_kernels_device_is_unavailable(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("6,1,1,-;NVRM: Xid (PCI:0000:00:06): 79\n")
    src = KmsgSource(HostRoot(str(tmp_path)))
    why = src.start(lambda w: None)
    assert why is not None and "not the kernel's log device" in why
    assert KmsgSource(HostRoot(str(tmp_path / "nowhere"))).start(lambda w: None) is not None


def test_a_link_out_of_the_root_is_not_followed(tmp_path):
    (tmp_path / "dev").mkdir()
    os.symlink("/dev/kmsg", tmp_path / "dev/kmsg")  # resolved beneath the root: /dev/kmsg of the tree, absent
    assert KmsgSource(HostRoot(str(tmp_path))).start(lambda w: None) is not None


def test_a_bundle_is_not_followed():
    from gpuwarden.examples import open_example

    assert KmsgSource(open_example("healthy")).start(lambda w: None) == "not a live root"


class _Reads:
    """os.read of the source's fd replaced: records from a list, EPIPE where the list says."""

    def __init__(self, records: list) -> None:
        self.records = records

    def __call__(self, fd: int, n: int) -> bytes:
        if not self.records:
            raise BlockingIOError(errno.EAGAIN, "again")
        r = self.records.pop(0)
        if r == "EPIPE":
            raise BrokenPipeError(errno.EPIPE, "overwritten")
        return r


def test_overwritten_records_are_counted_and_reading_goes_on(monkeypatch):
    got: list = []
    src = KmsgSource(HostRoot("/"))
    src._emit = got.append
    reads = _Reads([b"6,1,1,-;hello\n", "EPIPE", b"3,9,2,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1\n"])
    monkeypatch.setattr(kmsg_mod.os, "read", reads)
    src._ready(1)
    assert src.overwritten == 1 and src.records == 2
    assert [w.detail for w in got] == ["NVRM: Xid (PCI:0000:00:06): 79, pid=1"]


def test_a_flood_is_read_in_bounded_slices_and_one_wake_each(monkeypatch):
    got: list = []
    src = KmsgSource(HostRoot("/"))
    src._emit = got.append
    line = b"3,9,2,-;NVRM: Xid (PCI:0000:00:06): 13, pid=1\n"
    reads = _Reads([line] * 5000)
    monkeypatch.setattr(kmsg_mod.os, "read", reads)
    src._ready(1)  # one poll wake-up reads one slice
    assert src.records == kmsg_mod.BATCH and len(got) == 1


def test_past_the_per_second_budget_the_cursor_jumps_to_the_end(monkeypatch):
    got: list = []
    seeks: list = []
    src = KmsgSource(HostRoot("/"))
    src._emit = got.append
    monkeypatch.setattr(kmsg_mod, "MAX_RECORDS_PER_S", 100)
    monkeypatch.setattr(kmsg_mod.os, "read", _Reads([b"6,1,1,-;noise\n"] * 1000))
    monkeypatch.setattr(kmsg_mod.os, "lseek", lambda fd, pos, how: seeks.append(how))
    monkeypatch.setattr(kmsg_mod.time, "sleep", lambda s: None)
    src._second = int(time.monotonic())
    src._ready(1)
    assert src.records == 100 and seeks == [os.SEEK_END] and src.floods == 1
    assert len(got) == 1 and "flood" in got[0].detail


def test_the_anchors_come_from_the_kernel_signatures():
    w = kernel_words()
    assert w.search(b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    assert w.search(b"NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")
    assert not w.search(b"eth0: link up, 100Gbps")
    assert message(b"6,12,345,-;text here\n SUBSYSTEM=pci\n") == b"text here"
