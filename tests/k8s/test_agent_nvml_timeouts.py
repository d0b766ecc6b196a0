"""gpuwarden's own slowness never fences a node (issue 32 item 4): the agent's live NVML probe against
the real test API server, through real libraries in the probe child — tools/gpu/nvml_hang_shim.c (nvmlInit
never returns, incident 5) or tests/probes/nvml_fake.c (NVML answers) — switched between checks.

One timeout is GPU-DRV-006 at-risk: no condition, no taint (the dry-run plan is empty). K of the last
N checks timing out, the latest included, is confirmed: GPUDriver=True and the node tainted. The probe
answering again clears it after `debounce_clear` checks, and the taint goes with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.kube.client import Kube
from gpuwarden.root import HostRoot
from tests.support.agent_kube import cleanup_nodes, conditions_of, make_node, new_agent, our_events
from tests.support.agent_nodes import synthetic_node
from tests.support.realplugin import Unavailable, build_shim

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]
TAINT = "gpuwarden.io/unhealthy"
PROBE_S = 0.5


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    out = tmp_path_factory.mktemp("nvml")
    try:
        return {"timeout": str(build_shim(REPO / "tools/gpu/nvml_hang_shim.c", out / "hang", soname="libnvidia-ml.so.1")),
                "ok": str(build_shim(REPO / "tests/probes/nvml_fake.c", out / "ok", soname="libnvidia-ml.so.1"))}
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def kube(k8s):
    kb = Kube(k8s.api)
    yield kb
    cleanup_nodes(kb)


def _check(agent, monkeypatch, libs, probe: str):
    monkeypatch.setenv("GPUWARDEN_NVML_LIBRARY", libs[probe])
    r = agent.check()
    drv = [(f.status.value, f.severity.name) for f in r.findings if f.code == "GPU-DRV-006"]
    return r, drv


def _taints(kube, node):
    return [t["key"] for t in kube.get_node(node)["spec"].get("taints") or []]


def _agent(kube, k8s, node, tmp_path, remediate):
    root = synthetic_node(tmp_path / "root", "healthy")
    return new_agent(kube, node, HostRoot(str(root)), k8s.namespace, remediate=remediate, probes=True,
                     probe_timeout_s=PROBE_S, probe_timeout_repeat=3, probe_timeout_window=5)


@pytest.mark.rule("GPU-DRV-006", "negative")
def test_one_probe_timeout_is_at_risk_and_never_a_taint(kube, k8s, tmp_path, monkeypatch, libs):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    agent, out = _agent(kube, k8s, node, tmp_path, "dry-run")
    seen = [_check(agent, monkeypatch, libs, p) for p in ("ok", "timeout", "ok", "ok", "ok", "ok")]
    assert [d for _, d in seen] == [[], [("at-risk", "HIGH")], [], [], [], []]
    assert "NVML did not answer within" in next(f.summary for f in seen[1][0].findings if f.code == "GPU-DRV-006")
    assert all(not r.conditions["GPUDriver"] for r, _ in seen)
    assert all(not r.outcomes for r, _ in seen) and "taint-node" not in out.getvalue()
    # two in a row raise the code (debounce_raise=2), still at-risk (2 of the last 5, the first one
    # has left the window): still no condition and no taint
    seen = [_check(agent, monkeypatch, libs, "timeout") for _ in range(2)]
    assert seen[1][0].transitions.get("GPU-DRV-006") == "raised" and seen[1][1] == [("at-risk", "HIGH")]
    assert not seen[1][0].conditions["GPUDriver"] and not seen[1][0].outcomes
    assert conditions_of(kube, node)["GPUDriver"]["status"] == "False"
    assert "taint-node" not in out.getvalue() and _taints(kube, node) == []
    # its Warning Event says at-risk: the controller does not count the node as failing
    from gpuwarden.controller.model import node_signals

    [ev] = [e for e in our_events(kube, node) if e["reason"] == "GpuDrv006"]
    assert ev["type"] == "Warning" and ev["metadata"]["annotations"]["gpuwarden.io/status"] == "at-risk"
    assert node_signals(kube.get_node(node), [ev], agent.clock(), ["GPUDriver"], ["GPU-DRV"], 600) == []


@pytest.mark.rule("GPU-DRV-006", "positive")
@pytest.mark.rule("GPU-DRV-006", "clears")
def test_repeated_timeouts_confirm_fence_and_clear_after_k_answers(kube, k8s, tmp_path, monkeypatch, libs):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    agent, _ = _agent(kube, k8s, node, tmp_path, "on")
    seen = [_check(agent, monkeypatch, libs, "timeout") for _ in range(3)]
    assert [d for _, d in seen] == [[("at-risk", "HIGH")], [("at-risk", "HIGH")], [("confirmed", "CRITICAL")]]
    r = seen[2][0]
    [f] = [f for f in r.findings if f.code == "GPU-DRV-006"]
    assert "timed out in 3 of the last 3 checks, the latest included" in f.summary
    assert [(o.action.kind, o.result) for o in r.outcomes] == [("taint-node", "done")]
    assert _taints(kube, node) == [TAINT]
    c = conditions_of(kube, node)["GPUDriver"]
    assert (c["status"], c["reason"]) == ("True", "GpuDrv006")
    # NVML answers again: the fence holds until debounce_clear (3) answering checks, then both go
    after = [_check(agent, monkeypatch, libs, "ok") for _ in range(3)]
    assert [d for _, d in after] == [[], [], []]
    assert [[(o.action.kind, o.result) for o in r.outcomes] for r, _ in after] == [[], [], [("untaint-node", "done")]]
    assert after[2][0].transitions.get("GPU-DRV-006") == "cleared"
    assert _taints(kube, node) == []
    assert conditions_of(kube, node)["GPUDriver"]["status"] == "False"
    assert [e["reason"] for e in our_events(kube, node) if e.get("action")] == ["TaintedNode", "UntaintedNode"]
    # raised at the 2nd timeout (at-risk: a Warning the controller does not count), confirmed at the 3rd
    evs = {e["metadata"]["annotations"]["gpuwarden.io/status"]: e for e in our_events(kube, node)
           if e["reason"] == "GpuDrv006"}
    assert sorted(evs) == ["at-risk", "confirmed"]
    assert "timed out in 3 of the last 3 checks" in evs["confirmed"]["message"]
    assert "did not answer within" in evs["at-risk"]["message"]
