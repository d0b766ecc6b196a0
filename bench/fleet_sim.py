#!/usr/bin/env python3
"""Many GPU nodes failing at once: real gpuwarden agents, hundreds to thousands in one process.

    .venv/bin/python bench/fleet_sim.py --nodes 1500 --failing 750 --interval 2 > OUT.json
    .venv/bin/python bench/fleet_sim.py --agents events --fault xid --nodes 1500 --failing 500 > OUT.json  # as root

Starts the test API server (tools/testapiserver + etcd, docs/testing-apiserver.md) with the chart's
RBAC and admission policies for `agent.remediate=on` (tests/support/rbac.py), creates the Nodes, and
runs one real `Agent` (gpuwarden.agent.loop) per Node, remediation on (taint), each with its own
identity: a bound-ServiceAccount-like token whose node-name claim names its Node (what the chart's
node confinement checks), its own API client, and its own root (a node that stays healthy: a bundle
overlaying the built-in `healthy` example; a node that will fail: a hard-linked copy of it). The real
controller (`gpuwarden controller --execute`, its own process and token) watches the fleet and opens
the agents' breaker in a storm (`--no-controller`: none).

The fault: at T0 the NVIDIA driver disappears from `--failing` roots at once (`/proc/modules` and
`/proc/devices` lose their nvidia lines, `/proc/driver/nvidia/version` is removed: a bad driver rollout, GPU-DRV-001 critical,
whose action is the node taint). `--waves 7,3` injects them in waves (the next once the breaker is
open, or `--wave-gap` later). `--fault xid`: Xid 79 (the GPU fell off the bus, GPU-HW-002 critical, the
node taint) appended to each failing root's kernel log: one code on every node, which the controller's
fence storm (controller/fencing.py) counts. `--recover`: then the fault is reverted on every root, and
the run waits for the breaker to close and the taints to go. `--fault memory`: incident 4 instead (a root switched to a copy of the
driver-memory-cascade example; the action is the eviction of the node's culprit pod).
Measured, per failing node: fault injected on its root -> taint visible in the API (a watch of this
process), and the agent's own path (start of the check that raised the fault -> taint visible); the
breaker (when it opened, its Event, what the agents did after); every write per node from the
server's audit (exactly one taint PATCH per failing node, none on a healthy one).

`--agents events --fault xid` (issue 41): each agent is its own event loop (`Agent.run`, as `gpuwarden agent`
runs it) at the chart's defaults (interval 60 s, debounce 2, confirm_delay 0.2 s) on a real node tree (the
`healthy` example materialized: files and mknod'd device nodes; a failing node's tree is its own hard-linked
copy with its own kernel log, a healthy node reads one shared tree that never changes). The fault is an Xid 79
line appended in place to the failing node's kernel log at its own time T; its log-file source sees it through
inotify, the coalescing queue wakes the loop, the targeted check sees it bad, the confirming re-read 0.2 s later
raises it, the executor taints (through the breaker's gate). Measured from T: the source's wake
(`fault_to_seen_s`), the raise, the taint seen by the watch (`fault_to_fence_s`); which check raised it
(`raised_by`: "confirm" is the event path, "periodic" would be the interval). What is shared or simulated,
and only that: one inotify instance and one thread for every agent's two inotify sources (InotifyHub: the
kernel allows 128 instances per user, and 3,000 poll threads would be the simulator's cost, not the agent's);
the sources' own handlers run on it unchanged. A Gate of `--workers` CPU slots through which every check
passes, event-driven checks first (without it thousands of runnable threads in one GIL are all slow
together); its wait is `sim_lag_event_checks_s`. The API client's connection pool (as below). Left out: the
pods watch (`wake_pods` off: no pod fails in this fault, and thousands of watch streams would measure the
API server's fan-out) and NVML (no GPU); PSI and /dev/kmsg say they are unavailable on a tree, as on any.

What the simulator cannot give each agent is its own CPU: every check runs in this one process
(one GIL), checks of failing nodes first. `sim_lag_s` says how late checks ran; on a real fleet each
agent checks on its own node, so fault -> taint there is the detection time (a uniform phase within
`--interval`, plus `debounce_raise - 1` intervals) plus the agent path, reported as `projected`.
Many agents share one HTTP connection pool (each request still carries its own node's token).
"""

from __future__ import annotations

import argparse
import heapq
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO), str(REPO / "src")):
    if p not in sys.path:
        sys.path.append(p)

from gpuwarden.agent.config import AgentConfig  # noqa: E402
from gpuwarden.agent.loop import Agent  # noqa: E402
from gpuwarden.examples import HERE as EXAMPLES, open_bundle_dir  # noqa: E402
from gpuwarden.kube.client import SMP, Kube  # noqa: E402
from gpuwarden.kube.errors import KubeError  # noqa: E402
from tests.support.apiserver import start_apiserver  # noqa: E402
from tests.support.rbac import chart_authz  # noqa: E402

TAINT_KEY = "gpuwarden.io/unhealthy"
FAULTS = {"driver": ("GPU-DRV-001", "taint-node"), "memory": ("GPU-NODE-001", "evict-pod-for-memory"),
          "xid": ("GPU-HW-002", "taint-node")}
#: --fault xid: the healthy example's GPU falls off the bus (Xid 79, as the driver prints it; GPU-HW-002)
XID79 = "3,358,3800000,-;NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
MEMORY_EXAMPLE, MEMORY_NS = "driver-memory-cascade", "render"
MEMORY_POD_UID = "5e0c3a7e-2b1d-4c9a-8e7f-6d5c4b3a2918"  # the render pod of the driver-memory-cascade example
EVENT_NS = "default"
#: NVSentinel's published scale test (1,503 nodes): fault -> cordon P90 when N nodes fail at once
NVSENTINEL_P90_S = {150: 28, 375: 163, 750: 419}
#: NVSentinel's published scale test (v1.31 line, 2026-09): detect -> cordon P50 / P99 with N nodes failing at
#: once, measured from the detection's health event (not from the fault)
NVSENTINEL_P50_P99_S = {100: (1.1, 2.2), 500: (5.9, 15.7), 1000: (28.0, 42.7)}


