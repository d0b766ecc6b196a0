"""The NVML event source and the node's pods watch, wired into the agent's event loop: which sources a
configuration starts, that NVML's blocking start never delays the first check, and that a wake of each
topic leads to a targeted check raising its code (a lost GPU through a stand-in NVML; a pod rejected for
a lost GPU on the real test API server) at the chart's 60 s interval."""

from __future__ import annotations

import threading
import time
import types

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.events import default_sources
from gpuwarden.root import HostRoot
from gpuwarden.wake.base import Wake
from gpuwarden.wake.nvml import NvmlEvents
from gpuwarden.wake.pods import PodsWatch
from tests.agent.test_agent_events import XID79, Running, _append, healthy, wait  # noqa: F401  (fixture)
from tests.wake.test_nvml_events import fake_lib, files, trigger  # noqa: F401  (fixtures)

#: fault -> raised at the 60 s interval: a wake-up's check and its confirming re-read 0.2 s later
BOUND_S = 3.0


class _Live:
    live = True


def _agent(kube=None, root=None, **kw):
    cfg = AgentConfig(node_name="gpu-node-a", **kw)
    return types.SimpleNamespace(cfg=cfg, root=root if root is not None else _Live(), kube=kube, log=None)


def _kinds(agent) -> set[str]:
    return {type(s).__name__ for s in default_sources(agent)}


class _WatchingKube:
    def watch(self, *a, **kw):
        raise AssertionError("not started here")


def test_default_sources_add_nvml_on_a_live_root_with_probes_and_pods_with_an_api_client():
    assert {"NvmlEvents", "PodsWatch"} <= _kinds(_agent(_WatchingKube()))
    assert _kinds(_agent(_WatchingKube())) >= {"KernelLog", "WatchSource", "PsiSource", "MemDropSource"}


@pytest.mark.parametrize("kw,root,kube,gone", [
    ({"wake_nvml": False}, None, _WatchingKube(), "NvmlEvents"),
    ({"probes": False}, None, _WatchingKube(), "NvmlEvents"),
    ({}, types.SimpleNamespace(live=False), _WatchingKube(), "NvmlEvents"),
    ({"wake_pods": False}, None, _WatchingKube(), "PodsWatch"),
    ({}, None, None, "PodsWatch"),
    ({}, None, object(), "PodsWatch"),  # a client that cannot watch (the example's offline one)
])
def test_each_new_source_is_left_out_when_switched_off_or_unusable(kw, root, kube, gone):
    kinds = _kinds(_agent(kube, root, **kw))
    assert gone not in kinds and "KernelLog" in kinds


