"""The memory guard stands alone (issue 17): a confirmed, high-confidence memory escape gets its eviction,
and with the API server unreachable its local last resort, whatever the rest of the plan does.

The unreachable API server is real: the agent's own Kubernetes client against a closed loopback port.
"""

from __future__ import annotations

import io
import types

import pytest

from gpuwarden.agent import monitors as mon
from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.agent.metrics import AgentMetrics
from gpuwarden.examples import open_example
from gpuwarden.kube.errors import KubeError
from tests.support.kubeconfigs import UNREACHABLE_KUBECONFIG

EXAMPLE = "egl-framebuffer-escape"


def agent(tmp_path, **kw) -> Agent:
    kc = tmp_path / "kubeconfig"
    kc.write_text(UNREACHABLE_KUBECONFIG)
    cfg = AgentConfig(example=EXAMPLE, kubeconfig=str(kc), remediate="on", memory_local_kill=True, listen="",
                      select=["GPU-NODE"], boot_grace_s=0, node_name="n1", **kw)
    return Agent(cfg, root=open_example(EXAMPLE), out=io.StringIO(), clock=lambda: 1_800_000_000.0)


def test_api_unreachable_the_guard_goes_to_its_last_resort(tmp_path):
    a = agent(tmp_path)
    a.check()
    r = a.check()  # raised after two checks
    kinds = [(o.action.kind, o.result) for o in r.outcomes]
    # the example is not a live node, so the kill itself is refused: what matters is that it was reached
    assert kinds == [("kill-pod-processes", "refused")]
    assert any(e.startswith("memory guard: HTTP 0 ") for e in r.errors)


class Answering:
    """An API server that answers but fails the node read (HTTP 500) and accepts the eviction."""

    def __init__(self) -> None:
        self.evicted: list[tuple[str, str, str]] = []

    def get_node(self, name: str) -> dict:
        raise KubeError(500, "Internal Server Error", "etcdserver: request timed out")

    def list_pods(self, **_: object) -> list:
        raise KubeError(500, "Internal Server Error", "")

    def get_configmap(self, namespace: str, name: str) -> None:
        return None

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> dict:
        self.evicted.append((namespace, name, uid))
        return {}

    def list_events(self, **_: object) -> list:
        return []

    def iter_events(self, **_: object) -> list:
        return []

    def create_event(self, namespace: str, event: dict) -> dict:
        return event


def test_one_failed_api_call_does_not_stop_the_eviction():
    kube = Answering()
    cfg = AgentConfig(example=EXAMPLE, remediate="on", memory_local_kill=True, listen="", select=["GPU-NODE"],
                      boot_grace_s=0, node_name="n1", conditions=False)
    a = Agent(cfg, kube=kube, root=open_example(EXAMPLE), out=io.StringIO(), clock=lambda: 1_800_000_000.0)
    a.check()
    r = a.check()
    assert kube.evicted == [("viz", "render-0", "a6234a7e-29ef-434f-b254-d3cccc28be4e")]
    assert [(o.action.kind, o.result) for o in r.outcomes] == [("evict-pod-for-memory", "done")]


def test_a_failing_monitor_does_not_skip_the_others(tmp_path, monkeypatch):
    def broken(*_: object) -> None:
        raise ValueError("float() argument must be a string or a real number, not 'NoneType'")

    seen = []
    monkeypatch.setattr(mon, "memory_growth", broken)
    monkeypatch.setattr(mon, "repeated_timeouts", lambda *a: seen.append(a))
    cfg = AgentConfig(example=EXAMPLE, kube=False, listen="", select=["GPU-NODE"], boot_grace_s=0, node_name="n1")
    r = Agent(cfg, root=open_example(EXAMPLE), out=io.StringIO(), clock=lambda: 1_800_000_000.0).check()
    assert seen and r.findings
    assert r.errors == ["monitor memory-growth failed: ValueError: float() argument must be a string or a real "
                        "number, not 'NoneType'"]


def test_memory_growth_gauge_with_no_rate_yet():
    m = AgentMetrics()
    t = types.SimpleNamespace(rate=None, early_rate=None)
    mon.memory_growth(types.SimpleNamespace(maybe=lambda n: types.SimpleNamespace(escape=types.SimpleNamespace(
        gap=1 << 30, trend=t))), m)
    assert m.registry.get_sample_value("gpuwarden_uncharged_memory_growth_bytes_per_second") == 0.0  # unset
    t = types.SimpleNamespace(rate=None, early_rate=float(1 << 28))
    mon.memory_growth(types.SimpleNamespace(maybe=lambda n: types.SimpleNamespace(escape=types.SimpleNamespace(
        gap=1 << 30, trend=t))), m)
    assert m.registry.get_sample_value("gpuwarden_uncharged_memory_growth_bytes_per_second") == float(1 << 28)


@pytest.mark.parametrize("rounds", [3])
def test_information_raises_nothing(tmp_path, rounds):
    """Charged driver memory inside a working limit is information: no condition, no event, no action."""
    from tests.support.bundles import h200_node

    cfg = AgentConfig(kube=False, listen="", select=["GPU-NODE"], boot_grace_s=0, node_name="n1",
                      remediate="on", memory_local_kill=True)
    a = Agent(cfg, root=h200_node(tmp_path / "n", "managed"), out=io.StringIO(), clock=lambda: 1_800_000_000.0)
    for _ in range(rounds):
        r = a.check()
    assert [f.severity.name for f in r.findings] == ["INFO"]
    assert not a.debounce.raised_keys() and r.outcomes == [] and r.observed["GPU-NODE-001"] == "good"