class Quiet:
    """The agents' structured log, kept only for what the report needs (remediation outcomes)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, msg: str, **kv: Any) -> None:
        if msg in ("remediation", "remediation-failed", "check-failed", "conditions-failed"):
            self.lines.append((msg, kv))

    warn = error = info


@dataclass
class SimNode:
    name: str
    root: Path
    failing: bool = False
    agent: Any = None
    due: float = 0.0
    hot: bool = False  # fault injected: its checks go first
    busy: bool = False
    checks: int = 0
    check_s: list[float] = field(default_factory=list)
    lag_s: list[tuple[float, float]] = field(default_factory=list)  # (check start, how late it started)
    t_inject: float | None = None
    t_raise_check: float | None = None  # start of the check whose observation raised the fault
    t_taint_sent: float | None = None  # the agent's taint PATCH left
    t_tainted: float | None = None  # the taint first seen by the watch
    t_evicted: float | None = None  # the agent's eviction returned (the pod is gone: grace period 0)
    fault_root: Any = None  # --fault memory: the node's root once the fault is in
    results: list[str] = field(default_factory=list)  # outcomes of the fault's action
    errors: list[str] = field(default_factory=list)
    t_evict_sent: float | None = None
    t_seen: float | None = None  # --agents events: the fault's wake, as its source saw it
    t_raised: float | None = None  # --agents events: the end of the check that raised the fault
    event_cpu_s: list[float] = field(default_factory=list)  # --agents events: CPU of its checks, fault -> raise
    raised_by: str = ""  # which check raised it: "confirm" (the re-read), a wake-up's topics, or "periodic"

    @property
    def t_acted(self) -> float | None:
        """The fault's action visible: the taint seen by the watch, or the eviction returned."""
        return self.t_tainted if self.t_tainted is not None else self.t_evicted

    @property
    def t_sent(self) -> float | None:
        return self.t_taint_sent if self.t_taint_sent is not None else self.t_evict_sent


# -- the node's root --------------------------------------------------------------------------------
def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def make_root(base: Path, name: str, fails: bool) -> Path:
    """The node's own root. A node that will fail: a copy of the `healthy` example, its files hard-linked
    (the fault replaces and removes files, never writes into one). A node that stays healthy: a bundle
    overlaying the shipped `healthy` example with nothing of its own (the same reads, two files)."""
    dest = base / name
    if fails:
        shutil.copytree(EXAMPLES / "healthy", dest, copy_function=_link_or_copy)
        return dest
    (dest / "files").mkdir(parents=True)
    meta = json.loads((EXAMPLES / "healthy" / "meta.json").read_text())
    (dest / "meta.json").write_text(json.dumps({"base": "healthy", "format": meta.get("format"),
                                                "captured_at": meta.get("captured_at")}))
    return dest


def inject_driver_gone(root: Path) -> None:
    """The NVIDIA driver unloaded: /proc/modules without its nvidia lines, /proc/devices without the char
    devices its modules registered (the kernel unregisters them at unload; a node file that kept them
    while the modules are gone is one no kernel writes, and gpuwarden grades it at-risk, not confirmed:
    issue 30), no /proc/driver/nvidia/version."""
    for name, keep in (("modules", lambda ln: not ln.startswith("nvidia")),
                       ("devices", lambda ln: not (ln.split()[1:2] and ln.split()[1].startswith("nvidia")))):
        f = root / "files" / "proc" / name
        kept = "".join(ln for ln in f.read_text().splitlines(True) if keep(ln))
        tmp = f.with_name(name + ".tmp")
        tmp.write_text(kept)
        os.replace(tmp, f)  # a new inode: the example's own file is untouched
    (root / "files" / "proc" / "driver" / "nvidia" / "version").unlink(missing_ok=True)


def inject_xid(root: Path) -> None:
    """The GPU fell off the bus: Xid 79 in the kernel log of this boot (a new inode: the example's file is
    untouched). The same code on every failing node, as one bad driver or firmware rollout gives."""
    f = root / "files" / ".gpuwarden" / "logs" / "kmsg.txt"
    tmp = f.with_name("kmsg.txt.tmp")
    tmp.write_text(f.read_text() + XID79)
    os.replace(tmp, f)


def make_tree_template(base: Path) -> Path:
    """--agents events: the `healthy` example as a real tree (files, device nodes by mknod: needs root), the
    root every healthy node's agent reads (a node that never changes; its watches are the same directories)."""
    from gpuwarden.examples import open_example
    from tests.support.bundles import materialize

    return materialize(open_example("healthy"), base / "_healthy-tree")


def make_tree(base: Path, name: str, template: Path) -> Path:
    """A failing node's own tree: the template hard-linked (`cp -al`: its own directories, so its own
    inotify watches), its kernel log a copy of its own, which the fault appends to."""
    dest = base / name
    subprocess.run(["cp", "-al", str(template), str(dest)], check=True)
    log = dest / ".gpuwarden" / "logs" / "kmsg.txt"
    tmp = log.with_name("kmsg.txt.own")
    shutil.copyfile(log, tmp)
    os.replace(tmp, log)
    return dest


def append_xid(root: Path) -> float:
    """--agents events: the GPU falls off the bus as the kernel logs it: Xid 79 appended to the node's own
    kernel log, in place (the log-file source sees it through inotify). Returns the fault's own time: just
    before the write."""
    with open(root / ".gpuwarden" / "logs" / "kmsg.txt", "a") as f:
        t = time.time()
        f.write(XID79)
    return t


class SwitchRoot:
    """--fault memory: the node's root, switched at T0 from its healthy tree to a copy of the
    driver-memory-cascade example (incident 4), whose pod UID is the one the API server gave that
    node's pod. The agent reads through it as through any root; only the tree behind it changes."""

    def __init__(self, root: Any) -> None:
        self.current = root

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)


def memory_fault_root(base: Path, name: str, pod_uid: str) -> Any:
    from tests.support.agent_nodes import rename_uids

    dest = base / f"{name}.fault"
    shutil.copytree(EXAMPLES / MEMORY_EXAMPLE, dest)  # a real copy: the UIDs are rewritten in place
    rename_uids(dest, {MEMORY_POD_UID: pod_uid})
    return open_bundle_dir(dest, label=f"sim:{name}")


