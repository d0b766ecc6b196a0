"""The memory scenarios' harness (tools/gpu/memharness.py) and verdicts, without a GPU: the leak's pacing and
figures, the agent's log followed as it is written, the kubelet stand-in, the carried kit, and the API session
under the chart's RBAC (the agent's token evicts a pod, the stand-in stops it) on the real test API server."""

from __future__ import annotations

import lzma
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "tools/gpu"), str(HERE)]

import memharness as H  # noqa: E402
import memory_scenarios as S  # noqa: E402

GIB, MIB = H.GIB, H.MIB


# -- pacing ----------------------------------------------------------------------------------------------

def test_fbs_due_follows_the_rate_and_never_passes_the_cap():
    rate = 40 * GIB / 60
    assert H.fbs_due(rate, 0.0, 0, 128 * MIB, 30 * GIB, 4) == 0
    assert H.fbs_due(rate, 1.0, 0, 128 * MIB, 30 * GIB, 4) == 4  # 0.67 GiB due: 6 framebuffers, 4 at once
    assert H.fbs_due(rate, 1.0, 600 * MIB, 128 * MIB, 30 * GIB, 4) == 1
    assert H.fbs_due(rate, 1.0, GIB, 128 * MIB, 30 * GIB, 4) == 0  # ahead of the rate: wait
    assert H.fbs_due(rate, 100.0, 30 * GIB - 200 * MIB, 128 * MIB, 30 * GIB, 4) == 1
    assert H.fbs_due(rate, 100.0, 30 * GIB - 100 * MIB, 128 * MIB, 30 * GIB, 4) == 0  # one more would pass the cap
    assert H.fbs_due(rate, 5.0, 0, 0, 30 * GIB, 4) == 0


def test_a_paced_leak_reaches_the_rate_and_stops_at_the_cap():
    """fbs_due driven as _fast_leak drives it (every 0.25 s, what was made lands at once): 40 GiB/min, held at 8 GiB."""
    rate, per, cap, leaked, t, held = 40 * GIB / 60, 128 * MIB, 8 * GIB, 0, 0.0, None
    while t < 30:
        n = H.fbs_due(rate, t, leaked, per, cap, 4)
        leaked += n * per
        if held is None and leaked + per > cap:
            held = t
        assert leaked <= cap and leaked <= rate * t + 4 * per
        t += 0.25
    assert held is not None and abs(held - 12.0) < 0.5 and leaked == cap


def _samples(avail0: int, start: float, rate: float, stop: float, end: float, dt: float = 0.1) -> list:
    out, t = [], 0.0
    while t <= end:
        gone = 0 if t < start + 1.0 else rate * (min(t, stop) - start - 1.0)  # the GPU's last memory first
        out.append((t, int(avail0 - gone), int(avail0 - gone)))
        t = round(t + dt, 3)
    return out


def test_leak_figures_rate_drop_and_the_quarter():
    avail0 = 120 * GIB
    s = _samples(avail0, 5.0, 40 * GIB / 60, 20.0, 25.0)
    f = H.leak_figures(s, 5.0, 20.0)
    assert abs(f["rate_gib_per_min"] - 40) < 0.5 and f["memavailable_at_start"] == avail0
    assert abs(f["drop_at_stop"] - 14 * 40 * GIB / 60) < 0.2 * GIB and f["before_a_quarter"] is True
    late = H.leak_figures(_samples(avail0, 5.0, 40 * GIB / 60, 60.0, 62.0), 5.0, 60.0)
    assert late["before_a_quarter"] is False and late["drop_share"] > 0.25
    assert "error" in H.leak_figures(s[:2], 5.0, 20.0)
    held = _samples(avail0, 5.0, 40 * GIB / 60, 30.0, 45.0)  # the leak held from 30 s, stopped at 45 s
    assert H.leak_figures(held, 5.0, 45.0)["rate_gib_per_min"] < 35  # the flat hold dilutes the slope ...
    assert abs(H.leak_figures(held, 5.0, 45.0, t_held=30.0)["rate_gib_per_min"] - 40) < 0.5  # ... unless cut off


# -- the agent's log, the memory sampler, the kit ----------------------------------------------------------

