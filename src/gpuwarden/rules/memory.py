"""Node memory: host RAM that the GPU driver holds outside every counter and every memory limit."""

from __future__ import annotations

from typing import Iterator

from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.memory import MemoryFacts, escape_settings, gap_threshold
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.memory.attribution import Separation, Suspect
from gpuwarden.memory.attribution import MemoryLedger
from gpuwarden.memory.ledger import human, human_seconds
from gpuwarden.memory.trend import Trend
from gpuwarden.rules.base import Hit, rule

#: share of the gap that per-page NVIDIA slab objects must cover to name the driver as holder
TRACKED_SHARE = 0.5
MiB = 1 << 20
#: growth below this is bookkeeping noise, not a trend worth a rate in the summary
GROWING_PER_MIN = 16 * MiB

MECHANISM = (
    "The NVIDIA driver allocates system memory for a GPU context (nv_alloc_pages/nvos_create_alloc; in "
    "incident 4 EGL framebuffers that were never freed) straight from the page allocator: the pages appear in "
    "no /proc/meminfo field and, on that kernel/driver, are charged to no memory cgroup, so the pod's limit "
    "never fires. Reclaim then evicts the page cache of every binary and library (kubelet's included), which "
    "is re-read from disk at once: the node thrashes, free memory stays above the min watermark so the OOM "
    "killer never runs, kubelet stops posting status, the node goes NotReady, and eviction moves the pod to "
    "the next node, which dies the same way."
)

REMEDY = """
    1. Now, while the node still answers: delete the suspect pod (`kubectl delete pod -n <ns> <pod>`); the
       driver frees the memory when the process exits (no leak). Cordon the node first if the workload
       would be rescheduled onto it.
    2. Stop the cascade: give the workload explicit `tolerationSeconds` for `node.kubernetes.io/not-ready` and
       `unreachable`, or lower kube-controller-manager `--node-eviction-rate` (default 0.1/s; the write-up
       suggests 0.0003 ≈ 1 node/hour) and `--secondary-node-eviction-rate` for GPU pools.
    3. Act before the thrash: a userspace early-OOM on PSI/MemAvailable (earlyoom, systemd-oomd, oomd) kills
       before reclaim stalls the node; none of them can attribute kernel memory to a pod, so let it target
       the GPU workloads' cgroups.
    4. Keep the node manageable: reserve memory for the system (`systemReserved`/`kubeReserved` with
       `enforceNodeAllocatable`), protect kubelet's cgroup with `memory.min` (cgroup v2), keep kubelet and
       sshd resident (prelockd).
    5. Fix the application: destroy EGL contexts and delete framebuffers/textures it no longer uses
       (incident 4), cap batch sizes.
"""


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "?"


def _affected(s: Suspect, why: str) -> Affected:
    if s.kind == "pod":
        return Affected("pod", s.name or s.uid, s.namespace, s.uid, why)
    return Affected("process", s.name, detail=f"pid {', '.join(map(str, s.pids))}; {why}")


def _ledger_evidence(m: MemoryFacts) -> list[Evidence]:
    node = m.ledger.node
    ev = [Evidence("/proc/meminfo", m.meminfo.quote(
        "MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "Shmem", "AnonPages", "Slab", "SReclaimable",
        "SUnreclaim", "KernelStack", "PageTables", "VmallocUsed", "Percpu", "Hugetlb"))]
    top = sorted(node.lines, key=lambda x: -x.bytes)[:6]
    ev.append(Evidence("memory ledger", f"{human(node.unexplained)} ({_pct(node.unexplained, node.total)} of MemTotal "
                       f"{human(node.total)}) is in no meminfo field; counted: "
                       + ", ".join(f"{x.key} {human(x.bytes)}" for x in top)))
    return ev


