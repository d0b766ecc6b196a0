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


# -- a healthy node is never fenced for the workload's own failures (issue 29, item 2) ----------------
RUNC = "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: "
EXEC_FAILED = {"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": {
    "reason": "StartError", "exitCode": 128,
    "message": RUNC + 'unable to start container process: exec: "/opt/render.sh": no such file or directory: unknown'}}}]}
HOOK_FAILED = {"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": {
    "reason": "StartError", "exitCode": 128,
    "message": RUNC + "unable to start container process: error during container init: error running hook #0: error "
                      "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: "
                      "initialization error: nvml error: driver not loaded: unknown"}}}]}
CRASHLOOP = {"phase": "Running", "containerStatuses": [{"name": "main", "restartCount": 6, "state": {"waiting": {
    "reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container=main"}}, "lastState": {
    "terminated": {"reason": "StartError", "exitCode": 128, "message": EXEC_FAILED["containerStatuses"][0]["state"]
                   ["terminated"]["message"]}}}]}
IMAGE_PULL = {"phase": "Pending", "containerStatuses": [{"name": "main", "state": {"waiting": {
    "reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example/render:1"'}}}]}
OOM = {"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": {"reason": "OOMKilled",
                                                                                          "exitCode": 137}}}]}
CLEAR = {"type": "GPUDevicePlugin", "status": "False", "reason": "GpuOk", "message": "no GPU problem found",
         "lastHeartbeatTime": format_rfc3339(time.time()), "lastTransitionTime": format_rfc3339(time.time() - 3600)}


class Burst:
    """A workload's controller making pods, bound round-robin over `nodes`, each ending as `outcome(node, i)`."""

    def __init__(self, c: Cluster, nodes: list[str]) -> None:
        self.c, self.nodes, self.i = c, nodes, 0

    def pods(self, n: int, outcome) -> None:
        for _ in range(n):
            node = self.nodes[self.i % len(self.nodes)]
            name = f"{self.c.prefix}-{uuid.uuid4().hex[:5]}"
            self.c.v1.create_namespaced_pod(self.c.ns, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": self.c.labels, "ownerReferences": [self.c.owner]},
                "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "registry.example/render:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
            self.c.v1.patch_namespaced_pod_status(name, self.c.ns, {"status": outcome(node, self.i)})
            self.i += 1


def _agents_report_healthy(c: Cluster) -> None:
    for n in c.nodes:
        c.v1.patch_node_status(n, {"status": {"conditions": [CLEAR]}})


MIXED = [EXEC_FAILED, CRASHLOOP, IMAGE_PULL, OOM]


@pytest.mark.parametrize("family", ["start-error-job", "crashloop", "image-pull", "mixed"])
@pytest.mark.parametrize("spread", [1, 3], ids=["one-node", "three-nodes"])
def test_a_workloads_own_failures_fence_no_healthy_node(k8s, family, spread):
    c = Cluster(k8s)
    c.job("render")
    _agents_report_healthy(c)
    ctl = c.controller("ctl-a", execute=True, actions=["workload", "node"])
    outcome = {"start-error-job": lambda n, i: EXEC_FAILED, "crashloop": lambda n, i: CRASHLOOP,
               "image-pull": lambda n, i: IMAGE_PULL, "mixed": lambda n, i: MIXED[i % 4]}[family]
    burst = Burst(c, c.nodes[:spread])
    for _ in range(3):  # 30 pods, the controller looking every 10
        burst.pods(10, outcome)
        assert [d for d in ctl.step() if d.kind == "failing-node"] == []
    assert all(not c.v1.read_node(n).spec.taints for n in c.nodes)
    assert c.events("NodeFailsEveryPod", ctl.cfg.namespace) == []


def test_the_gpu_hook_failing_on_one_node_only_fences_that_node(k8s):
    c = Cluster(k8s)
    c.job("render")
    _agents_report_healthy(c)  # the agent has not seen it yet: the runtime's own words suffice
    sick = c.nodes[0]
    ctl = c.controller("ctl-a", execute=True, actions=["workload", "node"])
    burst = Burst(c, c.nodes)
    burst.pods(36, lambda n, i: HOOK_FAILED if n == sick else {"phase": "Running"})
    (d,) = [d for d in ctl.step() if d.kind == "failing-node"]
    assert d.subject == sick and d.outcomes[0].result == "done"
    assert [t.value for t in c.v1.read_node(sick).spec.taints] == ["admission"]
    assert all(not c.v1.read_node(n).spec.taints for n in c.nodes[1:])
    [ev] = c.events("NodeFailsEveryPod", ctl.cfg.namespace)
    assert "nvidia-container-cli: initialization error: nvml error: driver not loaded" in ev.message


def test_the_gpu_hook_failing_everywhere_is_the_workloads(k8s):
    c = Cluster(k8s)
    c.job("render")
    _agents_report_healthy(c)
    ctl = c.controller("ctl-a", execute=True, actions=["workload", "node"])
    Burst(c, c.nodes).pods(36, lambda n, i: HOOK_FAILED)  # e.g. an image asking for a newer driver everywhere
    assert [d for d in ctl.step() if d.kind == "failing-node"] == []
    assert all(not c.v1.read_node(n).spec.taints for n in c.nodes)


def test_a_device_plugin_storm_without_an_agent_fences_and_the_agents_fault_fences_and_clears(k8s):
    c = Cluster(k8s)
    c.job("render")
    _agents_report_healthy(c)
    plugin_down, gpu_lost = c.nodes[0], c.nodes[1]
    refused = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": ALLOCATE_FAILED}
    ctl = c.controller("ctl-a", execute=True, actions=["workload", "node"])
    # gpu_lost: its agent reports the GPU off the bus; the Job's pods die at start there (any reason)
    c.v1.patch_node_status(gpu_lost, {"status": {"conditions": [PLUGIN_CONDITION]}})
    Burst(c, [plugin_down, gpu_lost]).pods(24, lambda n, i: refused if n == plugin_down else EXEC_FAILED)
    found = sorted((d.subject, d.outcomes[0].result) for d in ctl.step() if d.kind == "failing-node")
    assert found == sorted([(plugin_down, "done"), (gpu_lost, "done")])
    assert ctl.history.failing[gpu_lost]["fault"] and not ctl.history.failing[plugin_down]["fault"]

    # the agent's fault clears: the taint it justified is lifted, once; the other stays (nothing says it recovered)
    c.v1.patch_node_status(gpu_lost, {"status": {"conditions": [CLEAR]}})
    (d,) = [d for d in ctl.step() if d.kind == "failing-node-cleared"]
    assert d.subject == gpu_lost and d.outcomes[0].result == "done"
    assert not c.v1.read_node(gpu_lost).spec.taints
    assert "gpuwarden.io/quarantine-holders" not in (c.v1.read_node(gpu_lost).metadata.annotations or {})
    assert [t.value for t in c.v1.read_node(plugin_down).spec.taints] == ["admission"]
    [ev] = c.events("NodeFailsEveryPodCleared", ctl.cfg.namespace)
    assert ev.involved_object.name == gpu_lost and ev.type == "Normal"
    assert [d for d in ctl.step() if d.kind.startswith("failing-node")] == []  # once

    # an operator lifts the other by hand: the records are pruned once their window has passed
    c.v1.patch_node(plugin_down, {"spec": {"taints": []}, "metadata": {"annotations": {
        "gpuwarden.io/quarantine-holders": None}}})
    ctl.step()
    assert ctl.history.failing[plugin_down]["tainted"] is not None  # within its window: kept
    later = time.time() + ctl.cfg.admission_window_s + 60
    ctl.clock = lambda: later
    ctl.reconcile()
    assert ctl.history.failing[plugin_down]["tainted"] is None
    ctl.reconcile()
    assert ctl.history.failing == {}
