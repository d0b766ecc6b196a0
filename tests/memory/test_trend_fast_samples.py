"""The agent's fast memory sampling (issue 41): its samples replace each other within `coalesce_s`, so the
interval's history is not pushed out of the bounded series; without `coalesce_s` every sample is kept."""

from __future__ import annotations

from gpuwarden.memory.trend import MemoryHistory, MemSample

GiB = 1 << 30


def test_fast_samples_replace_each_other_and_keep_the_intervals_history():
    h = MemoryHistory(maxlen=5, window_s=300, growth_bytes_per_min=GiB)
    for i in range(4):  # the interval's samples, 60 s apart
        h.add(MemSample(60.0 * i, GiB))
    for k in range(1, 41):  # 20 s of fast samples every 0.5 s, growing 0.5 GiB each
        h.add(MemSample(180.0 + 0.5 * k, GiB + k * (GiB // 2)), coalesce_s=30.0)
    ts = [s.t for s in h.samples]
    assert ts == [0.0, 60.0, 120.0, 180.0, 200.0]  # the interval's four and the newest fast one
    assert h.samples[-1].gap == GiB + 40 * (GiB // 2)  # the newest reading counts
    t = h.trend()
    assert t is not None and t.growth_began == 180.0 and t.change_bytes == 20 * GiB  # the growth is seen whole


def test_without_coalescing_every_sample_is_kept_and_old_ones_leave():
    h = MemoryHistory(maxlen=5)
    for k in range(10):
        h.add(MemSample(0.5 * k, GiB))
    assert [s.t for s in h.samples] == [2.5, 3.0, 3.5, 4.0, 4.5]


def test_only_a_latest_sample_close_to_its_predecessor_is_replaced():
    h = MemoryHistory(maxlen=10)
    h.add(MemSample(0.0, GiB))
    h.add(MemSample(60.0, GiB))
    h.add(MemSample(100.0, GiB), coalesce_s=30.0)  # the latest (60) is 60 s after its predecessor: kept
    h.add(MemSample(101.0, GiB), coalesce_s=30.0)  # the latest (100) is 40 s after 60: kept too
    h.add(MemSample(101.5, GiB), coalesce_s=30.0)  # the latest (101) is 1 s after 100: replaced
    assert [s.t for s in h.samples] == [0.0, 60.0, 100.0, 101.5]