def _slab_evidence(m: MemoryFacts, gap: int) -> list[Evidence]:
    node = m.ledger.node
    if m.slabinfo is None:
        return [Evidence("/proc/slabinfo", "unreadable (root only): NVIDIA slab caches not checked")]
    ev = []
    for c in m.slabinfo.driver_page_trackers():
        pages = c.active_objs * node.page_size
        ev.append(Evidence("/proc/slabinfo",
                           f"{c.name} {c.active_objs} {c.num_objs} {c.objsize} {c.objperslab} {c.pagesperslab}: "
                           f"{c.active_objs} objects ({human(c.size_bytes(node.page_size))} of slab), one per page the "
                           f"driver allocated → {human(pages)} of driver pages ({_pct(pages, gap)} of the gap)"))
    if not ev:
        nv = m.slabinfo.nvidia_bytes(node.page_size)
        ev.append(Evidence("/proc/slabinfo", f"NVIDIA caches hold {human(nv)}; no per-page tracking cache "
                           "(nvidia_pte_cache) in this driver, so the slab cannot name the driver as holder"))
    return ev


def _cgroup_evidence(m: MemoryFacts) -> list[Evidence]:
    split = m.ledger.split
    ev = []
    if not split.available:
        return [Evidence("memory cgroups", f"no per-cgroup split: {split.reason}")]
    if split.charged_outside_meminfo is not None:
        ev.append(Evidence(split.charged_outside_source,
                           f"{human(split.charged_outside_meminfo)} of kernel memory charged to cgroups lies outside "
                           f"meminfo{'' if split.exact else ' (v1: whole kmem, an upper bound)'}; "
                           f"{human(split.uncharged_unexplained)} is charged to no cgroup"))
    for p in m.ledger.split.pods:
        if not p.gpu_pids:
            continue
        c = p.cgroup.charges
        parts = ""
        if c is not None:
            parts = ", ".join(f"{k} {human(v)}" for k, v in (("anon", c.anon), ("file", c.file), ("kernel", c.kernel))
                              if v is not None)
        lim = f" of its limit {human(p.cgroup.limit)}" if p.cgroup.limit else " (no limit)"
        ev.append(Evidence(p.cgroup.source, f"GPU pod {p.ref} is charged {human(p.cgroup.current)}{lim} ({parts}): "
                           "the driver's pages are not in its charge, so the limit cannot stop them"))
    if not any(p.gpu_pids for p in split.pods) and split.reason:
        ev.append(Evidence("memory cgroups", split.reason))
    return ev


def _holder_evidence(m: MemoryFacts) -> list[Evidence]:
    ev = []
    refs = {p.uid: p.ref for p in m.ledger.split.pods}
    for h in m.holders[:8]:
        who = f"pod {refs.get(h.pod_uid, h.pod_uid)}" if h.pod_uid else "host process"
        role = ", GPU infrastructure" if h.infra else ""
        ev.append(Evidence(f"/proc/{h.pid}/fd", f"{h.name} (pid {h.pid}, {who}{role}) has {', '.join(h.devices)} open"))
    if len(m.holders) > 8:
        ev.append(Evidence("/proc/*/fd", f"… and {len(m.holders) - 8} more NVIDIA device holders"))
    if not m.scan.complete:
        ev.append(Evidence("/proc/*/fd", f"scan incomplete: {m.scan.reason}"))
    a = m.ledger.attribution
    sep = m.escape.separation if m.escape is not None else None
    if sep is None:  # without the separation (no reliable ledger) the device holders' own count is all there is
        ev.append(Evidence("attribution", f"confidence {a.confidence}: {a.explanation}"))
    return ev


def kubelet_protection(facts: NodeFacts, m: MemoryFacts) -> list[Evidence]:
    """What keeps kubelet alive under reclaim, if anything is visible (remedy evidence)."""
    ev = []
    kf = facts.maybe("kubelet")
    cfg = getattr(kf, "config", None)
    flags = getattr(kf, "flags", None) or {}
    if isinstance(cfg, dict) and (cfg or flags):
        def pick(key: str, sub: str, flag: str) -> str:
            v = cfg.get(key)
            if isinstance(v, dict) and v.get(sub):
                return str(v[sub])
            for item in str(flags.get(flag, "")).split(","):
                k, _, val = item.partition("=")
                if k.strip() in (sub, "memory.available") and val:
                    return val
            return ""
        sr, kr = pick("systemReserved", "memory", "system-reserved"), pick("kubeReserved", "memory", "kube-reserved")
        eh = pick("evictionHard", "memory.available", "eviction-hard")
        enforce = cfg.get("enforceNodeAllocatable") or flags.get("enforce-node-allocatable") or ["pods"]
        src = getattr(kf, "config_path", None) or "kubelet flags"
        text = (f"systemReserved.memory={sr or 'unset'}, kubeReserved.memory={kr or 'unset'}, "
                f"evictionHard memory.available={eh or 'unset (default 100Mi)'}, enforceNodeAllocatable={enforce}")
        if not sr and not kr:
            text += ": nothing is reserved for the system; "
        else:
            text += ": reservations shrink allocatable only; "
        text += "kubelet's eviction counts charged memory, which excludes the driver's pages"
        ev.append(Evidence(src, text))
    k = m.kubelet
    if k is not None and k.protection_source:
        if not k.memory_min:
            ev.append(Evidence(f"{k.protection_source}/memory.min",
                               f"kubelet's cgroup memory.min={k.memory_min or 0}: nothing keeps its pages resident"))
    elif m.cgroup_version == 1:
        ev.append(Evidence("cgroup v1", "no memory.min on cgroup v1: kubelet's pages are reclaimed like any other"))
    return ev


