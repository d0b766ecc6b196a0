"""No false action under heavy legitimate load (issue 43, item 4): graphics tenants whose memory moves legitimately
(a resize, steady rendering, a large but bounded scene) are never named by their signals, and the unsure policy
never fires on them: a bounded growth never projects the node into its min watermark within the bound."""

from __future__ import annotations

from gpuwarden.agent.unsure import POLICIES, decide
from gpuwarden.memory.tracking import ProcSignals
from gpuwarden.memory.trend import GiB, MemoryHistory, MemSample, MiB

GROWTH = 1 << 30
RESIZE, STEADY, SCENE = "uid-resize", "uid-steady", "uid-scene"
REFS = {RESIZE: "viz/resize-0", STEADY: "viz/steady-0", SCENE: "viz/scene-0"}
PIDS = {RESIZE: (101,), STEADY: (102,), SCENE: (103,)}


def run(gaps: list[int], avail0: int, dt: float = 0.5) -> list:
    """The agent's history over `gaps` (one sample every `dt`), three tenants moving as legitimate ones do:
    resize-0 remaps its framebuffers every 20 samples, steady-0 renders, scene-0 loads a scene from sample 10 to 40
    (faults, kernel time, mappings) and then renders it. Returns the trend after each sample."""
    h = MemoryHistory(window_s=300, growth_bytes_per_min=GROWTH, noise_bytes=64 * MiB)
    out = []
    k = {RESIZE: 0, STEADY: 0, SCENE: 0}
    f = dict(k)
    maps = {RESIZE: 64 * MiB, STEADY: 64 * MiB, SCENE: 64 * MiB}
    for i, g in enumerate(gaps):
        k[STEADY] += 4
        f[STEADY] += 30
        k[RESIZE] += 3 + (20 if i % 20 == 0 else 0)
        maps[RESIZE] = (64 if (i // 20) % 2 == 0 else 96) * MiB
        loading = 10 <= i < 40
        k[SCENE] += 25 if loading else 4
        f[SCENE] += 4000 if loading else 30
        maps[SCENE] += 8 * MiB if loading else 0
        sig = {x: ProcSignals(k[x], f[x], 4, maps[x]) for x in REFS}
        s = MemSample(i * dt, g, avail0 - (g - gaps[0]), 256 * MiB, dict(REFS), dict(PIDS), None, sig)
        out.append(h.trend_with(s))
        h.add(s)
    return out


def test_heavy_legit_load_with_a_flat_gap_names_nobody_and_never_acts():
    """The tenants' memory is charged or in GPU memory: the uncharged gap only wobbles by a few MiB."""
    gaps = [700 * MiB + (i % 3) * 4 * MiB for i in range(120)]
    for t in run(gaps, 60 * GiB)[1:]:
        assert t.tracking.holder is None
        assert t.seconds_to_min_watermark is None or t.seconds_to_min_watermark > 3600
        for p in POLICIES:
            assert not decide({"unsure": {"candidates": [], "seconds_to_min_watermark": t.seconds_to_min_watermark,
                                          "recent_rate_bytes_per_s": t.recent_rate, "growth_bytes": t.change_bytes,
                        "headroom_bytes": t.available - t.min_watermark}}, p, 300, GROWTH).act


def test_a_large_bounded_scene_never_fires_the_policy():
    """6 GiB of uncharged growth at 24 GiB/min while the scene loads, then flat. At that rate 100 GiB of headroom
    projects to about 4 min, under the bound; but 6 GiB is under an eighth of the headroom, and the growth stops:
    the policy never fires."""
    gaps = [700 * MiB] * 10 + [700 * MiB + (i + 1) * 205 * MiB for i in range(30)] + [700 * MiB + 30 * 205 * MiB] * 80
    fired = []
    for t in run(gaps, 100 * GiB)[2:]:
        d = {"unsure": {"candidates": [{"ref": r, "kind": "pod", "name": r.split("/")[1], "namespace": "viz",
                                        "uid": u, "graphics": True} for u, r in REFS.items()],
                        "seconds_to_min_watermark": t.seconds_to_min_watermark,
                        "recent_rate_bytes_per_s": t.recent_rate, "growth_bytes": t.change_bytes,
                        "headroom_bytes": t.available - t.min_watermark}}
        fired += [p for p in POLICIES if decide(d, p, 300, GROWTH).act]
    assert fired == []


def test_the_same_growth_near_the_watermark_does_fire_and_clears_when_it_stops():
    """Positive control of the above: the same growth on a node with 8 GiB available does cross the bound while it
    goes on, and the decision clears once the latest samples are flat."""
    gaps = [700 * MiB] * 10 + [700 * MiB + (i + 1) * 205 * MiB for i in range(30)] + [700 * MiB + 30 * 205 * MiB] * 40
    acts = []
    for t in run(gaps, 8 * GiB)[2:]:
        d = {"unsure": {"candidates": [{"ref": "viz/a", "kind": "pod", "name": "a", "namespace": "viz",
                                        "uid": "a", "graphics": True}],
                        "seconds_to_min_watermark": t.seconds_to_min_watermark,
                        "recent_rate_bytes_per_s": t.recent_rate, "growth_bytes": t.change_bytes,
                        "headroom_bytes": t.available - t.min_watermark}}
        acts.append(decide(d, "stop-graphics-candidates", 300, GROWTH).act)
    assert any(acts[10:38]) and not any(acts[-10:])
