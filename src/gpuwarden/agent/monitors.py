"""The agent's own observations: kubelet gRPC probes and what only history shows.

Each monitor returns findings and, per code, an observation (`bad` / `good` / `unknown`) that the
debouncer combines with the rules' own. A monitor's `good` counts only where it is authoritative
for the code (the plugin probe answering in time is a full observation of GPU-K8S-001's hang);
drift, memory growth and repeated timeouts only ever add `bad`.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Iterable

from msgspec import Struct, field

from gpuwarden import confine
from gpuwarden.agent.history import ContainerKey, ContainerObs, GpuObs, NodeHistory, Obs
from gpuwarden.findings import Affected, Evidence, Finding, Severity, Status
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.probes.bounded import ChildResult, run_func

UVM = "/dev/nvidia-uvm"

#: catalog metadata for codes the agent can raise even when no rule module registers them
_FALLBACK = {
    "GPU-K8S-001": dict(
        title="Device plugin does not answer the kubelet's gRPC calls in time (pod admission blocks on it)",
        severity=Severity.CRITICAL, family="kubelet",
        remedy="""
            1. Restart the device-plugin pod on this node; if NVML hangs too (GPU-DRV-006), fix the driver first:
               upgrade to >= 570.172.08 (or 580.65.06+), downgrade to 570.86.15, or disable MIG — drain first.
            2. After the plugin answers again, restart the kubelet to release admission goroutines already hung.
        """,
        references=("incident 5 (shared/incidents/5-mig-nvml-hang-kubelet-blocked.zh.md)",
                    "kubernetes/kubernetes#117435", "kubernetes/kubernetes#130855", "NVIDIA/gpu-operator#1361")),
    "GPU-DRV-006": dict(
        title="NVML hangs (nvmlInit / nvidia-smi does not return)", severity=Severity.CRITICAL, family="driver",
        remedy="1. Cordon the node; look for D-state processes and NVRM/Xid lines; drain and reboot.",
        references=("NVIDIA/go-nvml#152",)),
    "GPU-DEV-002": dict(
        title="GPU devices dropped from a running container's device cgroup", severity=Severity.HIGH,
        family="device-access", remedy="1. Recreate the affected pods; put devices in the spec (PASS_DEVICE_SPECS=true) or use CDI.",
        references=("kubernetes/kubernetes#101771",)),
    "GPU-DEV-003": dict(
        title="GPU devices dropped from a running container's device cgroup (systemd cgroup driver)",
        severity=Severity.HIGH,
        family="device-access", remedy="1. Recreate the affected pods; create /dev/char links (nvidia-ctk system create-dev-char-symlinks).",
        references=("NVIDIA/nvidia-container-toolkit#48",)),
    # the API side of a DRA node (rules/dra_api.py): titles kept should that module fail to import
    "GPU-K8S-020": dict(title="ResourceSlices advertise GPUs of a node whose DRA kubelet plugin is gone",
                        severity=Severity.HIGH, family="dra", references=("kubernetes/kubernetes#141912",)),
    "GPU-K8S-021": dict(title="ResourceSlices of the node advertise no GPU while the node has GPUs",
                        severity=Severity.HIGH, family="dra",
                        references=("kubernetes-sigs/dra-driver-nvidia-gpu#1008",)),
    "GPU-K8S-022": dict(title="A device taint outlives its cause (the GPU is present and quiet, the taint stays)",
                        severity=Severity.MEDIUM, family="dra",
                        references=("kubernetes-sigs/dra-driver-nvidia-gpu#904",)),
    "GPU-NODE-001": dict(
        title="Host RAM taken by GPU-driver allocations no memory cgroup is charged for", severity=Severity.CRITICAL,
        family="memory", remedy="1. Evict the pod holding the GPU context that allocates while the node still responds.",
        references=("incident 4",)),
}


def make_finding(code: str, status: Status, summary: str, *, evidence: Iterable[Evidence] = (),
                 affected: Iterable[Affected] = (), data: dict | None = None, mechanism: str = "",
                 severity: Severity | None = None) -> Finding:
    """A Finding stamped with the registered rule's metadata when there is one."""
    from gpuwarden.rules import get_rule

    r = get_rule(code)
    fb = _FALLBACK.get(code, {})
    base_sev = r.severity if r else fb.get("severity", Severity.HIGH)
    return Finding(
        code=code, status=status,
        severity=severity if severity is not None else base_sev,
        title=r.title if r else fb.get("title", code),
        summary=summary, affected=list(affected), evidence=list(evidence),
        remedy=r.remedy if r else inspect.cleandoc(fb.get("remedy", "")),
        references=r.references if r else tuple(fb.get("references", ())),
        mechanism=mechanism, family=r.family if r else fb.get("family", ""), data=dict(data or {}),
    )


