"""Leader election logic against an in-memory Lease store with the API's resourceVersion semantics.

(The same code runs against the real test API server in tests/k8s/test_controller_leader.py.)
"""

from __future__ import annotations

import copy

from gpuwarden.controller.lease import STATE_ANNOTATION, LeaderElector
from gpuwarden.kube.errors import KubeError


class LeaseStore:
    def __init__(self) -> None:
        self.obj: dict | None = None
        self.rv = 0
        self.writes = 0
        self.reads = 0
        self.down = False  # the API is away: every call fails
        self.timeouts: list = []  # the timeout each request was given
        self.on_request = None  # called with the method before each request (a slow network)

    def _call(self, method, timeout):
        self.timeouts.append(timeout)
        if self.on_request:
            self.on_request(method)
        if self.down:
            raise KubeError(0, "ConnectionRefused", "")

    def get_lease(self, ns, name, timeout=None):
        self._call("GET", timeout)
        self.reads += 1
        return copy.deepcopy(self.obj)

    def create_lease(self, ns, body, timeout=None):
        if self.obj is not None:
            raise KubeError(409, "Conflict", '{"message": "already exists"}')
        return self._store(body)

    def replace_lease(self, ns, name, body, timeout=None):
        self._call("PUT", timeout)
        if body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", '{"message": "the object has been modified"}')
        return self._store(body)

    def _store(self, body):
        self.rv += 1
        self.writes += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.obj)


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def pair(store, clock):
    a = LeaderElector(store, "gw", "ctl", "a", 15, 10, clock)
    b = LeaderElector(store, "gw", "ctl", "b", 15, 10, clock)
    return a, b


def test_a_newcomer_waits_a_full_lease_whatever_renewTime_says():
    """Expiry is judged on the local clock since the record last changed, not on the holder's clock."""
    store, clock = LeaseStore(), Clock()
    a, b = pair(store, clock)
    assert a.try_acquire_or_renew()
    clock.t += 3600  # a's renewTime is an hour old, but b has never seen the record before
    assert b.try_acquire_or_renew() is False
    clock.t += 16
    assert b.try_acquire_or_renew() is True


def test_one_leader_then_takeover_after_expiry():
    store, clock = LeaseStore(), Clock()
    a, b = pair(store, clock)
    assert a.try_acquire_or_renew() is True
    assert store.obj["spec"]["holderIdentity"] == "a" and store.obj["spec"]["leaseTransitions"] == 0
    assert store.obj["spec"]["renewTime"].endswith("Z") and "." in store.obj["spec"]["renewTime"]
    assert b.try_acquire_or_renew() is False and b.holder == "a"
    clock.t += 5
    assert a.try_acquire_or_renew() is True  # renews
    assert b.try_acquire_or_renew() is False  # sees a change: restarts its expiry clock
    clock.t += 14
    assert b.try_acquire_or_renew() is False  # 14 s since b saw the record change: not expired
    assert not a.is_leader()  # but a, not having renewed for 19 s (> renew deadline), stops acting
    clock.t += 2
    assert b.try_acquire_or_renew() is True  # 16 s > 15 s lease
    assert store.obj["spec"]["holderIdentity"] == "b" and store.obj["spec"]["leaseTransitions"] == 1
    assert a.try_acquire_or_renew() is False and not a.is_leader()


def test_renew_with_a_stale_resource_version_conflicts():
    store, clock = LeaseStore(), Clock()
    a, b = pair(store, clock)
    assert a.try_acquire_or_renew()
    stale = copy.deepcopy(store.obj)
    assert not b.try_acquire_or_renew()  # b starts watching the record ...
    clock.t += 20
    assert b.try_acquire_or_renew()  # ... and takes over once it stayed unchanged for a lease (rv bumps)
    store.get_lease = lambda ns, name, **_: copy.deepcopy(stale)  # a reads an old copy (a lagging cache)
    assert a.try_acquire_or_renew() is False  # its PUT conflicts
    assert store.obj["spec"]["holderIdentity"] == "b"


def test_release_lets_a_successor_in_at_once():
    store, clock = LeaseStore(), Clock()
    a, b = pair(store, clock)
    a.try_acquire_or_renew(state='{"v":1}')
    assert a.release(state='{"v":2}') is True
    assert store.obj["spec"]["holderIdentity"] is None
    assert b.try_acquire_or_renew() is True
    assert b.acquired_state == '{"v":2}'  # the state left by a
    assert store.obj["metadata"]["annotations"][STATE_ANNOTATION] == '{"v":2}'


