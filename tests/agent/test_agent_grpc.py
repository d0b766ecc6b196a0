"""The agent's gRPC monitors against real gRPC servers on unix sockets (tests/support/fake_kubelet).

The servers run in processes of their own (Apart): the monitors call gRPC from a forked child, as on
a node, and a child forked from a process that serves gRPC could not."""

from __future__ import annotations

import time

import pytest

from gpuwarden.agent import monitors as mon
from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.history import NodeHistory
from gpuwarden.agent.loop import Agent
from gpuwarden.agent.metrics import AgentMetrics
from gpuwarden.findings import Status
from gpuwarden.grpcapi.client import PodDevices
from gpuwarden.root import HostRoot
from tests.support.agent_nodes import DEVICE_PLUGIN_DIR, POD_RESOURCES_SOCKET, sock, synthetic_node
from tests.support.fake_kubelet import Apart, FakeDevicePlugin, FakePodResources, write_checkpoint
from tests.support.bundles import GPU_UUID

DEADLINE = 0.4


def _value(metrics, name, **labels):
    v = metrics.registry.get_sample_value(name, labels)
    return v


def test_hung_plugin_is_gpu_k8s_001_evidence_within_the_deadline(sock_dir):
    path = sock_dir / "nvidia-gpu.sock"
    h, m = NodeHistory(), AgentMetrics()
    res = mon.MonitorResult()
    with Apart(FakeDevicePlugin, path, [GPU_UUID], hang_on={"GetDevicePluginOptions"}):
        t0 = time.monotonic()
        mon.probe_plugins(HostRoot("/"), str(sock_dir), DEADLINE, h, m, 100.0, res)
        elapsed = time.monotonic() - t0
    assert elapsed < DEADLINE + 0.5
    [f] = res.findings
    assert (f.code, f.status) == ("GPU-K8S-001", Status.CONFIRMED)
    assert res.observed["GPU-K8S-001"] == "bad"
    text = " ".join(str(e) for e in f.evidence)
    assert str(path) in text and "GetDevicePluginOptions" in text and "DEADLINE_EXCEEDED" in text
    assert _value(m, "gpuwarden_probe_timeouts_total", probe="plugin/GetDevicePluginOptions") == 1.0
    assert h.timeouts("plugin/nvidia-gpu.sock", 10)[0] == 1


def test_list_and_watch_is_never_called(sock_dir):
    """A cancelled ListAndWatch leaves a goroutine in the NVIDIA plugin for its lifetime, competing with the
    kubelet's stream for health events: the monitor never opens one (GPA's IDs come from the checkpoint)."""
    write_checkpoint(sock_dir, {"nvidia.com/gpu": [GPU_UUID]})
    res = mon.MonitorResult()
    with Apart(FakeDevicePlugin, sock_dir / "nvidia-gpu.sock", [GPU_UUID], hang_on={"ListAndWatch"}) as p:
        for _ in range(3):
            mon.probe_plugins(HostRoot("/"), str(sock_dir), DEADLINE, NodeHistory(), AgentMetrics(), 1.0, res)
    assert res.findings == [] and res.observed["GPU-K8S-001"] == "good"
    assert "ListAndWatch" not in p.calls and p.calls.count("GetPreferredAllocation") == 3


def test_no_ids_in_the_checkpoint_is_not_evaluated_not_good(sock_dir):
    """Without the kubelet's IDs GetPreferredAllocation is not asked (no guessed ID), and NVML's path
    through the plugin is unchecked: unknown, never good."""
    res = mon.MonitorResult()
    with Apart(FakeDevicePlugin, sock_dir / "nvidia-gpu.sock", [GPU_UUID], hang_on={"GetPreferredAllocation"}) as p:
        mon.probe_plugins(HostRoot("/"), str(sock_dir), DEADLINE, NodeHistory(), AgentMetrics(), 1.0, res)
    assert p.calls == ["GetDevicePluginOptions"] and res.findings == []
    assert res.observed["GPU-K8S-001"] == "unknown"
    [(sock, why)] = res.gpa_not_evaluated.items()
    assert sock.endswith("/nvidia-gpu.sock") and why.startswith("not evaluated:") and "missing" in why