def merge_into(findings: list[Finding], extra: Finding) -> None:
    """Add a monitor's finding: same code and status (or a confirmed one) absorbs its evidence. A finding
    that supersedes the at-risk ones (data["supersedes"]: repeated probe timeouts confirm what one
    timeout only suggested) replaces them, taking their evidence."""
    if extra.data.get("supersedes") == "at-risk":
        weaker = [f for f in findings if f.code == extra.code and f.status == Status.AT_RISK]
        for f in weaker:
            findings.remove(f)
            extra.evidence += [e for e in f.evidence if e not in extra.evidence]
    for f in findings:
        if f.code == extra.code and (f.status == extra.status or f.status == Status.CONFIRMED):
            f.evidence += [e for e in extra.evidence if e not in f.evidence]
            f.affected += [a for a in extra.affected if a not in f.affected]
            for k, v in extra.data.items():
                f.data.setdefault(k, v)
            return
    findings.append(extra)


class MonitorResult(Struct):
    findings: list[Finding] = field(default_factory=list)
    observed: dict[str, Obs] = field(default_factory=dict)  # code -> authoritative observation
    allocations: list[Any] | None = None  # PodDevices rows from pod-resources
    registered: dict[str, tuple[str, ...]] = field(default_factory=dict)  # resource -> healthy IDs (kubelet checkpoint)
    gpa_not_evaluated: dict[str, str] = field(default_factory=dict)  # socket -> why GetPreferredAllocation was not asked
    errors: list[str] = field(default_factory=list)  # what could not be observed, and why

    def see(self, code: str, obs: Obs) -> None:
        prev = self.observed.get(code)
        if prev == "bad" or (prev == "good" and obs == "unknown"):
            return
        self.observed[code] = obs


# ---------------------------------------------------------------------------------------------------
# gRPC: the device plugin and the pod-resources API


