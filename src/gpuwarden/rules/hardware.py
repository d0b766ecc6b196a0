"""GPU hardware health: Xids, the bus, ECC, row remapping, NVLink, PCIe, missing GPUs, NVSwitch SXids.

Sources, each optional (a rule reports what it could read and is "not evaluated" only when it
could read none of its sources): the kernel log's Xid and NVRM lines (`xids`, `logs`),
`nvidia-smi -q -x` (`driver.smi`), the live NVML probe (`probes`), sysfs PCI functions (`pci`)
and the kubelet's device-manager checkpoint (`kubelet`).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

from gpuwarden import xid as xidtable
from gpuwarden.facts import NodeFacts
from gpuwarden.facts.boot import boot_time
from gpuwarden.facts.nvidia_smi import SMI_XML
from gpuwarden.facts.xids import FOLLOW_S, GpuRef, XidEvent, XidFacts, gpu_map, in_current_boot
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.rules.base import Hit, require_any, rule
from gpuwarden.rules.fmt import line_with, ts
from gpuwarden.rules.held_devices import held_devices
from gpuwarden.parsers.kubelet_checkpoint import base_device_id

XID_DATA = "data/xid.yaml"
XID_REFS = ("https://docs.nvidia.com/deploy/xid-errors/index.html",
            "NVIDIA/NVSentinel charts/gpu-health-monitor/xiderrorsmapping.csv",
            "NVIDIA/k8s-device-plugin internal/rm/health.go")
#: unparsed driver lines quoted as evidence (the count covers all of them)
MAX_UNPARSED = 5


# -- shared helpers ----------------------------------------------------------------------------------

def _gpus(facts: NodeFacts, xf: XidFacts | None) -> dict[str, GpuRef]:
    return xf.gpus if xf is not None else gpu_map(facts)


def _ref(gpus: dict[str, GpuRef], key: str | None) -> GpuRef:
    return gpus.get(key or "") or GpuRef(key or "unknown")


def _smi_gpus(facts: NodeFacts) -> list[Any]:
    driver = facts.maybe("driver")
    return list(driver.smi.gpus) if driver is not None and driver.smi is not None else []


def _probe_gpus(facts: NodeFacts) -> tuple[list[dict], str]:
    """Per-GPU dicts of a successful NVML probe snapshot, and its evidence source."""
    probes = facts.maybe("probes")
    n = getattr(probes, "nvml", None) if probes is not None else None
    if n is None or getattr(n, "status", "") != "ok" or not isinstance(getattr(n, "value", None), dict):
        return [], ""
    src = "probe nvml" + (" (recorded)" if getattr(probes, "recorded", False) else "")
    return [g for g in n.value.get("gpus") or [] if isinstance(g, dict)], src


def _yes(v: Any) -> bool:
    return str(v).strip().lower() in ("yes", "true", "1", "enabled")


def _int(v: Any) -> int | None:
    m = re.match(r"\s*([0-9]+)", str(v or ""))
    return int(m.group(1)) if m else None


def _xid_ev(events: list[XidEvent]) -> list[Evidence]:
    """The last line of each Xid, and how often it occurred."""
    out: list[Evidence] = []
    by: dict[int, list[XidEvent]] = {}
    for e in events:
        by.setdefault(e.xid, []).append(e)
    for x, evs in sorted(by.items()):
        last = evs[-1]
        out.append(last.event.evidence())
        if len(evs) > 1:
            out.append(Evidence(last.event.source, f"Xid {x}: {len(evs)} lines, first at {ts(evs[0].time)}, "
                                                   f"last at {ts(last.time)}"))
    return out


def _followers(xf: XidFacts | None, key: str, causes: set[int]) -> tuple[list[Evidence], dict[str, int]]:
    """Evidence of the follow-on Xids (45) tied to `causes` on GPU `key`, and their counts by Xid."""
    if xf is None or not causes:
        return [], {}
    evs = xf.followers(key, causes)
    if not evs:
        return [], {}
    counts: dict[str, int] = {}
    for e in evs:
        counts[str(e.xid)] = counts.get(str(e.xid), 0) + 1
    by_cause = sorted({e.cause for e in evs if e.cause is not None})
    last = evs[-1]
    return [last.event.evidence(),
            Evidence(last.event.source, f"{len(evs)} follow-on Xid line(s) ({', '.join(f'Xid {x} x{n}' for x, n in sorted(counts.items()))}) "
                                        f"caused by Xid {', '.join(map(str, by_cause))}: NVIDIA's catalog says act on "
                                        "the Xid they follow (the applications on those channels were stopped)")], counts


def _repeated(events: list[XidEvent], now: float | None) -> bool:
    """The catalog's threshold per time window (data/xid.yaml `repeat`) is reached by these events
    in a window that is still open at `now` (facts.now: a bundle's capture time)."""
    rep = xidtable.table().repeat
    timed = [e.time for e in events if e.time is not None]
    return rep.reached(timed, now) if timed else len(events) >= rep.count


def _classification(x: xidtable.XidInfo) -> Evidence:
    plugin = ("the NVIDIA device plugin ignores it" if x.device_plugin == "ignored"
              else "the NVIDIA device plugin marks the GPU Unhealthy on it (sticky)")
    return Evidence(XID_DATA, f"Xid {x.xid} {x.name or '(unnamed)'}: {x.meaning}; NVIDIA immediate action "
                              f"{x.action.name}; {plugin}")


def _xids_for(facts: NodeFacts, code: str) -> tuple[XidFacts | None, list[XidEvent], list[XidEvent]]:
    """(facts, current-boot events, earlier-boot events) of the Xids routed to `code`."""
    xf: XidFacts | None = facts.maybe("xids")
    if xf is None:
        return None, [], []
    mine = [e for e in xf.events if e.info.rule == code]
    return xf, [e for e in mine if e.current_boot is not False], [e for e in mine if e.current_boot is False]


def _kernel_events(facts: NodeFacts, sig: str) -> tuple[list[Any], float | None]:
    logs = facts.maybe("logs")
    if logs is None or logs.kernel is None:
        return [], None
    return logs.kernel.of(sig), boot_time(facts)


# -- GPU-HW-001 --------------------------------------------------------------------------------------

@rule(
    "GPU-HW-001",
    title="GPU Xid errors in the kernel log that need action (generic Xid classifier)",
    severity=Severity.HIGH,
    family="hardware",
    needs=("xids",),
    automation="per Xid: A2 (cordon, drain, GPU reset or reboot) / A3",
    remedy="""
        Follow NVIDIA's immediate action for each Xid (quoted in the finding): RESET_GPU: cordon, drain,
        `nvidia-smi -r -i <bus id>` (never with processes running); RESTART_BM: drain and reboot;
        UNEXPECTED_ERR_REPORT_ISSUE: collect `nvidia-bug-report.sh` and report it; application Xids: restart
        the job, and if they repeat on one GPU across jobs run `dcgmi diag -r 2`.
    """,
    references=XID_REFS + ("catalog GPU-HW-001 (../shared/knowledge/signatures.md §5)",),
)
def xid_classifier(facts: NodeFacts) -> Iterator[Hit]:
    """NVIDIA driver errors (Xids) classified with NVIDIA's Xid catalog, per GPU.

    Reads `NVRM: Xid (PCI:0000:3b:00): 46, pid=…, …` lines of the kernel log and classifies each
    Xid with data/xid.yaml (NVIDIA's "immediate action" buckets as mirrored by NVSentinel). Xids
    with a signature of their own are left to it: 79 (GPU-HW-002), 48/94/95/140/171/172 (GPU-HW-003),
    63/64 (GPU-HW-004), 74 and 144-150 (GPU-HW-005), 119/120 (GPU-DRV-005).

    CONFIRMED, per GPU, in the current boot (the line's time at or after /proc/stat btime; a
    /dev/kmsg capture holds only the current boot): an Xid whose action is RESET_GPU, RESTART_BM,
    RESTART_VM, a WORKFLOW, UNEXPECTED_ERR_REPORT_ISSUE or the like; Xid 154 takes the severity of
    the recovery action it names (0x2 node reboot: critical). Severity is the worst action's.
    AT-RISK (medium): application-class Xids (RESTART_APP: 13, 31, 43, 45, 68 …) reaching the
    threshold per time window of data/xid.yaml `repeat` on one GPU (3 within 24 h) [heuristic from
    the catalog: one is the application's fault, a series points at the GPU; it clears once the
    window passes without a new one]; an Xid newer than NVIDIA's catalog as read (data/xid.yaml
    `catalog.read`): escalate it, as the peers do ("contact support").
    A follow-on Xid (45) tied to the Xid it follows on the same GPU (its line's "caused by
    previous Xid N", else another Xid of that GPU within 60 s before it) is never reported alone:
    the finding of its cause quotes it, and it counts toward nothing (the catalog's investigatory
    action: "Not Solo: IGNORE (follow other Xid)").
    AT-RISK (low), once per node: NVRM / nvidia-nvswitch lines that name an Xid or SXid in a form
    gpuwarden cannot read, quoted as unparsed evidence (nothing matched halfway is dropped).
    Not reported: IGNORE-class Xids, single application Xids, Xids of earlier boots.
    """
    xf: XidFacts = facts.get("xids")
    # a follow-on Xid (45) tied to its cause is reported with the cause, by the cause's rule
    events = [e for e in xf.current() if e.info.rule == "GPU-HW-001" and e.cause is None]
    for key, evs in sorted(xf.by_gpu(events).items()):
        gpu = xf.gpu(key)
        serious = []
        sev = Severity.MEDIUM
        actions: dict[str, str] = {}
        for e in evs:
            if not e.info.known or e.info.benign:
                continue
            s, name = e.info.severity, e.info.action.name
            if e.xid == 154 and (ra := xidtable.recovery_action(e.detail)) is not None:
                if ra[1] <= Severity.INFO:
                    continue  # "changed … to 0x0 (None)": nothing to do
                s, name = ra[1], f"Xid 154 ({ra[0]})"
            serious.append(e)
            sev = max(sev, s)
            actions.setdefault(name, e.info.action.remedy)
        app = [e for e in evs if e.info.known and e.info.app_class]
        unknown = [e for e in evs if not e.info.known]
        if serious:
            xids = sorted({e.xid for e in serious})
            infos = [xidtable.classify(x) for x in xids]
            follow_ev, follow = _followers(xf, key, set(xids))
            ev = _xid_ev(serious) + follow_ev + [_classification(i) for i in infos]
            yield Hit(
                Status.CONFIRMED,
                f"GPU {gpu.bus_id or key} logged " + ", ".join(i.label() for i in infos)
                + f" since boot; NVIDIA's action: {', '.join(sorted(actions))}.",
                affected=[gpu.affected()], evidence=ev, severity=sev,
                remedy="\n".join(f"{a}: {r}" for a, r in sorted(actions.items())),
                data={"gpu": key, "xids": {str(x): sum(1 for e in serious if e.xid == x) for x in xids},
                      "actions": sorted(actions), "follow_on": follow},
            )
            continue
        if app and _repeated(app, facts.now):
            xids = sorted({e.xid for e in app})
            pids = sorted({m.group(1) for e in app if (m := re.search(r"pid=([^,\s]+)", e.detail))})
            yield Hit(
                Status.AT_RISK,
                f"GPU {gpu.bus_id or key} logged {len(app)} application-class Xid(s) "
                f"({', '.join(map(str, xids))}), {xidtable.table().repeat.describe()} or more"
                + (f" from {len(pids)} process(es)" if pids else "")
                + ": one is the application's fault, a series on one GPU points at the GPU.",
                affected=[gpu.affected()],
                evidence=_xid_ev(app) + [_classification(xidtable.classify(x)) for x in xids],
                severity=Severity.MEDIUM,
                remedy="Run `dcgmi diag -r 2` on the GPU when it is idle; if the same Xid repeats for "
                       "different jobs, drain the GPU and treat it as faulty.",
                data={"gpu": key, "xids": {str(x): sum(1 for e in app if e.xid == x) for x in xids},
                      "pids": pids},
            )
        if unknown:
            xids = sorted({e.xid for e in unknown})
            t = xidtable.table()
            yield Hit(
                Status.AT_RISK,
                f"GPU {gpu.bus_id or key} logged Xid {', '.join(map(str, xids))}, newer than NVIDIA's Xid catalog as "
                f"gpuwarden read it ({t.catalog.get('read', '?')}, up to Xid {t.catalog.get('last_xid', '?')}): "
                "escalate it.",
                affected=[gpu.affected()],
                evidence=_xid_ev(unknown) + [Evidence(XID_DATA, f"catalog read {t.catalog.get('read', '?')}: "
                                                                f"{t.catalog.get('url', '')}")],
                severity=t.actions["UNKNOWN"].severity, remedy=t.actions["UNKNOWN"].remedy,
                data={"gpu": key, "xids": xids},
            )
    if xf.unparsed:
        yield Hit(
            Status.AT_RISK,
            f"{xf.unparsed_count} NVIDIA driver line(s) name an Xid or SXid in a form gpuwarden cannot read: "
            "they are quoted so that an operator reads them.",
            affected=[Affected("node", "kernel-log", detail=xf.source)],
            evidence=[e.evidence() for e in xf.unparsed[-MAX_UNPARSED:]], severity=Severity.LOW,
            remedy="Read the quoted lines against NVIDIA's Xid catalog; report the format to gpuwarden so that it "
                   "is parsed.",
            data={"unparsed": xf.unparsed_count},
        )


def lost_gpu_evidence(facts: NodeFacts, gpus: dict[str, GpuRef]
                      ) -> tuple[dict[str, list[Evidence]], dict[str, list[Evidence]]]:
    """GPUs lost (fallen off the bus, "GPU is lost") in the current boot and before it: PCI key ->
    the evidence (Xid 79, the driver's lost-GPU lines, config space all 0xff, NVML "GPU is lost").
    Shared by GPU-HW-002 and the allocation rule that a lost GPU breaks (GPU-K8S-012)."""
    avail = {k: facts.maybe(k) for k in ("xids", "pci", "probes")}
    xf: XidFacts | None = avail.get("xids")
    now_ev: dict[str, list[Evidence]] = {}
    old_ev: dict[str, list[Evidence]] = {}
    if xf is not None:
        for e in xf.events:
            if e.xid != 79:
                continue
            (old_ev if e.current_boot is False else now_ev).setdefault(e.key or "unknown", []).append(e.event.evidence())
    for lost in (xf.lost if xf is not None else []):
        (old_ev if lost.current_boot is False else now_ev).setdefault(lost.key or "unknown", []).extend(
            e.evidence() for e in lost.events)
    lines, boot = _kernel_events(facts, "kernel.gpu-fallen-off-bus")
    for e in lines:
        k = xidtable.pci_key(e.get("device")) or next(iter(now_ev), None) or "unknown"
        if in_current_boot(e.time, boot) is False:
            old_ev.setdefault(k, []).append(e.evidence())
        else:
            now_ev.setdefault(k, []).append(e.evidence())
    pci = avail.get("pci")
    for fn in (pci.gpus() if pci is not None else []):
        if fn.config_all_ff:
            now_ev.setdefault(fn.key or fn.bdf, []).append(
                Evidence(f"{fn.source}/config", "config space reads all 0xff (lspci: rev ff): the device does not answer"))
    probes = avail.get("probes")
    n = getattr(probes, "nvml", None) if probes is not None else None
    lost_text = ""
    if n is not None:
        blob = f"{getattr(n, 'detail', '')} {getattr(n, 'value', '')}"
        if "gpu is lost" in blob.lower() or "gpuislost" in blob.lower().replace("_", ""):
            lost_text = blob.strip()[:300]
    # NVML's own per-GPU answer first: a lost GPU named by its index, so that the snapshot's text below
    # joins that GPU rather than an unnamed one (an unnamed lost GPU fences the node, not one device)
    for k, ev in _nvml_lost(facts, gpus):
        now_ev.setdefault(k, []).append(ev)
    smi = facts.maybe("nvidia_smi")
    for src, text in (("probe nvml", lost_text), (SMI_XML, line_with(smi.text, "GPU is lost") if smi else "")):
        if text:
            km = re.search(r"GPU\s?([0-9a-fA-F]+:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9])?)", text)
            k = xidtable.pci_key(km.group(1)) if km else (next(iter(now_ev), None) or "unknown")
            now_ev.setdefault(k or "unknown", []).append(Evidence(src, text))
    return now_ev, old_ev


# -- GPU-HW-002 --------------------------------------------------------------------------------------

@rule(
    "GPU-HW-002",
    title="GPU fell off the bus (Xid 79, GPU is lost)",
    severity=Severity.CRITICAL,
    family="hardware",
    needs=(),
    uses=("boot", "containers", "driver", "kubelet", "logs", "nvidia_smi", "pci", "probes", "xids"),
    automation="A2 (cordon, drain, reboot) + A3 (RMA if it recurs)",
    remedy="""
        1. Cordon the node and drain it: the GPU is gone until the node reboots (a GPU reset does not bring
           it back), and everything that touches it (the device plugin, DCGM, nvidia-smi) fails or hangs.
        2. Reboot the node. Before that, collect `nvidia-bug-report.sh` and the kernel log around the Xid
           (PCIe AER errors and thermal events often precede it: GPU-HW-006).
        3. If it recurs after a reboot, reseat the GPU / riser and check power; then RMA.
    """,
    references=("kubernetes/kubernetes#97131", "NVIDIA/open-gpu-kernel-modules#1151",
                "NVIDIA/open-gpu-kernel-modules#387", "NVIDIA/nvidia-docker#1553") + XID_REFS[:1],
)
def fallen_off_bus(facts: NodeFacts) -> Iterator[Hit]:
    """A GPU that fell off the bus no longer answers on PCIe; only a reboot brings it back.

    Evidence read: Xid 79 lines (`NVRM: Xid (PCI:0000:b1:00): 79, pid=…, GPU has fallen off the
    bus.`, or `…: 79` alone), the driver's own `NVRM: GPU 0000:b1:00.0: GPU has fallen off the
    bus.` (older: `NVRM: GPU at 0000:01:00.0 has fallen off the bus.`), the classic three-line
    message `NVRM: The NVIDIA GPU 0000:b3:00.0` / `NVRM: (PCI ID: 10de:26b5) installed in this
    system has` / `NVRM: fallen off the bus and is not responding to commands.` (one /dev/kmsg
    record with `\\x0a`, rsyslog's `#012`, or three lines), a PCI config space that reads all 0xff
    in sysfs (lspci's "rev ff"), and "GPU is lost" from NVML (the probe or a captured nvidia-smi
    run; the probe's per-GPU NVML_ERROR_GPU_IS_LOST names the GPU by its bus-order index, only when
    the driver lists as many GPUs as NVML counts). All wordings of one GPU make one finding.

    CONFIRMED (critical): any of these in the current boot, per GPU, with the device IDs of the
    kubelet's checkpoint that are the GPU's (its replicas, its MIG slices where their parent is
    established) and the pods holding them.
    AT-RISK (high): Xid 79 only before the last reboot (btime): the GPU came back, but a GPU that
    fell off once is likely to again (reseat / RMA if it recurs).
    """
    avail = require_any(facts, ("xids", "logs", "pci", "probes", "driver"))
    xf: XidFacts | None = avail.get("xids")
    gpus = _gpus(facts, xf)
    now_ev, old_ev = lost_gpu_evidence(facts, gpus)
    for k, ev in sorted(now_ev.items()):
        gpu = _ref(gpus, k)
        held = held_devices(facts, gpu)
        yield Hit(
            Status.CONFIRMED,
            f"GPU {gpu.bus_id or k}{held.phrase()} fell off the bus in this boot: it no longer answers on PCIe; "
            "CUDA and NVML fail for it (\"GPU is lost\") until the node reboots.",
            affected=[gpu.affected(), *held.affected],
            evidence=ev + [_classification(xidtable.classify(79))] + list(held.evidence),
            data={"gpu": k, "held": held.data()},
        )
    for k, ev in sorted(old_ev.items()):
        if k in now_ev:
            continue
        gpu = _ref(gpus, k)
        yield Hit(
            Status.AT_RISK,
            f"GPU {gpu.bus_id or k} fell off the bus before the last reboot"
            + (f" ({ts(xf.boot_time)})" if xf is not None and xf.boot_time else "")
            + "; it is back now, but a GPU that fell off once tends to again.",
            affected=[gpu.affected()], evidence=ev, severity=Severity.HIGH,
            remedy="Watch the GPU: if it falls off again, drain the node, reseat the GPU / riser, check power, "
                   "then RMA. Check for PCIe AER errors (GPU-HW-006).",
            data={"gpu": k, "boot_time": xf.boot_time if xf is not None else None},
        )


def _nvml_lost(facts: NodeFacts, gpus: dict[str, GpuRef]) -> Iterator[tuple[str, Evidence]]:
    """GPUs NVML itself calls lost (nvmlDeviceGetHandleByIndex: NVML_ERROR_GPU_IS_LOST) while it answers
    for the others. NVML gives a lost GPU no handle, so no bus id: it is named by its index, NVML's place
    in PCI bus order, only when the driver's GPU list has exactly as many GPUs as NVML counts."""
    snap, src = _probe_gpus(facts)
    by_index = {r.index: k for k, r in gpus.items() if r.index is not None}
    for g in snap:
        if "error" not in g or not (g.get("error_code") == 15 or "gpu is lost" in str(g.get("error", "")).lower()):
            continue
        k = by_index.get(g.get("index")) if len(by_index) == len(snap) else None
        if k is None:
            continue
        yield k, Evidence(src, f"GPU {g.get('index')} ({gpus[k].bus_id or k}): nvmlDeviceGetHandleByIndex: "
                               f"{g.get('error')} (NVML error {g.get('error_code')})")


# -- GPU-HW-003 --------------------------------------------------------------------------------------

@rule(
    "GPU-HW-003",
    title="Uncorrectable ECC errors on a GPU (Xid 48/94/95/140/171/172, volatile DBE counters)",
    severity=Severity.HIGH,
    family="hardware",
    needs=(),
    uses=("driver", "probes", "xids"),
    automation="A2 (cordon, drain, GPU reset) + A3 (RMA)",
    remedy="""
        1. Drain the GPU's workloads: their results may be wrong; CUDA reports
           "uncorrectable ECC error encountered" (error 214).
        2. Reset the GPU (`nvidia-smi -r -i <bus id>`, no processes on it) or reboot; with a row remap pending
           (GPU-HW-004) the reset applies it. Xid 95 on A100 without MIG: reboot.
        3. Xid 94 (contained): restart the affected application; the GPU needs nothing unless Xid 94 repeats (then
           drain it and run `dcgmi diag -r 3`).
        4. Aggregate SRAM uncorrectable > 4, or "SRAM threshold exceeded": RMA candidate.
    """,
    references=("NVIDIA GPU memory error management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt)",
                "stas00/ml-engineering compute/accelerator/nvidia/debug.md") + XID_REFS[:2],
)
def uncorrectable_ecc(facts: NodeFacts) -> Iterator[Hit]:
    """Uncorrectable (double-bit) memory errors on a GPU.

    Reads the volatile (since driver load) and aggregate (lifetime) uncorrectable ECC counters of
    `nvidia-smi -q -x` (`ecc_errors/volatile/{sram_uncorrectable_parity,sram_uncorrectable_secded,
    dram_uncorrectable}` on Hopper, `double_bit/total` before), the NVML probe's
    `ecc_uncorrected_volatile`, and Xid 48 (DBE), 94 (contained), 95 (uncontained), 140
    (unrecovered ECC escape), 171/172 (uncorrectable DRAM / SRAM error: the details of an Xid 48)
    in the kernel log of the current boot.

    CONFIRMED (high): a volatile uncorrectable counter > 0, or Xid 48/95/140/171/172 in this boot.
    AT-RISK (high): aggregate SRAM uncorrectable > 4, SRAM threshold exceeded or unrepairable
    memory reported: an RMA candidate.
    Xid 94 alone (a contained error: the driver stopped the one application that touched the
    memory; NVIDIA's catalog: RESTART_APP, investigatory IGNORE): AT-RISK (low), restart the
    application, the GPU needs nothing; (medium) when Xid 94 reaches the threshold per time
    window of data/xid.yaml `repeat` on one GPU (3 within 24 h): the memory keeps failing, test
    the GPU. It clears once the window passes without a new one.
    """
    require_any(facts, ("xids", "driver", "probes"))
    xf, now, _old = _xids_for(facts, "GPU-HW-003")
    gpus = _gpus(facts, xf)
    found: dict[str, dict[str, Any]] = {}

    def slot(k: str) -> dict[str, Any]:
        return found.setdefault(k, {"confirmed": [], "contained": [], "rma": []})

    for g in _smi_gpus(facts):
        k = xidtable.pci_key(g.bus_id) or g.bus_id
        f = g.fields
        vol = _int(f.get("ecc_volatile_uncorrectable"))
        if vol:
            slot(k)["confirmed"].append(Evidence(SMI_XML, f"gpu {g.bus_id}: ecc_errors/volatile uncorrectable total {vol}"))
        sram = _int(f.get("ecc_aggregate_sram_uncorrectable"))
        if sram is not None and sram > 4:
            slot(k)["rma"].append(Evidence(SMI_XML, f"gpu {g.bus_id}: ecc_errors/aggregate SRAM uncorrectable {sram} (> 4)"))
        for fld, what in (("sram_threshold_exceeded", "sram_threshold_exceeded"), ("unrepairable_memory", "unrepairable_memory")):
            if _yes(f.get(fld)):
                slot(k)["rma"].append(Evidence(SMI_XML, f"gpu {g.bus_id}: {what}: {f.get(fld)}"))
    pg, psrc = _probe_gpus(facts)
    for g in pg:
        v = g.get("ecc_uncorrected_volatile")
        if isinstance(v, int) and v > 0:
            k = xidtable.pci_key(g.get("bus_id")) or str(g.get("bus_id") or g.get("index"))
            slot(k)["confirmed"].append(Evidence(psrc, f"gpu {g.get('bus_id')}: volatile uncorrected ECC errors {v}"))
    for e in now:
        k = e.key or "unknown"
        (slot(k)["contained"] if e.xid == 94 else slot(k)["confirmed"]).append(e.event.evidence())
    for k, s in sorted(found.items()):
        gpu = _ref(gpus, k)
        xids = sorted({e.xid for e in now if (e.key or "unknown") == k})
        cls = [_classification(xidtable.classify(x)) for x in xids]
        if s["confirmed"]:
            yield Hit(Status.CONFIRMED,
                      f"GPU {gpu.bus_id or k} has uncorrectable ECC errors in this boot"
                      + (f" (Xid {', '.join(map(str, xids))})" if xids else "")
                      + ": results of work on it may be wrong and CUDA fails with 'uncorrectable ECC error'.",
                      affected=[gpu.affected()],
                      evidence=s["confirmed"] + s["contained"] + s["rma"] + _followers(xf, k, set(xids))[0] + cls,
                      data={"gpu": k, "xids": xids})
        elif s["rma"]:
            yield Hit(Status.AT_RISK,
                      f"GPU {gpu.bus_id or k} has accumulated uncorrectable SRAM errors beyond NVIDIA's threshold: "
                      "an RMA candidate.", affected=[gpu.affected()], evidence=s["rma"] + s["contained"] + cls,
                      severity=Severity.HIGH, data={"gpu": k})
        elif s["contained"]:
            x94 = [e for e in now if (e.key or "unknown") == k and e.xid == 94]
            rep = _repeated(x94, facts.now)
            follow_ev, follow = _followers(xf, k, {94})
            yield Hit(Status.AT_RISK,
                      (f"GPU {gpu.bus_id or k} logged Xid 94 (contained ECC error) {len(x94)} times, "
                       f"{xidtable.table().repeat.describe()} or more: its memory keeps failing; test the GPU."
                       if rep else
                       f"GPU {gpu.bus_id or k} logged Xid 94 (contained ECC error): the driver stopped the application "
                       "that touched the failing memory; restart it. The GPU itself needs nothing (NVIDIA: RESTART_APP)."),
                      affected=[gpu.affected()], evidence=s["contained"] + follow_ev + cls,
                      severity=Severity.MEDIUM if rep else Severity.LOW,
                      remedy=("Drain the GPU when convenient and run `dcgmi diag -r 3`; a pending row remap (GPU-HW-004) "
                              "is applied by a GPU reset." if rep else
                              "Restart the application the Xid line names (pid=…); nothing to do on the GPU."),
                      data={"gpu": k, "xids": xids, "count": len(x94), "repeated": rep, "follow_on": follow})


# -- GPU-HW-004 --------------------------------------------------------------------------------------

@rule(
    "GPU-HW-004",
    title="GPU memory row remapping pending or failed, retired pages pending (Xid 63/64)",
    severity=Severity.MEDIUM,
    family="hardware",
    needs=(),
    uses=("driver", "probes", "xids"),
    automation="A2 (drain, GPU reset) + A3 (RMA on failure)",
    remedy="""
        Pending: drain the GPU and reset it (`nvidia-smi -r -i <bus id>`, or reboot) so the remap / page
        retirement takes effect; until then the bad rows stay in use.
        Failure occurred, or Xid 64 recurring: the GPU ran out of spare rows: drain it and RMA.
    """,
    references=("https://docs.nvidia.com/deploy/dynamic-page-retirement/index.html",
                "NVML nvmlDeviceGetRemappedRows (nvmlRemappedRowsInfo_v2_t)", "azure/azhpc-diagnostics#75")
    + XID_REFS[:2],
)
def row_remap(facts: NodeFacts) -> Iterator[Hit]:
    """A100 and later fix bad memory rows by remapping them; the remap applies at the next GPU reset.

    Reads `nvidia-smi -q -x` `remapped_rows/{remapped_row_pending,remapped_row_failure}` (Ampere
    and later) and `retired_pages/{pending_retirement,pending_blacklist}` (earlier GPUs), the
    NVML probe's remapped-rows info and retired-pages-pending status, and Xid 63 (remap/retirement
    recorded) / 64 (recording failed) in the kernel log of the current boot.

    CONFIRMED (high): remapping failure reported, or Xid 64 in this boot.
    CONFIRMED (medium): a remap or page retirement pending now: the GPU needs a reset.
    AT-RISK (medium): Xid 63 in this boot while the pending state cannot be read (nvidia-smi and
    NVML unavailable): the remap may already have been applied by a reset.
    """
    require_any(facts, ("xids", "driver", "probes"))
    xf, now, _old = _xids_for(facts, "GPU-HW-004")
    gpus = _gpus(facts, xf)
    state: dict[str, dict[str, list[Evidence]]] = {}
    known: set[str] = set()

    def slot(k: str) -> dict[str, list[Evidence]]:
        return state.setdefault(k, {"failure": [], "pending": [], "xid63": []})

    for g in _smi_gpus(facts):
        k = xidtable.pci_key(g.bus_id) or g.bus_id
        f = g.fields
        if any(f.get(x) for x in ("remap_pending", "remap_failure", "retired_pages_pending")):
            known.add(k)
        if _yes(f.get("remap_failure")):
            slot(k)["failure"].append(Evidence(SMI_XML, f"gpu {g.bus_id}: remapped_rows failure: {f['remap_failure']}"
                                               + (f" (uncorrectable remapped rows {f['remap_uncorrectable']})"
                                                  if f.get("remap_uncorrectable") else "")))
        if _yes(f.get("remap_pending")):
            slot(k)["pending"].append(Evidence(SMI_XML, f"gpu {g.bus_id}: remapped_rows pending: {f['remap_pending']}"))
        for fld in ("retired_pages_pending", "retired_pages_pending_blacklist"):
            if _yes(f.get(fld)):
                slot(k)["pending"].append(Evidence(SMI_XML, f"gpu {g.bus_id}: {fld.replace('_', ' ')}: {f[fld]}"))
    pg, psrc = _probe_gpus(facts)
    for g in pg:
        k = xidtable.pci_key(g.get("bus_id")) or str(g.get("bus_id") or g.get("index"))
        rr = g.get("remapped_rows")
        if isinstance(rr, dict):
            known.add(k)
            if rr.get("failure"):
                slot(k)["failure"].append(Evidence(psrc, f"gpu {g.get('bus_id')}: NVML remapped rows failureOccurred=1"))
            if rr.get("pending"):
                slot(k)["pending"].append(Evidence(psrc, f"gpu {g.get('bus_id')}: NVML remapped rows isPending=1"))
        if g.get("retired_pages_pending") in (1, True):
            known.add(k)
            slot(k)["pending"].append(Evidence(psrc, f"gpu {g.get('bus_id')}: NVML retired pages pending"))
    for e in now:
        k = e.key or "unknown"
        (slot(k)["failure"] if e.xid == 64 else slot(k)["xid63"]).append(e.event.evidence())
    for k, s in sorted(state.items()):
        gpu = _ref(gpus, k)
        xids = sorted({e.xid for e in now if (e.key or "unknown") == k})
        cls = [_classification(xidtable.classify(x)) for x in xids]
        if s["failure"]:
            yield Hit(Status.CONFIRMED, f"GPU {gpu.bus_id or k}: memory row remapping failed: it has no spare rows "
                                        "left for new memory errors.",
                      affected=[gpu.affected()], evidence=s["failure"] + s["pending"] + s["xid63"] + cls,
                      severity=Severity.HIGH, data={"gpu": k, "state": "failure"})
        elif s["pending"]:
            yield Hit(Status.CONFIRMED, f"GPU {gpu.bus_id or k}: a memory row remap / page retirement is pending: "
                                        "it takes effect only after a GPU reset.",
                      affected=[gpu.affected()], evidence=s["pending"] + s["xid63"] + cls,
                      data={"gpu": k, "state": "pending"})
        elif s["xid63"] and k not in known:
            yield Hit(Status.AT_RISK, f"GPU {gpu.bus_id or k} recorded a row remap / page retirement (Xid 63) in this "
                                      "boot; whether a reset has applied it cannot be read here.",
                      affected=[gpu.affected()], evidence=s["xid63"] + cls, severity=Severity.MEDIUM,
                      data={"gpu": k, "state": "recorded"})


# -- GPU-HW-005 --------------------------------------------------------------------------------------

@rule(
    "GPU-HW-005",
    title="NVLink errors on a GPU (Xid 74, NVLink5 Xid 144-150)",
    severity=Severity.HIGH,
    family="hardware",
    needs=("xids",),
    automation="A2 (cordon, drain, reset) + A3 (vendor)",
    remedy="""
        1. Drain the node's multi-GPU jobs (NCCL hangs or slows down on a bad link).
        2. `nvidia-smi nvlink --status` / `nvidia-smi nvlink -e`: inactive links, growing replay/recovery/CRC
           counters. A failing GPU can make its peer log Xid 74: look at both ends.
        3. Reset the GPUs or reboot; if it persists, reseat / vendor support (NVSwitch tray on HGX).
    """,
    references=XID_REFS + ("catalog GPU-HW-005 (Xid 74 DWORD bits: ml-engineering debug.md)",),
)
def nvlink_errors(facts: NodeFacts) -> Iterator[Hit]:
    """NVLink errors break or slow down multi-GPU communication (NCCL).

    Reads Xid 74 (`NVLINK_ERROR`) and the NVLink5 Xids 144-150 (SAW, RLW, TLW, TREX, NVLPW, NETIR,
    MSE) in the kernel log. The Xid 74 line carries the link and error DWORDs (bits 4/5 ECC or
    parity, 21/22 marginal signal integrity: see the catalog); they are quoted, not decoded.
    An NVLink5 line (`145, RLW_REMAP Nonfatal XC0 i0 Link 10 (0x00000082 0x00000001 …)`) is
    decoded with NVIDIA's "XID 144-150 Decode" sheet (data/xid.yaml `nvlink5_decode`): its interrupt
    info, read in the layout of the loaded driver branch (before / from R575), and its error status
    give NVIDIA's action, and the severity follows it.

    CONFIRMED (high): Xid 74 in the current boot; an NVLink5 Xid whose decoded action is RESET_GPU,
    or that could not be decoded and whose line says Fatal.
    AT-RISK: (low) decoded XID_154_EVAL (act on the Xid 154 that follows: GPU-HW-001 reports it),
    or not decoded and the line says Nonfatal; (medium) not decoded and the line says neither, or
    decoded RESET_GPU while the line itself says Nonfatal (escalate: never high on a Nonfatal line).
    Not reported: NVLink5 Xids NVIDIA decodes as IGNORE; earlier boots.
    """
    xf: XidFacts = facts.get("xids")
    now = [e for e in xf.current() if e.info.rule == "GPU-HW-005"]
    for k, evs in sorted(xf.by_gpu(now).items()):
        gpu = xf.gpu(k)
        graded = [(e, *_nvlink_grade(e)) for e in evs]
        graded = [g for g in graded if g[1] is not None]
        if not graded:
            continue
        status = Status.CONFIRMED if any(g[1] is Status.CONFIRMED for g in graded) else Status.AT_RISK
        kept = [g for g in graded if g[1] is status]
        sev = max(g[2] for g in kept)
        mine = [g[0] for g in kept]
        xids = sorted({e.xid for e in mine})
        links = sorted({str(int(m.group(1))) for e in mine if (m := re.search(r"[Ll]ink (-?[0-9]+)", e.detail))},
                       key=int)
        decode_ev = [Evidence(XID_DATA, f"Xid {e.xid} {e.nvlink5.unit}: {g}") for e, _s, _v, g in kept
                     if e.nvlink5 is not None][-4:]
        what = _nvlink_what(status, [e for e in mine if e.nvlink5 is not None and e.nvlink5.decoded])
        follow_ev, follow = _followers(xf, k, set(xids))
        yield Hit(
            status,
            f"GPU {gpu.bus_id or k} logged NVLink error Xid {', '.join(map(str, xids))} in this boot"
            + (f" (link {', '.join(links)})" if links else "") + f": {what}.",
            affected=[gpu.affected()],
            evidence=_xid_ev(mine) + decode_ev + follow_ev + [_classification(xidtable.classify(x)) for x in xids],
            severity=sev, data={"gpu": k, "xids": xids, "links": links, "follow_on": follow,
                                "decoded": sorted({e.nvlink5.action for e in mine if e.nvlink5 and e.nvlink5.action})},
        )


def _nvlink_what(status: Status, decoded: list[XidEvent]) -> str:
    """What the finding's first sentence says, in agreement with the decode it quotes."""
    actions = {e.nvlink5.action for e in decoded if e.nvlink5 is not None}
    if status is Status.CONFIRMED:
        return "multi-GPU jobs on it can hang or slow down" + (
            "; NVIDIA's decode: reset the GPU" if "RESET_GPU" in actions else "")
    if "RESET_GPU" in actions:
        return ("NVIDIA's decode says reset the GPU (RESET_GPU), but the line itself says Nonfatal: "
                "escalate before resetting")
    if "XID_154_EVAL" in actions:
        return "NVIDIA's decode says act on the Xid 154 recovery action that follows (GPU-HW-001 reports it)"
    return "the line could not be decoded with NVIDIA's sheet; repeated, it points at the link"


def _nvlink_grade(e: XidEvent) -> tuple[Status | None, Severity, str]:
    """(status, severity, why) of one NVLink Xid; status None: nothing to report (decoded IGNORE)."""
    d = e.nvlink5
    if d is None:
        return Status.CONFIRMED, Severity.HIGH, "Xid 74"
    if d.decoded:
        sev = xidtable.NVLINK5_ACTIONS[d.action]
        why = f"NVIDIA's decode: {d.action} ({d.row_severity}; {d.why})"
        if sev is None:
            return None, Severity.INFO, why
        if sev >= Severity.HIGH and d.nonfatal:
            return Status.AT_RISK, Severity.MEDIUM, why + f"; but the line says {d.word}: escalate"
        return (Status.CONFIRMED if sev >= Severity.HIGH else Status.AT_RISK), sev, why
    if d.nonfatal:
        return Status.AT_RISK, Severity.LOW, f"not decoded ({d.why}); the line says {d.word}"
    if d.word:
        return Status.CONFIRMED, Severity.HIGH, f"not decoded ({d.why}); the line says {d.word}"
    return Status.AT_RISK, Severity.MEDIUM, f"not decoded ({d.why}) and the line names no severity: escalate"


# -- GPU-HW-006 --------------------------------------------------------------------------------------

def _width(v: Any) -> int | None:
    return _int(str(v).replace("x", "")) if v not in (None, "") else None


def _gts(v: Any) -> float | None:
    m = re.match(r"\s*([0-9.]+)\s*GT/s", str(v or ""))
    return float(m.group(1)) if m else None


def _busy(g: Any) -> bool:
    """nvidia-smi shows the GPU working: utilisation above 0 and the idle clock reason not active."""
    util = _int(g.fields.get("gpu_util"))
    idle = str(g.fields.get("clocks_gpu_idle", "")).strip().lower()
    return bool(util) and idle == "not active"


@rule(
    "GPU-HW-006",
    title="GPU PCIe link degraded (width, or generation under load) or PCIe AER errors",
    severity=Severity.MEDIUM,
    family="hardware",
    needs=(),
    uses=("boot", "driver", "logs", "pci", "probes"),
    automation="A3 (reseat, riser, BIOS)",
    remedy="""
        1. Confirm: `nvidia-smi -q -d PCI` (link width/generation now and max) while the GPU is busy, and
           `lspci -vvv -s <bus id>` (LnkSta vs LnkCap); AER counters in /sys/bus/pci/devices/<bdf>/aer_dev_*.
        2. A narrower link than the slot's, or uncorrected AER errors: drain the node, reseat the GPU and its
           riser/cable, check the slot's BIOS settings (link speed, bifurcation); replace the part that follows
           the fault. Uncorrected errors often precede the GPU falling off the bus (GPU-HW-002).
    """,
    references=("catalog GPU-HW-006 (../shared/knowledge/signatures.md §5)",
                "linux drivers/pci/pcie/aer.c", "linux drivers/pci/pci.c __pcie_print_link_status"),
)
def pcie_degraded(facts: NodeFacts) -> Iterator[Hit]:
    """A GPU's PCIe link runs narrower or slower than it can, or reports AER errors.

    GPUs lower their PCIe *generation* when idle to save power, so a current generation below
    the maximum is normal at idle: it is reported only while nvidia-smi shows the GPU busy
    (utilisation > 0 and the "GPU idle" clock reason not active). The link *width* does not
    change with load, so a width below the maximum counts at any time.

    Reads `nvidia-smi -q -x` pci_gpu_link_info (current/max generation and width), the NVML probe's
    link generation and width, sysfs `current_link_width`/`max_link_width` (and speeds, under load),
    the kernel's enumeration line "… available PCIe bandwidth, limited by 8.0 GT/s PCIe x8 link …
    (capable of … x16 link)" (width only: GPUs train at low speed before the driver loads), and
    AER: kernel "PCIe Bus Error: severity=…" lines for NVIDIA GPUs and sysfs aer_dev_* counters.

    CONFIRMED (medium): width below maximum; generation below maximum while busy; an uncorrected
    (Non-Fatal or Fatal) AER error on the GPU in this boot or in its sysfs counters.
    AT-RISK (low): 10 or more corrected AER errors on the GPU in this boot (or 100 in sysfs).
    """
    avail = require_any(facts, ("driver", "pci", "logs", "probes"))
    gpus = gpu_map(facts)
    nv_keys = set(gpus)
    pci = avail.get("pci")
    if pci is not None:
        nv_keys |= {f.key for f in pci.gpus() if f.key}
    degraded: dict[str, list[Evidence]] = {}
    uncorrected: dict[str, list[Evidence]] = {}
    corrected: dict[str, list[Evidence]] = {}
    busy: set[str] = set()
    for g in _smi_gpus(facts):
        k = xidtable.pci_key(g.bus_id) or g.bus_id
        f = g.fields
        w, wmax = _width(f.get("pcie_width_current")), _width(f.get("pcie_width_max"))
        gen, gmax = _int(f.get("pcie_gen_current")), _int(f.get("pcie_gen_max"))
        if _busy(g):
            busy.add(k)
        if w and wmax and w < wmax:
            degraded.setdefault(k, []).append(Evidence(SMI_XML, f"gpu {g.bus_id}: link width {w}x, max {wmax}x"))
        if gen and gmax and gen < gmax and k in busy:
            degraded.setdefault(k, []).append(Evidence(
                SMI_XML, f"gpu {g.bus_id}: PCIe gen {gen} while busy (gpu_util {f.get('gpu_util')}, "
                         f"idle clock reason {f.get('clocks_gpu_idle')}), max gen {gmax}"))
    pg, psrc = _probe_gpus(facts)
    for g in pg:
        k = xidtable.pci_key(g.get("bus_id")) or str(g.get("bus_id"))
        w, wmax = g.get("pcie_width_current"), g.get("pcie_width_max")
        if isinstance(w, int) and isinstance(wmax, int) and 0 < w < wmax:
            degraded.setdefault(k, []).append(Evidence(psrc, f"gpu {g.get('bus_id')}: NVML link width x{w}, max x{wmax}"))
    for fn in (pci.gpus() if pci is not None else []):
        k = fn.key or fn.bdf
        w, wmax = _int(fn.link.get("current_link_width")), _int(fn.link.get("max_link_width"))
        if w and wmax and w < wmax:
            degraded.setdefault(k, []).append(Evidence(f"{fn.source}/current_link_width",
                                                       f"x{w} (max_link_width x{wmax})"))
        sp, spmax = _gts(fn.link.get("current_link_speed")), _gts(fn.link.get("max_link_speed"))
        if sp and spmax and sp < spmax and k in busy:
            degraded.setdefault(k, []).append(Evidence(f"{fn.source}/current_link_speed",
                                                       f"{fn.link['current_link_speed']} while busy "
                                                       f"(max {fn.link['max_link_speed']})"))
        for kind, bucket in (("aer_dev_fatal", uncorrected), ("aer_dev_nonfatal", uncorrected)):
            tot = fn.aer_total(kind)
            if tot:
                bucket.setdefault(k, []).append(Evidence(f"{fn.source}/{kind}", f"TOTAL {tot}"))
        cor = fn.aer_total("aer_dev_correctable")
        if cor is not None and cor >= 100:
            corrected.setdefault(k, []).append(Evidence(f"{fn.source}/aer_dev_correctable", f"TOTAL_ERR_COR {cor}"))
    logs = avail.get("logs")
    kernel = logs.kernel if logs is not None else None
    if kernel is not None:
        boot = boot_time(facts)
        enumerated = {xidtable.pci_key(e.get("device")) for e in kernel.of("kernel.pci-nvidia")
                      if e.get("class", "").startswith(("0300", "0302"))}
        nv_keys |= {k for k in enumerated if k}
        for e in kernel.of("kernel.pcie-bandwidth-limited"):
            k = xidtable.pci_key(e.get("device"))
            w, wmax = _int(e.get("width")), _int(e.get("max_width"))
            if k in nv_keys and w and wmax and w < wmax and in_current_boot(e.time, boot) is not False:
                degraded.setdefault(k, []).append(e.evidence())
        cor_lines: dict[str, list[Any]] = {}
        for e in kernel.of("kernel.pcie-aer"):
            k = xidtable.pci_key(e.get("device"))
            if not (k in nv_keys or e.get("driver") == "nvidia") or in_current_boot(e.time, boot) is False:
                continue
            if e.get("severity", "").lower().startswith("uncorrected"):
                uncorrected.setdefault(k or "unknown", []).append(e.evidence())
            else:
                cor_lines.setdefault(k or "unknown", []).append(e)
        for k, evs in cor_lines.items():
            if len(evs) >= 10:
                corrected.setdefault(k, []).extend([evs[0].evidence(), evs[-1].evidence(),
                                                    Evidence(evs[-1].source, f"{len(evs)} corrected AER lines for "
                                                                             f"{k} in this boot")])
    for k in sorted(set(degraded) | set(uncorrected)):
        gpu = _ref(gpus, k)
        parts = []
        if k in degraded:
            parts.append("its PCIe link runs below its capability")
        if k in uncorrected:
            parts.append("it reported uncorrected PCIe (AER) errors")
        yield Hit(Status.CONFIRMED, f"GPU {gpu.bus_id or k}: " + " and ".join(parts)
                  + ": host<->GPU transfers are slower, and link errors can precede the GPU falling off the bus.",
                  affected=[gpu.affected()], evidence=degraded.get(k, []) + uncorrected.get(k, []) + corrected.get(k, []),
                  data={"gpu": k, "degraded": k in degraded, "uncorrected_aer": k in uncorrected})
    for k in sorted(set(corrected) - set(degraded) - set(uncorrected)):
        gpu = _ref(gpus, k)
        yield Hit(Status.AT_RISK, f"GPU {gpu.bus_id or k} keeps logging corrected PCIe (AER) errors: a marginal link.",
                  affected=[gpu.affected()], evidence=corrected[k], severity=Severity.LOW, data={"gpu": k})


# -- GPU-HW-007 --------------------------------------------------------------------------------------

@rule(
    "GPU-HW-007",
    title="GPUs missing: on the PCI bus but not in the driver, or fewer than the kubelet registered",
    severity=Severity.HIGH,
    family="hardware",
    needs=(),
    uses=("boot", "driver", "kubelet", "logs", "pci"),
    automation="A2 (cordon) + A3",
    remedy="""
        1. Cordon the node: it advertises fewer GPUs than it has, or jobs sized for all of them fail.
        2. Look at the kernel log for the missing GPU's bus id: `RmInitAdapter failed` (GPU-DRV-005), `fallen off
           the bus` (GPU-HW-002), `probe of … failed`. `nvidia-smi -q -i <bus id>`; `lspci -s <bus id> -vv`.
        3. Reboot; if it stays missing, reseat the GPU / riser, check the slot in the BIOS; then RMA.
        A GPU deliberately bound to vfio-pci or excluded (NVreg_ExcludedGpus) is not missing.
    """,
    references=("catalog GPU-HW-007 (../shared/knowledge/signatures.md §5)",
                "NVIDIA/NVSentinel ADR-043 (expected device counts)",
                "kubernetes pkg/kubelet/cm/devicemanager manager.go writeCheckpoint (RegisteredDevices = healthy IDs)"),
)
def missing_gpus(facts: NodeFacts) -> Iterator[Hit]:
    """Fewer GPUs work than the node has.

    Compared, per source that could be read:
    - sysfs: NVIDIA GPU functions (class 0300/0302) on the PCI bus, bound to the nvidia driver or
      to none, that /proc/driver/nvidia/gpus does not list (a GPU bound to vfio-pci or another
      driver is deliberate and skipped);
    - /proc/driver/nvidia/gpus (what the kernel module probed) vs nvidia-smi (what NVML could
      initialise): a probed GPU nvidia-smi does not list failed to initialise [inferred from the
      driver initialising a GPU on first open; excluded GPUs, "GPU Excluded: Yes", are skipped];
    - the kernel log: NVIDIA GPUs enumerated at boot (`pci 0000:3b:00.0: [10de:2335] … class
      0x030200`) that the driver does not list, when the same log enumerated at least one GPU the
      driver does list (so it is this node's current boot);
    - the kubelet's checkpoint: `RegisteredDevices["nvidia.com/gpu"]` holds the device IDs that were
      healthy when the kubelet last wrote it; more distinct GPU UUIDs there than the driver now
      lists means GPUs disappeared. (The count the node *should* have, from node labels or an
      inventory, is the agent's to compare.)

    CONFIRMED (high): a GPU present on the bus, probed, or registered, that the driver / NVML no
    longer has; from the kernel log alone only when a failure line (probe failed, RmInitAdapter
    failed, fallen off the bus) names it. AT-RISK (medium): enumerated at boot, absent from the
    driver, no failure line (vfio-pci binding not visible without sysfs).
    """
    avail = require_any(facts, ("driver", "pci", "logs", "kubelet"))
    driver = avail.get("driver")
    if driver is None or not driver.loaded:
        return  # no driver at all is GPU-DRV-001
    dkeys = {xidtable.pci_key(g.bus_id): g for g in driver.gpus if xidtable.pci_key(g.bus_id)}
    excluded = {k for k, g in dkeys.items() if g.info.get("GPU Excluded", "").strip().lower() == "yes"}
    gpus = gpu_map(facts)
    missing: dict[str, list[Evidence]] = {}
    weak: dict[str, list[Evidence]] = {}
    pci = avail.get("pci")
    for fn in (pci.gpus() if pci is not None else []):
        k = fn.key
        if not k or k in dkeys or fn.driver not in ("nvidia", None, ""):
            continue
        bound = "bound to nvidia" if fn.driver == "nvidia" else "bound to no driver" if fn.driver is None else "driver binding not captured"
        missing.setdefault(k, []).append(Evidence(f"{fn.source}/class",
                                                  f"{fn.pci_class} (NVIDIA GPU {fn.device_id}), {bound}; "
                                                  "not in /proc/driver/nvidia/gpus"))
    if driver.smi is not None and driver.gpus:
        skeys = {xidtable.pci_key(g.bus_id) for g in driver.smi.gpus}
        for k, g in dkeys.items():
            if k not in skeys and k not in excluded:
                missing.setdefault(k, []).append(Evidence(
                    g.source, f"probed by the driver ({g.model or g.bus_id}, UUID {g.uuid or '?'}) but absent from "
                              f"nvidia-smi, which lists {len(driver.smi.gpus)} GPU(s)"))
    logs = avail.get("logs")
    kernel = logs.kernel if logs is not None else None
    if kernel is not None:
        boot = boot_time(facts)
        enum = {}
        for e in kernel.of("kernel.pci-nvidia"):
            if e.get("class", "").startswith(("0300", "0302")) and in_current_boot(e.time, boot) is not False:
                k = xidtable.pci_key(e.get("device"))
                if k:
                    enum.setdefault(k, e)
        failures: dict[str, list[Evidence]] = {}
        for sig in ("kernel.nvidia-probe-failed", "kernel.rminitadapter-failed", "kernel.gpu-fallen-off-bus"):
            for e in kernel.of(sig):
                k = xidtable.pci_key(e.get("device"))
                if k and in_current_boot(e.time, boot) is not False:
                    failures.setdefault(k, []).append(e.evidence())
        if enum and set(enum) & set(dkeys):
            for k, e in enum.items():
                if k in dkeys:
                    continue
                ev = [e.evidence(), Evidence("/proc/driver/nvidia/gpus", f"no entry for {k}")]
                if k in failures:
                    missing.setdefault(k, []).extend(ev + failures[k])
                elif k not in missing:
                    weak.setdefault(k, []).extend(ev)
    kub = avail.get("kubelet")
    cp = kub.checkpoint if kub is not None else None
    if cp is not None and driver.gpus:
        reg = {base_device_id(x) for x in cp.registered.get("nvidia.com/gpu", []) if x.startswith("GPU-")}
        known = {g.uuid for g in driver.gpus if g.uuid}
        gone = sorted(reg - known)
        if len(reg) > len(driver.gpus) and gone:
            ev = [Evidence(kub.checkpoint_path, f'RegisteredDevices["nvidia.com/gpu"]: {len(reg)} GPU UUID(s) healthy '
                                                f"at the kubelet's last checkpoint; not known to the driver now: "
                                                + ", ".join(gone[:8])),
                  Evidence("/proc/driver/nvidia/gpus", f"{len(driver.gpus)} GPU(s)")]
            missing.setdefault("kubelet-registered", []).extend(ev)
    for k, ev in sorted(missing.items()):
        who = (Affected("node", "gpus", detail=f"{len(driver.gpus)} GPU(s) in the driver")
               if k == "kubelet-registered" else _ref(gpus, k).affected())
        what = ("the kubelet registered more GPUs than the driver now has" if k == "kubelet-registered"
                else f"GPU {k} is on the node but the driver / NVML does not have it")
        yield Hit(Status.CONFIRMED, f"{what}: the node runs with fewer GPUs than it has.", affected=[who],
                  evidence=ev, data={"gpu": k, "driver_gpus": len(driver.gpus)})
    for k, ev in sorted(weak.items()):
        yield Hit(Status.AT_RISK, f"GPU {k} was enumerated on the PCI bus at boot but the driver does not list it "
                                  "(unless it is bound to vfio-pci or excluded on purpose).",
                  affected=[_ref(gpus, k).affected()], evidence=ev, severity=Severity.MEDIUM,
                  data={"gpu": k, "driver_gpus": len(driver.gpus)})


# -- GPU-HW-008 --------------------------------------------------------------------------------------

SXID_DATA = "data/sxid.yaml"


@rule(
    "GPU-HW-008",
    title="NVSwitch errors (SXid) in the kernel log, graded by the Fabric Manager guide",
    severity=Severity.HIGH,
    family="hardware",
    needs=("xids",),
    automation="A2 (drain; restart, or reset GPUs and NVSwitches) + A3 (vendor)",
    remedy="""
        Follow the Fabric Manager guide's recovery for each SXid (data/sxid.yaml, quoted in the finding).
        Fatal to a port (guide D.5) or stalling GPU access (D.4 11004, 12028): NVLink traffic through the
        switch port stalls and its GPU hangs or aborts (Xid 74 / 45): cordon and drain the node, restart it
        (or reset the GPUs and NVSwitches as the guide's reset procedure says, Fabric Manager stopped), start
        Fabric Manager and check the fabric (GPU-DRV-007: `nvidia-smi -q | grep -A2 Fabric` State
        Completed, Status Success); the same SXid after the restart: NVSwitch inspection by the vendor.
        Always fatal (D.6): the whole fabric; restart the host. Non-fatal (D.4 ECC, replay): nothing to do;
        repeated on one switch or link: check the link and the NVSwitch tray.
    """,
    references=("NVIDIA Fabric Manager User Guide DU-09883-001_v1.3, appendix D \"NVSwitch SXid Errors\" "
                "(docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide)",
                "leptonai/gpud components/accelerator/nvidia/sxid/sxid.go (the guide's tables, transcribed)",
                "NVIDIA/NVSentinel health-monitors/syslog-health-monitor (SysLogsSXIDError)",
                "NVIDIA/open-gpu-kernel-modules#446 (SXid 24007 with Xid 62/45 on HGX A100)", "GPU-DRV-007"),
)
def nvswitch_errors(facts: NodeFacts) -> Iterator[Hit]:
    """NVSwitch errors, logged by the nvswitch driver as `nvidia-nvswitch0: SXid (PCI:0000:c3:00.0):
    24007, Fatal, Link 28 sourcetrack timeout error (First)`; the lines that follow some of them
    (`…: 24007, Severity 1 Engine instance 12 …`, `…: 24007, Data {0x…}`) belong to the same error.

    Each SXid is graded by the Fabric Manager guide's tables (data/sxid.yaml, appendix D of the guide:
    non-fatal, fatal, always fatal, other notable), and never below its line's own word (a line that
    says Fatal is at least fatal to its port). Per switch (its PCI address), in the current boot:
    CONFIRMED when an SXid's action is fatal: high for a port (D.5) or for a stalled GPU access whose
    recovery is a restart (D.4 11004, 12028) or a reset of every GPU and NVSwitch (19084); critical
    when always fatal to the fabric (D.6). The GPUs behind it are named where the log allows: every
    GPU of the node for a fabric-wide action, else a GPU that logged Xid 74 (the guide: a fatal SXid
    reaches the GPU as Xid 74) within 60 s of the SXid; otherwise "not established".
    AT-RISK for the non-fatal ones, counted per switch against the table's window (`repeat`, 3
    within 24 h): low below it, medium at it (cooling events medium; an SXid in no table whose
    line says neither Fatal nor Non-fatal medium: escalate); they clear once the window has passed
    with no new line. Fatal ones stay for the boot (their recovery is a restart). Earlier boots
    are not reported.
    """
    xf: XidFacts = facts.get("xids")
    table = xidtable.sxid_table()
    by_switch: dict[str, list[Any]] = {}
    for s in xf.sxids:
        if s.current_boot is not False:
            by_switch.setdefault(s.key or s.device or s.switch, []).append(s)
    for k, evs in sorted(by_switch.items()):
        by_x: dict[int, list[Any]] = {}
        for s in evs:
            by_x.setdefault(s.sxid, []).append(s)
        infos = {x: table.get(x, _sxid_word(ss)) for x, ss in by_x.items()}
        fatal = sorted(x for x, i in infos.items() if i.action.fatal)
        rest = [s for s in evs if s.sxid not in fatal and infos[s.sxid].action.severity > Severity.INFO]
        recent = [s for s in rest if _in_window(s, table.repeat, facts.now)]
        if fatal:
            status, pick = Status.CONFIRMED, fatal
            sev = max(infos[x].action.severity for x in fatal)
        elif recent:
            status, pick = Status.AT_RISK, sorted({s.sxid for s in recent})
            sev = max(infos[x].action.severity for x in pick)
            if _sxid_count(recent) >= table.repeat.count:
                sev = max(sev, Severity.MEDIUM)
        else:
            continue  # only non-fatal SXids, and their window has passed: cleared
        shown = [s for s in (evs if fatal else recent) if s.sxid in pick]
        links = sorted({s.link.lstrip("0") or "0" for s in shown if s.link}, key=int)
        name = shown[0].switch
        actions = sorted({infos[x].action.name for x in pick})
        gpus_aff, gpus_ev, behind = _gpus_behind(xf, [infos[x] for x in pick], shown, links)
        ev = [s.event.evidence() for s in shown[-6:]]
        if len(shown) > 6:
            ev.append(Evidence(shown[-1].event.source, f"{len(shown)} SXid lines of {name} in this boot"))
        ev += [Evidence(SXID_DATA, f"{infos[x].label()}: action {infos[x].action.name}"
                                   + (f"; {infos[x].impact}" if infos[x].impact else "")
                                   + (f" (the line says {_sxid_word(by_x[x])})" if _sxid_word(by_x[x]) else ""))
               for x in pick] + gpus_ev
        if status is Status.CONFIRMED:
            what = ("fatal to the whole NVLink fabric" if "FABRIC_FATAL" in actions
                    else "NVLink traffic through it stalls and GPU access hangs until the GPUs and NVSwitches are "
                         "reset or the node restarts")
        elif sev >= Severity.MEDIUM and "ESCALATE" in actions:
            what = "not in the Fabric Manager guide's tables and the line grades it neither fatal nor non-fatal: escalate"
        elif sev >= Severity.MEDIUM:
            what = (f"non-fatal, but {_sxid_count(recent)} within {table.repeat.describe().split(' within ')[-1]}"
                    if "COOLING" not in actions else "a thermal event: NVLink throughput may drop")
        else:
            what = "non-fatal: no action now"
        yield Hit(
            status,
            f"{name} ({k}) logged " + ", ".join(infos[x].label() for x in pick)
            + (f" on link {', '.join(links)}" if links else "") + f" in this boot: {what}; "
            + f"the Fabric Manager guide's action: {', '.join(actions)}" + (f"; GPUs behind it: {behind}" if behind else "") + ".",
            affected=[Affected("nvswitch", k, detail=name + (f", links {', '.join(links)}" if links else ""))] + gpus_aff,
            evidence=ev, severity=sev,
            remedy="\n".join(f"{a}: {table.actions[a].remedy}" for a in actions),
            data={"switch": name, "pci": k, "sxids": pick, "links": links, "fatal": fatal,
                  "non_fatal": sorted(x for x in by_x if x not in fatal and infos[x].action.name != "ESCALATE"),
                  "unclear": sorted(x for x in by_x if infos[x].action.name == "ESCALATE"),
                  "actions": actions, "gpus": [a.name for a in gpus_aff],
                  "window": {"count": _sxid_count(recent), "of": table.repeat.describe()}},
        )


def _sxid_word(lines: list[Any]) -> str:
    """The worst word the lines of one SXid say: "Fatal", "Non-fatal" or ""."""
    words = {s.fatality.lower() for s in lines}
    return "Fatal" if "fatal" in words else "Non-fatal" if "non-fatal" in words else ""


def _sxid_count(lines: list[Any]) -> int:
    """SXid events, not lines: an error's `Severity N …` and `Data {…}` lines are part of it. Per SXid,
    its lines that say Fatal/Non-fatal; else (newer drivers) its `Severity` lines; else its lines."""
    by: dict[int, list[Any]] = {}
    for s in lines:
        by.setdefault(s.sxid, []).append(s)
    n = 0
    for ss in by.values():
        worded = [s for s in ss if s.fatality]
        sev = [s for s in ss if s.detail.startswith("Severity")]
        n += len(worded) or len(sev) or len(ss)
    return n


def _in_window(s: Any, rep: xidtable.Repeat, now: float | None) -> bool:
    """A line within the non-fatal window at `now` (a line of unknown time counts: it cannot be aged)."""
    return s.event.time is None or now is None or now - rep.window_s <= s.event.time <= now + 120.0


def _gpus_behind(xf: XidFacts, infos: list[xidtable.SxidInfo], shown: list[Any],
                 links: list[str]) -> tuple[list[Affected], list[Evidence], str]:
    """The GPUs an SXid touches, as far as the log shows them: every GPU for a fabric-wide action;
    for a port's, the GPUs that logged Xid 74 within FOLLOW_S of it; else "not established"."""
    scopes = {i.action.gpus for i in infos}
    if "all" in scopes and xf.gpus:
        refs = sorted(xf.gpus.values(), key=lambda r: (r.index is None, r.index or 0, r.key))
        return ([r.affected("behind the NVSwitch") for r in refs],
                [Evidence(SXID_DATA, "the guide's recovery resets every GPU and NVSwitch of the fabric")],
                f"all {len(refs)} GPU(s) of the node")
    if "link" not in scopes:
        return [], [], ""
    times = [s.event.time for s in shown if s.event.time is not None]
    near = [e for e in xf.current() if e.xid == 74 and e.time is not None
            and any(abs(e.time - t) <= FOLLOW_S for t in times)]
    if near:
        by = xf.by_gpu(near)
        refs = [xf.gpu(g) for g in sorted(by)]
        return ([r.affected("Xid 74 with the SXid") for r in refs], [by[g][-1].event.evidence() for g in sorted(by)],
                ", ".join(f"GPU {r.index if r.index is not None else r.bus_id or r.key} ({r.bus_id or r.key}, Xid 74 "
                          f"within {FOLLOW_S:g} s)" for r in refs))
    where = f"link {', '.join(links)}" if links else "the port"
    return [], [Evidence(SXID_DATA, f"the GPU on {where}: not established (no NVLink port map in the facts and no "
                                    f"Xid 74 within {FOLLOW_S:g} s of the SXid)")], f"the GPU on {where}: not established"