def test_the_switches_are_yaml_keys_and_flags_default_on():
    from gpuwarden.agent.config import command_params, from_mapping

    assert AgentConfig().wake_nvml and AgentConfig().wake_pods
    c = from_mapping({"wake-nvml": False, "wake_pods": False})
    assert (c.wake_nvml, c.wake_pods, c.wake) == (False, False, True)
    flags = {o for p in command_params() for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
    assert {"--wake-nvml", "--no-wake-nvml", "--wake-pods", "--no-wake-pods"} <= flags


class _SlowSource:
    """A source whose start blocks (as NvmlEvents' does until nvmlInit answers)."""

    name = "slow"
    slow_start = True

    def __init__(self, delay: float) -> None:
        self.delay, self.emit, self.stopped, self.started = delay, None, threading.Event(), threading.Event()

    def start(self, emit):
        time.sleep(self.delay)
        self.emit = emit
        self.started.set()
        return None

    def stop(self):
        self.stopped.set()


def test_a_slow_starting_source_never_delays_the_first_check_and_its_wakes_arrive(healthy):
    src = _SlowSource(1.5)
    t0 = time.monotonic()
    with Running(healthy, sources=[src]) as r:
        first = time.monotonic() - t0
        assert first < 1.0 and not src.started.is_set(), first  # the first check ran while it was starting
        assert src.started.wait(5) and wait(lambda: src in r.agent.loop.running, 2)
        _append(healthy / ".gpuwarden/logs/kmsg.txt", XID79)  # no log source: only this wake brings it
        src.emit(Wake(source="slow", topic="log", seen=time.time()))
        assert r.raised("GPU-HW-002", BOUND_S) is not None, r.log.getvalue()
    assert src.stopped.is_set()


def test_a_source_still_starting_when_the_agent_stops_is_stopped_when_it_starts(healthy):
    src = _SlowSource(1.0)
    with Running(healthy, sources=[src]):
        pass
    assert src.started.wait(5) and src.stopped.wait(2)


# -- the gpu topic: NVML says a GPU is lost --------------------------------------------------------
def _nvml(lib: str) -> NvmlEvents:
    return NvmlEvents(HostRoot("/"), lib, init_timeout_s=2.0, wait_ms=100, tick_s=1.0)


def test_a_gpu_lost_from_nvml_events_is_raised_within_the_bound_at_a_60s_interval(healthy, fake_lib, files):
    src = _nvml(fake_lib)
    with Running(healthy, sources=[src], interval_s=60.0) as r:
        assert wait(lambda: r.metric("gpuwarden_wake_source_up", source="nvml") == 1, 10), r.log.getvalue()
        # the driver logs Xid 79 as NVML reports the GPU lost; no log source here: only the NVML wake reads it
        _append(healthy / ".gpuwarden/logs/kmsg.txt", XID79)
        trigger(files["lost"])
        took = r.raised("GPU-HW-002", BOUND_S)
        assert took is not None, r.log.getvalue()
        assert r.metric("gpuwarden_wakeups_total", source="nvml", topic="gpu") >= 1
        assert "scope=gpu source=nvml" in r.log.getvalue()


def test_without_the_nvml_wake_the_lost_gpu_waits_for_the_interval(healthy, fake_lib, files):
    with Running(healthy, sources=[], interval_s=60.0) as r:
        _append(healthy / ".gpuwarden/logs/kmsg.txt", XID79)
        trigger(files["lost"])
        assert r.raised("GPU-HW-002", BOUND_S) is None


# -- the admission topic: the kubelet rejects a pod for a lost GPU ---------------------------------
class _RunningKube(Running):
    """Running, reporting to a real API server (cfg.kube on), with the loop's default sources."""

    def __init__(self, root, kube, **kw) -> None:
        import dataclasses
        import io

        from gpuwarden.agent.loop import Agent
        from gpuwarden.kube.log import Log

        super().__init__(root, **kw)
        cfg = dataclasses.replace(self.agent.cfg, kube=True, namespace="gpuwarden")
        self.agent = Agent(cfg, root=HostRoot(str(root)), kube=kube,
                           log=Log("text", node="gpu-node-a", stream=self.log), out=io.StringIO())
        self.thread = threading.Thread(target=self.agent.run, daemon=True)


@pytest.mark.apiserver
@pytest.mark.parametrize("wake_pods", [True, False], ids=["watched", "not-watched"])
def test_a_pod_rejected_for_a_lost_gpu_is_raised_from_the_pods_watch(tmp_path, wake_pods):
    from gpuwarden.kube.client import Kube
    from tests.k8s.test_agent_admission_fence import plugin_lost_node, rejected_pod
    from tests.rules.test_lost_gpu import GPA_LOST
    from tests.support.agent_kube import ensure_namespace, make_node
    from tests.support.apiserver import ApiServerUnavailable, start_apiserver

    try:
        server = start_apiserver()
    except ApiServerUnavailable as exc:
        pytest.skip(f"REAL API SERVER UNAVAILABLE: {exc}")
    with server as s:
        admin = Kube(s.api_client())
        for ns in ("gpuwarden", "ml"):
            ensure_namespace(admin, ns)
        make_node(admin, "gpu-node-a")
        root = plugin_lost_node(tmp_path / "lost") / "files"  # the bundle's tree, read as a live node
        with _RunningKube(root, Kube(s.api_client()), interval_s=60.0, wake_pods=wake_pods) as r:
            # GPU-K8S-012 is raised already from the plugin's "GPU is lost"; the rejected pod is its proof
            # (the pod named, CONFIRMED): what each check concluded is recorded
            seen: list[tuple[float, str]] = []
            check = r.agent.check

            def recording(*a):
                res = check(*a)
                import msgspec

                seen.append((time.monotonic(), msgspec.json.encode(
                    [f for f in res.findings if f.code == "GPU-K8S-012"]).decode()))
                return res

            r.agent.check = recording
            if wake_pods:
                assert wait(lambda: any(isinstance(x, PodsWatch) and x.up for x in r.agent.loop.running), 10)
            time.sleep(0.5)  # the first check's confirming read is done
            t0 = time.monotonic()
            rejected_pod(admin, "ml", "storm-0", "gpu-node-a", GPA_LOST, t=time.time())
            named = wait(lambda: any("storm-0" in text for t, text in seen if t > t0), BOUND_S)
            if wake_pods:
                assert named, (seen, r.log.getvalue())
                assert r.agent.debounce.raised("GPU-K8S-012")
                assert r.metric("gpuwarden_wakeups_total", source="pods", topic="admission") >= 1
                assert wait(lambda: "scope=admission source=pods" in r.log.getvalue(), 2), r.log.getvalue()
            else:
                assert not named and not any(isinstance(x, PodsWatch) for x in r.agent.loop.running)
