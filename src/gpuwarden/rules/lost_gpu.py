"""One lost GPU that makes the device plugin fail every allocation of its node (GPU-K8S-012).

The NVIDIA device plugin's topology-aware GetPreferredAllocation (whole GPUs, no replicas) builds
its device list over *every* GPU of the node through NVML (go-gpuallocator NewDevices: UUID, PCI
info, P2P and NVLink for each pair). One lost GPU fails that for every request, also requests that
would never touch it; the kubelet rejects each pod (UnexpectedAdmissionError) while the node
stays Ready and advertises its GPUs, so the scheduler keeps sending GPU pods to it.
"""

from __future__ import annotations

import re
from typing import Iterator

from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.admissions import SOURCE
from gpuwarden.facts.xids import GpuRef, gpu_map, gpu_ref
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.logs.scan import LogEvent
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.fmt import ts
from gpuwarden.rules.hardware import lost_gpu_evidence
from gpuwarden.rules.held_devices import held_devices
from gpuwarden.rules.logview import events
from gpuwarden.rules.plugin import GPU_RESOURCE, latest_instance
from gpuwarden.parsers.admission import Rejection
from gpuwarden.parsers.kubelet_checkpoint import base_device_id

#: an allocation failure older than this (by facts.now) no longer confirms the storm: the agent's
#: check runs every interval, so a storm in progress keeps writing new ones
RECENT_S = 600.0
MAX_QUOTED = 4
#: pods rejected at admission for a GPU (API server) that, with a GPU lost, confirm the storm: the first one
MIN_REJECTED = 1
#: the rejected pods a finding's data lists
MAX_LISTED = 20
_DEVICES = re.compile(r"devices \(([0-9]+), ([0-9]+)\)")


def _recent(e: LogEvent, now: float, since: float | None) -> bool:
    """Within RECENT_S of `now`, and not before the plugin's current start `since`. A line's time is as
    fine as its log writes it: klog and journald give microseconds (the plugin's start, from /proc, is
    good to a clock tick), a syslog line whole seconds, so only a whole-second time gets a second's slack."""
    return True if e.time is None else _within(e.time, now, since)


def _within(t: float, now: float, since: float | None) -> bool:
    slack = 1.0 if float(t).is_integer() else 0.02
    return now - t <= RECENT_S and (since is None or t >= since - slack)


def _rejected(facts: NodeFacts, since: float | None) -> tuple[list[Rejection], str]:
    """This node's pods the kubelet rejected at admission for a GPU in the last RECENT_S, after the plugin's
    current start, as the API server shows them (the agent reads them only now: a GPU is lost); and why
    they could not be read ("" when they were). A rejection with no time cannot be placed in the window:
    it does not count."""
    try:
        adm = facts.get("admissions")
    except FactUnavailable as exc:
        return [], str(exc)
    return [r for r in adm.rejections if r.time is not None and _within(r.time, facts.now, since)], ""


def _failures(facts: NodeFacts, since: float | None) -> list[LogEvent]:
    """Recent GetPreferredAllocation failures on a lost GPU in the kubelet log, since the plugin's start
    (`since`). The plugin does not log the error it returns to the kubelet."""
    return [e for e in events(facts, "kubelet.gpa-gpu-lost", logs=("kubelet",)) if _recent(e, facts.now, since)]


def _plugin_lost(facts: NodeFacts, gpus: dict[str, GpuRef]) -> dict[str, list[Evidence]]:
    """GPUs the current plugin instance found lost through NVML ("Marking device GPU-… as unhealthy: GPU is lost")."""
    out: dict[str, list[Evidence]] = {}
    cur, _old = latest_instance(facts, events(facts, "plugin.gpu-lost", logs=("pod",), current=False))
    for e in cur:
        dev = e.get("device") or e.get("placement") or e.get("events")
        ref = gpu_ref(facts, uuid=base_device_id(dev)) if dev else None
        if ref is None and len(gpus) == 1:
            ref = next(iter(gpus.values()))
        if ref is not None:
            out.setdefault(ref.key, []).append(e.evidence())
    return out


