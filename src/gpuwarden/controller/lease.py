"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it.

- **acquire / renew**: read the Lease; if another holder renewed it within its leaseDurationSeconds
  *as observed locally* (the time this process last saw the record change — no trust in the other
  process's clock), stay a follower. Otherwise write ourselves in with a PUT carrying the
  resourceVersion just read: of two candidates only one write succeeds, the other gets 409 Conflict.
  A new holder sets acquireTime and bumps leaseTransitions.
- **leading** means: the last successful renewal is younger than `renew_deadline_s` (shorter than the
  lease duration), so a leader cut off from the API stops acting before anyone else may take over.
  The defaults are client-go's: lease 15 s, renew deadline 10 s, retry period 2 s.
- **renewing is one request**: the leader renews with a PUT of the Lease it last wrote (its
  resourceVersion), as client-go's fast path does; only when that is refused (409: someone wrote it
  since) or when acquiring does it read the Lease first. A renewal costs one round trip, not two.
- **a renewal has a deadline, and is not sent when it would land late**: its request gets what is
  left of the renew deadline as its timeout, and the leader sends none when less is left than half
  its last Lease request took (`rtt`, the one-way time): such a request would reach the server after
  the leader stepped down and refresh the record then, making a healthy follower wait a whole new
  lease. It steps down at once instead.
- **fencing**: `fence()` answers, before each write of an action, how long the write may take (what
  is left of the renew deadline) or raises `Fenced`: a leader that lost or cannot prove the Lease
  stops mid-action, between two requests, not at the end of the action.
- **stepping down**: a leader that could not renew within its renew deadline stops leading, says so
  (`leader-stepped-down`), and counts the Lease as held by someone else from that moment: it may take
  it again only after a further lease duration without a change, by which time a healthy follower
  (which saw the last renewal lease-duration ago) has taken it.
- **release** (at shutdown): clear holderIdentity (leaseDurationSeconds 1), so a successor need not
  wait out the lease.

The leader may also keep a small JSON document on the Lease (annotation
`gpuwarden.io/controller-state`): it is written by the same guarded PUTs, and read by whoever
acquires the Lease next.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from gpuwarden.kube.errors import KubeError
from gpuwarden.parsers.wallclock import format_rfc3339

STATE_ANNOTATION = "gpuwarden.io/controller-state"


class Fenced(KubeError):
    """A write refused before it was sent: this instance does not (provably) hold the Lease."""

    def __init__(self, why: str) -> None:
        super().__init__(-1, "Fenced", why)


#: the shortest timeout a Lease or fenced request is sent with (less: not sent)
MIN_REQUEST_S = 0.05