def _node_hit(facts: NodeFacts, m: MemoryFacts, led: MemoryLedger, gap: int, threshold: int) -> Hit:
    node, thrash = led.node, led.thrash
    tracked = node.tracked_driver_bytes or 0
    driver_named = gap > 0 and tracked >= TRACKED_SHARE * gap
    confirmed = thrash.present or driver_named
    a = led.attribution
    ev = _ledger_evidence(m) + _cgroup_evidence(m) + _slab_evidence(m, gap)
    ev += [Evidence(s.source, s.text) for s in thrash.signals]
    if not thrash.signals:
        ev.append(Evidence("thrash precursors", "none: MemAvailable, watermarks and PSI show no stall yet"))
    ev += _holder_evidence(m) + kubelet_protection(facts, m)
    what = (" and charged to no cgroup" if led.split.uncharged_unexplained is not None else
            " (no memory cgroup was readable, so whether a limit covers it is unknown)")
    head = (f"{human(gap)} of host RAM ({_pct(gap, node.total)} of {human(node.total)}) is held outside every "
            f"meminfo counter{what}")
    if driver_named and m.slabinfo is not None:
        names = ", ".join(c.name for c in m.slabinfo.driver_page_trackers())
        head += f"; {names} tracks {human(tracked)} of NVIDIA driver pages"
    if thrash.present:
        head += "; the node is thrashing (" + ", ".join(s.key for s in thrash.signals if s.strong) + ")"
    elif confirmed:
        head += "; no thrash yet"
    else:
        head += "; not thrashing yet, but reclaim cannot free it and no memory limit will stop it"
    head += f"; {_trend_text(m)}"
    e = m.escape
    sep = e.separation if e is not None else None
    if sep is not None:
        head += ". " + _who(sep)
        suspects = [sep.holder] if sep.holder is not None else sep.remaining
        conf = sep.confidence
    else:
        if a.suspects:
            head += f". Likely holder: {a.suspects[0].ref} ({a.confidence} confidence)"
        suspects, conf = a.suspects, a.confidence
    ev += _escape_evidence(m)
    affected = [Affected("node", "this node", detail=f"{human(gap)} uncounted")]
    affected += [_affected(s, f"candidate holder; {conf} confidence") for s in suspects[:4]]
    data = _data(m, led)
    data.update({"threshold": threshold, "driver_named_by_slab": driver_named, "thrashing": thrash.present})
    if e is not None and sep is not None and sep.holder is not None and sep.confidence == "high" \
            and sep.holder.kind == "pod":
        h = sep.holder
        pod = next((p for p in led.split.pods if p.uid == h.uid), None)
        data["pod"] = {"namespace": h.namespace, "name": h.name, "uid": h.uid,
                       "cgroup": pod.cgroup.path if pod is not None else ""}
    return Hit(Status.CONFIRMED if confirmed else Status.AT_RISK, _danger(m) + head + ".", affected, ev,
               severity=None if confirmed else Severity.HIGH, mechanism=MECHANISM, data=data)


