"""Separation by evidence over time (issue 43, item 1): whose own signals move with the uncharged growth."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.memory.attribution import GpuMemory, GpuProcess, GpuView, Suspect, separate
from gpuwarden.memory.tracking import OTHERS_MAX, ProcSignals
from gpuwarden.memory.tracking import tracking as _tracking
from gpuwarden.memory.trend import GiB, MemoryHistory, MemSample, MiB
from gpuwarden.parsers import proc_pid

GROWTH = 1 << 30  # bytes per minute


def tracking(samples, growth, noise, min_window_s: float = 1.0):
    """The synthetic series below are 1 s apart, each pair a window (the default window, 2 s, has its own tests)."""
    return _tracking(samples, growth, noise, min_window_s)
NOISE = 64 * MiB
A, B = "uid-a", "uid-b"


def series(gaps: list[int], sig: dict[str, list[int]], dt: float = 1.0, pids: dict[str, tuple] | None = None,
           maps: dict[str, list[int]] | None = None) -> list[MemSample]:
    """Samples `dt` apart: the gap, and per candidate its cumulative kernel ticks (and device-mapped bytes)."""
    out = []
    for i, g in enumerate(gaps):
        s = {k: ProcSignals(kernel_ticks=v[i], faults=1000 + i * 10,
                            dev_map_bytes=(maps or {}).get(k, [0] * len(gaps))[i]) for k, v in sig.items()}
        out.append(MemSample(i * dt, g, candidates={k: f"viz/{k}" for k in sig},
                             pids=(pids or {k: (100 + n,) for n, k in enumerate(sig)}), signals=s))
    return out


def cum(steps: list[int]) -> list[int]:
    out, x = [], 0
    for d in steps:
        x += d
        out.append(x)
    return out


# 4 quiet windows, then 6 windows of growth at 2 GiB/min (dt 1 s: 34 MiB a window)
QUIET, GROW = 4, 6
GAPS = [GiB] * (QUIET + 1) + [GiB + (i + 1) * 34 * MiB for i in range(GROW)]
STEADY = cum([0] + [5] * (QUIET + GROW))  # renders all along: 5 ticks a second
LEAKS = cum([0] + [5] * QUIET + [40] * GROW)  # renders, then allocates: kernel time jumps with the growth


def test_one_tracks_is_named_with_its_numbers():
    t = tracking(series(GAPS, {A: LEAKS, B: STEADY}), GROWTH, NOISE)
    assert t.holder == A and t.strength == "strong"
    assert "6 of 6 growth windows (100%)" in t.why and "the others' in 0 of 6" in t.why
    assert any("quiet-time maximum over 4 quiet windows: kernel time 5.0 ticks/s" in x for x in t.evidence)


def test_none_tracks_nobody_named():
    t = tracking(series(GAPS, {A: STEADY, B: STEADY}), GROWTH, NOISE)
    assert t.holder is None and t.strength == "none" and "no candidate's signals track" in t.why


def test_both_track_nobody_named():
    t = tracking(series(GAPS, {A: LEAKS, B: LEAKS}), GROWTH, NOISE)
    assert t.holder is None and "several candidates" in t.why


def test_noisy_legit_rendering_is_not_named():
    # B renders with bursts while quiet as high as during the growth: it never beats its own quiet maximum
    noisy = cum([0, 3, 30, 2, 25] + [20, 4, 28, 6, 22, 10])
    t = tracking(series(GAPS, {A: LEAKS, B: noisy}), GROWTH, NOISE)
    assert t.holder == A
    tb = next(x for x in t.tracks if x.key == B)
    assert tb.share <= OTHERS_MAX
    # and alone it is nobody
    assert tracking(series(GAPS, {B: noisy}), GROWTH, NOISE).holder is None


def test_device_mappings_alone_separate():
    flat = [0] * len(GAPS)
    maps = {A: [0] * (QUIET + 1) + [(i + 1) * 32 * MiB for i in range(GROW)], B: flat}
    t = tracking(series(GAPS, {A: STEADY, B: STEADY}, maps=maps), GROWTH, NOISE)
    assert t.holder == A and next(x for x in t.tracks if x.key == A).beat == {"dev_map_bytes": GROW}


def test_no_quiet_time_cannot_tell():
    """Both leaking from the first sample: no baseline, so nobody (the unsure policy's case)."""
    gaps = [GiB + i * 34 * MiB for i in range(8)]
    t = tracking(series(gaps, {A: cum([40] * 8), B: cum([0] + [5] * 7)}), GROWTH, NOISE)
    # without a quiet time each is held to the signals' floors: both move above them, so both track
    assert t.holder is None and "several candidates" in t.why
    assert all(x.floors_only for x in t.tracks)
    assert any("too few for a baseline of its own" in x for x in t.evidence)


def test_no_quiet_time_one_moves_named_but_never_strong():
    """The leak began before the samples did, and only one candidate's signals move at all: named on the floors,
    'sufficient' at most, and the evidence says it had no baseline of its own."""
    gaps = [GiB + i * 34 * MiB for i in range(8)]
    t = tracking(series(gaps, {A: cum([0] + [40] * 7), B: cum([0] * 8)}), GROWTH, NOISE)
    assert t.holder == A and t.strength == "sufficient"
    assert "no quiet-time baseline for viz/uid-a, viz/uid-b" in t.why


def test_a_steady_renderer_without_baseline_blocks_naming():
    """The negative: with no quiet time, a tenant whose kernel time moves all along (steady rendering) counts as
    tracking too, so nobody is named (the floors can only make naming harder)."""
    gaps = [GiB + i * 34 * MiB for i in range(8)]
    t = tracking(series(gaps, {A: cum([0] + [40] * 7), B: cum([0] + [5] * 7)}), GROWTH, NOISE)
    assert t.holder is None and "several candidates" in t.why


# Run 20a on the H200 (docs/validation.md, 2026-12-02 18:11 UTC), memory-late-leaker-separated as sampled by the
# scenario: the gap (MiB) at ~1.3 s samples, jittering a few MiB a second while quiet, then viz/render-0's
# framebuffers; cumulative kernel ticks (stime x 100) of viz/render-0 and viz/steady-0. Before this fix the jitter
# (5-7 MiB/s, above half the growth rate) made no window quiet, so no candidate had a baseline and nobody was named.
H200_T = [174.7, 175.9, 177.2, 178.4, 179.6, 180.9, 181.2, 182.6, 184.1, 185.7, 187.3, 188.9, 190.4, 192.0]
H200_GAP = [262, 331, 338, 322, 329, 334, 328, 1040, 2125, 3169, 4222, 5240, 6275, 7280]
H200_RENDER = [7, 7, 7, 7, 7, 7, 8, 29, 60, 94, 128, 161, 193, 223]
H200_STEADY = [5] * 14


def test_h200_late_leaker_is_named_through_the_jitter():
    out = []
    for i, t in enumerate(H200_T):
        sig = {A: ProcSignals(kernel_ticks=H200_RENDER[i]), B: ProcSignals(kernel_ticks=H200_STEADY[i])}
        out.append(MemSample(t, H200_GAP[i] * MiB, candidates={A: "viz/render-0", B: "viz/steady-0"},
                             pids={A: (1291,), B: (1290,)}, signals=sig))
    t = tracking(out[1:], GROWTH, NOISE)  # from the second sample: the first one's gap predates a process start
    assert t.holder == A, t.why
    ta, tb = (next(x for x in t.tracks if x.key == k) for k in (A, B))
    assert ta.quiet_windows >= 2 and not ta.floors_only and ta.hits == ta.growth_windows == 7 and tb.hits == 0


def test_a_restart_is_not_movement():
    pids = {A: (100,), B: (101,)}
    s = series(GAPS, {A: LEAKS, B: STEADY}, pids=pids)
    # B's process restarts mid-growth: its windows across the change are left out, not counted as growth
    s = [x if i < 7 else MemSample(x.t, x.gap, x.candidates, {A: (100,), B: (999,)}, signals=x.signals)
         for i, x in enumerate(s)]
    t = tracking(s, GROWTH, NOISE)
    tb = next(x for x in t.tracks if x.key == B)
    assert tb.growth_windows == GROW - 1


def test_the_growth_stopping_clears():
    """A named holder is no longer named once the history shows the others' windows too (the leak stopped and it
    renders steadily again: quiet windows raise nobody)."""
    gaps = GAPS + [GAPS[-1]] * 30
    a = LEAKS + cum([LEAKS[-1]] + [5] * 30)[1:]
    b = STEADY + cum([STEADY[-1]] + [5] * 30)[1:]
    h = MemoryHistory(window_s=60, growth_bytes_per_min=GROWTH, noise_bytes=NOISE)
    for x in series(gaps, {A: a, B: b})[:len(GAPS)]:
        h.add(x)
    assert h.trend_with(MemSample(99, GAPS[-1], {A: "viz/a", B: "viz/b"})).tracking.holder == A
    h2 = MemoryHistory(window_s=60, growth_bytes_per_min=GROWTH, noise_bytes=NOISE)
    for x in series(gaps[len(GAPS):], {A: a[len(GAPS):], B: b[len(GAPS):]}):
        h2.add(x)
    assert h2.trend_with(MemSample(99, GAPS[-1])).tracking.holder is None


def test_separate_names_the_tracking_graphics_client():
    """Two graphics clients of a full GPU, both there from the start: the tracking one is named, by 'tracking'."""
    h = MemoryHistory(window_s=5, growth_bytes_per_min=GROWTH, noise_bytes=NOISE)
    for x in series(GAPS, {A: LEAKS, B: STEADY})[:-1]:
        h.add(x)
    tr = h.trend_with(series(GAPS, {A: LEAKS, B: STEADY})[-1])
    view = GpuView("NVML probe", (GpuProcess(100, "G", 1 * GiB, "0"), GpuProcess(101, "G", GiB, "0")),
                   (GpuMemory("0", 79 * GiB, 100 * MiB, 80 * GiB),))
    sus = [Suspect("pod", "a", "viz", A, pids=[100], devices=["/dev/nvidia0"]),
           Suspect("pod", "b", "viz", B, pids=[101], devices=["/dev/nvidia0"])]
    sep = separate(sus, True, view, tr)
    assert sep.holder is not None and sep.holder.uid == A and sep.method == "tracking" and sep.confidence == "high"
    assert any("per-process signals" in e for e in sep.evidence)
    # without the tracking, the same two are not separated
    sep2 = separate(sus, True, view, None)
    assert sep2.holder is None


@settings(max_examples=200, deadline=None)
@given(quiet=st.lists(st.integers(0, 50), min_size=2, max_size=8),
       grow=st.lists(st.integers(0, 50), min_size=3, max_size=10),
       leak=st.lists(st.integers(0, 500), min_size=3, max_size=10),
       dt=st.sampled_from([0.5, 1.0, 30.0]))
def test_a_non_tracking_candidate_is_never_named(quiet, grow, leak, dt):
    """B moves no faster while the memory grows than it did while it was quiet: whatever A does, B is never named."""
    cap = max(quiet)
    grow = [min(g, cap) for g in grow]
    leak = (leak + [0] * len(grow))[:len(grow)]
    n = len(quiet) + len(grow)
    step = int(GROWTH / 60 * dt) + 40 * MiB  # every growth window grows
    gaps = [GiB] * (len(quiet) + 1) + [GiB + (i + 1) * step for i in range(len(grow))]
    b = cum([0] + quiet + grow)
    a = cum([0] + [5] * len(quiet) + leak)
    assert len(gaps) == n + 1
    # each pair of samples a window (min_window_s = dt): the property is about windows, whatever their length
    t = tracking(series(gaps, {A: a, B: b}, dt=dt), GROWTH, NOISE, min_window_s=dt)
    assert t.holder != B
    assert tracking(series(gaps, {B: b}, dt=dt), GROWTH, NOISE, min_window_s=dt).holder is None


def test_parsers_faults_and_device_maps():
    stat = "42 (Xorg (gl)) S 1 42 42 0 -1 4194560 1500 0 25 0 10 7 0 0 20 0 3 0 12345 0 0"
    assert proc_pid.faults(stat) == 1525 and proc_pid.kernel_ticks(stat) == 7
    assert proc_pid.faults("garbage") is None and proc_pid.faults("1 (x) S 1 2 3 4 5 6 x 0 y") is None
    maps = ("7f0000000000-7f0000200000 rw-s 00000000 00:05 1030 /dev/nvidia0\n"
            "7f0000200000-7f0000201000 rw-s 00000000 00:05 1031 /dev/nvidiactl\n"
            "7f0000300000-7f0000400000 rw-s 00000000 00:05 1032 /dev/dri/renderD128\n"
            "7f0000400000-7f0000500000 r--p 00000000 08:01 99 /usr/lib/libnvidia-glcore.so\n"
            "7f0000500000-7f0000600000 rw-p 00000000 00:00 0 \n"
            "not a line /dev/nvidia0\n7f00006")
    assert proc_pid.device_maps(maps) == (3, 0x200000 + 0x1000 + 0x100000)
    assert proc_pid.device_maps("") == (0, 0)


def test_signals_survive_the_samples_file():
    s = series(GAPS[:2], {A: LEAKS[:2]})[1]
    assert MemSample.from_json(s.to_json()) == s
    import pytest

    with pytest.raises(ValueError):
        MemSample.from_json({**s.to_json(), "signals": {A: [1, 2]}})


def test_half_second_samples_with_allocation_and_growth_in_different_halves_are_windows_of_two_seconds():
    """Run 22 on the H200: the agent samples every 0.5 s while memory grows; the leaker allocates a burst every
    2 s, its kernel time in one half second, the memory showing in the next. Half-second windows split the two
    (the leaker beat its baseline in 2 of 6); the default 2 s windows hold both, and it is named."""
    ts = [i * 0.5 for i in range(40)]
    gaps, ka, kb = [], [], []
    g, a, b = GiB, 0, 0
    for i, t in enumerate(ts):
        if t >= 8 and i % 4 == 1:
            a += 40  # the burst's kernel time
        if t >= 8 and i % 4 == 2:
            g += 256 * MiB  # its memory, half a second later
        b += 1 if i % 2 else 0  # steady: half a tick a sample
        gaps.append(g)
        ka.append(a)
        kb.append(b)
    out = [MemSample(t, gaps[i], candidates={A: "viz/render-0", B: "viz/steady-0"}, pids={A: (1,), B: (2,)},
                     signals={A: ProcSignals(kernel_ticks=ka[i]), B: ProcSignals(kernel_ticks=kb[i])})
           for i, t in enumerate(ts)]
    half = _tracking(out, GROWTH, NOISE, min_window_s=0.5)
    assert half.holder is None  # the growth windows are the halves without the kernel time
    t = _tracking(out, GROWTH, NOISE)
    assert t.holder == A, t.why


def test_once_the_tracked_holder_left_the_quiet_one_is_never_named():
    """Run 23 on the H200: the leaker (tracked) was evicted; for a moment its memory had not come back, and the quiet
    graphics pod, now the only graphics client of the full GPU, was named (at-risk, high). It is not: nobody is
    named until the memory comes back or other evidence does."""
    h = MemoryHistory(window_s=5, growth_bytes_per_min=GROWTH, noise_bytes=NOISE)
    for x in series(GAPS, {A: LEAKS, B: STEADY})[:-1]:
        h.add(x)
    tr = h.trend_with(series(GAPS, {A: LEAKS, B: STEADY})[-1])
    assert tr.tracking.holder == A
    view = GpuView("NVML probe", (GpuProcess(101, "G", GiB, "0"),), (GpuMemory("0", 79 * GiB, 100 * MiB, 80 * GiB),))
    only_b = [Suspect("pod", "b", "viz", B, pids=[101], devices=["/dev/nvidia0"])]
    sep = separate(only_b, True, view, tr)
    assert sep.holder is None and sep.method == "none"
    assert "viz/uid-a, whose own signals tracked the growth" in sep.evidence[0]
    # the negative: without a tracked holder that left, the lone graphics client is named as before
    assert separate(only_b, True, view, None).holder is not None


def test_a_candidate_that_left_during_the_growth_leaves_nobody_named_by_elimination():
    """Without any tracking: a graphics pod present while the memory grew has just left (evicted), its memory not yet
    back; the other graphics pod, now alone, is not 'the only graphics client of a full GPU' (run 23's scenario
    samples named it so)."""
    gaps = [GiB] * 3 + [GiB + i * 300 * MiB for i in range(1, 5)]
    both = series(gaps, {A: cum([0] * 7), B: cum([0] * 7)})  # no signals move: no tracking holder
    h = MemoryHistory(window_s=5, growth_bytes_per_min=GROWTH, noise_bytes=NOISE)
    for x in both:
        h.add(x)
    last = MemSample(both[-1].t + 1, gaps[-1], candidates={B: "viz/uid-b"}, pids={B: (101,)},
                     signals={B: ProcSignals(kernel_ticks=0)})
    tr = h.trend_with(last)
    view = GpuView("NVML probe", (GpuProcess(101, "G", GiB, "0"),), (GpuMemory("0", 79 * GiB, 100 * MiB, 80 * GiB),))
    only_b = [Suspect("pod", "b", "viz", B, pids=[101], devices=["/dev/nvidia0"])]
    sep = separate(only_b, True, view, tr)
    assert sep.holder is None and "viz/uid-a held NVIDIA device files while the memory grew" in sep.evidence[0]
    # the negative: no history (nobody left that we know of): the lone graphics client is named as before
    assert separate(only_b, True, view, None).holder is not None


def test_run24_the_one_shot_reading_right_after_the_kill_names_nobody():
    """Run 24 on the H200 (docs/validation.md), the scenario's own reading one sample after the agent killed the
    leaker: viz/render-0 gone with 1.6 GiB back (freed), viz/steady-0 the only graphics client left. It named
    viz/steady-0 ('graphics', at-risk); it names nobody now."""
    from gpuwarden.memory.trend import Freed, Presence, Trend

    # the recorded trend's figures (rate 442 MB/s over 7.7 s, 7 samples, no growth interval in its 8 s window)
    tr = Trend(rate=442324798.0, span_s=7.7, samples=7, growth_intervals=0,
               refs={"56edc93f": "viz/render-0", "1dc0959d": "viz/steady-0"},
               freed=[Freed("56edc93f", "viz/render-0", 1603288552, 75.27)], before={},
               seconds_to_min_watermark=None, available=None, min_watermark=None, growing=True,
               presence={k: Presence(k, None, False, 6, 0, 0, 12) for k in ("56edc93f", "1dc0959d")})
    view = GpuView("NVML probe", (GpuProcess(806, "G", 75 * MiB, "0"),),
                   (GpuMemory("0", 139 * GiB, int(1.4 * GiB), int(140.4 * GiB)),))
    sep = separate([Suspect("pod", "steady-0", "viz", "1dc0959d", pids=[806], devices=["/dev/nvidia0"])], True,
                   view, tr)
    assert sep.holder is None and "viz/render-0 held NVIDIA device files" in sep.evidence[0]