class LeaderElector:
    def __init__(self, kube: Any, namespace: str, name: str, identity: str, lease_duration_s: float = 15.0,
                 renew_deadline_s: float = 10.0, clock: Callable[[], float] = time.time, log: Any = None) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.clock = clock
        self.log = log
        self.observed: tuple = ()  # (holder, renewTime, resourceVersion) last seen
        self.observed_at = 0.0  # local time it last changed
        self.last_renew: float | None = None  # local time our last successful acquire/renew was *sent*
        self.holder = ""  # the holder as last seen
        self.acquired_state: str | None = None  # the state annotation found when we acquired
        self.transitions = 0
        self.stepped_down = False  # we lost our own Lease: our record counts as another holder's
        self.step_downs = 0
        self.stepped_down_at: float | None = None  # local time of the last step-down
        self.mine: dict | None = None  # the Lease as our last successful write left it (renew: PUT it)
        self.rtt = 0.0  # how long our last Lease request took (a timed-out one: at least its timeout)
        self.renewals = 0  # successful acquires and renewals
        self.sent_at: list[float] = []  # local times renewal requests were sent (the last 64)
        self.fenced = 0  # writes refused by the fence

    # -- queries -----------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        last = self.last_renew
        return last is not None and self.clock() - last < self.renew_deadline_s

    def fence(self) -> float:
        """Before a write of an action: the seconds it may take (until the renew deadline), or Fenced."""
        last = self.last_renew
        left = (last + self.renew_deadline_s - self.clock()) if last is not None else -1.0
        if left < MIN_REQUEST_S:
            self.fenced += 1
            raise Fenced(f"{self.identity} does not hold the Lease {self.namespace}/{self.name} within its renew "
                         f"deadline ({self.renew_deadline_s:g}s): write not sent")
        return left

    # -- acquire / renew ---------------------------------------------------------------------------
    def try_acquire_or_renew(self, state: str | None = None) -> bool:
        """One attempt; True when we hold the Lease afterwards. Never raises on API errors."""
        now = self.clock()
        if self.last_renew is not None:
            left = self.last_renew + self.renew_deadline_s - now
            if left <= 0:
                self._step_down(now, f"not renewed within the renew deadline ({self.renew_deadline_s:g}s)")
            elif left < max(self.rtt / 2, MIN_REQUEST_S):
                self._step_down(now, f"{left:.2f}s left of the renew deadline, less than half the last Lease "
                                     f"request took ({self.rtt:.2f}s): a renewal sent now would land after it "
                                     f"(not sent)")
        if self.last_renew is not None and self.mine is not None:
            done = self._renew(now, state)
            if done is not None:
                return done
        try:
            lease = self._call(lambda budget: self.kube.get_lease(self.namespace, self.name, **budget))
        except KubeError as exc:
            return self._failed(f"cannot read the Lease: {exc}")
        if lease is None:
            return self._create(now, state)
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), meta.get("resourceVersion"))
        if record != self.observed:
            self.observed, self.observed_at = record, now
        self.holder = holder
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        if holder and (holder != self.identity or self.stepped_down) and self.observed_at + duration > now:
            self.last_renew = self.mine = None
            return False
        was_mine = holder == self.identity and not self.stepped_down
        new_spec = dict(spec)
        new_spec.update({"holderIdentity": self.identity, "leaseDurationSeconds": int(round(self.lease_duration_s)),
                         "renewTime": format_rfc3339(now, 6)})
        if not was_mine:
            new_spec["acquireTime"] = format_rfc3339(now, 6)
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": dict(meta), "spec": new_spec}
        if state is not None:
            body["metadata"]["annotations"] = {**(meta.get("annotations") or {}), STATE_ANNOTATION: state}
        if self.last_renew is not None and self.last_renew + self.renew_deadline_s - self.clock() < MIN_REQUEST_S:
            return self._failed("the renew deadline passed while reading the Lease")
        now = self.clock()  # the write proves the Lease from when it is sent, not from the read before it
        try:
            out = self._call(lambda budget: self.kube.replace_lease(self.namespace, self.name, body, **budget), sent=True)
        except KubeError as exc:
            if exc.conflict:  # someone else wrote it between our read and write
                self.last_renew = self.mine = None
                return False
            return self._failed(f"cannot write the Lease: {exc}")
        if not was_mine:
            self.acquired_state = (meta.get("annotations") or {}).get(STATE_ANNOTATION)
            self.transitions += 1
            if self.log:
                self.log.info("leader-acquired", lease=f"{self.namespace}/{self.name}", identity=self.identity,
                              previous=holder or None)
        self._took(out, now)
        return True

    def _renew(self, now: float, state: str | None) -> bool | None:
        """The leader's renewal: PUT the Lease we last wrote. None: refused with 409 (read it, then)."""
        mine = self.mine or {}
        meta = dict(mine.get("metadata") or {})
        meta.pop("managedFields", None)
        if state is not None:
            meta["annotations"] = {**(meta.get("annotations") or {}), STATE_ANNOTATION: state}
        spec = {**(mine.get("spec") or {}), "renewTime": format_rfc3339(now, 6)}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
        try:
            out = self._call(lambda budget: self.kube.replace_lease(self.namespace, self.name, body, **budget), sent=True)
        except KubeError as exc:
            if exc.conflict:
                self.mine = None
                return None
            return self._failed(f"cannot renew the Lease: {exc}")
        self._took(out, now)
        return True

    def _call(self, request: Callable[[dict], Any], sent: bool = False) -> Any:
        """One Lease request within what is left of the renew deadline (acquiring: the client's own
        timeout); its duration is kept (`rtt`) to decide whether the next renewal can make it."""
        budget: dict = {}
        if self.last_renew is not None:
            budget["timeout"] = self.last_renew + self.renew_deadline_s - self.clock()
        t0 = time.monotonic()
        if sent:
            self.sent_at = (self.sent_at + [self.clock()])[-64:]
        try:
            return request(budget)
        finally:
            self.rtt = time.monotonic() - t0

    def _create(self, now: float, state: str | None) -> bool:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if state is not None:
            meta["annotations"] = {STATE_ANNOTATION: state}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(round(self.lease_duration_s)),
                         "acquireTime": format_rfc3339(now, 6), "renewTime": format_rfc3339(now, 6), "leaseTransitions": 0}}
        try:
            out = self.kube.create_lease(self.namespace, body)
        except KubeError as exc:
            if exc.conflict:  # created by another candidate meanwhile
                self.last_renew = self.mine = None
                return False
            return self._failed(f"cannot create the Lease: {exc}")
        self.acquired_state = None
        self.transitions += 1
        if self.log:
            self.log.info("leader-acquired", lease=f"{self.namespace}/{self.name}", identity=self.identity,
                          previous=None)
        self._took(out, now)
        return True

    def _step_down(self, now: float, why: str) -> None:
        self.last_renew = self.mine = None
        self.stepped_down = True
        self.stepped_down_at = now
        self.observed_at = now  # from now on our old record is a foreign one, not yet expired
        self.step_downs += 1
        if self.log:
            self.log.warn("leader-stepped-down", lease=f"{self.namespace}/{self.name}", identity=self.identity,
                          why=why, retake_after_s=self.lease_duration_s)

    def _took(self, lease: dict, now: float) -> None:
        spec = lease.get("spec") or {}
        self.observed = (spec.get("holderIdentity") or "", spec.get("renewTime"),
                         (lease.get("metadata") or {}).get("resourceVersion"))
        self.observed_at = now
        self.holder = self.identity
        self.last_renew = now
        self.mine = lease
        self.renewals += 1
        self.stepped_down = False

    def _failed(self, why: str) -> bool:
        if self.log:
            self.log.warn("lease-error", lease=f"{self.namespace}/{self.name}", error=why,
                          leading=self.is_leader())
        if self.last_renew is not None and not self.is_leader():
            self._step_down(self.clock(), f"{why}; not renewed within the renew deadline "
                                          f"({self.renew_deadline_s:g}s)")
        return self.is_leader()  # still leading until the renew deadline passes

    # -- release -----------------------------------------------------------------------------------
    def release(self, state: str | None = None) -> bool:
        """Give the Lease up if we hold it; True when released."""
        was = self.last_renew is not None
        self.last_renew = self.mine = None
        if not was:
            return False
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return False
            now = self.clock()
            spec = dict(lease.get("spec") or {})
            spec.update({"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": format_rfc3339(now, 6)})
            meta = dict(lease.get("metadata") or {})
            if state is not None:
                meta["annotations"] = {**(meta.get("annotations") or {}), STATE_ANNOTATION: state}
            self.kube.replace_lease(self.namespace, self.name, {"apiVersion": "coordination.k8s.io/v1",
                                                               "kind": "Lease", "metadata": meta, "spec": spec})
        except KubeError as exc:
            if self.log:
                self.log.warn("lease-release-failed", error=str(exc))
            return False
        if self.log:
            self.log.info("leader-released", lease=f"{self.namespace}/{self.name}", identity=self.identity)
        return True