def _who(sep: Separation) -> str:
    """The holder, or the remaining candidates and what would separate them: with the finding's one confidence."""
    if sep.holder is not None:
        return f"Holder: {sep.holder.ref} ({sep.confidence} confidence, by {sep.method})"
    left = sep.remaining
    if not left:
        return f"No candidate can hold it ({sep.confidence} confidence): {sep.evidence[0]}"
    out = ("Candidates, not separated (" + sep.confidence + " confidence; nothing is evicted or killed on this unless "
           "the node nears its min watermark and the agent's memory_unsure_policy says so): "
           + ", ".join(s.ref for s in left))
    return out + (f"; what would separate them: {sep.separate_by}" if sep.separate_by else "")


def _data(m: MemoryFacts, led: MemoryLedger) -> dict:
    """The ledger's data with the attribution's confidence, order and explanation taken from the separation
    (one confidence, one explanation: the ledger's ranking may name a candidate the separation eliminated)."""
    data = led.to_json()
    e = m.escape
    if e is not None:
        data["escape"] = e.to_json()
        att = data.get("attribution") or {}
        att["confidence"] = e.separation.confidence
        sep = e.separation
        att["explanation"] = "; ".join([_who(sep), *sep.evidence[:1]])
        # the memory-guard hook evicts the first pod of a "high" list: only the named holder may be on it
        keep = [sep.holder.ref] if sep.holder is not None else [x.ref for x in sep.remaining]
        att["suspects"] = sorted((s for s in att.get("suspects") or [] if s.get("ref") in keep),
                                 key=lambda s: keep.index(s["ref"]))
        data["attribution"] = att
        left = [c for c in sep.candidates if not c.eliminated]
        if sep.holder is None and len(left) >= 2:
            data["unsure"] = _unsure(led, left, e.trend)
    return data


def _unsure(led: MemoryLedger, left: list, t: Trend | None) -> dict:
    """What the agent's unsure policy needs (agent/unsure.py): the remaining candidates with their cgroups, and how
    near the min watermark the growth is taking the node."""
    cg = {p.uid: p.cgroup.path for p in led.split.pods}
    return {"candidates": [dict(c.to_json(), cgroup=cg.get(c.suspect.uid, "")) for c in left],
            "seconds_to_min_watermark": t.seconds_to_min_watermark if t is not None else None,
            "recent_rate_bytes_per_s": t.recent_rate if t is not None else None,
            "growth_bytes": t.change_bytes if t is not None and t.growth_began is not None else 0,
            "headroom_bytes": (t.available - t.min_watermark) if t is not None and t.available is not None
            and t.min_watermark is not None else None}


def _charged_risk(m: MemoryFacts, s: Suspect) -> str:
    """Why driver memory charged to a pod can hurt this node ("" when its limit covers it and the node has room)."""
    pod = next((p for p in m.ledger.split.pods if p.uid == s.uid), None)
    if pod is None:
        return ""
    cg, th = pod.cgroup, m.ledger.thrash
    if cg.limit is None:
        return (f"{s.ref} has no memory limit: the driver memory charged to it can grow until the node runs out, "
                "and /proc/meminfo does not show it")
    if th.mem_available is not None and cg.current is not None:
        room = th.mem_available - (th.min_watermark or 0)
        if cg.limit - cg.current > room:
            return (f"{s.ref} may still grow by {human(cg.limit - cg.current)} within its {human(cg.limit)} limit, but "
                    f"the node has only {human(max(0, room))} above the min watermark: the limit no longer protects "
                    "the node")
    return ""