def kubelet_grpc(root: Any, plugin_dir: str | None, pod_resources_socket: str | None, timeout_s: float,
                 history: NodeHistory, metrics: Any, now: float, out: MonitorResult) -> None:
    """The agent's gRPC monitors, all in one killable child: the device plugins (with `plugin_dir`) and
    the kubelet's pod-resources List (with `pod_resources_socket`), both node paths under the live root.

    Each socket is opened beneath the root in this process, without following a link
    (probes.plugin.open_sockets, HostRoot.open_socket), and the forked child connects through those fds
    (confine.fd_address). The agent process itself never opens a gRPC channel: grpc's core, its
    threads and its allocations live and die with the child. Run in the agent's process, they left its
    RSS growing by 12-17 KiB per 100 checks beside the real plugin, and by none without it
    (docs/performance.md §11). Each call keeps its own deadline (a timeout is evidence); the child is
    killed once all of them could have passed, which is "not observed" (an error line), never a verdict.
    """
    from gpuwarden.probes.plugin import CHECKPOINT, close_all, open_sockets, read_gpa_ids

    opened = open_sockets(root, plugin_dir) if plugin_dir else []
    pr_fd: int | None = None
    if pod_resources_socket:
        try:
            pr_fd = root.open_socket(pod_resources_socket)
        except OSError:
            pr_fd = None  # a link or a missing socket: nothing observed
    try:
        ids = read_gpa_ids(root, plugin_dir, [p for p, _ in opened]) if opened else {}
        plan = [(path, confine.fd_address(fd), ids[path].ids) for path, fd in opened]
        pr_addr = confine.fd_address(pr_fd) if pr_fd is not None else None
        done = ask_sockets(plan, pr_addr, timeout_s) if (plan or pr_addr) else None
    finally:
        close_all(opened)
        if pr_fd is not None:
            os.close(pr_fd)
    if done is not None and not done.ok:
        out.errors.append(f"kubelet gRPC probe: {done.status} after {done.elapsed_s:.1f}s "
                          f"({done.detail or 'killed at its deadline'}): sockets not observed this check")
    answers = done.value if done is not None and done.ok else None
    if plugin_dir:
        _plugins(opened, ids, answers[0] if answers else None, history, metrics, now, out)
        _registered(root, f"{plugin_dir.rstrip('/')}/{CHECKPOINT}", metrics, out)
    if answers and answers[1] is not None:
        _pod_resources(answers[1], history, metrics, now, out)


def probe_plugins(root: Any, socket_dir: str, timeout_s: float, history: NodeHistory, metrics: Any, now: float,
                  out: MonitorResult) -> None:
    """GetDevicePluginOptions, then GetPreferredAllocation on every plugin socket, each under a deadline
    (in the child of kubelet_grpc).

    A call that hits its deadline is the GPU-K8S-001 signature (the kubelet makes the same calls with
    no deadline at all): CONFIRMED, with the socket, the RPC and the time waited as evidence.
    GetPreferredAllocation is the call the kubelet blocks on at admission, and the one that reaches
    NVML in the NVIDIA plugin (go-gpuallocator calls nvmlInit for each): a plugin whose NVML hangs
    still answers the options from memory (checked against the real plugin, docs/validation.md).
    It is asked only when the plugin offers it, for the device IDs the kubelet recorded in its
    device-manager checkpoint beside the sockets (probes.plugin.gpa_ids); with none, it is not
    evaluated and the socket counts as unchecked. It has no side effects by contract (Allocate, which
    may have some, is never called). ListAndWatch is never called: the NVIDIA plugin never ends a
    cancelled stream, so every call would leave a goroutine competing with the kubelet's stream for
    health events (docs/security.md). The checkpoint's registered (healthy) devices per resource
    are the device health this monitor reports (out.registered).
    """
    kubelet_grpc(root, socket_dir, None, timeout_s, history, metrics, now, out)


def pod_resources(root: Any, socket_path: str, timeout_s: float, history: NodeHistory, metrics: Any, now: float,
                  out: MonitorResult) -> None:
    """The kubelet's pod-resources List, through the socket at the node path `socket_path` opened beneath
    the root (a link or a missing socket: nothing observed), in the child of kubelet_grpc."""
    kubelet_grpc(root, None, socket_path, timeout_s, history, metrics, now, out)


#: the plugin calls of one socket: (node path, GetDevicePluginOptions, GetPreferredAllocation or None)
PluginAnswers = list[tuple[str, Any, Any]]


def ask_sockets(plan: list[tuple[str, str, tuple[str, ...]]], pod_resources_addr: str | None,
                timeout_s: float) -> ChildResult:
    """_ask in a forked child, killed once every call could have reached its deadline.

    grpc and the generated modules are imported here, in the agent, before the fork: a child then
    costs ~25 ms of CPU instead of ~180 ms (this VM). Importing them initialises no gRPC core (no
    channel, no thread), so the fork copies none of it."""
    from gpuwarden.grpcapi import client

    client.load_protos()
    calls = 2 * len(plan) + (1 if pod_resources_addr else 0)
    return run_func(_ask, plan, pod_resources_addr, timeout_s, timeout=timeout_s * calls + 1.0)


