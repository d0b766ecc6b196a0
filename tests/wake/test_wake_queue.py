"""The coalescing queue: one pending entry per topic whatever the burst, the earliest wake kept."""

from __future__ import annotations

import threading
import time

from gpuwarden.wake.base import DETAIL_MAX, TOPICS, Wake, clip
from gpuwarden.wake.queue import WakeQueue


def test_a_burst_on_one_topic_is_one_pending_entry_with_its_first_wake():
    q = WakeQueue()
    for i in range(10_000):
        q.put(Wake("kmsg", "log", f"line {i}", 100.0 + i))
    assert len(q) == 1
    batch = q.take(0)
    assert list(batch) == ["log"]
    p = batch["log"]
    assert p.count == 10_000 and p.first.detail == "line 0" and p.first.seen == 100.0
    assert p.last.detail == "line 9999"
    assert q.take(0) == {} and q.received == 10_000 and q.folded == 9_999


def test_topics_stay_apart_and_an_earlier_wake_becomes_the_first():
    q = WakeQueue()
    q.put(Wake("inotify", "devices", "/dev/nvidia-uvm", 50.0))
    q.put(Wake("inotify", "plugins", "/var/lib/kubelet/device-plugins/nvidia-gpu.sock", 51.0))
    q.put(Wake("nvml", "devices", "late", 49.0))  # seen earlier by another source
    batch = q.take(0)
    assert set(batch) == {"devices", "plugins"}
    assert batch["devices"].first.source == "nvml" and batch["devices"].count == 2


def test_a_wake_without_a_time_is_stamped_on_arrival():
    q = WakeQueue()
    t0 = time.time()
    q.put(Wake("psi", "memory"))
    assert q.take(0)["memory"].first.seen >= t0


def test_take_waits_for_a_wake_and_returns_empty_after_its_timeout():
    q = WakeQueue()
    t0 = time.monotonic()
    assert q.take(0.05) == {}
    assert time.monotonic() - t0 >= 0.04
    threading.Timer(0.05, lambda: q.put(Wake("kmsg", "log", "x", 1.0))).start()
    got = q.take(5)
    assert "log" in got


def test_wake_up_returns_a_waiting_take_with_nothing():
    q = WakeQueue()
    threading.Timer(0.05, q.wake_up).start()
    t0 = time.monotonic()
    assert q.take(5) == {}
    assert time.monotonic() - t0 < 2


def test_threads_flooding_every_topic_leave_at_most_one_entry_per_topic():
    q = WakeQueue()

    def flood(topic: str) -> None:
        for i in range(5_000):
            q.put(Wake("x", topic, str(i), 1.0 + i))

    threads = [threading.Thread(target=flood, args=(t,)) for t in TOPICS for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batch = q.take(0)
    assert set(batch) == set(TOPICS) and all(p.count == 10_000 for p in batch.values())
    assert q.received == 10_000 * len(TOPICS)


def test_clip_bounds_the_detail():
    assert clip(b"NVRM: Xid (PCI:0000:00:06): 79\n") == "NVRM: Xid (PCI:0000:00:06): 79"
    long = clip("x" * 10_000)
    assert len(long) == DETAIL_MAX and long.endswith("…")
    assert clip(b"\xff\xfe bad") == "\ufffd\ufffd bad"