def _charged_hit(m: MemoryFacts, charged: list[Suspect]) -> Hit:
    """Driver memory charged to pods (unified memory as `kernel`): info while their limits cover it and the node
    has room for those limits (measured: the limit OOM-kills at the limit); medium where it can hurt this node."""
    total = sum(s.kernel_other or 0 for s in charged)
    ev = []
    for s in charged:
        pod = next((p for p in m.ledger.split.pods if p.uid == s.uid), None)
        if pod is not None and pod.cgroup.charges is not None:
            c = pod.cgroup.charges
            ev.append(Evidence(pod.cgroup.source,
                               f"kernel {c.kernel} = slab {c.slab} + kernel_stack {c.kernel_stack} + pagetables "
                               f"{c.pagetables} + sec_pagetables {c.sec_pagetables or 0} + percpu {c.percpu} + "
                               f"vmalloc {c.vmalloc} + {c.kernel_other} other "
                               f"({human(c.kernel_other)}); file_mapped beyond file {human(c.driver_mapped)}; "
                               f"shmem {human(c.shmem)}; memory.current {human(pod.cgroup.current)} of limit "
                               f"{human(pod.cgroup.limit) if pod.cgroup.limit else 'max'}"))
        ev.extend(Evidence(f"/proc/{pid}/fd", f"pid {pid} ({', '.join(s.names)}) has {', '.join(s.devices)} open")
                  for pid in s.pids[:3])
    node = m.ledger.node
    ev.append(Evidence("memory ledger", f"{human(node.unexplained)} of MemTotal {human(node.total)} is in no meminfo "
                       f"field, of which {human(m.ledger.split.charged_outside_meminfo)} is charged to cgroups"))
    ev.append(Evidence("attribution", "confidence high: the pod's own memory.stat is charged for it"))
    risks = [r for r in (_charged_risk(m, s) for s in charged) if r]
    ev += [Evidence("risk", r) for r in risks]
    who = ", ".join(f"{s.ref} ({human(s.kernel_other)})" for s in charged)
    summary = (f"GPU-driver memory charged to pods as kernel memory: {who}, {human(total)} that /proc/meminfo does "
               "not show. ")
    summary += ("; ".join(risks) + "." if risks else
                "Their limits cover it and the node has room for them: the kernel OOM-kills such a pod at its limit "
                "(measured on driver 580). Information only: on drivers or kernels that do not charge it, the same "
                "workload escapes its limit (incident 4).")
    return Hit(Status.AT_RISK, summary, [_affected(s, f"{human(s.kernel_other)} kernel memory beyond slab/stacks/"
                                                   "page tables") for s in charged], ev,
               severity=Severity.MEDIUM if risks else Severity.INFO, mechanism=(
                   "Unified (managed) memory touched on the host is charged to the process's memory cgroup as "
                   "`kernel` one for one and shows in no /proc/meminfo field (measured on an H200, driver "
                   "580.159.04, kernel 6.18); pinned host memory is charged as file/shmem and shows in Cached."),
               data={"charged": [s.to_json() for s in charged], "risks": risks})


def _rate(t: Trend) -> float:
    """Bytes per second: the sustained rate once its window is covered, else what the first samples show."""
    return t.rate if t.rate is not None else (t.early_rate or 0.0)


def _danger(m: MemoryFacts) -> str:
    """The first words of the finding while the memory grows: how soon the node is in danger at this rate."""
    t = m.escape.trend if m.escape else None
    if t is None or _rate(t) * 60 < GROWING_PER_MIN or t.seconds_to_min_watermark is None:
        return ""
    what = (f"{human(t.change_bytes)} in {human_seconds(t.change_s)}" if t.rate is None else
            f"{human(t.per_min)}/min over {human_seconds(t.span_s)}")
    return (f"At +{what}, MemAvailable reaches the kernel's min watermark (thrash, then NotReady) in "
            f"{human_seconds(t.seconds_to_min_watermark)}. ")


def _trend_text(m: MemoryFacts) -> str:
    """Growth rate and time to exhaustion (the agent's history), or why there is none."""
    t = m.escape.trend if m.escape else None
    avail, mins = m.ledger.thrash.mem_available, m.ledger.thrash.min_watermark
    room = (f"MemAvailable {human(avail)}" + (f", min watermark {human(mins)}" if mins is not None else "")
            if avail is not None else "")
    if t is None:
        return ("growth rate unknown from one sample (the agent measures it across checks)"
                + (f"; {room}" if room else ""))
    if t.rate is None:
        if t.early_rate is None:
            return (f"not growing in the agent's {t.samples} samples over {human_seconds(t.span_s)}"
                    + (f"; {room}" if room else ""))
        txt = (f"grown +{human(t.change_bytes)} in {human_seconds(t.change_s)} ({human(t.early_rate * 60)}/min from the "
               "first samples; the sustained rate needs its window)")
    elif t.rate * 60 >= GROWING_PER_MIN:
        txt = f"growing {human(t.per_min)}/min over the last {human_seconds(t.span_s)}"
    else:
        return (f"not growing now ({human(t.per_min)}/min over {human_seconds(t.span_s)}): the memory stays taken until "
                "the process exits" + (f"; {room}" if room else ""))
    if t.seconds_to_min_watermark is not None:
        txt += f"; at this rate MemAvailable reaches the min watermark in {human_seconds(t.seconds_to_min_watermark)}"
    return txt + (f" ({room})" if room else "")