def test_hung_get_preferred_allocation_alone_is_found(sock_dir):
    """The NVIDIA plugin with NVML hung answers options from memory; only GPA hangs."""
    write_checkpoint(sock_dir, {"nvidia.com/gpu": [GPU_UUID]})
    res, m = mon.MonitorResult(), AgentMetrics()
    with Apart(FakeDevicePlugin, sock_dir / "nvidia-gpu.sock", [GPU_UUID], hang_on={"GetPreferredAllocation"}) as p:
        t0 = time.monotonic()
        mon.probe_plugins(HostRoot("/"), str(sock_dir), DEADLINE, NodeHistory(), m, 1.0, res)
        elapsed = time.monotonic() - t0
    assert elapsed < 2 * DEADLINE + 0.5
    [f] = res.findings
    assert (f.code, f.status) == ("GPU-K8S-001", Status.CONFIRMED) and "GetPreferredAllocation" in f.summary
    assert res.observed["GPU-K8S-001"] == "bad" and p.calls[-1] == "GetPreferredAllocation"
    assert _value(m, "gpuwarden_probe_timeouts_total", probe="plugin/GetPreferredAllocation") == 1.0


def test_get_preferred_allocation_is_not_asked_of_a_plugin_without_it(sock_dir):
    res = mon.MonitorResult()
    with Apart(FakeDevicePlugin, sock_dir / "nvidia-gpu.sock", [GPU_UUID], hang_on={"GetPreferredAllocation"},
                          get_preferred_allocation_available=False) as p:
        mon.probe_plugins(HostRoot("/"), str(sock_dir), DEADLINE, NodeHistory(), AgentMetrics(), 1.0, res)
    assert res.findings == [] and "GetPreferredAllocation" not in p.calls


def test_answering_plugin_is_a_good_observation(sock_dir):
    """Device health comes from the kubelet's checkpoint (RegisteredDevices: the healthy ones), not the plugin."""
    write_checkpoint(sock_dir, {"nvidia.com/gpu": [GPU_UUID], "nvidia.com/mig-1g.10gb": []},
                     [("uid-1", "c", "nvidia.com/gpu", ["GPU-dead"])])
    res, m = mon.MonitorResult(), AgentMetrics()
    with Apart(FakeDevicePlugin, sock_dir / "nvidia-gpu.sock", [GPU_UUID, ("GPU-dead", "Unhealthy")]) as p:
        mon.probe_plugins(HostRoot("/"), str(sock_dir), 2.0, NodeHistory(), m, 1.0, res)
    assert res.findings == [] and res.observed["GPU-K8S-001"] == "good"
    assert p.calls == ["GetDevicePluginOptions", "GetPreferredAllocation"]
    assert res.registered == {"nvidia.com/gpu": (GPU_UUID,), "nvidia.com/mig-1g.10gb": ()}
    assert _value(m, "gpuwarden_plugin_devices", resource="nvidia.com/gpu") == 1.0
    assert _value(m, "gpuwarden_plugin_devices", resource="nvidia.com/mig-1g.10gb") == 0.0
    assert _value(m, "gpuwarden_probe_duration_seconds_count", probe="plugin/GetPreferredAllocation") == 1.0
    assert _value(m, "gpuwarden_probe_duration_seconds_count", probe="plugin/ListAndWatch") is None


def test_no_plugin_socket_is_unknown_not_good(sock_dir):
    res = mon.MonitorResult()
    mon.probe_plugins(HostRoot("/"), str(sock_dir), DEADLINE, NodeHistory(), AgentMetrics(), 1.0, res)
    assert res.observed["GPU-K8S-001"] == "unknown"


