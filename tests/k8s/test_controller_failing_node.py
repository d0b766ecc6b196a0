"""The other cascade, played against the real test API server: a node whose device plugin lost its GPUs
(Xid 79) still looks schedulable; each GPU pod the scheduler binds there fails admission
(UnexpectedAdmissionError) and its ReplicaSet makes another. The test plays the ReplicaSet (replaces
failed pods), the scheduler (binds to the first node whose taints the pod does not have to tolerate)
and the kubelets (the sick node refuses every pod at admission; the others run them); gpuwarden's
agent on the sick node has raised GPUDevicePlugin.
"""

from __future__ import annotations

import time
import uuid

import pytest

from gpuwarden.parsers.wallclock import format_rfc3339
from tests.k8s.controller_world import Cluster

pytestmark = pytest.mark.apiserver

ALLOCATE_FAILED = ("Allocate failed due to rpc error: code = Unknown desc = device 'GPU-7f2c' is unhealthy, "
                   "which is unexpected")
PLUGIN_CONDITION = {"type": "GPUDevicePlugin", "status": "True", "reason": "GpuHw002",
                    "message": "GPU-HW-002: GPU 0000:1b:00.0 fell off the bus (Xid 79)",
                    "lastHeartbeatTime": format_rfc3339(time.time()), "lastTransitionTime": format_rfc3339(time.time())}


class World:
    """The ReplicaSet, the scheduler and the kubelets, played step by step."""

    def __init__(self, c: Cluster, sick: str) -> None:
        self.c, self.sick = c, sick
        self.failed: list[str] = []
        self.running: list[str] = []

    def schedule(self) -> str:
        for n in self.c.nodes:
            taints = self.c.v1.read_node(n).spec.taints or []
            if not any(t.effect == "NoSchedule" for t in taints):
                return n
        raise AssertionError("no schedulable node")

    def replace_one(self) -> str:
        """The ReplicaSet creates a pod; the scheduler binds it; the node's kubelet admits or refuses it."""
        node = self.schedule()
        name = f"{self.c.prefix}-{uuid.uuid4().hex[:5]}"
        self.c.v1.create_namespaced_pod(self.c.ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": self.c.labels, "ownerReferences": [self.c.owner]},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example/train:1",
                                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        if node == self.sick:
            self.c.v1.patch_namespaced_pod_status(name, self.c.ns, {"status": {
                "phase": "Failed", "reason": "UnexpectedAdmissionError", "message": ALLOCATE_FAILED}})
            self.failed.append(name)
        else:
            self.c.v1.patch_namespaced_pod_status(name, self.c.ns, {"status": {"phase": "Running"}})
            self.running.append(name)
        return node


def test_a_node_that_fails_every_pod_is_named_explained_and_tainted(k8s):
    c = Cluster(k8s)
    c.deployment("trainer", replicas=4)
    sick, healthy = c.nodes[0], c.nodes[1]
    c.v1.patch_node_status(sick, {"status": {"conditions": [PLUGIN_CONDITION]}})
    ctl = c.controller("ctl-a", execute=True, actions=["workload", "node"])
    w = World(c, sick)

    for _ in range(9):  # fewer failures than admission_failures (10): nothing yet
        assert w.replace_one() == sick
    assert [d for d in ctl.step() if d.kind == "failing-node"] == []
    for _ in range(3):
        w.replace_one()
    (d,) = [d for d in ctl.step() if d.kind == "failing-node"]
    assert d.subject == sick and d.outcomes[0].result == "done"
    taints = c.v1.read_node(sick).spec.taints
    assert [(t.key, t.value, t.effect) for t in taints] == [("gpuwarden.io/quarantine", "admission", "NoSchedule")]
    assert c.v1.read_node(healthy).spec.taints in (None, [])
    # the Event names the node, the failures, and the cause gpuwarden's agent reported there
    [ev] = c.v1.list_namespaced_event(ctl.cfg.namespace, field_selector="reason=NodeFailsEveryPod").items
    assert ev.involved_object.kind == "Node" and ev.involved_object.name == sick
    assert f"node {sick} failed 12 of the 12 pods sent to it" in ev.message
    assert "UnexpectedAdmissionError: Allocate failed" in ev.message
    assert "GPUDevicePlugin=GpuHw002 (GPU-HW-002: GPU 0000:1b:00.0 fell off the bus (Xid 79))" in ev.message
    assert f"replicaset/{c.ns}/{c.prefix}" in ev.message
    assert "spares ~" in ev.message and f"kubectl taint node {sick} gpuwarden.io/quarantine-" in ev.message

    # the scheduler now sends the replacements elsewhere, where they run
    for _ in range(4):
        assert w.replace_one() == healthy
    # ten minutes on, the controller says how many pods the taint spared (its rate before, x the time)
    later = time.time() + 600
    ctl.clock = lambda: later
    ctl.reconcile()
    spared = ctl.metrics().decode()
    value = float(next(ln.split()[1] for ln in spared.splitlines() if ln.startswith("gpuwarden_controller_pods_spared ")))
    assert value >= 12 * 9  # >= 12 failed pods a minute (one minute floor on the span) x ~10 minutes
    assert len(c.v1.list_namespaced_event(ctl.cfg.namespace, field_selector="reason=NodeFailsEveryPod").items) == 1


def test_a_few_failures_or_a_dry_run_taint_nothing(k8s):
    c = Cluster(k8s)
    c.deployment("trainer", replicas=2)
    sick = c.nodes[0]
    dry = c.controller("ctl-a")  # dry run: reported with what would be done
    w = World(c, sick)
    for _ in range(2):
        w.replace_one()
    assert [d for d in dry.step() if d.kind == "failing-node"] == []  # two failures: any node has those
    for _ in range(10):
        w.replace_one()
    (d,) = [d for d in dry.step() if d.kind == "failing-node"]
    assert d.outcomes[0].result == "dry-run"
    assert not c.v1.read_node(sick).spec.taints
    [ev] = c.v1.list_namespaced_event(dry.cfg.namespace, field_selector="reason=NodeFailsEveryPod").items
    assert ev.message.startswith("Dry run: would taint node") and "no gpuwarden agent reports on this node" in ev.message
