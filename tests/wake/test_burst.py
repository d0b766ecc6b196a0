"""A burst of events is a leading wake at once and at most one trailing wake a window, with its count."""

from __future__ import annotations

import threading
import time

from gpuwarden.wake.base import Wake
from gpuwarden.wake.burst import MAX_DETAIL, Burst, clip


def collect() -> tuple[list[Wake], threading.Event, object]:
    got: list[Wake] = []
    ev = threading.Event()

    def emit(w: Wake) -> None:
        got.append(w)
        ev.set()

    return got, ev, emit


def test_the_first_event_is_a_wake_at_once():
    got, _, emit = collect()
    b = Burst(emit, "pods", "admission", window_s=10.0)
    b.offer("ml/a: lost", seen=5.0)
    assert got == [Wake("pods", "admission", "ml/a: lost", 5.0)]
    b.close()


def test_events_within_the_window_are_one_trailing_wake_with_their_count_and_first_time():
    got, ev, emit = collect()
    b = Burst(emit, "nvml", "gpu", window_s=0.2)
    b.offer("gpu 0 xid 79", seen=1.0)
    ev.clear()
    for i in range(999):
        b.offer(f"gpu 0 xid {i}", seen=2.0 + i)
    assert len(got) == 1  # nothing more before the window ends
    assert ev.wait(2.0)
    assert got[1] == Wake("nvml", "gpu", "gpu 0 xid 998 (+998 more)", 2.0)
    assert (b.events, b.wakes) == (1000, 2)
    b.close()


def test_a_quiet_window_makes_the_next_event_a_leading_wake_again():
    got, _, emit = collect()
    b = Burst(emit, "nvml", "gpu", window_s=0.05)
    b.offer("one")
    time.sleep(0.1)
    b.offer("two")
    assert [w.detail for w in got] == ["one", "two"]
    b.close()


def test_a_count_from_upstream_is_carried():
    got, _, emit = collect()
    b = Burst(emit, "nvml", "gpu", window_s=0.05)
    b.offer("gpu 1 xid 48", count=40)
    assert got[0].detail == "gpu 1 xid 48 (+39 more)"
    b.close()


def test_nothing_is_emitted_after_close_and_no_timer_is_left():
    got, _, emit = collect()
    b = Burst(emit, "pods", "admission", window_s=0.1)
    b.offer("a")
    b.offer("b")  # pending: a trailing wake would come at 0.1 s
    b.close()
    time.sleep(0.25)
    b.offer("c")
    assert [w.detail for w in got] == ["a"]
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()]


def test_details_are_one_bounded_line_and_keep_their_count():
    got, _, emit = collect()
    b = Burst(emit, "pods", "admission", window_s=0.05)
    b.offer("ns/" + "x" * 1000 + "\n\x1b[31m", count=3)
    (w,) = got
    assert len(w.detail) <= MAX_DETAIL and w.detail.endswith("… (+2 more)") and "\n" not in w.detail
    assert clip("a\tb\x00c") == "a b c"
    b.close()