def test_the_calls_are_made_in_a_child_never_in_the_agents_process(sock_dir, monkeypatch):
    """grpc's core, threads and allocations stay out of the agent (its RSS grew with them, docs/performance.md
    §11): every RPC of both monitors runs in the forked child, which inherits this recorder; the
    agent's own list stays empty while the answers come back."""
    import os

    from gpuwarden.grpcapi import client

    write_checkpoint(sock_dir, {"nvidia.com/gpu": [GPU_UUID]})
    here: list[int] = []
    real = client.rpc_method

    def recorded(*a, **k):
        here.append(os.getpid())
        return real(*a, **k)

    monkeypatch.setattr(client, "rpc_method", recorded)
    res, m = mon.MonitorResult(), AgentMetrics()
    rows = [PodDevices("ml", "trainer-0", "trainer", "nvidia.com/gpu", (GPU_UUID,))]
    with Apart(FakeDevicePlugin, sock_dir / "nvidia-gpu.sock", [GPU_UUID]) as p, \
            Apart(FakePodResources, sock_dir / "pr.sock", rows) as pr:
        mon.kubelet_grpc(HostRoot("/"), str(sock_dir), str(sock_dir / "pr.sock"), 2.0, NodeHistory(), m, 1.0, res)
    assert p.calls == ["GetDevicePluginOptions", "GetPreferredAllocation"] and pr.calls == ["List"]
    assert res.observed["GPU-K8S-001"] == "good" and res.allocations == rows and res.errors == []
    assert here == []


def test_a_child_killed_at_its_deadline_is_not_observed_never_a_verdict(sock_dir, monkeypatch):
    """Each call has its own deadline, and a timeout there is evidence; a child that outlives all of
    them (stuck anywhere else) is killed: nothing observed this check, said as an error line."""
    monkeypatch.setattr(mon, "_ask", lambda *a: time.sleep(3600))  # the forked child inherits it
    res = mon.MonitorResult()
    with Apart(FakeDevicePlugin, sock_dir / "nvidia-gpu.sock", [GPU_UUID]) as p:
        t0 = time.monotonic()
        mon.kubelet_grpc(HostRoot("/"), str(sock_dir), None, 0.2, NodeHistory(), AgentMetrics(), 1.0, res)
        elapsed = time.monotonic() - t0
    assert elapsed < 2 * 0.2 + 1.0 + 1.0 and p.calls == []
    assert res.findings == [] and res.observed["GPU-K8S-001"] == "unknown"
    [err] = res.errors
    assert err.startswith("kubelet gRPC probe: timeout") and "not observed" in err


@pytest.mark.rule("GPU-DRV-006", "positive")
def test_repeated_timeouts_the_latest_included_are_a_confirmed_hang():
    h = NodeHistory()
    for i, s in enumerate(["timeout", "ok", "timeout", "ok", "timeout"]):
        h.record_probe("plugin/nvidia-gpu.sock", i, s)
        h.record_probe("nvml", i, s)
    res = mon.MonitorResult()
    mon.repeated_timeouts(h, 3, 10, res)
    assert sorted((f.code, f.status) for f in res.findings) == [("GPU-DRV-006", Status.CONFIRMED),
                                                                ("GPU-K8S-001", Status.CONFIRMED)]
    assert "timed out in 3 of the last 5 checks, the latest included" in res.findings[0].summary
    res2 = mon.MonitorResult()
    mon.repeated_timeouts(h, 4, 10, res2)
    assert res2.findings == []


@pytest.mark.rule("GPU-DRV-006", "negative")
def test_timeouts_are_no_verdict_once_the_latest_probe_answered_or_below_k():
    h = NodeHistory()
    for i, s in enumerate(["timeout", "timeout", "timeout", "ok"]):
        h.record_probe("nvml", i, s)
    res = mon.MonitorResult()
    mon.repeated_timeouts(h, 3, 10, res)
    assert res.findings == [] and res.observed == {}  # the rule's own observation (good) counts towards clearing
    h2 = NodeHistory()
    for i, s in enumerate(["ok", "timeout", "ok", "timeout"]):
        h2.record_probe("nvml", i, s)
    mon.repeated_timeouts(h2, 3, 10, res)
    assert res.findings == []
    # K of the last N only: older timeouts outside the window do not count
    h3 = NodeHistory()
    for i, s in enumerate(["timeout", "timeout", "ok", "ok", "timeout"]):
        h3.record_probe("nvml", i, s)
    mon.repeated_timeouts(h3, 3, 3, res)
    assert res.findings == []