def test_agent_run_follows_the_log_as_it_is_written(tmp_path):
    script = tmp_path / "fake_agent.py"
    script.write_text(
        "import json, sys, time\n"
        "def say(**kv): print(json.dumps(kv), file=sys.stderr, flush=True)\n"
        "say(msg='agent-started'); say(msg='check', n=1); print('[dry-run] nothing', flush=True)\n"
        "time.sleep(0.3); print('not json', file=sys.stderr, flush=True)\n"
        "say(msg='check', n=1, scope='memory', source='fast-memory', transitions={'GPU-NODE-001': 'raised'})\n"
        "say(msg='memory-fast-sampling', every_s=0.5)\n"
        "say(msg='remediation', action='kill-pod-processes', target='pod viz/render-0', result='done')\n"
        "time.sleep(30)\n")
    a = H.AgentRun([sys.executable, str(script), "-", "-"])
    first = a.wait_for(H.full_check, timeout=10)
    assert first is not None and first[1]["n"] == 1
    hit = a.wait_for(lambda r: H.acted(r, "kill-pod-processes", "pod viz/render-0"), timeout=10)
    assert hit is not None and hit[0] >= first[0]
    s = a.stop(since=first[0])
    assert s["checks"] == 1 and s["targeted"] == 1 and s["not_json"] == ["not json"]
    seen = S._first_seen(s["log"], s["check_lines"])
    assert seen["raised_by"]["source"] == "fast-memory" and seen["action"]["result"] == "done"
    assert seen["fast_sampling_at_s"] >= 0 and s["stdout"] == ["[dry-run] nothing"]


def test_memwatch_samples_and_notes_a_death():
    seq = iter(range(10**6))
    w = H.MemWatch(period=0.01, read=lambda: {"MemAvailable": 100 - next(seq), "MemFree": 5}).start()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    w.watch("viz/x", p)
    p.wait()
    time.sleep(0.1)
    w.stop()
    assert len(w.samples) > 5 and w.samples[1][1] < w.samples[0][1] and "viz/x" in w.died


def test_unpack_kit_decompresses_what_the_carry_limit_made_xz(tmp_path):
    kit = tmp_path / "kit"
    kit.mkdir()
    with lzma.open(kit / "testapiserver.xz", "wb") as f:
        f.write(b"#!/bin/sh\necho server\n")
    (kit / "etcd").write_bytes(b"#!/bin/sh\necho etcd\n")
    got = H.unpack_kit(kit, tmp_path / "out")
    assert subprocess.run([got["testapiserver"]], capture_output=True, text=True).stdout == "server\n"
    assert subprocess.run([got["etcd"]], capture_output=True, text=True).stdout == "etcd\n"


# -- the kubelet stand-in ----------------------------------------------------------------------------------

def test_the_kubelet_stand_in_stops_an_evicted_pod_once_and_only_it():
    pods = [{"metadata": {"uid": "a", "name": "render-0"}}, {"metadata": {"uid": "b", "name": "steady-0"}},
            {"metadata": {"uid": "c", "name": "filler-0"}}]
    stopped, finalized = [], []
    k = H.KubeletStandIn(lambda: list(pods), lambda uid: stopped.append(uid), finalize=finalized.append)
    for uid, ref in (("a", "viz/render-0"), ("b", "viz/steady-0"), ("c", "ml/filler-0")):
        k.track(uid, ref)
    k.step()
    assert stopped == []
    pods[0] = {"metadata": {"uid": "a", "name": "render-0", "deletionTimestamp": "2026-12-02T00:00:00Z"}}
    pods.pop(2)  # deleted outright
    k.step()
    k.step()
    assert sorted(stopped) == ["a", "c"] and [p["metadata"]["uid"] for p in finalized] == ["a"]
    assert {v["ref"]: v["why"] for v in k.stopped.values()} == {"viz/render-0": "terminating", "ml/filler-0": "deleted"}


def test_the_kubelet_stand_in_survives_an_api_error():
    def boom() -> list:
        raise OSError("connection refused")

    k = H.KubeletStandIn(boom, lambda uid: None)
    k.track("a", "viz/render-0")
    k.step()
    assert k.stopped == {} and "connection refused" in k.errors[0]


# -- the verdicts ----------------------------------------------------------------------------------------

def _rem(action: str, target: str, result: str = "done") -> dict:
    return {"msg": "remediation", "action": action, "target": target, "result": result}