def _ask(plan: list[tuple[str, str, tuple[str, ...]]], pod_resources_addr: str | None,
         timeout_s: float) -> tuple[PluginAnswers, Any]:
    """Runs in the child: per plugin socket GetDevicePluginOptions, then GetPreferredAllocation when the
    plugin offers it and the kubelet's checkpoint gave IDs; then pod-resources List (plain records)."""
    from gpuwarden.grpcapi import client
    from gpuwarden.probes.plugin import ask

    plugins: PluginAnswers = [(path, *ask(addr, gpa_ids, timeout_s)) for path, addr, gpa_ids in plan]
    listed = client.pod_resources_list(pod_resources_addr, timeout_s) if pod_resources_addr else None
    return plugins, listed


def _registered(root: Any, path: str, metrics: Any, out: MonitorResult) -> None:
    """The kubelet's registered (healthy) devices per resource, from its checkpoint (nothing if unreadable)."""
    from gpuwarden.parsers import kubelet_checkpoint

    text = root.read_text(path)
    cp = kubelet_checkpoint.parse(text) if isinstance(text, str) else None
    if cp is None:
        return
    out.registered = {r: tuple(ids) for r, ids in cp.registered.items()}
    if metrics is not None:
        metrics.set_plugin_devices(out.registered)


def _plugins(opened: list[tuple[str, int]], ids: dict[str, Any], answers: PluginAnswers | None,
             history: NodeHistory, metrics: Any, now: float, out: MonitorResult) -> None:
    from gpuwarden.probes.plugin import offers_preferred

    if not opened or answers is None:  # no socket, or the child gave nothing back
        out.see("GPU-K8S-001", "unknown")
        return
    hung: list[tuple[str, Any]] = []
    answered = 0
    for sock, r, gpa in answers:
        name = sock.rsplit("/", 1)[-1]
        _note(metrics, history, f"plugin/{name}", "plugin/GetDevicePluginOptions", r, now)
        if r.status == "timeout":
            hung.append((sock, r))
            continue
        if offers_preferred(r):
            if gpa is None:
                out.gpa_not_evaluated[sock] = ids[sock].note if sock in ids else "not evaluated: no device IDs"
                continue  # NVML not reached: this socket is not checked
            _note(metrics, history, f"plugin/{name}", "plugin/GetPreferredAllocation", gpa, now)
            if gpa.status == "timeout":
                hung.append((sock, gpa))
                continue
        if r.ok or r.status == "unimplemented":
            answered += 1
    if hung:
        ev = [Evidence(s, f"{r.rpc}: {r.detail} (deadline {r.timeout_s:g}s, waited {r.elapsed_s:.2f}s)") for s, r in hung]
        ev.append(Evidence("kubelet devicemanager", "the kubelet calls GetPreferredAllocation/Allocate on this socket "
                                                    "with no deadline: pod admission on the node waits on it"))
        out.findings.append(make_finding(
            "GPU-K8S-001", Status.CONFIRMED,
            f"The device plugin did not answer {hung[0][1].rpc.rsplit('/', 1)[-1]} within {hung[0][1].timeout_s:g}s: "
            "the kubelet, which waits on it with no deadline, stops admitting pods on this node.",
            evidence=ev, affected=[Affected("plugin", s.rsplit("/", 1)[-1], detail=s) for s, _ in hung],
            mechanism="device-plugin gRPC call hangs (kubelet has no deadline on it)",
            data={"hung_sockets": [s for s, _ in hung], "rpc": hung[0][1].rpc},
        ))
        out.see("GPU-K8S-001", "bad")
    elif answered:
        out.see("GPU-K8S-001", "good")
    else:
        out.see("GPU-K8S-001", "unknown")


