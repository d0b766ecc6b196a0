"""Whole checks of the agent without an API server: examples, drift, memory growth, grace, HTTP."""

from __future__ import annotations

import re
import shutil
import types
import urllib.error
import urllib.request

from gpuwarden.agent import monitors as mon
from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.history import NodeHistory
from gpuwarden.agent.loop import Agent
from gpuwarden.agent.metrics import AgentMetrics
from gpuwarden.examples import HERE as EXAMPLES, open_example
from gpuwarden.findings import Status
from gpuwarden.root import HostRoot
from tests.support.agent_nodes import synthetic_node


class Quiet:
    def info(self, *a, **k): ...
    warn = error = info


class Clock:
    def __init__(self, t=1_800_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def agent(root, clock=None, **kw):
    base = dict(node_name="gpu-node-a", kube=False, listen="", probes=False, grpc=False, boot_grace_s=0)
    base.update(kw)
    return Agent(AgentConfig(**base), root=root, clock=clock or Clock(), log=Quiet())


def test_uvm_missing_example_raises_after_debounce_and_sets_metrics():
    a = agent(open_example("uvm-missing"))
    r1 = a.check()
    assert [f.code for f in r1.findings] == ["GPU-DEV-001"] and r1.transitions == {}
    assert r1.conditions["GPUDeviceAccess"] is False
    r2 = a.check()
    assert r2.transitions == {"GPU-DEV-001": "raised"}
    assert r2.conditions == {"GPUDeviceAccess": True, "GPUDriver": False, "GPUDevicePlugin": False,
                             "GPUUnchargedMemory": False, "GPUHardware": False}
    assert a.check().transitions == {}  # raised once per debounce
    text = a.metrics.exposition().decode()
    assert 'gpuwarden_findings{code="GPU-DEV-001",family="device-access",gpu="",severity="high",status="confirmed"} 1.0' in text
    assert 'gpuwarden_fault_raised{code="GPU-DEV-001"} 1.0' in text
    assert 'gpuwarden_node_condition{type="GPUDeviceAccess"} 1.0' in text
    assert re.search(r'gpuwarden_container_device_access\{container="trainer",device="/dev/nvidia-uvm",'
                     r'namespace="ml",pod="trainer-0"\} 0\.0', text)
    assert "gpuwarden_check_duration_seconds_count 3.0" in text


def test_healthy_example_raises_nothing():
    a = agent(open_example("healthy"))
    for _ in range(3):
        r = a.check()
    assert r.findings == [] and not any(r.conditions.values())
    assert r.observed["GPU-DEV-001"] == "good"


def test_not_evaluated_keeps_a_raised_fault():
    a = agent(open_example("uvm-missing"), debounce_raise=1, debounce_clear=1)
    assert a.check().transitions == {"GPU-DEV-001": "raised"}
    a.root = open_example("healthy")
    a.root.listdir = lambda p: __import__("gpuwarden.root", fromlist=["Missing"]).Missing(p, "denied")  # blind
    r = a.check()
    assert r.observed["GPU-DEV-001"] == "unknown"
    assert r.transitions == {} and r.conditions["GPUDeviceAccess"] is True
    a.root = open_example("healthy")
    assert a.check().transitions == {"GPU-DEV-001": "cleared"}


def test_boot_grace_raises_nothing(tmp_path):
    # the example's /proc/stat btime says how long before capture the node booted
    from gpuwarden.agent.loop import node_uptime
    from gpuwarden.facts import NodeFacts

    up = node_uptime(NodeFacts(open_example("uvm-missing")))
    assert up is not None and up > 0
    a = agent(open_example("uvm-missing"), boot_grace_s=up + 60)
    for _ in range(3):
        r = a.check()
        assert r.in_grace and r.transitions == {}
    b = agent(open_example("uvm-missing"), boot_grace_s=max(1.0, up - 60))
    b.check()
    assert b.check().transitions == {"GPU-DEV-001": "raised"}


def test_drift_allowed_at_first_sight_denied_now(node_dir):
    root = synthetic_node(node_dir / "root", "healthy")
    clock = Clock()
    a = agent(HostRoot(str(root)), clock=clock, select=["GPU-DEV-002", "GPU-DEV-003"])
    assert a.check().findings == []
    clock.t += 60
    a.check()
    # kubelet's static CPU manager runs `runc update`: overlay incident 3's files (devices.list, kubelet config)
    shutil.copytree(EXAMPLES / "cpu-manager-device-loss" / "files", root, dirs_exist_ok=True)
    clock.t += 60
    r = a.check()
    [f] = [f for f in r.findings if f.code == "GPU-DEV-002"]
    assert f.status == Status.CONFIRMED
    drift = f.data["drift"]
    assert {"/dev/nvidiactl", "/dev/nvidia0"} <= {d["device"] for d in drift}
    assert all(d["first_seen"] == 1_800_000_000.0 and d["last_allowed"] == 1_800_000_060.0
               and d["denied_since"] == 1_800_000_120.0 for d in drift)
    text = " ".join(str(e) for e in f.evidence)
    assert "allowed when first seen 2027-01-15T08:00:00Z" in text and "cpuManagerPolicy=static" in text


def test_memory_metrics_read_the_memory_section_defensively():
    m = AgentMetrics()
    esc = types.SimpleNamespace(gap=11 << 30, trend=types.SimpleNamespace(rate=(2 << 30) / 60))
    mon.memory_growth(types.SimpleNamespace(maybe=lambda n: types.SimpleNamespace(escape=esc)), m)
    assert m.registry.get_sample_value("gpuwarden_uncharged_memory_bytes") == float(11 << 30)
    assert m.registry.get_sample_value("gpuwarden_uncharged_memory_growth_bytes_per_second") == (2 << 30) / 60
    # no memory section, or one without the attribute: skipped, never an error
    mon.memory_growth(types.SimpleNamespace(maybe=lambda n: None), m)
    mon.memory_growth(types.SimpleNamespace(maybe=lambda n: object()), m)


def test_memory_growth_on_a_synthetic_node(node_dir):
    """The agent's MemoryHistory gives GPU-NODE-001 the growth rate: slow growth below the floor stays quiet,
    fast growth is raised with its rate and the time to the min watermark."""
    root = synthetic_node(node_dir / "root", "healthy")
    meminfo = root / "proc/meminfo"
    text = meminfo.read_text()
    free = int(re.search(r"MemFree:\s+(\d+)", text).group(1))
    avail = int(re.search(r"MemAvailable:\s+(\d+)", text).group(1))
    clock = Clock()
    a = agent(HostRoot(str(root)), clock=clock, select=["GPU-NODE"], memory_growth_window_s=300)
    raised, taken = None, 0

    def step(kib: int) -> object:
        nonlocal taken
        taken += kib
        meminfo.write_text(re.sub(r"MemAvailable:\s+\d+", f"MemAvailable: {avail - taken}",
                                  re.sub(r"MemFree:\s+\d+", f"MemFree: {free - taken}", text)))
        r = a.check()
        clock.t += 60
        return r

    for _ in range(12):  # 128 MiB/min for 12 min: below the rate and, at 1.5 GiB, below the 4 GiB floor
        r = step(128 << 10)
        raised = raised or r.transitions.get("GPU-NODE-001")
    assert raised is None
    for _ in range(8):  # 2 GiB/min
        r = step(2 << 20)
        raised = raised or r.transitions.get("GPU-NODE-001")
    assert raised == "raised"
    [f] = [f for f in r.findings if f.code == "GPU-NODE-001"]
    assert f.status == Status.AT_RISK and "growing 2.0 GiB/min" in f.summary
    assert "MemAvailable reaches the min watermark in" in f.summary
    assert a.metrics.registry.get_sample_value("gpuwarden_uncharged_memory_growth_bytes_per_second") > (1 << 30) / 60


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_healthz_readyz():
    a = agent(open_example("uvm-missing"), listen="127.0.0.1:0")
    a.start()
    try:
        base = f"http://{a.server.address}"
        assert _get(base + "/readyz")[0] == 503  # no successful check yet
        assert _get(base + "/healthz")[0] == 200
        a.check()
        assert _get(base + "/readyz") == (200, "ok\n")
        code, body = _get(base + "/metrics")
        assert code == 200 and "gpuwarden_findings{" in body and "gpuwarden_checks_total" in body
        assert _get(base + "/nope")[0] == 404
    finally:
        a.server.stop()


def test_a_taken_port_is_a_start_up_error():
    """--listen on a port another process holds: exit 2 at start, saying so, before any check or API write."""
    import socket

    from click.testing import CliRunner

    from gpuwarden.cli import main

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = CliRunner().invoke(main, ["agent", "--example", "uvm-missing", "--no-kube", "--cycles", "1",
                                      "--listen", f"127.0.0.1:{port}", "--log-format", "text"])
    assert r.exit_code == 2, r.output
    assert "msg=start-failed" in r.stderr and f"127.0.0.1:{port}" in r.stderr and "in use" in r.stderr
    assert "msg=check " not in r.stderr and "[would write]" not in r.stdout  # nothing checked, nothing written


def test_a_free_port_serves():
    from click.testing import CliRunner

    from gpuwarden.cli import main

    r = CliRunner().invoke(main, ["agent", "--example", "healthy", "--no-kube", "--cycles", "1", "--listen",
                                  "127.0.0.1:0", "--log-format", "text"])
    assert r.exit_code == 0 and "msg=serving" in r.stderr and "start-failed" not in r.stderr
