"""History and debounce: what only time shows, and when a fault is raised or cleared."""

from __future__ import annotations

from gpuwarden.agent.history import ContainerKey, ContainerObs, Debouncer, NodeHistory


def test_debounce_raises_after_n_and_clears_after_m():
    d = Debouncer(raise_after=2, clear_after=3)
    assert d.observe("X", "bad", 1) is None
    assert d.observe("X", "bad", 2) == "raised"
    assert d.observe("X", "bad", 3) is None  # one transition per debounce
    assert d.observe("X", "good", 4) is None
    assert d.observe("X", "good", 5) is None
    assert d.observe("X", "good", 6) == "cleared"
    assert not d.raised("X")


def test_a_bad_interrupts_the_clean_streak_and_a_good_the_bad_one():
    d = Debouncer(2, 2)
    d.observe("X", "bad", 0)
    d.observe("X", "good", 1)
    assert d.observe("X", "bad", 2) is None  # streak restarted
    d.observe("X", "bad", 3)
    assert d.raised("X")
    d.observe("X", "good", 4)
    d.observe("X", "bad", 5)
    d.observe("X", "good", 6)
    assert d.raised("X")


def test_lost_observability_never_clears():
    d = Debouncer(1, 2)
    d.observe("X", "bad", 0)
    for t in range(1, 20):
        assert d.observe("X", "unknown", t) is None
    assert d.raised("X")
    d.observe("X", "good", 21)
    d.observe("X", "unknown", 22)  # blindness neither counts nor resets the clean streak
    assert d.observe("X", "good", 23) == "cleared"


def test_grace_defers_raising():
    d = Debouncer(2, 2)
    for t in range(5):
        assert d.observe("X", "bad", t, allow_raise=False) is None
    assert d.observe("X", "bad", 6) == "raised"


def test_preset_needs_m_clean_observations():
    d = Debouncer(2, 3)
    d.preset("X", True)
    d.observe("X", "good", 1)
    d.observe("X", "good", 2)
    assert d.raised("X")
    assert d.observe("X", "good", 3) == "cleared"


def test_drift_needs_allowed_at_first_sight():
    h = NodeHistory(10)
    k = ContainerKey("uid", "c", "id1", "ns", "pod")
    for t, allowed in ((100, True), (160, True), (220, False), (280, False)):
        h.begin()
        h.record_container(k, ContainerObs(t, {"/dev/nvidiactl": allowed}, {"/dev/nvidiactl": f"at {t}"}, "devices.list"))
    [d] = h.drifts()
    assert (d.path, d.first_seen, d.last_allowed, d.denied_since) == ("/dev/nvidiactl", 100, 160, 220)
    assert d.evidence_now == "at 280"

    h2 = NodeHistory(10)  # denied from the first observation on: never granted, not drift
    for t in (100, 160):
        h2.begin()
        h2.record_container(k, ContainerObs(t, {"/dev/nvidiactl": False}))
    assert h2.drifts() == []


def test_a_restarted_container_is_a_new_series():
    h = NodeHistory(10)
    h.begin()
    h.record_container(ContainerKey("uid", "c", "id1"), ContainerObs(1, {"/dev/nvidia0": True}))
    h.begin()
    h.record_container(ContainerKey("uid", "c", "id2"), ContainerObs(2, {"/dev/nvidia0": False}))
    assert h.drifts() == []


def test_prune_forgets_gone_containers():
    h = NodeHistory(3)
    k = ContainerKey("uid", "c", "id1")
    h.begin()
    h.record_container(k, ContainerObs(1, {}))
    for _ in range(4):
        h.begin()
        h.prune()
    assert k not in h.containers


def test_timeouts_count_in_the_window():
    h = NodeHistory(30)
    for i, s in enumerate(["ok", "timeout", "ok", "timeout", "timeout", "ok"]):
        h.record_probe("nvml", i, s)
    assert h.timeouts("nvml", 10)[:2] == (3, 6)
    assert h.timeouts("nvml", 2)[:2] == (1, 2)