def culprit_pod(node: str) -> dict:
    """The pod the memory example blames, one per failing node (its name made unique; the agent finds it by UID)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"egl-render-{node}", "namespace": MEMORY_NS,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "egl-render",
                                              "uid": "7d1c0c5e-0000-4000-8000-000000000001", "controller": True}]},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "render", "image": "registry.example/render:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


# -- identities and clients -------------------------------------------------------------------------
def shared_pool(url: str, size: int) -> Any:
    from kubernetes import client
    from kubernetes.client import rest

    cfg = client.Configuration()
    cfg.host, cfg.retries, cfg.connection_pool_maxsize = url, False, size
    return rest.RESTClientObject(cfg)


class TimedKube(Kube):
    """The agent's Kube, noting when its taint PATCH (or eviction) left, past the breaker's gate (the only
    behaviour added): a write the gate refused is not counted as sent."""

    node: SimNode | None = None

    def _sent_since(self, t: float) -> float | None:
        """When this client's latest write left, if after `t` (a write the breaker's gate refused never left)."""
        return self.last_write_sent if self.last_write_sent >= t else None

    def patch_node(self, name: str, patch: Any, content_type: str = SMP) -> dict:
        t = time.time()
        try:
            return super().patch_node(name, patch, content_type)
        finally:
            if self.node is not None and self.node.t_taint_sent is None and "taints" in (patch.get("spec") or {}):
                self.node.t_taint_sent = self._sent_since(t)

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> dict:
        t = time.time()
        try:
            got = super().evict_pod(namespace, name, uid)
        finally:
            if self.node is not None and self.node.t_evict_sent is None:
                self.node.t_evict_sent = self._sent_since(t)
        if self.node is not None and self.node.t_evicted is None:
            self.node.t_evicted = time.time()
        return got


def kube_for(url: str, token: str, pool: Any, node: SimNode, timeout_s: float = 10.0) -> TimedKube:
    """The agent's own API client (its token), over the process's shared connection pool."""
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host, cfg.retries = url, False
    cfg.api_key = {"authorization": f"Bearer {token}"}
    api = client.ApiClient(cfg)
    kube = TimedKube(api, timeout_s=timeout_s)
    api.rest_client = pool
    kube.node = node
    return kube


def node_body(name: str) -> dict:
    t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 86400))
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", "gpuwarden-sim": "true"}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status", "lastHeartbeatTime": t,
                                       "lastTransitionTime": t}]}}


# -- the fleet ----------------------------------------------------------------------------------------
class Fleet:
    """The agents and their schedule: a check is due every `interval` from a random phase; due checks of
    nodes whose fault was injected run first, then the others (late when the process cannot keep up)."""

    def __init__(self, nodes: list[SimNode], interval: float, workers: int, fault: str = "driver") -> None:
        self.nodes = nodes
        self.code, self.kind = FAULTS[fault]
        self.interval = interval
        self.workers = workers
        self.cv = threading.Condition()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.hot: list[tuple[float, int, int]] = []
        self.cold: list[tuple[float, int, int]] = []
        self.seq = 0
        self.cold_running = 0
        self.cold_max = max(1, workers // 8)  # checks of healthy nodes at once (the rest wait for failing ones)

    def _push(self, i: int) -> None:
        n = self.nodes[i]
        self.seq += 1
        heapq.heappush(self.hot if n.hot else self.cold, (n.due, self.seq, i))

    def start(self, rng: random.Random) -> None:
        now = time.time()
        with self.cv:
            for i, n in enumerate(self.nodes):
                n.due = now + rng.uniform(0, self.interval)
                self._push(i)
        for k in range(self.workers):
            t = threading.Thread(target=self._work, name=f"sim-{k}", daemon=True)
            t.start()
            self.threads.append(t)

    def heat(self, idx: list[int]) -> None:
        """These nodes' faults were injected: their checks go first (their due times are kept: their phase)."""
        with self.cv:
            for i in idx:
                self.nodes[i].hot = True
            self.cold = [e for e in self.cold if not self.nodes[e[2]].hot]
            heapq.heapify(self.cold)
            for i in idx:
                if not self.nodes[i].busy:
                    self._push(i)
            self.cv.notify_all()

    def _next(self) -> tuple[int, bool] | None:
        with self.cv:
            while not self.stop.is_set():
                now = time.time()
                if self.hot and self.hot[0][0] <= now:
                    _, _, i = heapq.heappop(self.hot)
                    self.nodes[i].busy = True
                    return i, False
                if self.cold and self.cold[0][0] <= now and self.cold_running < self.cold_max:
                    _, _, i = heapq.heappop(self.cold)
                    self.nodes[i].busy = True
                    self.cold_running += 1
                    return i, True
                waits = [self.hot[0][0]] if self.hot else []
                if self.cold and self.cold_running < self.cold_max:
                    waits.append(self.cold[0][0])
                soonest = min(waits, default=now + 0.5)
                self.cv.wait(max(0.001, min(0.5, soonest - now)))
        return None

    def _work(self) -> None:
        while (got := self._next()) is not None:
            i, was_cold = got
            n = self.nodes[i]
            t0 = time.time()
            n.lag_s.append((t0, t0 - n.due))
            try:
                r = n.agent.check()
                if r.transitions.get(self.code) == "raised" and n.t_raise_check is None:
                    n.t_raise_check = t0
                n.results += [o.result for o in r.outcomes if o.action.kind == self.kind]
                n.errors += r.errors
            except Exception as exc:  # a check the agent's own loop would survive
                n.errors.append(f"{type(exc).__name__}: {exc}")
            t1 = time.time()
            n.checks += 1
            n.check_s.append(t1 - t0)
            with self.cv:
                n.busy = False
                self.cold_running -= was_cold
                if n.hot and (n.t_acted is not None or "breaker-open" in n.results):
                    n.hot = False  # measured: its checks go back among the others
                n.due = t0 + max(self.interval, t1 - t0)  # the agent loop: the next check an interval after
                self._push(i)
                self.cv.notify()

    def halt(self) -> None:
        self.stop.set()
        with self.cv:
            self.cv.notify_all()
        for t in self.threads:
            t.join(timeout=30)


# -- event-driven agents (--agents events) ------------------------------------------------------------
class InotifyHub:
    """One inotify instance and one thread for every simulated agent's inotify sources (the kernel's
    default of 128 inotify instances per user, and one poll thread per source per agent, would not hold
    thousands of agents in one process). Each source gets a `View` in place of its own instance: its
    watches are added to the shared instance (IN_MASK_ADD), the events of its watch descriptors are handed
    to it, and its own handler (LogFileSource/WatchSource `_ready`: the real reading, matching and
    emitting) runs on the hub's thread as it would on its own Poller's. Shared: the instance, the fd, the
    thread. Not simulated: everything from the event on."""

    IN_MASK_ADD = 0x20000000

    def __init__(self, pace_s: float = 0.005) -> None:
        from gpuwarden.wake.inotify import Inotify

        self.ino = Inotify()
        self.pace_s = pace_s
        self.lock = threading.Lock()
        self.by_wd: dict[int, list[View]] = {}
        self.handlers: dict[View, Any] = {}
        self.failed: dict[View, str] = {}
        self.events = 0
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.thread = threading.Thread(target=self._run, name="sim-inotify-hub", daemon=True)
        self.thread.start()

    def view(self) -> "View":
        return View(self)

    def _run(self) -> None:
        import select

        p = select.poll()
        p.register(self._r, select.POLLIN)
        p.register(self.ino.fd, select.POLLIN)
        while True:
            ready = p.poll()
            if any(fd == self._r for fd, _ in ready):
                return
            touched: list[View] = []
            for e in self.ino.read():
                self.events += 1
                with self.lock:
                    views = [v for vs in self.by_wd.values() for v in vs] if e.wd < 0 else list(self.by_wd.get(e.wd, ()))
                for v in views:
                    if not v.pending:
                        touched.append(v)
                    v.pending.append(e)
            for v in touched:
                h = self.handlers.get(v)
                if h is None or v in self.failed:
                    v.pending.clear()
                    continue
                try:
                    h(select.POLLIN)
                except Exception as exc:  # as Poller: a source's bug ends that source only
                    self.failed[v] = f"{type(exc).__name__}: {exc}"
            if self.pace_s:
                time.sleep(self.pace_s)

    def close(self) -> None:
        os.write(self._w, b"x")
        self.thread.join(timeout=5)
        self.ino.close()