def _fast(api: bool, **kw) -> dict:
    res = {"scenario": "memory-fast-leak-defaults" + ("-api" if api else ""), "stopped_after_s": 2.1,
           "capped_after_s": None, "filler_alive": True,
           "figures": {"rate_gib_per_min": 41.0, "before_a_quarter": True},
           "agent": {"log": [_rem("evict-pod-for-memory" if api else "kill-pod-processes", "pod viz/render-0")]}}
    if api:
        res.update(kubelet_stopped={"viz/render-0": {}}, agent_requests_denied=[])
    res.update(kw)
    return res


@pytest.mark.parametrize("api", [False, True])
def test_fast_leak_verdict(api):
    assert S.verdict(_fast(api))
    assert not S.verdict(_fast(api, figures={"rate_gib_per_min": 25.0, "before_a_quarter": True}))  # too slow
    assert not S.verdict(_fast(api, figures={"rate_gib_per_min": 41.0, "before_a_quarter": False}))
    assert not S.verdict(_fast(api, capped_after_s=44.0))  # held at the quarter: missed, whatever came after
    assert not S.verdict(_fast(api, agent={"log": []}))  # stopped, but not by the agent
    assert not S.verdict(_fast(api, filler_alive=False))
    if api:
        assert not S.verdict(_fast(api, agent_requests_denied=["create pods/eviction viz/render-0"]))
        assert not S.verdict(_fast(api, agent_requests_denied="not enforced"))


def _separated(**kw) -> dict:
    res = {"scenario": "memory-late-leaker-separated-api", "killed_after_s": 7.2,
           "separations": ["trend", "tracking"], "named": [None, "viz/render-0"],
           "alive": {"viz/steady-0": True, "viz/render-0": False}, "filler_alive": True,
           "kubelet_stopped": {"viz/render-0": {}}, "api_pods_left": ["ml/filler-0", "viz/steady-0"],
           "agent_requests_denied": [], "agent": {"log": [_rem("evict-pod-for-memory", "pod viz/render-0")]}}
    res.update(kw)
    return res


def test_separated_api_verdict():
    assert S.verdict(_separated())
    assert not S.verdict(_separated(named=["viz/steady-0"]))
    assert not S.verdict(_separated(separations=["arrival"]))
    assert not S.verdict(_separated(agent={"log": [_rem("kill-pod-processes", "pod viz/render-0")]}))
    assert not S.verdict(_separated(agent={"log": [_rem("evict-pod-for-memory", "pod viz/render-0"),
                                                   _rem("evict-pod-for-memory", "pod viz/steady-0")]}))
    assert not S.verdict(_separated(api_pods_left=["ml/filler-0"]))
    assert not S.verdict(_separated(agent_requests_denied=["create events"]))


def _legit(**kw) -> dict:
    res = {"scenario": "memory-graphics-legit-unsure", "samples": [{}], "findings": [],
           "sample_findings": [{"status": "at-risk", "severity": "info"}],
           "alive": {"viz/steady-0": True, "viz/resize-0": True, "viz/scene-0": True}, "filler_alive": True,
           "agent": {"log": [{"msg": "memory-unsure", "act": False}]}}
    res.update(kw)
    return res


def test_legit_unsure_verdict():
    assert S.verdict(_legit())
    assert not S.verdict(_legit(sample_findings=[{"status": "at-risk", "severity": "high"}]))
    assert not S.verdict(_legit(findings=[{"code": "GPU-NODE-001", "status": "at-risk", "severity": "medium"}]))
    assert not S.verdict(_legit(agent={"log": [_rem("kill-pod-processes", "pod viz/scene-0", "dry-run")]}))
    assert not S.verdict(_legit(agent={"log": [{"msg": "memory-unsure", "act": True}]}))
    assert not S.verdict(_legit(agent={"log": [{"msg": "fault-raised", "code": "GPU-NODE-001"}]}))
    assert not S.verdict(_legit(alive={"viz/scene-0": False}))
    assert not S.verdict(_legit(samples=None))


def test_the_run_of_issues_43_and_41_is_registered_in_order():
    assert set(S.ISSUE_43_41) <= set(S.SCENARIOS) and set(S.ISSUE_43_41) <= set(S.CROWDED)
    assert S.ISSUE_43_41[-2:] == ("memory-fast-leak-defaults", "memory-fast-leak-defaults-api")