def test_api_errors_keep_leading_until_the_renew_deadline():
    store, clock = LeaseStore(), Clock()
    a, _ = pair(store, clock)
    assert a.try_acquire_or_renew()
    store.down = True
    clock.t += 5
    assert a.try_acquire_or_renew() is True  # still within the renew deadline
    clock.t += 6
    assert a.try_acquire_or_renew() is False and not a.is_leader()


def test_create_race():
    store, clock = LeaseStore(), Clock()
    a, b = pair(store, clock)
    store.get_lease = lambda ns, name, **_: None  # both see no Lease
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False  # create conflicts


def test_the_leader_renews_with_one_put_of_the_lease_it_last_wrote():
    """client-go's fast path: a renewal is one round trip; a 409 (someone wrote it since) reads it."""
    store, clock = LeaseStore(), Clock()
    a, b = pair(store, clock)
    assert a.try_acquire_or_renew()
    reads = store.reads
    for _ in range(3):
        clock.t += 2
        assert a.try_acquire_or_renew(state='{"v":1}') is True
    assert store.reads == reads and store.obj["metadata"]["annotations"][STATE_ANNOTATION] == '{"v":1}'
    assert a.renewals == 4
    # b takes it over (a was cut off for a whole lease): a's PUT conflicts, it reads, and follows
    clock.t += 16
    assert b.try_acquire_or_renew() is False  # first sight of the record
    clock.t += 16
    assert b.try_acquire_or_renew() is True
    assert a.try_acquire_or_renew() is False and store.reads == reads + 3 and a.holder == "b"


def test_each_renewal_request_gets_what_is_left_of_the_renew_deadline():
    store, clock = LeaseStore(), Clock()
    a, _ = pair(store, clock)
    assert a.try_acquire_or_renew()
    clock.t += 2
    store.timeouts.clear()
    assert a.try_acquire_or_renew()
    assert store.timeouts == [8.0]  # renewed 2 s after the last renewal: 10 - 2 left


def test_no_renewal_is_sent_that_could_only_be_answered_after_the_renew_deadline():
    """The last renewal took 6 s (a connection 3 s slow each way): with 2.5 s left of the renew deadline
    a new one would land (3 s one way) after the leader stepped down, refreshing the record a healthy
    follower is waiting out. The leader steps down at once and sends nothing."""
    store, clock = LeaseStore(), Clock()
    a, _ = pair(store, clock)
    assert a.try_acquire_or_renew()

    def slow(method):
        clock.t += 6.0
    store.on_request = slow
    clock.t += 0.5
    sent = store.writes
    assert a.try_acquire_or_renew() is True  # sent at +0.5, answered at +6.5: proves the Lease from +0.5
    assert store.writes == sent + 1
    a.rtt = 6.0  # what the fake clock took (the elector measures the real one)
    clock.t += 1.5
    assert a.try_acquire_or_renew() is False  # at +8: 2.5 s left < 3 s one way: it would land after +10
    assert store.writes == sent + 1 and a.step_downs == 1 and not a.is_leader()


def test_a_renewal_that_can_still_land_in_time_is_sent():
    """The negative: 4 s left, 6 s round trip: it lands (3 s one way) before the deadline, so it is sent
    with the 4 s as its timeout; answered after them, the leader steps down at the deadline."""
    store, clock = LeaseStore(), Clock()
    a, _ = pair(store, clock)
    assert a.try_acquire_or_renew()
    a.rtt = 6.0
    clock.t += 6.0
    store.timeouts.clear()
    assert a.try_acquire_or_renew() is True and store.timeouts == [4.0]


def test_the_fence_refuses_writes_after_the_renew_deadline():
    import pytest

    from gpuwarden.controller.lease import Fenced

    store, clock = LeaseStore(), Clock()
    a, _ = pair(store, clock)
    with pytest.raises(Fenced):
        a.fence()  # never led
    assert a.try_acquire_or_renew()
    clock.t += 3
    assert a.fence() == 7.0  # a write may take what is left of the renew deadline
    clock.t += 7
    with pytest.raises(Fenced) as exc:
        a.fence()
    assert "write not sent" in str(exc.value) and not exc.value.unavailable