def _label(g: GpuRef, of: int) -> str:
    where = f" ({g.bus_id or g.key})" if (g.bus_id or g.key) else ""
    idx = f"GPU {g.index}" if g.index is not None else "GPU"
    return f"{idx}{where}" + (f" of {of}" if of else "")


@rule(
    "GPU-K8S-012",
    title="A lost GPU makes the device plugin fail every allocation: every GPU pod sent to the node is rejected",
    severity=Severity.CRITICAL,
    family="device-plugin",
    needs=(),
    uses=("admissions", "boot", "containers", "driver", "kubelet", "logs", "nvidia_smi", "pci", "plugin",
          "plugin_sockets", "probes", "xids"),
    automation="A2 (taint the node before the storm; drain and reboot for the lost GPU)",
    remedy="""
        1. Stop new GPU pods landing here: the agent taints the node (node_fault_action) when this is confirmed;
           by hand, `kubectl taint node <node> gpuwarden.io/gpu-fault=GPU-K8S-012:NoSchedule` or cordon it.
           Every GPU pod the scheduler sends here fails admission (UnexpectedAdmissionError), also pods that
           would use a healthy GPU.
        2. The lost GPU needs a reboot (GPU-HW-002): drain the node, collect `nvidia-bug-report.sh`, reboot.
           If it recurs, reseat / RMA the GPU.
        3. Until then, restarting the device plugin does not help while NVML still enumerates the lost GPU.
           Lift the taint once the GPU is back (the agent lifts its own after the debounce).
    """,
    references=("pytorch/ci-infra#1058", "NVIDIA/k8s-device-plugin#1929",
                "NVIDIA/k8s-device-plugin internal/rm/nvml_manager.go (alignedAlloc)",
                "NVIDIA/go-gpuallocator gpuallocator/device.go (NewDevices)",
                "kubernetes pkg/kubelet/cm/devicemanager/manager.go (callGetPreferredAllocationIfAvailable)"),
)
def lost_gpu_fails_allocation(facts: NodeFacts) -> Iterator[Hit]:
    """GPU N of M is lost, and the device plugin fails every allocation on the node.

    Reads the lost GPUs of the current boot as GPU-HW-002 does (Xid 79, the driver's lost-GPU
    lines, a PCI config space of all 0xff, NVML's "GPU is lost" from the probe or nvidia-smi) and
    the device plugin's own health lines ("Marking device GPU-… as unhealthy: GPU is lost"); the
    allocation failures that name a lost GPU (`Allocate failed due to device plugin
    GetPreferredAllocation rpc failed … GPU is lost, which is unexpected`) in the kubelet log (its
    event lines, V3); the kubelet checkpoint's RegisteredDevices (what the plugin last
    advertised as healthy: a lost GPU's time-slicing / MPS replicas `<uuid>::N` count as the GPU).

    CONFIRMED (critical): an allocation failed on a lost GPU in the last 10 minutes (by the
    capture time), after the plugin's current start; the GPU is named from the lost-GPU evidence,
    else the line's NVML indices ("devices (3, 0)"). Or, where the kubelet logs no rejection (below
    V3), a GPU is lost and the API server shows a pod of this node the kubelet rejected at admission
    for a GPU in that window (the agent's `admissions`: status UnexpectedAdmissionError whose message
    names "GPU is lost", a GPU device ID or a GPU resource; time status.startTime); the pods are named.
    The agent's node_fault_action taints the node; the taint holds while this is AT-RISK after it (the
    GPU still lost, the rejections aged out) and is lifted once it clears.
    AT-RISK (high): a GPU is lost now and the plugin still advertises it (the checkpoint lists it
    or one of its replicas as healthy), or still serves whole GPUs of the node (its preferred
    allocation enumerates the lost one): the next GPU pod is rejected.
    Clears: no failure and no rejected pod in the last 10 minutes, and no lost GPU in the current boot (the node
    rebooted, or the GPU came back and the plugin restarted). Not reported: a lost GPU with no
    device plugin on the node and no pod rejected for it (GPU-HW-002 alone), failures and
    rejections of an earlier plugin instance; rejections for CPU, memory, another resource,
    OutOf<resource> (capacity), or naming no GPU.
    Every device ID of the lost GPU is named with the pods holding it (k8s-device-plugin#1929): its
    replicas `<uuid>::N` and its MIG devices; nvidia-smi -q names no MIG device UUID, so a MIG UUID
    counts as the lost GPU's only when that GPU is the node's one GPU running MIG, and is otherwise
    "not established".
    """
    gpus = gpu_map(facts)
    by_key = dict(gpus)
    now_ev, _old = lost_gpu_evidence(facts, gpus)
    lost: dict[str, list[Evidence]] = {k: list(v) for k, v in now_ev.items()}
    for k, ev in _plugin_lost(facts, gpus).items():
        lost.setdefault(k, []).extend(ev)
    if "unknown" in lost and len(gpus) == 1:
        lost.setdefault(next(iter(gpus)), []).extend(lost.pop("unknown"))
    plugin = facts.maybe("plugin")
    proc = plugin.processes[0] if plugin is not None and plugin.processes else None
    since = proc.started_at if proc is not None else None
    fails = _failures(facts, since)
    n_gpus = len(gpus)

    def refs(keys: list[str]) -> list[GpuRef]:
        return [by_key.get(k) or GpuRef(k) for k in keys]

    if fails:
        if not lost and len(gpus) == 1:
            lost = {k: [] for k in gpus}  # the node's only GPU is the one NVML called lost
        keys = sorted(lost)
        named = refs(keys)
        if not named:
            # the line names NVML indices of a pair, one of them the lost GPU
            idx = {int(x) for e in fails for m in [_DEVICES.search(e.line)] if m for x in m.groups()}
            cand = [g for g in gpus.values() if g.index in idx]
            who = " or ".join(_label(g, 0) for g in cand) or "a GPU"
            head = f"{who} (of {n_gpus})" if n_gpus and cand else who
        else:
            head = ", ".join(_label(g, n_gpus) for g in named)
        held = {g.key: held_devices(facts, g) for g in named}
        head += "".join(h.phrase() for h in held.values())
        ev = [e.evidence() for e in fails[-MAX_QUOTED:]]
        ev += [x for k in keys for x in lost[k][:2]]
        ev += [x for h in held.values() for x in h.evidence]
        yield Hit(Status.CONFIRMED,
                  f"{head} is lost and the device plugin fails every allocation on this node "
                  f"({len(fails)} failed since {_since(fails)}): every GPU pod that lands here is rejected "
                  "(UnexpectedAdmissionError) while the node stays Ready.",
                  affected=([g.affected("lost; every allocation of the node fails") for g in named]
                            + [a for h in held.values() for a in h.affected])
                  or [Affected("node", "nvidia.com/gpu", detail="every allocation fails on a lost GPU")],
                  evidence=ev,
                  mechanism="the plugin's topology-aware GetPreferredAllocation reads every GPU through NVML; "
                            "one lost GPU fails it for every request",
                  data={"gpus": keys, "lost": len(keys), "of": n_gpus, "failures": len(fails),
                        "held": {k: h.data() for k, h in held.items()}})
        return
    if not lost:
        return
    rejected, unread = _rejected(facts, since)
    if len(rejected) >= MIN_REJECTED:
        keys = sorted(lost)
        named = refs(keys)
        head = ", ".join(_label(g, n_gpus) for g in named)
        held = {g.key: held_devices(facts, g) for g in named}
        head += "".join(h.phrase() for h in held.values())
        ev = [Evidence(f"Pod {r.ref} status ({SOURCE})", f"rejected {ts(r.time)} ({r.time_source}): {r.reason}: {r.message}")
              for r in rejected[-MAX_QUOTED:]]
        ev += [x for k in keys for x in lost[k][:2]]
        ev += [x for h in held.values() for x in h.evidence]
        pods = ", ".join(r.ref for r in rejected[-MAX_QUOTED:]) + (f" and {len(rejected) - MAX_QUOTED} more"
                                                                    if len(rejected) > MAX_QUOTED else "")
        yield Hit(Status.CONFIRMED,
                  f"{head} is lost and the kubelet rejected {len(rejected)} GPU pod(s) at admission since "
                  f"{ts(rejected[0].time)} ({pods}): every GPU pod that lands here is rejected "
                  "(UnexpectedAdmissionError) while the node stays Ready.",
                  affected=([g.affected("lost; GPU pods rejected at admission") for g in named]
                            + [a for h in held.values() for a in h.affected]),
                  evidence=ev,
                  mechanism="the kubelet's device manager failed the allocation of the pods' GPUs (pod status "
                            "UnexpectedAdmissionError, read from the API server: the kubelet logs it only at V3)",
                  data={"gpus": keys, "lost": len(keys), "of": n_gpus, "failures": 0, "rejected": len(rejected),
                        "held": {k: h.data() for k, h in held.items()},
                        "pods": [{"namespace": r.namespace, "name": r.name, "uid": r.uid, "time": r.time,
                                  "message": r.message} for r in rejected[-MAX_LISTED:]]})
        return
    kub = facts.maybe("kubelet")
    cp = kub.checkpoint if kub is not None else None
    reg = list(cp.registered.get(GPU_RESOURCE, [])) if cp is not None else []
    ps = facts.maybe("plugin_sockets")
    serving = proc is not None or bool(getattr(ps, "nvidia", None))
    if not reg and not serving:
        return
    for k in sorted(lost):
        g = by_key.get(k) or GpuRef(k)
        hd = held_devices(facts, g)
        advertised = {i for ids in (cp.registered.values() if cp is not None else []) for i in ids}
        mine = [d for d in hd.ids if d in advertised]
        whole = [d for d in reg if "::" not in d]
        ev = lost[k][:MAX_QUOTED]
        if mine:
            ev.append(Evidence(kub.checkpoint_path, "RegisteredDevices still lists "
                               + ", ".join(mine[:MAX_QUOTED]) + (f" (+{len(mine) - MAX_QUOTED})" if len(mine) > MAX_QUOTED else "")
                               + " as healthy"))
            why = (f"the device plugin still advertises it ({len(mine)} device(s)"
                   + (", replicas of the lost GPU" if hd.replicas else "")
                   + (", MIG slices of the lost GPU" if hd.mig else "") + ")")
        elif whole or (serving and not reg):
            if whole:
                ev.append(Evidence(kub.checkpoint_path, f'RegisteredDevices["{GPU_RESOURCE}"] lists {len(whole)} whole GPU(s)'))
            why = "the device plugin serves whole GPUs, and its preferred allocation reads every GPU through NVML"
        else:
            continue  # replicas of other GPUs only: the greedy allocation does not touch NVML
        ev += [x for x in hd.evidence if x not in ev]
        if unread and facts.settings.admission_pods is not None:
            ev.append(Evidence(SOURCE, f"not read: {unread}"))
        yield Hit(Status.AT_RISK,
                  f"{_label(g, n_gpus)}{hd.phrase()} is lost and {why}: the next GPU pod sent here will be rejected "
                  "(UnexpectedAdmissionError), whichever GPU it would use.",
                  affected=[g.affected("lost; still advertised"), *hd.affected], evidence=ev, severity=Severity.HIGH,
                  data={"gpus": [k], "lost": 1, "of": n_gpus, "advertised": mine, "held": {k: hd.data()}})


def _since(fails: list[LogEvent]) -> str:
    t = next((e.time for e in fails if e.time is not None), None)
    return ts(t) if t is not None else "this boot"
