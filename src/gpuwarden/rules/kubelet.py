"""Kubelet <-> device plugin failures."""

from __future__ import annotations

from typing import Any

from gpuwarden import known_versions
from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.nvidia_smi import SMI_XML
from gpuwarden.logs.devicemanager import PluginCall
from gpuwarden.facts.probes import result_field
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.fmt import dur as _dur, ts as _ts
from gpuwarden.rules.probeview import probe

NVML_HANG = "nvidia-driver-570-nvml-hang-mig"
NO_TIMEOUT = "kubelet-deviceplugin-call-no-timeout"
VERSION_FILE = "/proc/driver/nvidia/version"
MAX_QUOTED = 5


def _fixes() -> str:
    e = known_versions.get(NVML_HANG)
    fixed = " or ".join(f">= {v}" for v in e.fixed_in)
    good = ", ".join(str(v) for v in e.unaffected)
    return f"{fixed} (or downgrade to {good})" if good else fixed


REMEDY = f"""
Stopgap: restart the NVIDIA device plugin pod, then the kubelet (`systemctl restart kubelet`):
the kubelet waits on the hung call forever, and a restart releases the pods queued behind it,
until the next GetPreferredAllocation hangs again.
Fix (drain the node first): upgrade the NVIDIA driver to {_fixes()}, or disable MIG on the node.
After the driver is fixed, restart the kubelet once more to clear calls already hung, then the
device plugin. The kubelet itself has no timeout on GetPreferredAllocation/Allocate
(kubernetes#117435, #130855; the timeout PRs were not merged), so any plugin that hangs blocks
every pod admission and deletion on the node: watch for it rather than expect a kubelet fix.
"""


def _driver_risk(facts: NodeFacts) -> tuple[known_versions.Match | None, list[Evidence], dict[str, Any]]:
    """(the NVML-hang verdict for this driver when MIG is on, evidence, data)."""
    driver = facts.maybe("driver")
    if driver is None:
        return None, [], {}
    version = driver.version.version if driver.version else (driver.smi.driver_version if driver.smi else None)
    m = known_versions.get(NVML_HANG).check(version)
    data: dict[str, Any] = {"driver_version": version, "mig_gpus": list(driver.mig_gpus)}
    if m is not None:
        data["driver_status"] = m.status
    ev: list[Evidence] = []
    if driver.version:
        ev.append(Evidence(VERSION_FILE, driver.version.line))
    elif version:
        ev.append(Evidence(SMI_XML, f"<driver_version>{version}</driver_version>"))
    if driver.mig_gpus:
        src = SMI_XML if driver.smi else "/proc/driver/nvidia/capabilities/gpu*/mig"
        ev.append(Evidence(src, "MIG enabled on " + ", ".join(driver.mig_gpus)))
    risky = m if (m is not None and m.affected and driver.mig_gpus) else None
    return risky, ev, data


def _plugin_probe(facts: NodeFacts) -> tuple[list[Evidence], list[str], str]:
    """The live plugin probe's calls that got no answer in time: (evidence, sockets, first such RPC).

    `check` asks each plugin socket what the kubelet asks (probes/plugin.py); the agent's monitor
    raises the same finding from its own calls.
    """
    outcome = result_field(facts.maybe("probes"), "plugin")
    if outcome is None:
        return [], [], ""
    if result_field(outcome, "status") == "timeout":  # the child itself ran past every call's deadline
        return [Evidence("probe:plugin", str(result_field(outcome, "detail") or "plugin probe timed out"))], [], ""
    ev: list[Evidence] = []
    socks: list[str] = []
    rpc = ""
    for s in result_field(outcome, "value") or []:
        for c in (s.get("calls") or []) if isinstance(s, dict) else []:
            if isinstance(c, dict) and c.get("status") == "timeout":
                ev.append(Evidence(f"probe:plugin {s.get('socket', '?')}",
                                   f"{c.get('rpc', '?')}: {c.get('detail', '')} (waited {c.get('elapsed_s', '?')}s)"))
                socks.append(str(s.get("socket", "?")))
                rpc = rpc or str(c.get("rpc", ""))
    return ev, socks, rpc


def _pod_name(facts: NodeFacts, logs: Any, c: PluginCall) -> str:
    if c.pod:
        return c.pod
    name = logs.pod_names.get(c.pod_uid) if logs is not None else None
    if not name and c.pod_uid:
        containers = facts.maybe("containers")
        pod = containers.pod_by_uid(c.pod_uid) if containers is not None else None
        name = pod.ref if pod is not None and pod.name else None
    return name or ""


def _affected(facts: NodeFacts, logs: Any, c: PluginCall) -> Affected:
    name = _pod_name(facts, logs, c)
    ns, _, pod = name.rpartition("/") if name else ("", "", "")
    detail = f"{c.rpc} pending" + (f", resource {c.resource}" if c.resource else "")
    if c.container:
        return Affected("container", c.container, ns, c.pod_uid, detail + (f", pod {pod}" if pod else ""))
    return Affected("pod", pod or c.pod_uid, ns, c.pod_uid, detail)


