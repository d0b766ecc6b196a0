"""Never let the node die while unsure (issue 43, item 2): the operator's policy when candidates cannot be separated.

`decide` is pure; `act` runs through the agent's real executor (breaker, cooldown, token bucket, Events, dry-run
print) against a small fake API, and through the local kill with the API unreachable.
"""

from __future__ import annotations

import io

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.agent.unsure import POLICIES, act, decide, unsure
from gpuwarden.examples import open_example
from gpuwarden.findings import Finding, Severity, Status
from tests.support.kubeconfigs import UNREACHABLE_KUBECONFIG

GiB = 1 << 30
GROWTH = 1 << 30


def cand(name: str, graphics: bool, kind: str = "pod") -> dict:
    return {"ref": f"viz/{name}", "key": f"uid-{name}", "kind": kind, "namespace": "viz", "name": name,
            "uid": f"uid-{name}", "graphics": graphics, "cgroup": f"/kubepods.slice/pod{name}"}


def data(tte: float | None = 120.0, recent: float | None = 2 * GiB / 60, cands: list | None = None,
         grown: int = 4 * GiB, room: int | None = 4 * GiB) -> dict:
    return {"unsure": {"candidates": cands if cands is not None else
                       [cand("render-0", True), cand("steady-0", True), cand("filler-0", False)],
                       "seconds_to_min_watermark": tte, "recent_rate_bytes_per_s": recent,
                       "growth_bytes": grown, "headroom_bytes": room}}


def finding(d: dict, status: Status = Status.AT_RISK) -> Finding:
    return Finding("GPU-NODE-001", status, Severity.HIGH, "t", "Candidates, not separated", data=d)


# -- the decision -------------------------------------------------------------------------------------------

def test_alert_is_the_default_and_never_acts():
    assert AgentConfig().memory_unsure_policy == "alert"
    p = decide(data(tte=1.0), "alert", 300, GROWTH)
    assert not p.act and not p.pods


def test_stop_graphics_candidates_spares_compute_pods_and_host_processes():
    d = data(cands=[cand("render-0", True), cand("steady-0", True), cand("filler-0", False),
                    {"ref": "Xorg (pid 7)", "kind": "process", "graphics": True}])
    p = decide(d, "stop-graphics-candidates", 300, GROWTH)
    assert p.act and not p.fence
    assert [x["name"] for x in p.pods] == ["render-0", "steady-0"]
    assert any("filler-0" in s and "not a graphics client" in s for s in p.spared)
    assert any("Xorg" in s and "not a pod" in s for s in p.spared)
    assert "120s away (bound 300s)" in p.why


def test_fence_and_evict_takes_every_candidate_pod():
    p = decide(data(), "fence-and-evict", 300, GROWTH)
    assert p.act and p.fence and [x["name"] for x in p.pods] == ["render-0", "steady-0", "filler-0"]


@pytest.mark.parametrize("policy", POLICIES[1:])
def test_far_from_the_watermark_no_action(policy):
    assert not decide(data(tte=900.0), policy, 300, GROWTH).act
    assert not decide(data(tte=None), policy, 300, GROWTH).act


@pytest.mark.parametrize("policy", POLICIES[1:])
def test_a_growth_that_took_little_of_the_headroom_no_action(policy):
    p = decide(data(grown=1 * GiB, room=60 * GiB), policy, 300, GROWTH)
    assert not p.act and "under 12.5% of the headroom" in p.why
    assert not decide(data(room=None), policy, 300, GROWTH).act


@pytest.mark.parametrize("policy", POLICIES[1:])
def test_bounded_growth_that_stopped_no_action(policy):
    """A large but bounded scene: near the watermark by the window's rate, but the latest samples are flat."""
    p = decide(data(tte=60.0, recent=0.0), policy, 300, GROWTH)
    assert not p.act and "stopped" in p.why
    assert not decide(data(tte=60.0, recent=None), policy, 300, GROWTH).act


def test_only_unsure_findings_are_taken():
    assert unsure(finding(data()))
    assert not unsure(finding({**data(), "pod": {"name": "render-0"}}, Status.CONFIRMED))  # the guard's
    assert not unsure(finding({}))


# -- through the agent's executor ------------------------------------------------------------------------------

class Api:
    """Answers: the node's pods (with owners), evictions and taints recorded."""

    def __init__(self) -> None:
        self.evicted: list[tuple[str, str]] = []
        self.patched: list[dict] = []
        self.node = {"metadata": {"name": "n1", "resourceVersion": "1"}, "spec": {}}

    def list_pods(self, **_: object) -> list:
        return [{"metadata": {"name": n, "namespace": "viz", "uid": f"uid-{n}", "creationTimestamp": "2026-12-02T00:00:00Z",
                              "ownerReferences": [{"kind": "StatefulSet", "name": n[:-2], "controller": True}]}}
                for n in ("render-0", "steady-0", "filler-0")]

    def get_node(self, name: str) -> dict:
        return self.node

    def patch_node(self, name: str, patch: dict, content_type: str = "") -> dict:
        self.patched.append(patch)
        self.node = {"metadata": {"name": "n1", "resourceVersion": "2"}, "spec": patch.get("spec") or {}}
        return self.node

    def get_configmap(self, namespace: str, name: str) -> None:
        return None

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> dict:
        self.evicted.append((namespace, name))
        return {}

    def list_events(self, **_: object) -> list:
        return []

    def iter_events(self, **_: object) -> list:
        return []

    def create_event(self, namespace: str, event: dict) -> dict:
        return event