def _pod_resources(r: Any, history: NodeHistory, metrics: Any, now: float, out: MonitorResult) -> None:
    _note(metrics, history, "pod-resources", "pod-resources/List", r, now)
    if r.ok:
        out.allocations = list(r.value or ())
        if metrics is not None:
            metrics.set_allocations(out.allocations)


def _note(metrics: Any, history: NodeHistory, series: str, probe: str, r: Any, now: float) -> None:
    if r.status == "unavailable":
        return  # no socket: nothing was observed
    history.record_probe(series, now, r.status)
    if metrics is not None:
        metrics.probe(probe, r.elapsed_s, r.status)


# ---------------------------------------------------------------------------------------------------
# history: containers and GPUs


def record_access(facts: Any, history: NodeHistory, allocations: list[Any] | None,
                  registered: dict[str, tuple[str, ...]], now: float) -> list[tuple[str, str, str, str, bool]]:
    """Feed this check's per-container verdicts (and the pod-resources map) into the history.

    Returns the rows of the per-container device access gauge.
    """
    rows: list[tuple[str, str, str, str, bool]] = []
    access = facts.maybe("gpu_access")
    by_ctr: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for a in allocations or ():
        if a.resource.startswith("nvidia.com/") or a.source == "dra":
            by_ctr.setdefault((a.namespace, a.pod, a.container), ())
            by_ctr[(a.namespace, a.pod, a.container)] += tuple(a.device_ids)
    if access is not None:
        for ca in access.containers:
            key = ContainerKey(ca.pod.uid, ca.container.name, ca.container.id, ca.pod.namespace, ca.pod.name)
            verdicts = {p: v.allowed for p, v in ca.verdicts.items()}
            evidence = {p: f"{v.source}: {v.evidence}" for p, v in ca.verdicts.items()}
            how = next((v.how for v in ca.verdicts.values() if v.how), "")
            gpus = by_ctr.get((ca.pod.namespace, ca.pod.name, ca.container.name), ())
            history.record_container(key, ContainerObs(now, verdicts, evidence, how, gpus))
            for p, allowed in verdicts.items():
                if allowed is not None:
                    rows.append((ca.pod.namespace, ca.pod.name or ca.pod.uid, ca.container.name or ca.container.id[:12],
                                 p, bool(allowed)))
    health: dict[str, str] = {}  # "Healthy": registered in the kubelet's checkpoint; "" not known
    for ids in registered.values():
        for i in ids:
            health[i] = "Healthy"
    holders: dict[str, list[str]] = {}
    for (ns, pod, ctr), ids in by_ctr.items():
        for d in ids:
            holders.setdefault(d, []).append(f"{ns}/{pod}/{ctr}")
    for gpu in set(holders) | set(health):
        history.record_gpu(gpu, GpuObs(now, tuple(sorted(holders.get(gpu, ()))), health.get(gpu, "")))
    return rows