class View:
    """What a source sees of the hub: Inotify's interface (watch_fd, read, close, fd)."""

    def __init__(self, hub: InotifyHub) -> None:
        self.hub = hub
        self.fd = hub.ino.fd
        self.pending: list = []
        self.wds: list[int] = []

    def watch_fd(self, dirfd: int, mask: int) -> int:
        wd = self.hub.ino.watch_fd(dirfd, mask | InotifyHub.IN_MASK_ADD)
        with self.hub.lock:
            self.hub.by_wd.setdefault(wd, []).append(self)
        self.wds.append(wd)
        return wd

    def read(self) -> list:
        out, self.pending = self.pending, []
        return out

    def close(self) -> None:
        with self.hub.lock:
            for wd in self.wds:
                vs = self.hub.by_wd.get(wd, [])
                if self in vs:
                    vs.remove(self)
        self.hub.handlers.pop(self, None)


def hub_sources(root: Any, hub: InotifyHub, kubelet_root: str = "/var/lib/kubelet") -> list:
    """The agent's tree sources (agent/events.default_sources on a node tree: the kernel log's files, the
    watched directories, PSI), the two inotify ones on the hub. /dev/kmsg is not tried (a tree's is not
    the kernel's device); PSI says it is unavailable on a tree (its files are not the kernel's)."""
    from gpuwarden.wake.logfile import LogFileSource
    from gpuwarden.wake.psi import PsiSource
    from gpuwarden.wake.watch import WatchSource

    def on_hub(cls: type) -> type:
        class OnHub(cls):  # type: ignore[misc, valid-type]
            def _listen(self, fds: Any) -> None:
                (fd, _mask, handler), = list(fds)
                hub.handlers[self._ino] = handler

            @property
            def failed(self) -> str:
                return hub.failed.get(self._ino, "") if self._ino is not None else ""

            def _unlisten(self) -> None:
                if self._ino is not None:
                    hub.handlers.pop(self._ino, None)

        OnHub.__name__ = cls.__name__
        return OnHub

    srcs = [on_hub(LogFileSource)(root), on_hub(WatchSource)(root, kubelet_root=kubelet_root), PsiSource(root)]
    for s in srcs[:2]:
        s.new_inotify = hub.view
    return srcs


class Gate:
    """The simulator's CPUs: at most `slots` checks at once; a waiting check caused by an event (a wake-up's
    targeted check, a confirming re-read) goes first, then an agent's first check (its start), then the
    periodic ones, each kind first come first served (this machine cannot run thousands of agents'
    periodic checks every 60 s: they lag, and the report says by how much). On a real fleet each agent
    checks on its own node; here they share this process (one GIL), and without a gate thousands of
    runnable threads would all be slow together. A freed slot wakes one waiter (its own Event), never all.
    The wait is the simulator's lag (`sim_lag_event_checks_s`), never the agent's."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.lock = threading.Lock()
        self.busy = 0
        self.waiting: list[tuple[int, int, threading.Event]] = []  # one Event per waiter: a slot wakes one thread
        self.seq = 0
        self.closed = False  # halted: a check still waiting is refused (the agent's loop logs it and stops)

    def enter(self, prio: int) -> None:
        with self.lock:
            if self.closed:
                raise RuntimeError("the simulator halted")
            if self.busy < self.slots and not self.waiting:
                self.busy += 1
                return
            self.seq += 1
            me = threading.Event()
            heapq.heappush(self.waiting, (prio, self.seq, me))
        me.wait()
        if self.closed:
            raise RuntimeError("the simulator halted")
        # the slot was handed over by leave(): busy already counts it

    def leave(self) -> None:
        with self.lock:
            if self.waiting and not self.closed:
                heapq.heappop(self.waiting)[2].set()  # the slot passes to the first waiter
            else:
                self.busy -= 1

    def close(self) -> None:
        with self.lock:
            self.closed = True
            waiting, self.waiting = self.waiting, []
        for _, _, ev in waiting:
            ev.set()


class EventFleet:
    """One real agent loop per node (`Agent.run`: its event loop, sources, queue, targeted checks and
    confirming re-reads, at the chart's defaults), each in its own thread, its checks through the Gate."""

    def __init__(self, nodes: list[SimNode], workers: int, fault: str, hub: InotifyHub) -> None:
        self.nodes = nodes
        self.code, self.kind = FAULTS[fault]
        self.gate = Gate(workers)
        self.hub = hub
        self.threads: list[threading.Thread] = []
        self.cold_max = workers  # run() sets it (the scheduled fleet's knob); here the Gate's order does it
        self.confirm_delay_s = nodes[0].agent.cfg.confirm_delay_s if nodes and nodes[0].agent else 0.2

    def wire(self, n: SimNode) -> None:
        """The agent's check, timed and gated; what it did noted (the decision path is the agent's own)."""
        real, gate, code, kind = n.agent.check, self.gate, self.code, self.kind

        def check(scope: Any = None) -> Any:
            want = time.time()
            gate.enter(0 if scope is not None else 1 if n.checks == 0 else 2)
            t0, c0 = time.time(), time.thread_time()
            try:
                r = real() if scope is None else real(scope)
            finally:
                c1 = time.thread_time()
                gate.leave()
            t1 = time.time()
            if scope is not None and n.t_inject is not None and n.t_raise_check is None:
                n.event_cpu_s.append(c1 - c0)  # this check's own CPU (its thread's), the fault's way to the raise
            n.lag_s.append((t0, t0 - want))
            n.checks += 1
            n.check_s.append(t1 - t0)
            if scope is not None and n.t_inject is not None and n.t_seen is None and scope.seen >= n.t_inject:
                n.t_seen = scope.seen  # the wake of the fault: the source's own time of seeing it
            if r.transitions.get(code) == "raised" and n.t_raise_check is None:
                n.t_raise_check, n.t_raised = t0, t1
                n.raised_by = "periodic" if scope is None else ("confirm" if scope.confirm else scope.label)
            n.results += [o.result for o in r.outcomes if o.action.kind == kind]
            n.errors += r.errors
            return r

        n.agent.check = check

    def start(self, rng: random.Random, in_flight: int = 16) -> None:
        """Each agent's loop in its thread, at most `in_flight` of them before their first check (the phase
        of each agent's interval is when its first check ran: spread over the warm-up)."""
        from collections import deque

        waiting: deque = deque()
        for n in self.nodes:
            while True:
                waiting = deque(m for m in waiting if m.checks == 0)
                if len(waiting) < in_flight:
                    break
                time.sleep(0.02)
            t = threading.Thread(target=n.agent.run, name=f"agent-{n.name}", daemon=True)
            t.start()
            self.threads.append(t)
            waiting.append(n)

    def sources_running(self) -> dict[str, int]:
        """Source name -> how many agents run it (the others said why not and fell back to the interval)."""
        ran: dict[str, int] = {}
        for n in self.nodes:
            loop = getattr(n.agent, "loop", None)
            for src in list(getattr(loop, "running", None) or []):
                ran[src.name] = ran.get(src.name, 0) + 1
        return dict(sorted(ran.items()))

    def heat(self, idx: list[int]) -> None:
        """Nothing to do: the fault's own event wakes the agent."""

    def halt(self, timeout_s: float = 60.0) -> None:
        """Stop every agent; wait for their loops at most `timeout_s` in all (daemon threads: a loop still
        queued at the Gate ends with the process)."""
        for n in self.nodes:
            if n.agent is not None:
                n.agent.stop()
        self.gate.close()  # nothing waits for a slot any more
        end = time.time() + timeout_s
        for t in self.threads:
            t.join(timeout=max(0.0, end - time.time()))


def watch_taints(kube: Kube, nodes: dict[str, SimNode], rv: str, stop: threading.Event, seen: dict) -> None:
    """The first time each Node shows our taint, as this process sees it through a watch."""
    while not stop.is_set():
        try:
            for ev in kube.watch("/api/v1/nodes", rv, timeout_s=5, label_selector="gpuwarden-sim=true"):
                obj = ev.get("object") or {}
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                if ev.get("type") not in ("ADDED", "MODIFIED"):
                    continue
                name = obj["metadata"]["name"]
                taints = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("key") == TAINT_KEY]
                n = nodes.get(name)
                if taints and n is not None and n.t_tainted is None:
                    n.t_tainted = time.time()
                if stop.is_set():
                    return
        except KubeError as exc:
            seen.setdefault("watch_errors", []).append(str(exc)[:200])
            if exc.status == 410:
                rv = ""
            time.sleep(0.2)