# -- the API side, on the real test API server ---------------------------------------------------------------

@pytest.fixture
def session(monkeypatch, tmp_path):
    from tests.support.apiserver import ApiServerUnavailable, find_binary, find_etcd

    try:
        find_binary(build=False)
        find_etcd()
    except ApiServerUnavailable as exc:
        if os.environ.get("GPUWARDEN_REQUIRE_APISERVER") == "1":
            pytest.fail(str(exc))
        pytest.skip(f"REAL API SERVER UNAVAILABLE: {exc}")
    authz = tmp_path / "authz.json"
    H.render_authz(str(authz), "gpu-node-0")  # as the GPU host gets it: rendered here, read from the file there
    monkeypatch.setenv("GW_MEM_AUTHZ_FILE", str(authz))
    s = H.ApiSession("gpu-node-0", work=str(tmp_path / "work"))
    yield s
    s.close()


@pytest.mark.apiserver
def test_the_agents_eviction_under_the_charts_rbac_reaches_the_kubelet_stand_in(session):
    """What memory-*-api relies on: pods in the API with the cgroups' uids, the agent's node-bound token allowed
    to evict one of them (nothing refused), and the stand-in stopping exactly that one."""
    from gpuwarden.kube.client import Kube

    uids = {ref: session.pod(*ref.split("/")) for ref in ("viz/render-0", "viz/steady-0", "ml/filler-0")}
    stopped: list[str] = []
    k = H.KubeletStandIn(session.node_pods, stopped.append, finalize=session.remove)
    for ref, uid in uids.items():
        k.track(uid, ref)
    agent = Kube(session.server.api_client(session.ids.agent_token("gpu-node-0")))
    assert {p["metadata"]["uid"] for p in agent.list_pods(node_name="gpu-node-0")} == set(uids.values())
    agent.evict_pod("viz", "render-0", uids["viz/render-0"])
    k.step()
    k.step()
    assert stopped == [uids["viz/render-0"]]
    left = {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in session.node_pods()}
    assert left == {"viz/steady-0", "ml/filler-0"}  # the evicted pod finalized, as the kubelet does
    assert session.denied() == [] and "chart's RBAC" in session.authz_note
    assert Path(session.agent_kubeconfig()).is_file()
    session.admin.request("PATCH", "/api/v1/nodes/gpu-node-0", {"spec": {"taints": [
        {"key": "gpuwarden.io/unhealthy", "value": "node-memory", "effect": "NoSchedule"}]}},
        content_type="application/merge-patch+json")
    session.admin.create_event("viz", {"metadata": {"name": "ev-1", "namespace": "viz"}, "reason": "Evicted",
                                       "involvedObject": {"kind": "Pod", "name": "render-0", "namespace": "viz"}})
    session.clear()  # the next scenario's node: no pods, no Events to rebuild cooldowns from, no taint
    assert session.node_pods() == [] and session.admin.list_events() == []
    assert not (session.admin.get_node("gpu-node-0").get("spec") or {}).get("taints")


# -- the fast leak's loop, with a stand-in worker and memory ---------------------------------------------------

class FakeMemory:
    """RAM as the leak moves it: the first 12 framebuffers land in the GPU's last free memory."""

    def __init__(self, avail: int) -> None:
        self.avail0, self.fbs = avail, 0

    def available(self) -> int:
        return self.avail0 - max(0, self.fbs - 12) * 128 * MIB


class FakeWorker:
    def __init__(self, mem: FakeMemory, killed_after_s: float | None) -> None:
        self.mem, self.t0, self.kill_at = mem, time.monotonic(), killed_after_s
        self.p = self

    def poll(self):
        return -9 if self.kill_at is not None and time.monotonic() - self.t0 > self.kill_at else None

    def kill(self) -> None:
        self.kill_at = 0.0

    def cmd(self, c: str) -> dict:
        if self.poll() is not None:
            return {"error": "exited -9"}
        self.mem.fbs += int(c.split()[1])
        return {"counts": {"fb": self.mem.fbs}, "seconds": 0.01}


