"""A DRA kubelet plugin that does not answer the kubelet's calls (incident 5a in the DRA world)."""

from __future__ import annotations

from typing import Iterator

from gpuwarden.facts import NodeFacts
from gpuwarden.facts import FactUnavailable
from gpuwarden.facts.dra_probe import GONE, NOT_SURE, RUNNING, DraCall, DraProbe, DriverProbe
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.rules.base import Hit, rule

PROBE = "probe:dra"


def _ev(d: DriverProbe, c: DraCall) -> Evidence:
    what = {"timeout": f"no answer within {c.timeout_s:g}s", "unavailable": "connection refused or socket gone"}
    return Evidence(f"{PROBE} {c.socket}", f"{c.rpc}: {what.get(c.status, c.status)}"
                    + (f" ({c.detail})" if c.detail and c.status != "timeout" else "")
                    + f", waited {c.elapsed_s:g}s")


def _driver_hit(d: DriverProbe) -> Hit | None:
    hung = [c for c in d.calls if c.status == "timeout"]
    # a refusal is evidence only where the probe saw the node itself (facts.dra_probe.refusal_verdict)
    gone = [c for c in d.calls if c.status == "unavailable"] if d.refused in (GONE, RUNNING) else []
    if not hung and not gone:
        return None
    ev = [_ev(d, c) for c in hung + gone]
    if gone:
        ev.append(Evidence("/proc", d.refused_why.removeprefix("/proc: ")))
    answered = [c for c in d.calls if c.status == "ok"]
    ev += [Evidence(f"{PROBE} {c.socket}", f"{c.rpc}: answered in {c.elapsed_s:g}s") for c in answered]
    rpcs = " and ".join(dict.fromkeys(c.rpc for c in hung + gone))
    if hung:
        summary = (f"The DRA plugin {d.driver} did not answer {rpcs} within {hung[0].timeout_s:g}s"
                   + (f" (it answered {answered[0].rpc})" if answered else "")
                   + ": the kubelet's NodePrepareResources for any pod using its claims waits the same way, "
                     "and those pods stay in ContainerCreating.")
        mechanism = ("The plugin accepts the connection but its handler never returns. The kubelet plugin helper "
                     "serialises NodePrepareResources/NodeUnprepareResources, so one prepare stuck in the driver "
                     "(NVML, a lock, the API server) blocks every later one, including this empty no-op, which is "
                     "exactly what the driver's own liveness check sends.")
    elif d.refused == RUNNING:
        summary = (f"The DRA plugin {d.driver}'s socket(s) refuse connections on {rpcs} while a process of the "
                   "plugin still runs: it is not serving there (restarting, or hung before it listens, e.g. in "
                   "nvmlInit); pods using its claims fail to prepare until it serves again.")
        mechanism = ("Nothing listens on the socket file the kubelet calls; the plugin's process is still there, so "
                     "whether it will serve again is not known.")
        return Hit(Status.AT_RISK, summary, [Affected("plugin", d.driver, detail=", ".join(
                       f"{c.rpc} {c.status}" for c in d.calls))], ev, mechanism=mechanism, severity=Severity.HIGH,
                   data={"driver": d.driver, "refused": d.refused, "calls": [
                       {"rpc": c.rpc, "status": c.status, "elapsed_s": c.elapsed_s, "socket": c.socket}
                       for c in d.calls], "info": d.info})
    else:
        summary = (f"The DRA plugin {d.driver} has its socket(s) but refuses connections on {rpcs}, and no process "
                   "of the plugin runs on this node: the plugin is gone and left its socket behind; pods using its "
                   "claims fail to prepare.")
        mechanism = ("A Unix socket file outlives the process that listened on it; the kubelet keeps the plugin "
                     "registered until its plugin watcher sees the registration socket removed.")
    return Hit(Status.CONFIRMED, summary,
               [Affected("plugin", d.driver, detail=", ".join(f"{c.rpc} {c.status}" for c in d.calls))]
               + [Affected("node", "kubelet", detail=f"NodePrepareResources for {d.driver} claims blocks or fails")],
               ev, mechanism=mechanism,
               data={"driver": d.driver, "calls": [{"rpc": c.rpc, "status": c.status, "elapsed_s": c.elapsed_s,
                                                   "socket": c.socket} for c in d.calls], "info": d.info})