def _escape_evidence(m: MemoryFacts) -> list[Evidence]:
    e = m.escape
    if e is None:
        return []
    ev = [Evidence("uncharged memory", f"{human(e.gap)} is charged to no cgroup; a healthy node with {e.contexts} GPU "
                   f"context(s) shows up to {human(e.baseline)}, so {human(e.excess)} is unexplained by normal use")]
    if e.measured_before is not None and e.separation.holder is not None:
        ev.append(Evidence(e.trend.source if e.trend else "agent history", f"the agent measured {human(e.measured_before)} just before "
                           f"{e.separation.holder.ref} started: {human(e.attributed)} has appeared since"))
    ev += [Evidence(f"attribution ({e.separation.method})", line) for line in e.separation.evidence]
    t = e.trend
    if t is not None:
        ev.append(Evidence(t.source, f"{t.samples} samples over {t.span_s:.0f} s: "
                           + (f"{human(t.per_min)}/min sustained; " if t.rate is not None else "")
                           + f"+{human(t.change_bytes)} in {t.change_s:.0f} s since the growth began; "
                           f"{t.growth_intervals} growth interval(s)"))
    return ev


def _escape_hit(facts: NodeFacts, m: MemoryFacts, confirmed: bool) -> Hit:
    e = m.escape
    assert e is not None and e.escape is not None
    x, sep = e.escape, e.separation
    node, thrash = m.ledger.node, m.ledger.thrash
    state = ("the node is thrashing (" + ", ".join(t.key for t in thrash.signals if t.strong) + ")"
             if thrash.present else "no thrash yet")
    head = (f"{x.suspect.ref} has escaped its memory limit: it holds {human(x.total)} of host memory, "
            f"{human(x.over)} over its {human(x.limit)} limit — {human(x.uncharged)} of GPU-driver memory that no "
            f"cgroup is charged for, beside the {human(x.charged)} its cgroup is charged. Node: {human(e.gap)} of "
            f"host RAM ({_pct(e.gap, node.total)} of {human(node.total)}) is outside every meminfo counter and "
            f"every limit; {state}; {_trend_text(m)}. Named by {sep.method} ({sep.confidence} confidence)")
    if not confirmed:
        head += "; the evidence does not yet separate it from the other GPU workloads"
    ev = _escape_evidence(m) + _cgroup_evidence(m) + _ledger_evidence(m) + _slab_evidence(m, e.gap)
    ev += _holder_evidence(m) + [Evidence(s.source, s.text) for s in m.ledger.thrash.signals]
    ev += kubelet_protection(facts, m)
    data = _data(m, m.ledger)
    tracked = node.tracked_driver_bytes or 0
    data.update({"threshold": x.limit, "thrashing": thrash.present,
                 "driver_named_by_slab": e.gap > 0 and tracked >= TRACKED_SHARE * e.gap})
    if confirmed:
        pod = next((p for p in m.ledger.split.pods if p.uid == x.suspect.uid), None)
        data["pod"] = {"namespace": x.suspect.namespace, "name": x.suspect.name, "uid": x.suspect.uid,
                       "cgroup": pod.cgroup.path if pod is not None else ""}
    affected = [_affected(x.suspect, f"{human(x.over)} over its memory limit through uncharged driver memory")]
    return Hit(Status.CONFIRMED if confirmed else Status.AT_RISK, _danger(m) + head + ".", affected, ev,
               severity=None if confirmed else Severity.HIGH, mechanism=MECHANISM, data=data)


def _growth_hit(facts: NodeFacts, m: MemoryFacts) -> Hit:
    e = m.escape
    assert e is not None and e.trend is not None
    head = (f"Host memory that no cgroup is charged for is {_trend_text(m)}; now {human(e.gap)} "
            f"({human(e.excess)} beyond a healthy node's baseline). {_who(e.separation)}")
    ev = _escape_evidence(m) + _ledger_evidence(m) + _holder_evidence(m)
    data = _data(m, m.ledger)
    data.update({"thrashing": m.ledger.thrash.present})
    affected = [Affected("node", "this node", detail=f"{human(_rate(e.trend) * 60)}/min uncharged growth")]
    sep = e.separation
    affected += [_affected(s, f"candidate holder; {sep.confidence} confidence")
                 for s in ([sep.holder] if sep.holder is not None else sep.remaining[:4])]
    return Hit(Status.AT_RISK, _danger(m) + head + ".", affected, ev, severity=Severity.HIGH, mechanism=MECHANISM,
               data=data)