def drift_findings(facts: Any, history: NodeHistory, out: MonitorResult) -> None:
    """Device rules allowed when a container was first seen and denied now: what removed them, and when.

    The loss is proven by the history; the cause is named as GPU-DEV-002/003 name it
    (rules/loss_cause.py): only where the node shows the mechanism acting after the devices were
    last seen allowed (the static CPU manager's policy with runc < 1.0, a daemon-reload dated by
    systemd's generator directories), else "not determined" with the candidates.
    """
    drifts = history.drifts()
    if not drifts:
        return
    ev: list[Evidence] = []
    affected: list[Affected] = []
    data: dict[str, Any] = {"drift": []}
    lo = min(d.last_allowed for d in drifts)
    for d in drifts:
        ev.append(Evidence(f"history {d.key.ref}",
                           f"{d.path}: allowed when first seen {format_rfc3339(d.first_seen)}, last allowed {format_rfc3339(d.last_allowed)}, "
                           f"denied since {format_rfc3339(d.denied_since)} ({d.source or 'device policy'})"))
        if d.evidence_now:
            ev.append(Evidence("now", d.evidence_now))
        a = Affected("container", f"{d.key.pod or d.key.pod_uid}/{d.key.container}", d.key.namespace, d.key.pod_uid,
                     f"id {d.key.container_id[:12]}")
        if a not in affected:
            affected.append(a)
        data["drift"].append({"container": d.key.ref, "container_id": d.key.container_id, "device": d.path,
                              "first_seen": d.first_seen, "last_allowed": d.last_allowed,
                              "denied_since": d.denied_since})
    # the cause as the rules state it: proven only where the node shows it acting after the last
    # time the devices were seen allowed (rules/loss_cause.py)
    from gpuwarden.rules import loss_cause

    cause = loss_cause.determine(facts, [lo], [None], after="they were last seen allowed")
    code = loss_cause.code_for(facts, cause)
    ev += loss_cause.evidence_lines(cause)
    data.update(cause.data())
    out.findings.append(make_finding(
        code, Status.CONFIRMED,
        f"{len(affected)} GPU container(s) had device access when first seen and lost it since "
        f"({', '.join(sorted({d.path for d in drifts}))}). {cause.sentence}",
        evidence=ev, affected=affected, data=data, mechanism=cause.mechanism,
    ))
    out.see(code, "bad")


# ---------------------------------------------------------------------------------------------------
# memory growth


def memory_growth(facts: Any, metrics: Any) -> None:
    """Export the uncharged memory and its growth rate. The memory section keeps the series (the agent's
    MemoryHistory, passed as Settings.memory_history) and GPU-NODE-001 judges it; this only publishes."""
    mem = facts.maybe("memory")
    esc = getattr(mem, "escape", None)
    if esc is None or metrics is None:
        return
    metrics["gpuwarden_uncharged_memory_bytes"].set(esc.gap)
    t = esc.trend
    rate = None if t is None else t.rate if t.rate is not None else t.early_rate
    if rate is not None:  # none until two samples show a change: the gauge keeps its last value rather than lie
        metrics["gpuwarden_uncharged_memory_growth_bytes_per_second"].set(rate)


# ---------------------------------------------------------------------------------------------------
# repeated probe timeouts


def repeated_timeouts(history: NodeHistory, repeat: int, window: int, out: MonitorResult) -> None:
    """A probe that timed out `repeat` times in the last `window` checks, the latest included, hangs.

    This is what turns gpuwarden's own deadline into a verdict: one timeout (a loaded node, a slow
    first nvmlInit) is the rule's AT-RISK and never fences; K of the last N, the latest included, is
    CONFIRMED (and for NVML, GPU-DRV-006, a node fault the agent fences). Once the latest probe answers,
    nothing is reported here: the code's observation is the rules' own (`good`), so a raised fault
    clears after `debounce_clear` answering checks and keeps its fence until then (the debouncer's
    hold), instead of flapping with each answer or staying up until the old timeouts leave the window.
    """
    for series in sorted(history.probes):
        n, seen, times = history.timeouts(series, window)
        if n < repeat or history.probes[series][-1][1] != "timeout":
            continue
        code = "GPU-DRV-006" if series == "nvml" else "GPU-K8S-001" if series.startswith("plugin/") else ""
        if not code:
            continue
        out.findings.append(make_finding(
            code, Status.CONFIRMED,
            f"The {series} probe timed out in {n} of the last {seen} checks, the latest included: it hangs, "
            "not one slow answer.",
            evidence=[Evidence(f"history {series}", f"timeouts at {', '.join(format_rfc3339(t) for t in times[-5:])}")],
            affected=[Affected("plugin" if series.startswith("plugin/") else "node", series)],
            mechanism="repeated probe timeouts", data={"timeouts": n, "window": seen, "supersedes": "at-risk"},
        ))
        out.see(code, "bad")