@rule(
    "GPU-DRA-030",
    title="DRA kubelet plugin hung or not answering (GetInfo / NodePrepareResources)",
    severity=Severity.HIGH,
    family="dra",
    needs=("dra_probe",),
    automation="A2 (restart the plugin pod)",
    remedy="""
        1. Read the plugin's log and goroutines: `kubectl -n <ns> logs <gpu-kubelet-plugin pod> -c gpus`. A plugin
           stuck in NVML (driver hang, incident 5a) shows no line after "Preparing" / at start-up.
        2. Restart the plugin pod on this node (`kubectl -n <ns> delete pod <pod>`); it re-registers and pods
           waiting in ContainerCreating are prepared once it answers. If it hangs again in NVML, the node's
           driver is the cause: drain it (see GPU-K8S-001 for the known NVML-hang drivers).
        3. A socket with no plugin behind it: the plugin pod is gone or crash-looping; its ResourceSlices may
           still advertise the node's GPUs, so the scheduler keeps sending pods here.
    """,
    references=("kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/health.go (the liveness check: "
                "GetInfo + empty NodePrepareResources)", "k8s.io/dynamic-resource-allocation/kubeletplugin "
                "(serialised prepare)", "kubernetes/kubernetes#133920", "kubernetes/kubernetes#141912"),
)
def dra_plugin_hung(facts: NodeFacts) -> Iterator[Hit]:
    """A DRA kubelet plugin that does not answer the kubelet.

    The kubelet registers a DRA plugin through its `plugins_registry/<driver>-reg.sock` (GetInfo) and
    calls NodePrepareResources on its `plugins/<driver>/dra.sock` before every pod that uses one of
    its claims; until the call returns, the pod stays in ContainerCreating. The probe (live, or as
    recorded in a bundle) asks both with the probe deadline, in a killable child: the calls the
    NVIDIA driver's own liveness check makes, side-effect free.

    CONFIRMED: a call got no answer within the deadline (the plugin accepted the connection and
    never replied), or the socket exists and refuses connections and the node's process table shows no
    process of the plugin (the plugin is gone): only when the probe saw the running node itself (its
    own procfs, of the initial PID namespace, with this root as init's or its own root).
    AT-RISK (medium): the probe child itself ran past its deadline without a result. AT-RISK (high): the
    socket refuses connections on the node while a process of the plugin runs (argv naming the driver,
    or its known binary): not serving (restarting, or hung before it listens), not known to be gone.
    Not evaluated: a socket refuses connections on a copied tree, or in a bundle that recorded no
    verdict from the node's process table: a socket file with no listener is no evidence that a
    process died. Not raised for a registration socket of another plugin type (CSI), nor when every
    call answered.
    """
    p: DraProbe = facts.get("dra_probe")
    if p.status == "timeout":
        yield Hit(Status.AT_RISK, f"The DRA plugin probe did not finish within its deadline ({p.detail}).",
                  [Affected("plugin", d.driver) for d in p.drivers], [Evidence(PROBE, p.detail)],
                  severity=Severity.MEDIUM, data={"drivers": [d.driver for d in p.drivers]})
        return
    hits = [h for h in map(_driver_hit, p.drivers) if h is not None]
    unsure = [d for d in p.drivers if d.refused == NOT_SURE and not any(c.status == "timeout" for c in d.calls)]
    if not hits and unsure:
        raise FactUnavailable(f"the socket(s) of {', '.join(d.driver for d in unsure)} refuse connections, which is "
                              f"no evidence of a dead plugin here: {unsure[0].refused_why}")
    yield from hits