@rule(
    "GPU-NODE-001",
    title="Host RAM held by GPU-driver allocations that no memory cgroup is charged for (thrash → NotReady → "
          "eviction cascade)",
    severity=Severity.CRITICAL,
    family="node-memory",
    needs=("memory",),
    uses=("containers", "kubelet"),
    remedy=REMEDY,
    references=(
        "incident 4 (shared/incidents/4-driver-kernel-memory-node-cascade.zh.md)",
        "NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv.c: nvos_create_alloc, nvidia_pte_cache",
        "NVIDIA forum: CUDA unified memory usage is not accounted by linux cgroup",
        "Documentation/filesystems/proc.rst (meminfo), Documentation/admin-guide/cgroup-v2.rst (memory.stat)",
        "https://kubernetes.io/docs/concepts/architecture/nodes/#rate-limits-on-eviction",
        "hakavlad/prelockd, rfjakob/earlyoom, facebookincubator/oomd",
    ),
    automation="A2",
)
def driver_memory_outside_cgroups(facts: NodeFacts) -> Iterator[Hit]:
    """
    GPU-NODE-001 — host RAM held by GPU-driver allocations that no memory cgroup is charged for.

    The memory ledger splits MemTotal into the /proc/meminfo categories that do not overlap (free, page
    cache, buffers, anon, slab with the NVIDIA caches broken out, kernel stacks, page tables, vmalloc,
    percpu, HugeTLB …). What is left is memory no counter shows; subtracting what the memory cgroups are
    charged for beyond their slab/stacks/page tables leaves what *no limit* can stop.

    Per pod, CONFIRMED (critical) when a GPU pod has escaped its limit: what its cgroup is charged plus
    the uncharged memory beyond a healthy node's baseline (384 MiB + 128 MiB per GPU context) exceeds its
    memory limit by at least 1 GiB, and the holder is named with high confidence: the evidence for and
    against every candidate is combined (compute-only clients of a full GPU and graphics clients of a GPU
    that had room are eliminated; a graphics client of a full GPU, a process that appeared as the growth
    began, memory back when it left rank the rest), and one candidate remains or leads clearly. Otherwise
    the remaining candidates are named, with what would separate them, AT-RISK (high), and never acted on.
    Node-wide, CONFIRMED (critical) when the uncharged excess is at least `unexplained_mem_min_bytes`
    (4 GiB; optionally also `unexplained_mem_ratio` of MemTotal) and the node shows thrash precursors or
    a per-page NVIDIA slab cache accounts for half of it; AT-RISK (high) when it is that large without
    either, or when the agent sees it grow by `memory_growth_bytes_per_min` or more. A pod charged more
    than 2 GiB of `kernel` memory beyond slab/stacks/page tables (unified memory on driver 580) is
    information while its limit covers it and the node has room for that limit, AT-RISK (medium) when it
    has no limit or its limit exceeds the node's room. Thresholds and their reasons: docs/memory.md.
    """
    m: MemoryFacts = facts.get("memory")
    led = m.ledger
    if not led.node.reliable:
        raise FactUnavailable(f"memory ledger not computable: {led.node.reason}")
    threshold = gap_threshold(facts, led.node.total)
    e = m.escape
    excess = e.excess if e is not None else led.gap
    over_min = escape_settings(facts).over_limit_bytes
    escaped = e is not None and e.escape is not None and e.escape.over >= over_min
    if escaped and e.separation.confidence == "high":  # type: ignore[union-attr]
        yield _escape_hit(facts, m, confirmed=True)
    elif excess >= threshold:
        yield _node_hit(facts, m, led, led.gap, threshold)
    elif escaped:
        yield _escape_hit(facts, m, confirmed=False)
    elif e is not None and e.trend is not None and e.trend.growing and e.excess > 0:
        yield _growth_hit(facts, m)
    elif led.attribution.charged:
        yield _charged_hit(m, led.attribution.charged)
