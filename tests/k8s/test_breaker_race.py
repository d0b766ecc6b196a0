"""The agents' breaker holds at every speed (issue 45 item 2), against the real test API server.

In the fleet simulator (1,500 nodes, 750 failing at a 2 s interval) the breaker opened at 29.6 s and
one taint PATCH was still sent after it: the agent read the breaker once before its plan's actions,
then read the Node and sent its PATCH, and the breaker opened in between. Now each write of an action
passes the breaker's gate right before it is sent (remediation/breaker.py `Gate`).

The race is made certain here: many agents' executors fence at once, each held after it read the
breaker (closed) and its Node, i.e. with its decision taken. Half are let go before the breaker
opens: they taint. The breaker opens; the other half are let go: none sends its PATCH.
"""

from __future__ import annotations

import threading
import time

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.kube.client import Kube
from gpuwarden.remediation.executor import Executor
from gpuwarden.remediation.plan import Action, RemediationPlan, Target
from tests.support.agent_kube import make_node

pytestmark = pytest.mark.apiserver

FENCES = 32
KEY = "gpuwarden.io/unhealthy"


class HeldKube(Kube):
    """An agent's client whose read of its Node is held (the decision taken, the PATCH not sent yet)
    until `go` is set; `arrived` counts the held ones. `sent`: when its node PATCH left (0: none did)."""

    arrived: threading.Semaphore
    go: threading.Event
    sent = 0.0

    def get_node(self, name: str) -> dict:
        node = super().get_node(name)
        self.arrived.release()
        assert self.go.wait(60), "never let go"
        return node

    def patch_node(self, name: str, patch, content_type: str = "") -> dict:
        asked = time.time()
        out = super().patch_node(name, patch, content_type or "application/strategic-merge-patch+json")
        # it was sent (answered): when it left, past any gate (else: when it was asked, which is earlier)
        self.sent = max(asked, getattr(self, "last_write_sent", 0.0))
        return out


def _fence(node: str) -> RemediationPlan:
    return RemediationPlan(node, [Action("taint-node", Target("Node", node), "GPU-DRV-001", "the NVIDIA driver is gone",
                                         {"taint": {"key": KEY, "value": "driver", "effect": "NoSchedule"}})])


def test_fences_racing_the_breaker_none_is_sent_after_it_opens(k8s, kube):
    names = [k8s.name("race") for _ in range(FENCES)]
    for n in names:
        make_node(kube, n)
    arrived = threading.Semaphore(0)
    before, after = threading.Event(), threading.Event()
    runs = []
    for i, n in enumerate(names):
        kb = HeldKube(k8s.server.api_client())
        kb.arrived, kb.go = arrived, (before if i % 2 == 0 else after)
        cfg = AgentConfig(node_name=n, namespace=k8s.namespace, remediate="on", rate_burst=3)
        runs.append((n, kb, Executor(kb, cfg)))
    results: dict[str, list] = {}

    def one(n: str, kb: HeldKube, ex: Executor) -> None:
        results[n] = ex.execute(_fence(n), "on")

    threads = [threading.Thread(target=one, args=r, daemon=True) for r in runs]
    for t in threads:
        t.start()
    for _ in range(FENCES):  # every fence read the breaker (closed) and its Node: decided, not sent
        assert arrived.acquire(timeout=60)
    before.set()
    first = [t for i, t in enumerate(threads) if i % 2 == 0]
    for t in first:
        t.join(60)
    kube.create_configmap(k8s.namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "gpuwarden-breaker"},
                                          "data": {"open": "true", "reason": "fence storm (test)"}})
    t_open = time.time()  # the opening is acknowledged: stored
    after.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)

    sent = {n: kb.sent for n, kb, _ in runs if kb.sent}
    late = {n: round(t - t_open, 3) for n, t in sent.items() if t >= t_open}
    assert late == {}, f"fence PATCHes sent after the breaker opened: {late}"
    outcome = {n: [o.result for o in results[n]] for n in names}
    assert all(outcome[n] == ["done"] for n in names[0::2]), outcome
    assert all(outcome[n] == ["breaker-open"] for n in names[1::2]), outcome
    assert all("the breaker opened before this write was sent" in results[n][0].detail for n in names[1::2])
    tainted = {n for n in names if any(t.get("key") == KEY for t in (kube.get_node(n).get("spec") or {}).get("taints") or [])}
    assert tainted == set(names[0::2])
    # refused before it was sent: the token goes back, no cooldown, so the fence is done once the breaker closes
    n, kb, ex = runs[1]
    assert ex.buckets["taint-node"].available() and ex.cooldowns.remaining("taint-node", f"node/{n}") == 0
    kube.patch_configmap(k8s.namespace, "gpuwarden-breaker", {"data": {"open": "false"}})
    assert [o.result for o in ex.execute(_fence(n), "on")] == ["done"]