def make(policy: str, remediate: str = "on", kube: object = None, **kw) -> tuple[Agent, io.StringIO]:
    out = io.StringIO()
    cfg = AgentConfig(example="healthy", remediate=remediate, listen="", boot_grace_s=0, node_name="n1",
                      conditions=False, memory_unsure_policy=policy, kube=kube is not None, **kw)
    return Agent(cfg, kube=kube, root=open_example("healthy"), out=out, clock=lambda: 1_800_000_000.0), out


def test_stop_graphics_candidates_evicts_them_exactly_once():
    api = Api()
    a, _ = make("stop-graphics-candidates", kube=api)
    got = act(a, [finding(data())])
    assert sorted(api.evicted) == [("viz", "render-0"), ("viz", "steady-0")]  # never filler-0 (compute)
    assert all(o.result == "done" for o in got)
    assert {o.action.target.owner for o in got} == {("StatefulSet", "render"), ("StatefulSet", "steady")}
    again = act(a, [finding(data())])  # the next check: cooled down, nothing sent twice
    assert [o.result for o in again] == ["cooldown", "cooldown"] and len(api.evicted) == 2


def test_fence_and_evict_taints_then_evicts():
    api = Api()
    a, _ = make("fence-and-evict", kube=api)
    got = act(a, [finding(data())])
    assert [o.action.kind for o in got][0] == "taint-node"
    assert api.patched and api.patched[0]["spec"]["taints"][0]["key"] == "gpuwarden.io/memory-unsure"
    assert len(api.evicted) == 3


def test_dry_run_says_exactly_what_it_would_do():
    api = Api()
    a, out = make("stop-graphics-candidates", remediate="dry-run", kube=api)
    got = act(a, [finding(data())])
    assert api.evicted == [] and {o.result for o in got} == {"dry-run"}
    text = out.getvalue()
    assert "would stop viz/render-0, viz/steady-0" in text and "viz/filler-0: not a graphics client" in text
    assert "WOULD DO" in text


def unreachable(tmp_path, **kw) -> Agent:
    kc = tmp_path / "kubeconfig"
    kc.write_text(UNREACHABLE_KUBECONFIG)
    cfg = AgentConfig(example="healthy", kubeconfig=str(kc), remediate="on", listen="", boot_grace_s=0,
                      node_name="n1", memory_unsure_policy="stop-graphics-candidates", **kw)
    return Agent(cfg, root=open_example("healthy"), out=io.StringIO(), clock=lambda: 1_800_000_000.0)


def test_api_unreachable_local_kill_only_with_its_switch(tmp_path):
    a = unreachable(tmp_path, memory_local_kill=True)
    got = [o for o in act(a, [finding(data())]) if o.action.kind == "kill-pod-processes"]
    # the example is not a live node: the kill is refused there, but it was reached for both graphics pods only
    assert [(o.action.kind, o.action.target.name, o.result) for o in got] == [
        ("kill-pod-processes", "render-0", "refused"), ("kill-pod-processes", "steady-0", "refused")]
    b = unreachable(tmp_path)
    assert not [o for o in act(b, [finding(data())]) if o.action.kind == "kill-pod-processes"]


def test_alert_and_far_and_cleared_do_nothing():
    api = Api()
    assert act(make("alert", kube=api)[0], [finding(data())]) == []
    assert act(make("fence-and-evict", kube=api)[0], [finding(data(tte=3600.0))]) == []
    assert act(make("fence-and-evict", kube=api)[0], [finding({})]) == []  # separated or cleared: no data["unsure"]
    assert api.evicted == [] and api.patched == []


def test_the_agent_check_runs_the_policy_only_off_alert(monkeypatch):
    """The loop's hook: with `remediate off` nothing runs, whatever the policy."""
    import gpuwarden.agent.loop as loop

    calls = []
    monkeypatch.setattr(loop, "unsure_act", lambda agent, acting: calls.append(len(acting)) or [])
    a, _ = make("stop-graphics-candidates", remediate="off")
    a.check()
    b, _ = make("stop-graphics-candidates", remediate="dry-run")
    b.check()
    assert calls == [0]


def test_a_decision_not_to_act_is_logged_once_not_every_check():
    a, _ = make("fence-and-evict", kube=Api())
    lines = []
    a.log.info = lambda msg, **kw: lines.append((msg, kw.get("why"))) if msg == "memory-unsure" else None
    for tte in (900.0, 901.0, 950.0):
        act(a, [finding(data(tte=tte))])
    assert len(lines) == 1 and "900s away" in lines[0][1]
    act(a, [finding(data(recent=0.0))])
    assert len(lines) == 2