def watch_breaker(kube: Kube, ns: str, name: str, stop: threading.Event, seen: dict) -> None:
    while not stop.is_set():
        try:
            cm = kube.get_configmap(ns, name)
            is_open = bool(cm) and str((cm.get("data") or {}).get("open", "")).lower() == "true"
            if is_open and "breaker_open" not in seen:
                seen["breaker_open"] = time.time()
                seen["breaker_reason"] = (cm.get("data") or {}).get("reason", "")
            elif not is_open and "breaker_open" in seen and "breaker_closed" not in seen:
                seen["breaker_closed"] = time.time()
        except KubeError:
            pass
        stop.wait(0.1)


# -- the run ------------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(q * (len(xs) - 1)))))
    return round(xs[k], 2)


def pct_rank(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (as bench/event_latency.py), 3 decimals."""
    if not xs:
        return None
    ys = sorted(xs)
    return round(ys[max(0, min(len(ys) - 1, -(-int(q * 1000) * len(ys) // 1000) - 1))], 3)


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "p50": pct(xs, 0.5), "p90": pct(xs, 0.9), "p99": pct_rank(xs, 0.99),
            "max": round(max(xs), 2) if xs else None}


def run(nodes: int, failing: int, interval: float = 2.0, workers: int = 8, controller: bool = True,
        waves: list[int] | None = None, wave_gap: float = 10.0, settle_s: float = 5.0, max_s: float = 300.0,
        seed: int = 1, storm_fraction: float = 0.3, fault: str = "driver", evict_policy: bool = False,
        healthy_checks: int = 1, recover: bool = False, agents: str = "scheduled", log=None) -> dict:
    """One simulated storm; returns the report (a dict, JSON-ready). `max_s` bounds the warm-up and the
    storm together; `healthy_checks`: the storm ends only when each healthy node's agent checked this often
    since T0 (and each failing node's acted or was halted). `agents`: "scheduled" (checks run by the
    simulator's workers every `interval`) or "events" (each agent's own event loop; --fault xid only)."""
    say = log or (lambda *a: print(*a, file=sys.stderr, flush=True))
    if agents not in ("scheduled", "events"):
        raise ValueError(f"agents {agents!r}: scheduled or events")
    if agents == "events" and fault != "xid":
        raise ValueError("--agents events injects the fault as its source sees it: --fault xid (a kernel log line)")
    rng = random.Random(seed)
    waves = list(waves or [failing])
    if sum(waves) != failing or min(waves) < 0:
        raise ValueError(f"waves {waves} must add up to the {failing} failing nodes")
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    authz, ids = chart_authz("on", {"execute": True, "actions": ["workload", "node"]}, names,
                             values={"nodeConfinement": {"evictions": evict_policy}})
    work = Path(tempfile.mkdtemp(prefix="gw-fleet-"))
    out: dict = {"nodes": nodes, "failing": failing, "interval_s": interval, "debounce_raise": 2, "workers": workers,
                 "controller": controller, "waves": waves, "cpus": os.cpu_count(), "fault": FAULTS[fault][0],
                 "action": FAULTS[fault][1], "eviction_policy": evict_policy, "agents": agents}
    ctl = None
    stop = threading.Event()
    fleet: Any = None
    hub: InotifyHub | None = None
    seen: dict = {}
    t_setup = time.time()
    try:
        with start_apiserver(authz=authz) as s:
            admin = Kube(s.api_client())
            for ns in (ids.namespace, MEMORY_NS):
                admin.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": ns}})
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda n: admin.request("POST", "/api/v1/nodes", node_body(n)), names))
            sims = [SimNode(n, work / n) for n in names]
            for i in rng.sample(range(nodes), failing):
                sims[i].failing = True
            if agents == "events":
                template = make_tree_template(work)
                for n in sims:
                    n.root = make_tree(work, n.name, template) if n.failing else template
            else:
                for n in sims:
                    make_root(work, n.name, n.failing and fault in ("driver", "xid"))
            for n in sims:
                if n.failing and fault == "memory":  # the pod the fault will blame, and the root it will come with
                    pod = admin.request("POST", f"/api/v1/namespaces/{MEMORY_NS}/pods", culprit_pod(n.name))
                    admin.request("PATCH", f"/api/v1/namespaces/{MEMORY_NS}/pods/{pod['metadata']['name']}/status",
                                  {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                                  content_type="application/merge-patch+json")
                    n.fault_root = memory_fault_root(work, n.name, pod["metadata"]["uid"])
            pool = shared_pool(s.url, workers + 4)
            cfg_base = dict(namespace=ids.namespace, event_namespace=EVENT_NS, listen="", probes=False, grpc=False,
                            boot_grace_s=0, interval_s=interval, remediate="on", node_fault_action="taint",
                            taint_key=TAINT_KEY)

            if agents == "events":  # the chart's defaults: interval, debounce 2, confirm_delay 0.2 s
                cfg_base.update(wake=True, wake_pods=False, wake_nvml=False)
                hub = InotifyHub()

            def make_agent(n: SimNode) -> None:
                kube = kube_for(s.url, ids.agent_token(n.name), pool, n)
                if agents == "events":
                    from gpuwarden.root import HostRoot

                    root = HostRoot(str(n.root))
                    n.agent = Agent(AgentConfig(node_name=n.name, **cfg_base), kube=kube, root=root, out=io.StringIO(),
                                    log=Quiet())
                    n.agent.sources = hub_sources(root, hub)
                    return  # its own run() starts it (agent.start, then the event loop)
                root = open_bundle_dir(n.root, label=f"sim:{n.name}")
                n.agent = Agent(AgentConfig(node_name=n.name, **cfg_base), kube=kube,
                                root=SwitchRoot(root) if n.fault_root is not None else root, out=io.StringIO(),
                                log=Quiet())
                n.agent.start()

            with ThreadPoolExecutor(workers) as ex:
                list(ex.map(make_agent, sims))
            out["setup_s"] = round(time.time() - t_setup, 1)
            say(f"[fleet] {nodes} nodes, {nodes} agents started in {out['setup_s']} s")
            if controller:
                ctl = start_controller(s, ids, work, storm_fraction)
            by_name = {n.name: n for n in sims}
            rv = admin.list("/api/v1/nodes", label_selector="gpuwarden-sim=true")["metadata"]["resourceVersion"]
            threads = [threading.Thread(target=watch_taints, args=(admin, by_name, rv, stop, seen), daemon=True),
                       threading.Thread(target=watch_breaker, args=(Kube(s.api_client()), ids.namespace,
                                                                     "gpuwarden-breaker", stop, seen), daemon=True)]
            for t in threads:
                t.start()
            if agents == "events":
                fleet = EventFleet(sims, workers, fault, hub)
                for n in sims:
                    fleet.wire(n)
                fleet.start(rng, in_flight=2 * workers)
            else:
                fleet = Fleet(sims, interval, workers, fault)
                fleet.cold_max = workers  # until T0 every node is healthy: all workers check
                fleet.start(rng)
            # warm: every agent has checked once (its first check scans its logs whole)
            deadline = time.time() + max_s
            while min(n.checks for n in sims) < 1 and time.time() < deadline:
                time.sleep(0.2)
            out["warm_s"] = round(time.time() - t_setup - out["setup_s"], 1)
            if agents == "events":  # what each agent's loop runs (before the storm: stopping clears it)
                out["sources_running"] = fleet.sources_running()
                out["threads_at_t0"] = threading.active_count()
            say(f"[fleet] warm after {out['warm_s']} s; injecting {failing} faults in waves of {waves}")
            bad = [i for i, n in enumerate(sims) if n.failing]
            fleet.cold_max = max(1, workers // 8)  # from T0 most workers wait for the failing nodes' checks
            t0 = time.time()
            checks_at_t0 = {n.name: n.checks for n in sims}
            out["wave_log"] = []
            first = 0
            for w, size in enumerate(waves):
                part = bad[first:first + size]
                first += size
                if w:  # the next wave: once the breaker is open, or `wave_gap` later
                    until = time.time() + wave_gap
                    while time.time() < until and "breaker_open" not in seen:
                        time.sleep(0.05)
                out["wave_log"].append({"nodes": len(part), "at_s": round(time.time() - t0, 2),
                                        "breaker_open_before": "breaker_open" in seen,
                                        "names": [sims[i].name for i in part][:50]})
                for i in part:
                    if fault == "memory":
                        sims[i].agent.root.current = sims[i].fault_root
                    elif fault == "xid" and agents == "events":
                        sims[i].t_inject = append_xid(sims[i].root)
                        continue
                    elif fault == "xid":
                        inject_xid(sims[i].root)
                    else:
                        inject_driver_gone(sims[i].root)
                    sims[i].t_inject = time.time()
                fleet.heat(part)
            # until every failing node is tainted or halted by the breaker, and every agent checked since
            def acted(n: SimNode) -> bool:
                return n.t_acted is not None or "breaker-open" in n.results

            def done() -> bool:
                if any(n.failing and not acted(n) for n in sims):
                    return False
                return all(n.checks - checks_at_t0[n.name] >= (healthy_checks if not n.failing else 2) for n in sims)

            while not done() and time.time() < deadline:
                if all(acted(n) for n in sims if n.failing):
                    fleet.cold_max = workers  # the storm is measured: the rest check at full speed
                time.sleep(0.2)
            time.sleep(settle_s)  # anything late (a duplicate) still lands in the audit
            out["storm_s"] = round(time.time() - t0, 1)
            if recover:
                out["recovery"] = recover_fleet(sims, admin, seen, deadline + max_s)
            fleet.halt()
            stop.set()
            if ctl is not None:  # before the API server goes
                _stop_proc(ctl)
            audit = s.audit()
            out.update(report(sims, seen, audit, ids, admin, t0, interval, checks_at_t0))
            if agents == "events":
                out.update(event_report(sims, fleet, hub, t0))
            if fault == "memory":
                out.update(eviction_report(sims, audit, ids, t0))
            out["sim_rss_mib"] = _rss_mib()
    finally:
        stop.set()
        if fleet is not None:
            fleet.halt()
        if hub is not None:
            hub.close()
        if ctl is not None:
            _stop_proc(ctl)
            out["controller_log_tail"] = _tail(work / "controller.log", 3)
        shutil.rmtree(work, ignore_errors=True)
    return out


def recover_fleet(sims: list[SimNode], admin: Kube, seen: dict, until: float) -> dict:
    """--recover: the fault goes from every failing root at once (the bad rollout reverted: the example's own
    files back); until the breaker is closed and no node carries our taint, or `until`."""
    def tainted() -> list[str]:
        return [n["metadata"]["name"] for n in admin.list_nodes("gpuwarden-sim=true")
                if any(t.get("key") == TAINT_KEY for t in (n.get("spec") or {}).get("taints") or [])]

    at_storm_end = tainted()
    t_fix = time.time()
    for n in sims:
        if n.failing:
            for rel in (".gpuwarden/logs/kmsg.txt", "proc/modules", "proc/devices", "proc/driver/nvidia/version"):
                src, dst = EXAMPLES / "healthy" / "files" / rel, n.root / "files" / rel
                if src.exists() and dst.parent.exists():
                    tmp = dst.with_name(dst.name + ".tmp")
                    shutil.copyfile(src, tmp)
                    os.replace(tmp, dst)
    left = at_storm_end
    while time.time() < until:
        left = tainted()
        if "breaker_closed" in seen and not left:
            break
        time.sleep(0.5)
    closed = seen.get("breaker_closed")
    passed = [e.get("message", "") for e in admin.list_events("", field_selector="reason=GPUFenceStormPassed")]
    return {"tainted_at_storm_end": len(at_storm_end), "breaker_closed_after_fix_s": round(closed - t_fix, 2) if closed else None,
            "tainted_after": len(left), "passed_events": passed[:3]}


def start_controller(s: Any, ids: Any, work: Path, storm_fraction: float) -> subprocess.Popen:
    """The real controller, its own process and token (the chart's controller identity)."""
    log = open(work / "controller.log", "wb")
    cmd = [sys.executable, "-m", "gpuwarden", "controller", "--kubeconfig", s.kubeconfig_for(ids.controller_token),
           "--namespace", ids.namespace, "--execute", "--listen", "", "--interval", "2s", "--retry-period", "1s",
           "--storm-fraction", str(storm_fraction)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()
    admin = Kube(s.api_client())
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:  # leading: it holds the Lease
        lease = admin.get_lease(ids.namespace, "gpuwarden-controller")
        if lease and (lease.get("spec") or {}).get("holderIdentity"):
            break
        time.sleep(0.3)
    return proc


def report(sims: list[SimNode], seen: dict, audit: list[dict], ids: Any, admin: Kube, t0: float, interval: float,
           checks_at_t0: dict) -> dict:
    bad = [n for n in sims if n.failing]
    good = [n for n in sims if not n.failing]
    acted = [n for n in bad if n.t_acted is not None]
    opened = seen.get("breaker_open")
    # every write per node, from the server's own audit: the agents' taint PATCHes (nodes, no subresource)
    patches: dict[str, int] = {}
    for a in audit:
        if a["user"] == ids.agent_user and a["verb"] == "patch" and a.get("resource") == "nodes" \
                and not a.get("subresource") and a["allowed"]:
            patches[a["name"]] = patches.get(a["name"], 0) + 1
    denied = [a for a in audit if a["user"] in (ids.agent_user, ids.controller_user) and not a["allowed"]]
    # what the API holds at the end
    api_tainted = {n["metadata"]["name"] for n in admin.list_nodes("gpuwarden-sim=true")
                   if any(t.get("key") == TAINT_KEY for t in (n.get("spec") or {}).get("taints") or [])}
    action_events: dict[str, list[int]] = {}
    for e in admin.list_events(EVENT_NS, field_selector="reason=TaintedNode"):
        action_events.setdefault(e["involvedObject"]["name"], []).append(int(e.get("count") or 1))
    storm_events = [{"reason": e["reason"], "type": e["type"], "object": f"{e['involvedObject']['kind']}/"
                     f"{e['involvedObject']['name']}", "message": e.get("message", "")}
                    for reason in ("GPUNodeStorm", "GPUFenceStorm")
                    for e in admin.list_events(ids.namespace, field_selector=f"reason={reason}")]
    lat = [n.t_acted - n.t_inject for n in acted]
    path = [n.t_acted - n.t_raise_check for n in acted if n.t_raise_check]
    api = [n.t_acted - n.t_sent for n in acted if n.t_sent]
    lag = [x for n in sims for t, x in n.lag_s if t >= t0]
    # how late the failing nodes' checks ran between their fault and their action (counted from the fault)
    hot_lag = [min(x, t - n.t_inject) for n in bad if n.t_inject for t, x in n.lag_s
               if n.t_inject <= t <= (n.t_acted or float("inf"))]
    check_s = [x for n in sims for x in n.check_s[2:]]
    p90_path = pct(path, 0.9) or 0.0
    results: dict[str, int] = {}
    for n in bad:
        for r in n.results:
            results[r] = results.get(r, 0) + 1
    after_open = [n.name for n in acted if opened and n.t_sent and n.t_sent > opened]
    out = {
        "fault_to_action_s": summary(lat),
        "agent_path_s": summary(path),
        "action_sent_to_visible_s": summary(api),
        "sim_lag_s": {"failing_nodes": summary(hot_lag), "all": summary(lag)},
        # the rate at which the API server saw the failing nodes' actions (bounded here by the simulator's CPU)
        "actions_per_s": round((len(acted) - 1) / (max(lat) - min(lat)), 1) if len(lat) > 1 and max(lat) > min(lat)
        else None,
        "acted_at_s": sorted(round(n.t_acted - t0, 2) for n in acted),
        "check_s": summary(check_s),
        "projected_fault_to_action_p90_s": {
            f"interval {iv:g}s": round(0.9 * iv + (2 - 1) * iv + p90_path, 1) for iv in sorted({interval, 60.0})},
        "acted_failing": len(acted),
        "tainted_healthy": sorted(n.name for n in good if n.name in api_tainted or n.t_tainted)[:20],
        "action_outcomes": results,
        "taint_patches_per_node": _histogram([patches.get(n.name, 0) for n in bad]),
        "taint_patches_on_healthy": sum(patches.get(n.name, 0) for n in good),
        "tainted_in_api": len(api_tainted),
        "action_events_per_node": _histogram([sum(action_events.get(n.name, [])) for n in bad]),
        "failing_not_acted": sorted(n.name for n in bad if n.t_acted is None and "breaker-open" not in n.results)[:20],
        "denied": len(denied),
        "checks_since_t0_min": min(n.checks - checks_at_t0[n.name] for n in sims),
        "healthy_checks_since_t0": sum(n.checks - checks_at_t0[n.name] for n in good),
        "agent_errors": sorted({e[:160] for n in sims for e in n.errors})[:10],
    }
    if opened or storm_events:
        halted = [n for n in bad if n.t_acted is None and "breaker-open" in n.results]
        before = [n for n in acted if n.t_acted <= (opened or 0)]
        out["breaker"] = {"opened_after_s": round(opened - t0, 2) if opened else None,
                          "reason": seen.get("breaker_reason", ""),
                          "acted_before_open": len(before),
                          "halted_nodes": sum(1 for n in halted),
                          "halted": [n.name for n in halted][:50],
                          "actions_sent_after_open": after_open[:20],
                          "events": storm_events}
    if seen.get("watch_errors"):
        out["watch_errors"] = seen["watch_errors"][:5]
    return out


def event_report(sims: list[SimNode], fleet: Any, hub: Any, t0: float) -> dict:
    """--agents events: each failing node's way from its fault (its own injection time) to the fence: the
    source's wake, the raise (which check raised it), the taint visible; the sources the agents ran; the
    simulator's own lag (the Gate's wait of event-driven checks)."""
    bad = [n for n in sims if n.failing]
    by: dict[str, int] = {}
    for n in bad:
        if n.raised_by:
            by[n.raised_by] = by.get(n.raised_by, 0) + 1
    tainted = [n for n in bad if n.t_tainted is not None]
    event_lag = [x for n in bad if n.t_inject for t, x in n.lag_s if t >= n.t_inject and
                 t <= (n.t_raised or float("inf"))]
    # one node's own core: its source's wake as measured, each event check's own CPU (thread time), the
    # confirming re-read's delay, and its taint PATCH -> visible as measured here
    delay = fleet.confirm_delay_s
    own = [(n.t_seen - n.t_inject) + sum(n.event_cpu_s) + delay + (n.t_tainted - n.t_taint_sent)
           for n in bad if n.t_seen and n.t_inject and n.t_tainted and n.t_taint_sent and n.event_cpu_s]
    return {
        "projected_own_core_fault_to_fence_s": summary(own),
        "event_check_cpu_s": summary([x for n in bad for x in n.event_cpu_s]),
        "fault_to_seen_s": summary([n.t_seen - n.t_inject for n in bad if n.t_seen and n.t_inject]),
        "fault_to_raised_s": summary([n.t_raised - n.t_inject for n in bad if n.t_raised and n.t_inject]),
        "fault_to_fence_s": summary([n.t_tainted - n.t_inject for n in tainted if n.t_inject]),
        "raised_by": dict(sorted(by.items())),
        "inotify_hub_events": hub.events if hub is not None else None,
        "gate_slots": fleet.gate.slots,
        "sim_lag_event_checks_s": summary(event_lag),
        "injection_span_s": round(max(n.t_inject for n in bad) - min(n.t_inject for n in bad), 3) if bad else None,
    }


def eviction_report(sims: list[SimNode], audit: list[dict], ids: Any, t0: float) -> dict:
    """Evictions by the agents of the failing nodes: how many, how fast, and one per pod (the audit)."""
    bad = [n for n in sims if n.failing]
    done = sorted(n.t_evicted for n in bad if n.t_evicted is not None)
    per_pod: dict[str, int] = {}
    for a in audit:
        if a["user"] == ids.agent_user and a.get("subresource") == "eviction" and a["allowed"]:
            per_pod[a["name"]] = per_pod.get(a["name"], 0) + 1
    span = (done[-1] - done[0]) if len(done) > 1 else 0.0
    return {"evictions": len(done),
            "evictions_per_s": {"first_to_last": round((len(done) - 1) / span, 1) if span else None,
                                "since_fault": round(len(done) / (done[-1] - t0), 1) if done else None},
            "evictions_per_pod": _histogram([per_pod.get(f"egl-render-{n.name}", 0) for n in bad]),
            "evictions_of_other_pods": sum(v for k, v in per_pod.items()
                                           if k not in {f"egl-render-{n.name}" for n in bad}),
            "pdb": "not enforced: the test API server serves no PodDisruptionBudgets (docs/testing-apiserver.md)",
            "apf": "none: the test API server has k8s.io/apiserver's max-in-flight limit (400 reads, 200 "
                   "writes at once), not API Priority and Fairness"}


def _histogram(xs: list[int]) -> dict[str, int]:
    h: dict[str, int] = {}
    for x in xs:
        h[str(x)] = h.get(str(x), 0) + 1
    return dict(sorted(h.items()))


def _rss_mib() -> float:
    for ln in Path("/proc/self/status").read_text().splitlines():
        if ln.startswith("VmHWM:"):
            return round(int(ln.split()[1]) / 1024, 1)
    return 0.0


def _stop_proc(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _tail(path: Path, n: int) -> list[str]:
    try:
        return [ln[:300] for ln in path.read_text(errors="replace").splitlines()[-n:]]
    except OSError:
        return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1500)
    ap.add_argument("--failing", type=int, default=150)
    ap.add_argument("--agents", choices=("events", "scheduled"), default="scheduled",
                    help="events: each agent's own event loop at the chart's defaults, woken by its fault (with "
                         "--fault xid); scheduled: checks run by the simulator every --interval")
    ap.add_argument("--interval", type=float, default=None,
                    help="the agents' check interval (s; default 2, or the chart's 60 with --agents events)")
    ap.add_argument("--workers", type=int, default=8, help="threads running checks")
    ap.add_argument("--no-controller", dest="controller", action="store_false")
    ap.add_argument("--storm-fraction", type=float, default=0.3, help="the controller's (the chart's default 0.3)")
    ap.add_argument("--waves", default="", help="failing nodes per wave, e.g. 7,3 (default: all at once)")
    ap.add_argument("--wave-gap", type=float, default=10.0, help="the next wave: when the breaker opens, or this "
                                                                 "long after the previous one (s)")
    ap.add_argument("--max", type=float, default=300.0, help="give up waiting after this long (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--healthy-checks", type=int, default=None,
                    help="wait until each healthy node's agent checked this often since T0 (0: do not wait; "
                         "default 1, 0 with --agents events)")
    ap.add_argument("--fault", choices=sorted(FAULTS), default="driver",
                    help="driver: the driver unloads (taint); xid: Xid 79, the GPU off the bus (taint); memory: "
                         "incident 4's driver memory (eviction)")
    ap.add_argument("--recover", action="store_true", help="after the storm, revert the fault everywhere and wait "
                                                           "for the breaker to close and the taints to go")
    ap.add_argument("--eviction-policy", action="store_true", help="the chart's opt-in eviction confinement")
    a = ap.parse_args()
    if not 0 <= a.failing <= a.nodes:
        ap.error("--failing must be within 0..--nodes")
    waves = [int(x) for x in a.waves.split(",")] if a.waves else None
    events = a.agents == "events"
    if a.interval is None:
        a.interval = 60.0 if events else 2.0
    if a.healthy_checks is None:
        a.healthy_checks = 0 if events else 1
    r = run(a.nodes, a.failing, a.interval, a.workers, a.controller, waves, a.wave_gap, max_s=a.max, seed=a.seed,
            storm_fraction=a.storm_fraction, fault=a.fault, evict_policy=a.eviction_policy,
            healthy_checks=a.healthy_checks, recover=a.recover, agents=a.agents)
    r["nvsentinel_p90_s"] = NVSENTINEL_P90_S.get(a.failing)
    if events:
        r["nvsentinel_detect_to_cordon_p50_p99_s"] = NVSENTINEL_P50_P99_S.get(a.failing)
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
