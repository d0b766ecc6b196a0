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
        self.fail_reads = False

    def get_lease(self, ns, name, timeout=None):
        if self.fail_reads:
            raise KubeError(0, "ConnectionRefused", "")
        return copy.deepcopy(self.obj)

    def create_lease(self, ns, body, timeout=None):
        if self.obj is not None:
            raise KubeError(409, "Conflict", '{"message": "already exists"}')
        return self._store(body)

    def replace_lease(self, ns, name, body, timeout=None):
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
    store.get_lease = lambda ns, name: copy.deepcopy(stale)  # a reads an old copy (a lagging cache)
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
    store.fail_reads = True
    clock.t += 5
    assert a.try_acquire_or_renew() is True  # still within the renew deadline
    clock.t += 6
    assert a.try_acquire_or_renew() is False and not a.is_leader()


def test_create_race():
    store, clock = LeaseStore(), Clock()
    a, b = pair(store, clock)
    store.get_lease = lambda ns, name: None  # both see no Lease
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False  # create conflicts