def test_the_fast_leak_follows_its_rate_and_holds_at_the_cap(monkeypatch):
    monkeypatch.setattr(S, "FAST_RATE_GIB_MIN", 600.0)  # 10 GiB/s: the 5 GiB cap in half a second
    mem = FakeMemory(20 * GIB)
    got = S._fast_leak(FakeWorker(mem, killed_after_s=2.0), mem, max_s=5.0)
    assert got["cap_bytes"] == 5 * GIB and got["capped_after_s"] is not None and got["capped_after_s"] < 1.5
    assert mem.avail0 - mem.available() <= 5 * GIB and got["worker_exit"] == -9
    assert got["gpu_full_after_s"] is not None and got["fbs_made"] >= 12 + 5 * 8 - 1


def test_the_fast_leak_stopped_before_its_cap(monkeypatch):
    monkeypatch.setattr(S, "FAST_RATE_GIB_MIN", 60.0)  # 1 GiB/s: the cap (5 GiB) is 5 s away, the stop comes at 1 s
    mem = FakeMemory(20 * GIB)
    got = S._fast_leak(FakeWorker(mem, killed_after_s=1.0), mem, max_s=5.0)
    assert got["capped_after_s"] is None and got["worker_exit"] == -9 and "error" not in got
    assert 0 < mem.avail0 - mem.available() < 2 * GIB


@pytest.mark.apiserver
def test_the_memory_guard_and_the_unsure_policy_act_under_the_charts_rbac(session):
    """The agent's own paths of the -api scenarios, with its node-bound token: the memory guard evicts the escaped
    pod, the unsure policy (stop-graphics-candidates) the graphics candidates and never the compute pod; the
    server refuses nothing (breaker read, cooldowns from Events, evictions, Events) and the stand-in stops them."""
    from gpuwarden.agent.memguard import guard
    from gpuwarden.agent.unsure import act
    from gpuwarden.examples import open_example
    from gpuwarden.findings import Finding, Severity, Status
    from gpuwarden.kube.client import Kube
    from tests.support.agent_kube import new_agent

    uids = {ref: session.pod(*ref.split("/")) for ref in ("viz/render-0", "viz/render-1", "viz/steady-0",
                                                          "ml/filler-0")}
    stopped: list[str] = []
    k = H.KubeletStandIn(session.node_pods, stopped.append, finalize=session.remove)
    for ref, uid in uids.items():
        k.track(uid, ref)
    kube = Kube(session.server.api_client(session.ids.agent_token("gpu-node-0")))
    agent, _ = new_agent(kube, "gpu-node-0", open_example("healthy"), session.namespace, remediate="on",
                         memory_local_kill=True, memory_unsure_policy="stop-graphics-candidates")
    escaped = Finding("GPU-NODE-001", Status.CONFIRMED, Severity.CRITICAL, "t", "viz/steady-0 has escaped",
                      data={"pod": {"namespace": "viz", "name": "steady-0", "uid": uids["viz/steady-0"]}})
    got = guard(agent, [escaped], [])
    assert [(o.action.kind, o.result) for o in got] == [("evict-pod-for-memory", "done")]
    cands = [{"ref": ref, "kind": "pod", "namespace": ref.split("/")[0], "name": ref.split("/")[1], "uid": uids[ref],
              "graphics": ref.startswith("viz/"), "cgroup": ""} for ref in ("viz/render-0", "viz/render-1", "ml/filler-0")]
    unsure = Finding("GPU-NODE-001", Status.AT_RISK, Severity.HIGH, "t", "Candidates, not separated",
                     data={"unsure": {"candidates": cands, "seconds_to_min_watermark": 90.0,
                                      "recent_rate_bytes_per_s": 30 * GIB / 60, "growth_bytes": 16 * GIB,
                                      "headroom_bytes": 90 * GIB}})
    got = act(agent, [unsure])
    assert sorted((o.action.kind, o.action.target.name, o.result) for o in got) == [
        ("evict-pod-for-memory", "render-0", "done"), ("evict-pod-for-memory", "render-1", "done")]
    k.step()
    k.step()
    assert sorted(stopped) == sorted(uids[r] for r in ("viz/steady-0", "viz/render-0", "viz/render-1"))
    assert [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in session.node_pods()] == ["ml/filler-0"]
    assert session.denied() == []