def test_the_confirmed_repeat_replaces_the_rules_one_timeout_at_risk():
    from gpuwarden.findings import Evidence as E

    rule_f = mon.make_finding("GPU-DRV-006", Status.AT_RISK, "once", evidence=[E("probe nvml", "timeout")],
                              severity=mon.Severity.HIGH)
    h = NodeHistory()
    for i in range(3):
        h.record_probe("nvml", i, "timeout")
    res = mon.MonitorResult()
    mon.repeated_timeouts(h, 3, 10, res)
    findings = [rule_f]
    mon.merge_into(findings, res.findings[0])
    [f] = findings
    assert f.status == Status.CONFIRMED and E("probe nvml", "timeout") in f.evidence


def _agent(root, **kw):
    cfg = AgentConfig(node_name="n1", kube=False, listen="", probes=False, boot_grace_s=0,
                      grpc_timeout_s=DEADLINE, **kw)
    return Agent(cfg, root=root, log=_Quiet())


class _Quiet:
    def info(self, *a, **k): ...
    warn = error = info


def test_agent_on_a_synthetic_node_with_a_hung_plugin(node_dir):
    root = synthetic_node(node_dir / "root", "healthy")
    with Apart(FakeDevicePlugin, sock(root, f"{DEVICE_PLUGIN_DIR}/nvidia-gpu.sock"), [GPU_UUID],
                          hang_on={"GetDevicePluginOptions"}):
        a = _agent(HostRoot(str(root)))
        r1 = a.check()
        r2 = a.check()
    assert "GPU-K8S-001" in {f.code for f in r1.findings}
    assert r2.transitions.get("GPU-K8S-001") == "raised"
    assert r2.conditions["GPUDevicePlugin"] is True
    assert r1.duration_s < 2 * DEADLINE + 3


def test_pod_resources_mapping_feeds_history_and_metrics(node_dir):
    root = synthetic_node(node_dir / "root", "healthy")
    rows = [PodDevices("ml", "trainer-0", "trainer", "nvidia.com/gpu", (GPU_UUID,))]
    with Apart(FakePodResources, sock(root, POD_RESOURCES_SOCKET), rows), \
            Apart(FakeDevicePlugin, sock(root, f"{DEVICE_PLUGIN_DIR}/nvidia-gpu.sock"), [GPU_UUID]):
        a = _agent(HostRoot(str(root)))
        r = a.check()
    # (a materialised tree's /dev/nvidia-uvm has the ctime of its mknod, after the plugin's start:
    # GPU-DEV-001 at-risk is expected there; nothing is confirmed)
    assert [f.code for f in r.findings if f.status == Status.CONFIRMED] == []
    assert r.observed["GPU-K8S-001"] == "good"
    m = a.metrics
    assert _value(m, "gpuwarden_gpu_allocation", resource="nvidia.com/gpu", device_id=GPU_UUID, namespace="ml",
                  pod="trainer-0", container="trainer") == 1.0
    [series] = [s for k, s in a.history.containers.items() if k.container == "trainer"]
    assert series[-1].gpus == (GPU_UUID,)
    assert a.history.gpu_holders(GPU_UUID)[-1][1] == ("ml/trainer-0/trainer",)
    assert a.history.gpus[GPU_UUID][-1].health == "Healthy"  # registered in the example's checkpoint
    assert _value(m, "gpuwarden_container_device_access", namespace="ml", pod="trainer-0", container="trainer",
                  device="/dev/nvidiactl") == 1.0