@rule(
    "GPU-K8S-001",
    title="kubelet pod admission blocked by a hung device-plugin call (NVML hang with MIG on driver 570)",
    severity=Severity.CRITICAL,
    family="kubelet",
    needs=(),
    uses=("containers", "driver", "logs", "probes"),
    remedy=REMEDY,
    references=known_versions.references(NVML_HANG, NO_TIMEOUT),
    automation="A2",
)
def plugin_call_hang(facts: NodeFacts):
    """kubelet pod admission blocked by a device-plugin call that never returns.

    The kubelet's device manager calls the plugin's GetPreferredAllocation and Allocate over
    gRPC with no deadline, from the pod-admission path, which is serial: while one call hangs,
    no pod on the node is admitted or deleted — pods stay Pending or Terminating with no
    events, GPU or not. The NVIDIA plugin's GetPreferredAllocation calls NVML, and NVML hangs
    on driver 570.124.06–570.158.01 with MIG enabled (fixed in 570.172.08 / 580.65.06).

    CONFIRMED: the kubelet log shows "Issuing a GetPreferredAllocation call for container" (or
    "Making allocation request for device plugin") with nothing after it from that kubelet —
    no Allocate line, no sync-loop line, no line about the pod — for at least
    `plugin_call_stall_s` (default 60 s) before the capture time or the log's last line; pods
    the kubelet saw afterwards ("Adding new pods from source") are listed as queued. Or, on a
    live node (and in bundles that recorded it), the plugin probe — the kubelet's own
    GetDevicePluginOptions and GetPreferredAllocation (for the device IDs in the kubelet's
    checkpoint; "not evaluated" without them), each with the probe deadline — got no answer: the
    kubelet makes that call with no deadline at every GPU pod's admission. In the NVIDIA plugin
    only GetPreferredAllocation reaches NVML, so a plugin stuck in NVML still answers the options.
    ListAndWatch is never called (docs/grpc.md).
    AT-RISK (high): the driver is in the affected range and MIG is enabled; or a live NVML probe timed
    out (gpuwarden's own deadline: never more than at-risk here); or an earlier call stayed pending
    until the kubelet was restarted.
    Needs the kubelet log at --v=4 (the GetPreferredAllocation line is V4) for CONFIRMED.
    """
    logs = facts.maybe("logs")
    stall_s = float(facts.settings.plugin_call_stall_s)
    risky, driver_ev, data = _driver_risk(facts)
    nvml = probe(facts, "nvml")
    plugin_ev, hung_socks, hung_rpc = _plugin_probe(facts)
    dm = logs.devicemanager if logs is not None else None
    if dm is None and not data and nvml is None and not plugin_ev:
        why = []
        for name in ("logs", "driver"):
            try:
                facts.get(name)
            except FactUnavailable as exc:
                why.append(f"{name}: {exc}")
        if logs is not None and logs.kubelet is None:
            why.append("kubelet log: " + logs.not_found.get("kubelet", "not found"))
        raise FactUnavailable("; ".join(why) or "no kubelet log and no driver facts")

    nvml_ev = []
    if nvml is not None and nvml.status == "timeout":
        nvml_ev.append(Evidence("probe:nvml", f"NVML probe timed out{f' after {nvml.elapsed_s:g}s' if nvml.elapsed_s else ''}"
                                + (f": {nvml.detail}" if nvml.detail else "")))
    fix = known_versions.get(NVML_HANG).fix_for(risky.version) if risky is not None else None
    remedy = None
    if risky is not None and fix is not None:
        remedy = REMEDY.strip() + f"\nThis node runs driver {risky.version}: upgrade to {fix} or later."

    stalled = dm.stalled(stall_s) if dm is not None else []
    if stalled:
        kubelet = logs.kubelet
        c = stalled[-1]
        waited = max(c.waited_s or 0.0, c.log_after_s or 0.0)
        queued = dm.queued_pods()
        ev = [c.event.evidence()]
        if c.log_after_s is not None and c.log_after_s >= stall_s:
            ev.append(Evidence(kubelet.source,
                               f"the same kubelet (pid {c.event.pid}) kept logging, with no Allocate, sync-loop or "
                               f"pod line after the call; its last line: {kubelet.last_line}"))
        else:
            ev.append(Evidence(kubelet.source,
                               f"the log ends {_dur(c.log_after_s)} after the call with no Allocate, sync-loop or pod "
                               f"line; {_dur(c.waited_s)} had passed at {_ts(facts.now)}"))
        for _, _, e in queued[:MAX_QUOTED]:
            ev.append(e.evidence())
        if len(queued) > MAX_QUOTED:
            ev.append(Evidence(kubelet.source, f"… and {len(queued) - MAX_QUOTED} more queued pod lines"))
        ev += driver_ev + nvml_ev + plugin_ev
        affected = [_affected(facts, logs, x) for x in stalled]
        affected += [Affected("pod", p.rpartition("/")[2], p.rpartition("/")[0], detail=f"queued ({op}) behind the call")
                     for op, p, _ in queued if p]
        affected.append(Affected("node", "kubelet", detail="pod admission blocked"))
        who = c.who if not _pod_name(facts, logs, c) else f"{_pod_name(facts, logs, c)} container {c.container}"
        summary = (f"The kubelet has been waiting {_dur(waited)} for the device plugin's {c.rpc} "
                   f"for {who} (called at {_ts(c.event.time)}) and logged nothing of it since")
        if queued:
            summary += f"; {len(queued)} pod add/delete(s) queued behind it"
        if dm.syncloop_after == 0:
            summary += "; the sync loop has been silent since"
        if risky is not None:
            summary += f". Driver {risky.version} with MIG is in the NVML-hang range"
        yield Hit(
            Status.CONFIRMED, summary + ".", affected, ev, remedy=remedy,
            mechanism=("GetPreferredAllocation/Allocate have no deadline in the kubelet and pod admission is "
                       "serial, so one hung plugin call blocks every pod admission and deletion on the node."
                       + (" The NVIDIA plugin's GetPreferredAllocation calls NVML, which hangs on this driver "
                          "with MIG enabled." if risky is not None else "")),
            data=dict(data, rpc=c.rpc, pod_uid=c.pod_uid, container=c.container, waited_s=round(waited, 3),
                      log_after_s=c.log_after_s, stall_s=stall_s,
                      queued=[{"op": op, "pod": p} for op, p, _ in queued],
                      syncloop_after=dm.syncloop_after),
        )
        return

    if hung_socks:
        yield Hit(
            Status.CONFIRMED,
            f"The device plugin did not answer {hung_rpc} on {hung_socks[0]} within the probe's deadline: the "
            "kubelet makes this call with no deadline at every GPU pod's admission, so pod admission on this "
            "node blocks on it" + (f". Driver {risky.version} with MIG is in the NVML-hang range" if risky else "") + ".",
            [Affected("plugin", s.rsplit("/", 1)[-1], detail=f"{hung_rpc} unanswered, {s}") for s in dict.fromkeys(hung_socks)]
            + [Affected("node", "kubelet", detail="pod admission blocks on the plugin")],
            plugin_ev + driver_ev + nvml_ev, remedy=remedy,
            mechanism=("GetPreferredAllocation/Allocate have no deadline in the kubelet and pod admission is serial: "
                       "a plugin call that hangs blocks every pod admission on the node. The NVIDIA plugin's "
                       "GetPreferredAllocation initialises NVML, so an NVML hang surfaces there."),
            data=dict(data, rpc=hung_rpc, hung_sockets=list(dict.fromkeys(hung_socks)), source="plugin probe"),
        )
        return

    # -- not failing now: preconditions and history --------------------------------------
    parts: list[str] = []
    ev: list[Evidence] = []
    past = dm.restarted_stalls(stall_s) if dm is not None else []
    if past:
        c = past[-1]
        parts.append(f"a {c.rpc} call for {c.who} stayed pending {_dur(c.waited_s)} until the kubelet "
                     f"restarted at {_ts(c.followed_by.time if c.followed_by else None)}")
        ev.append(c.event.evidence())
        if c.followed_by is not None:
            ev.append(c.followed_by.evidence())
    if nvml_ev:  # gpuwarden's own deadline missed once: a risk, not a verdict (GPU-DRV-006 says the same)
        parts.append("the NVML probe did not answer in time; if NVML hangs, the device plugin's next "
                     "GetPreferredAllocation will block pod admission")
        ev += nvml_ev
    if risky is not None:
        parts.append(f"driver {risky.version} is in the NVML-hang range "
                     f"({risky.range.range if risky.range else 'known affected'}) and MIG is enabled on "
                     f"{len(data.get('mig_gpus', []))} GPU(s)" + (f"; fixed in {fix}" if fix else ""))
        ev += driver_ev
    if not parts:
        return
    yield Hit(
        Status.AT_RISK, "; ".join(parts)[:1].upper() + "; ".join(parts)[1:] + ".",
        [Affected("node", "kubelet", detail="pod admission can block")], ev, severity=Severity.HIGH, remedy=remedy,
        mechanism=("The kubelet has no timeout on device-plugin calls; a plugin stuck in NVML blocks all pod "
                   "admission on the node."),
        data=dict(data, stall_s=stall_s, restarted_stalls=len(past), nvml_probe=nvml.status if nvml else None),
    )
