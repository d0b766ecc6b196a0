"""Who must never be touched, and how often anything may be done.

Never acted on: control-plane and static pods (mirror-pod annotation, owner kind Node, or a
kube-apiserver/etcd/kube-scheduler/kube-controller-manager component), pods and nodes carrying the
opt-out annotation `gpuwarden.io/no-remediation: "true"`, pods already being deleted, and (unless
allowed) pods with no controller, which nothing would recreate.
"""

from __future__ import annotations

import time
from typing import Callable

from msgspec import Struct, field

OPT_OUT = "gpuwarden.io/no-remediation"
MIRROR = "kubernetes.io/config.mirror"
CONFIG_SOURCE = "kubernetes.io/config.source"
CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager")


def _truthy(v: object) -> bool:
    return str(v).strip().lower() in ("true", "yes", "1")


def protected_pod(pod: dict, allow_unowned: bool = False) -> str | None:
    """Why this pod must not be acted on, or None."""
    md = pod.get("metadata") or {}
    ann = md.get("annotations") or {}
    labels = md.get("labels") or {}
    name = md.get("name", "")
    if _truthy(ann.get(OPT_OUT, "")):
        return f"opted out ({OPT_OUT}: \"true\")"
    if MIRROR in ann:
        return "static pod (mirror pod annotation kubernetes.io/config.mirror)"
    if ann.get(CONFIG_SOURCE) in ("file", "http"):
        return f"static pod (config source {ann.get(CONFIG_SOURCE)})"
    owners = md.get("ownerReferences") or []
    if any(o.get("kind") == "Node" for o in owners):
        return "static pod (owned by the Node)"
    component = labels.get("component") or labels.get("k8s-app") or labels.get("app.kubernetes.io/name") or ""
    if component in CONTROL_PLANE or any(name == c or name.startswith(c + "-") for c in CONTROL_PLANE):
        if md.get("namespace") == "kube-system" or component in CONTROL_PLANE:
            return f"control-plane component ({component or name})"
    if md.get("deletionTimestamp"):
        return "already being deleted"
    if not allow_unowned and not any(o.get("controller") for o in owners):
        return "no controller would recreate it (delete_unowned_pods is off)"
    return None


def protected_node(node: dict) -> str | None:
    ann = ((node.get("metadata") or {}).get("annotations")) or {}
    if _truthy(ann.get(OPT_OUT, "")):
        return f"node opted out ({OPT_OUT}: \"true\")"
    return None


class TokenBucket(Struct):
    """`burst` tokens, refilled at `per_hour`; one token per action."""

    burst: int
    per_hour: float
    clock: Callable[[], float] = time.time
    tokens: float = field(default=-1.0)
    stamp: float = 0.0

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = float(self.burst)
        self.stamp = self.clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.per_hour / 3600.0)
        self.stamp = now

    def available(self) -> bool:
        self._refill()
        return self.tokens >= 1.0

    def take(self) -> bool:
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def give_back(self) -> None:
        """Return a token taken for an action that was not sent after all (the breaker opened meanwhile)."""
        self.tokens = min(float(self.burst), self.tokens + 1.0)


class Cooldowns:
    """Last action time per (action kind, target); in memory, rebuilt from our Events at start."""

    def __init__(self, cooldown_s: float, clock: Callable[[], float] = time.time) -> None:
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.last: dict[tuple[str, str], float] = {}

    def remaining(self, kind: str, target: str) -> float:
        t = self.last.get((kind, target))
        if t is None:
            return 0.0
        return max(0.0, self.cooldown_s - (self.clock() - t))

    def mark(self, kind: str, target: str, at: float | None = None) -> None:
        t = self.clock() if at is None else at
        self.last[(kind, target)] = max(t, self.last.get((kind, target), 0.0))

    def since(self, kind: str, target: str) -> float | None:
        return self.last.get((kind, target))
