"""The NVIDIA device plugin and the GPU Operator on the node: registration, health, MIG, limits.

The live view (node allocatable) belongs to the agent, which never calls ListAndWatch (it would leave
a stream in the plugin competing with the kubelet's for health events: docs/grpc.md); `check` reads what the
node keeps: the kubelet's device-plugin directory and checkpoint, the plugin process, the NVIDIA
pods' logs (/var/log/pods), the kernel log and /run/nvidia/validations.
"""

from __future__ import annotations

from typing import Any, Iterator

from gpuwarden import known_versions
from gpuwarden import xid as xidtable
from gpuwarden.facts import NodeFacts
from gpuwarden.facts.nvidia_smi import SMI_XML
from gpuwarden.logs.scan import LogEvent
from gpuwarden.facts.gpu_operator import VALIDATIONS, OperatorValidations
from gpuwarden.facts.inotify import MAX_USER_INSTANCES
from gpuwarden.facts.plugin_sockets import PluginSockets
from gpuwarden.facts.xids import gpu_map
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.parsers import plausible
from gpuwarden.rules.base import Hit, require_any, rule
from gpuwarden.rules.fmt import dur, ts
from gpuwarden.rules.logview import events
from gpuwarden.parsers.kubelet_checkpoint import base_device_id

GPU_RESOURCE = "nvidia.com/gpu"
MAX_QUOTED = 4
STICKY = "device-plugin-unhealthy-sticky"


# -- helpers -------------------------------------------------------------------------------------------

def _log_no(path: str) -> int:
    name = path.rsplit("/", 1)[-1]
    head = name.split(".", 1)[0]
    return int(head) if plausible.decimal(head) else -1


def latest_instance(facts: NodeFacts, found: list[LogEvent]) -> tuple[list[LogEvent], list[LogEvent]]:
    """Split pod-log events into (current container instance, earlier instances).

    Each NVIDIA container's two newest log files are scanned (`<restart count>.log`); an event
    in an older file happened before the container restarted, e.g. a plugin restart that cleared
    a sticky Unhealthy state.
    """
    logs = facts.maybe("logs")
    newest: dict[str, int] = {}
    for s in (logs.pods() if logs is not None else []):
        newest[s.log] = max(newest.get(s.log, -1), _log_no(s.source))
    cur, old = [], []
    for e in found:
        (cur if _log_no(e.source) >= newest.get(e.log, -1) else old).append(e)
    return cur, old


def _pod_events(facts: NodeFacts, *sig_ids: str) -> list[LogEvent]:
    """Every boot's: a plugin's instances are told apart by their log files (latest_instance)."""
    return events(facts, *sig_ids, logs=("pod",), current=False)


def _plugin_who(ev: LogEvent) -> Affected:
    if ev.log.startswith("pod:"):
        ns, _, rest = ev.log[4:].partition("/")
        pod, _, ctr = rest.partition("/")
        return Affected("plugin", pod, ns, detail=f"container {ctr}")
    return Affected("plugin", "nvidia-device-plugin")


# -- GPU-K8S-002 -------------------------------------------------------------------------------------

@rule(
    "GPU-K8S-002",
    title="NVIDIA device plugin not registered with the kubelet (socket missing or older than kubelet.sock)",
    severity=Severity.HIGH,
    family="device-plugin",
    needs=("plugin_sockets",),
    uses=("boot", "driver", "kubelet", "logs", "plugin", "dra"),
    automation="A1 (restart the device-plugin pod) / A3 (hostPath for a non-default kubelet root)",
    remedy="""
        1. Restart the device-plugin pod on this node (`kubectl -n <ns> delete pod <plugin pod>`); it
           re-creates its socket and registers. Check `kubectl describe node` for nvidia.com/gpu capacity.
        2. If it keeps failing, read its log: "Could not register device plugin" (kubelet socket path),
           "No devices found" (usually the runtime: GPU-K8S-004), "failed to create FS watcher" (GPU-K8S-008).
        3. Non-default kubelet root (k0s /var/lib/k0s/kubelet, microk8s /var/snap/microk8s/common/var/lib/kubelet):
           point the plugin's device-plugins hostPath at it.
    """,
    references=("kubernetes pkg/kubelet/cm/devicemanager manager.go (removeContents, GetCapacity), types.go "
                "(endpointStopGracePeriod)", "NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go",
                "NVIDIA/k8s-device-plugin#58", "NVIDIA/k8s-device-plugin#382", "NVIDIA/k8s-device-plugin#585",
                "NVIDIA/k8s-device-plugin#348", "NVIDIA/k8s-device-plugin#414", "kubernetes/kubernetes#99571"),
)
def plugin_not_registered(facts: NodeFacts) -> Iterator[Hit]:
    """Without a registered plugin the node advertises no nvidia.com/gpu: GPU pods stay Pending
    ("Insufficient nvidia.com/gpu") although the plugin pod is Running.

    On start the kubelet deletes every file in its device-plugins directory except its checkpoint
    and creates kubelet.sock; a plugin must notice, re-create its socket (`nvidia-gpu.sock`,
    `nvidia-mig-<profile>.sock` …) and register again. Allocatable drops to 0 at once, capacity
    after 5 minutes.

    Reads the listing of <kubelet root>/device-plugins and the sockets' mtimes (live, or recorded
    by `collect`), the plugin process, and the plugin pod's log.

    CONFIRMED (high): a device-plugin process runs but no nvidia*.sock exists; or the nvidia
    socket is older than kubelet.sock (the kubelet restarted after the plugin registered and the
    plugin did not come back).
    AT-RISK (medium): the kubelet runs, the driver sees GPUs, and neither a plugin process nor an
    nvidia socket exists.
    """
    kub = facts.maybe("kubelet")
    ps: PluginSockets = facts.get("plugin_sockets")
    d, names = ps.directory, ps.names
    plugin = facts.maybe("plugin")
    procs = plugin.processes if plugin is not None else []
    socks = ps.nvidia
    listing = Evidence(d, "contains " + (", ".join(names) if names else "nothing"))
    log_ev = [e.evidence() for e in latest_instance(facts, _pod_events(
        facts, "plugin.register-failed", "plugin.no-devices", "plugin.incompatible-platform", "plugin.fs-watcher-failed"))[0]]
    if procs and not socks:
        p = procs[0]
        ev = [listing, Evidence(f"/proc/{p.pid}/cmdline", f"device plugin running (pid {p.pid}"
                                + (f", started {ts(p.started_at)}" if p.started_at else "") + ")")]
        yield Hit(Status.CONFIRMED, "The NVIDIA device plugin runs but has no socket in the kubelet's device-plugins "
                                    "directory: it is not registered, and the node advertises no NVIDIA GPUs.",
                  affected=[Affected("plugin", f"pid {p.pid}")], evidence=ev + log_ev[-MAX_QUOTED:],
                  mechanism="no plugin socket: the plugin never served, or the kubelet removed it and the plugin "
                            "did not re-register",
                  data={"sockets": names})
        return
    if socks and "kubelet.sock" in names:
        k_mtime = ps.mtimes.get("kubelet.sock")
        for s in socks:
            s_mtime = ps.mtimes.get(s)
            if k_mtime and s_mtime and s_mtime + 1 < k_mtime:
                yield Hit(Status.CONFIRMED,
                          f"{s} is {dur(k_mtime - s_mtime)} older than kubelet.sock: the kubelet restarted after the "
                          "device plugin registered and the plugin did not register again; GPUs are not allocatable.",
                          affected=[Affected("plugin", s)],
                          evidence=[listing, Evidence(f"{d}/{s}", f"mtime {ts(s_mtime)}"),
                                    Evidence(f"{d}/kubelet.sock", f"mtime {ts(k_mtime)}")] + log_ev[-MAX_QUOTED:],
                          mechanism="the kubelet re-created kubelet.sock; the plugin's inotify restart did not happen",
                          data={"socket": s, "socket_mtime": s_mtime, "kubelet_sock_mtime": k_mtime})
        return
    if not procs and not socks and kub is not None and kub.pid is not None:
        driver = facts.maybe("driver")
        if driver is None or not driver.gpus:
            return
        dra = facts.maybe("dra")
        if dra is not None and dra.nvidia:
            return  # a DRA node: the NVIDIA DRA driver serves the GPUs (docs/dra.md)
        yield Hit(Status.AT_RISK, f"The driver sees {len(driver.gpus)} GPU(s) but no NVIDIA device plugin runs and none is "
                                  "registered: the node advertises no nvidia.com/gpu.",
                  affected=[Affected("node", "nvidia-device-plugin", detail="not running")],
                  evidence=[listing, Evidence("/proc", f"no device-plugin process; kubelet pid {kub.pid}")]
                  + log_ev[-MAX_QUOTED:], severity=Severity.MEDIUM, data={"sockets": names})


# -- GPU-K8S-003 -------------------------------------------------------------------------------------

def _disabled_xids(env: dict[str, str]) -> tuple[bool, set[int], set[int]]:
    """(all disabled, disabled, enabled) from DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS."""
    def parse(v: str) -> tuple[bool, set[int]]:
        toks = [t.strip().lower() for t in v.split(",") if t.strip()]
        return any(t in ("all", "xids") for t in toks), {int(t) for t in toks if plausible.decimal(t)}
    all_off, dis = parse(env.get("DP_DISABLE_HEALTHCHECKS", ""))
    _all_on, en = parse(env.get("DP_ENABLE_HEALTHCHECKS", ""))
    return all_off, dis, en


def _registered(facts: NodeFacts) -> tuple[set[str] | None, str]:
    kub = facts.maybe("kubelet")
    cp = kub.checkpoint if kub is not None else None
    if cp is None or GPU_RESOURCE not in cp.registered:
        return None, ""
    return {base_device_id(x) for x in cp.registered[GPU_RESOURCE]}, kub.checkpoint_path


@rule(
    "GPU-K8S-003",
    title="GPUs stuck Unhealthy in the device plugin after a benign Xid (sticky until the plugin restarts)",
    severity=Severity.MEDIUM,
    family="device-plugin",
    needs=(),
    uses=("boot", "driver", "kubelet", "logs", "plugin", "xids"),
    automation="A2 (restart the device-plugin pod after checking the GPU)",
    remedy="""
        1. Check the GPU is fine: the Xid's class (application or informational), `nvidia-smi -q -i <uuid>`,
           `dcgmi diag -r 2` when idle. If it is not, follow the GPU-HW finding instead.
        2. Restart the device-plugin pod on the node: the plugin has no path back to Healthy
           ("FIXME: there is no way to recover from the Unhealthy state").
        3. To stop over-quarantining on Xids NVIDIA classifies as IGNORE / RESTART_APP (63, 92, 94 …), add them to
           the plugin's DP_DISABLE_HEALTHCHECKS (comma list).
    """,
    references=known_versions.references(STICKY, "device-plugin-xid-109-ignored")
    + ("NVIDIA/k8s-device-plugin internal/rm/health.go", "kubernetes/kubernetes#130145"),
)
def unhealthy_after_benign_xid(facts: NodeFacts) -> Iterator[Hit]:
    """The NVIDIA device plugin marks a GPU Unhealthy on every Xid except 13, 31, 43, 45, 68 and 109,
    including Xids NVIDIA itself classifies as IGNORE or RESTART_APP (63 row-remap recorded, 92
    excessive SBE, 94 contained ECC …), and never marks it Healthy again. The GPU leaves the
    node's allocatable count until someone restarts the plugin.

    Reads the plugin pod's log (`XidCriticalError: Xid=63 on Device=GPU-…; marking device as
    unhealthy.`, `Error waiting for event: …; marking all devices as unhealthy`), only from the
    plugin container's current instance (an older log file means the plugin restarted since); the
    kubelet checkpoint's RegisteredDevices (the devices healthy at its last write); the kernel
    log's Xids with data/xid.yaml; the plugin's DP_DISABLE/ENABLE_HEALTHCHECKS. (ListAndWatch is
    never called: a cancelled stream stays in the plugin and takes health events from the kubelet's.)

    CONFIRMED (medium; high when every GPU is out): the plugin logged a GPU Unhealthy for an Xid of
    class IGNORE / RESTART_APP, or a kernel Xid of that class after the plugin started while the
    checkpoint no longer lists that GPU as healthy; or "marking all devices as unhealthy" for a
    reason other than a lost GPU (GPU-HW-002 covers that).
    AT-RISK (medium): such a kernel Xid after the plugin started, no checkpoint to confirm.
    Not reported: Xids that really need action (GPU-HW-*), Unhealthy marks from before a restart.
    """
    avail = require_any(facts, ("logs", "xids", "kubelet"))
    gpus = gpu_map(facts)
    by_uuid = {g.uuid: g for g in gpus.values() if g.uuid}
    reg, reg_src = _registered(facts)
    driver_uuids = set(by_uuid)
    # the checkpoint speaks of this node's GPUs: it lists one of them, or none at all (all unhealthy);
    # a checkpoint naming only other GPUs (another node's, a replaced board) proves nothing here
    comparable = reg is not None and (not reg or bool(reg & driver_uuids))
    plugin = facts.maybe("plugin")
    proc = plugin.processes[0] if plugin is not None and plugin.processes else None
    hits: dict[str, dict[str, Any]] = {}

    def add(uuid: str, ev: list[Evidence], x: int, confirmed: bool) -> None:
        h = hits.setdefault(uuid, {"ev": [], "xids": set(), "confirmed": False})
        h["ev"].extend(ev)
        h["xids"].add(x)
        h["confirmed"] = h["confirmed"] or confirmed

    cur, _old = latest_instance(facts, _pod_events(facts, "plugin.xid-unhealthy"))
    for e in cur:
        x = int(e.get("xid")) if plausible.decimal(e.get("xid")) else 0
        info = xidtable.classify(x)
        if info.known and not info.benign:
            continue
        add(e.get("device"), [e.evidence(), Evidence("data/xid.yaml", f"Xid {x}: {info.meaning}; NVIDIA action "
                                                                      f"{info.action.name} (the GPU itself is fine)")],
            x, True)
    xf = avail.get("xids")
    if xf is not None and proc is not None and not hits:
        all_off, dis, en = _disabled_xids(proc.env)
        for e in xf.current():
            info = e.info
            if not (info.known and info.benign and info.device_plugin == "unhealthy"):
                continue
            if (all_off or e.xid in dis) and e.xid not in en:
                continue
            if proc.started_at is not None and e.time is not None and e.time < proc.started_at:
                continue  # the plugin started after it: it did not see it
            g = gpus.get(e.key or "")
            if g is None or not g.uuid:
                continue
            ev = [e.event.evidence(), Evidence("data/xid.yaml", f"Xid {e.xid}: NVIDIA action {info.action.name}; "
                                                                 "the device plugin marks the GPU Unhealthy on it")]
            if proc.started_at:
                ev.append(Evidence(f"/proc/{proc.pid}/stat", f"device plugin started {ts(proc.started_at)}, before the Xid"))
            gone = comparable and g.uuid not in reg
            if gone:
                ev.append(Evidence(reg_src, f'RegisteredDevices["{GPU_RESOURCE}"] no longer lists {g.uuid} as healthy'))
            add(g.uuid, ev, e.xid, gone)
    n_gpus = max(len(driver_uuids), 1)
    for uuid, h in sorted(hits.items()):
        g = by_uuid.get(uuid)
        who = g.affected("Unhealthy in the device plugin") if g else Affected("gpu", uuid, detail="Unhealthy in the device plugin")
        ev = h["ev"][:MAX_QUOTED * 2]
        if comparable and h["confirmed"] and uuid not in reg and not any(reg_src == x.source for x in ev):
            ev.append(Evidence(reg_src, f'RegisteredDevices["{GPU_RESOURCE}"] does not list {uuid} as healthy'))
        xs = ", ".join(map(str, sorted(h["xids"])))
        if h["confirmed"]:
            yield Hit(Status.CONFIRMED, f"GPU {uuid} is Unhealthy in the device plugin after Xid {xs}, which does not "
                                        "mean the GPU is bad; it stays out of allocatable until the plugin restarts.",
                      affected=[who], evidence=ev, severity=Severity.HIGH if len(hits) >= n_gpus else Severity.MEDIUM,
                      data={"gpu": uuid, "xids": sorted(h["xids"])})
        else:
            yield Hit(Status.AT_RISK, f"GPU {uuid} logged Xid {xs} after the device plugin started: the plugin marks the "
                                      "GPU Unhealthy on it and keeps it so until it restarts.",
                      affected=[who], evidence=ev, severity=Severity.MEDIUM, data={"gpu": uuid, "xids": sorted(h["xids"])})
    all_cur, _ = latest_instance(facts, _pod_events(facts, "plugin.all-unhealthy"))
    lost = [e for e in all_cur if "lost" not in e.get("error").lower()]
    if lost:
        e = lost[-1]
        yield Hit(Status.CONFIRMED, f"The device plugin marked every GPU Unhealthy because waiting for NVML events failed "
                                    f"({e.get('error')}); they stay out of allocatable until the plugin restarts.",
                  affected=[_plugin_who(e)], evidence=[x.evidence() for x in lost[-MAX_QUOTED:]], severity=Severity.HIGH,
                  data={"error": e.get("error")})


# -- GPU-K8S-006 -------------------------------------------------------------------------------------

def plugin_mig_strategy(proc: Any) -> tuple[str | None, str]:
    """(strategy, where it was read) of a plugin process; None when not set explicitly."""
    v = proc.env.get("MIG_STRATEGY")
    if v:
        return v.strip().lower(), f"/proc/{proc.pid}/environ: MIG_STRATEGY={v}"
    argv = list(proc.argv)
    for i, a in enumerate(argv):
        if a.startswith("--mig-strategy="):
            return a.split("=", 1)[1].lower(), f"/proc/{proc.pid}/cmdline: {a}"
        if a == "--mig-strategy" and i + 1 < len(argv):
            return argv[i + 1].lower(), f"/proc/{proc.pid}/cmdline: {a} {argv[i + 1]}"
    return None, ""


@rule(
    "GPU-K8S-006",
    title="MIG strategy of the device plugin does not match the GPUs' MIG mode (or a MIG mode change is pending)",
    severity=Severity.MEDIUM,
    family="device-plugin",
    needs=(),
    uses=("boot", "driver", "logs", "plugin"),
    automation="A2 (align the strategy / MIG config; drain and reset GPUs)",
    remedy="""
        1. Make the plugin's (and GFD's) MIG strategy match the node: `none` only without MIG, `single` when every
           GPU has MIG enabled with one profile, `mixed` otherwise (resources nvidia.com/mig-<profile>). With the GPU
           Operator set it in the ClusterPolicy (mig.strategy) and the node's layout with the nvidia.com/mig.config label.
        2. A pending MIG mode change needs a GPU reset: drain the node and `nvidia-smi -r` (nvidia_drm loaded blocks the
           reset: mig-parted#181), or reboot.
    """,
    references=("NVIDIA/k8s-device-plugin internal/lm/mig-strategy.go", "NVIDIA/k8s-device-plugin internal/rm/device_map.go",
                "NVIDIA/gpu-operator#442", "NVIDIA/gpu-operator#646", "NVIDIA/gpu-operator#1738", "NVIDIA/mig-parted PR #182"),
)
def mig_strategy_mismatch(facts: NodeFacts) -> Iterator[Hit]:
    """A MIG strategy that does not fit the GPUs advertises resources nobody can use.

    Reads the plugin's MIG_STRATEGY (environment or --mig-strategy; only an explicit value is used:
    the plugin's own default is `none`, but the GPU Operator and the Helm chart set it), MIG mode per
    GPU (nvidia-smi current/pending, or the driver's MIG capability directories), and the plugin/GFD
    log's "Invalid configuration detected for mig-strategy=single: …".

    CONFIRMED (medium): strategy `none` while a GPU has MIG enabled (full-GPU resources advertised
    but unusable); strategy `single` with MIG enabled on some GPUs and not others (labels become
    <product>-MIG-INVALID, nvidia.com/gpu.count=0); the invalid-configuration log line in the
    plugin's current instance.
    AT-RISK (medium): a GPU whose pending MIG mode differs from the current one (a reset is needed).
    """
    avail = require_any(facts, ("logs", "driver", "plugin"))
    driver = avail.get("driver")
    plugin = avail.get("plugin")
    smi = driver.smi if driver is not None else None
    gpus = list(smi.gpus) if smi is not None else []
    enabled = sorted(driver.mig_gpus) if driver is not None else []
    disabled = [g.bus_id for g in gpus if g.mig_current.strip().lower() == "disabled"]
    ev: list[Evidence] = []
    found: list[str] = []
    for proc in (plugin.processes if plugin is not None else [])[:1]:
        strategy, src = plugin_mig_strategy(proc)
        if strategy is None:
            continue
        if strategy == "none" and enabled:
            found.append("MIG strategy none while MIG is enabled")
            ev += [Evidence(src.split(": ", 1)[0], src.split(": ", 1)[1]),
                   Evidence(SMI_XML if smi else "/proc/driver/nvidia/capabilities", "MIG enabled on " + ", ".join(enabled))]
        elif strategy == "single" and enabled and disabled:
            found.append("MIG strategy single with MIG enabled on some GPUs only")
            ev += [Evidence(src.split(": ", 1)[0], src.split(": ", 1)[1]),
                   Evidence(SMI_XML, f"MIG enabled on {', '.join(enabled)}; disabled on {', '.join(disabled)}")]
    cur, _ = latest_instance(facts, _pod_events(facts, "plugin.mig-strategy-invalid"))
    if cur:
        found.append("the plugin reports an invalid MIG configuration")
        ev += [e.evidence() for e in cur[-MAX_QUOTED:]]
    if found:
        yield Hit(Status.CONFIRMED, "; ".join(found)[:1].upper() + "; ".join(found)[1:]
                  + ": the node advertises GPU resources that pods cannot use (or none at all).",
                  affected=[Affected("plugin", "nvidia-device-plugin", detail="MIG strategy")], evidence=ev,
                  data={"mig_enabled": enabled, "mig_disabled": disabled})
        return
    pending = [g for g in gpus if g.mig_pending and g.mig_current and g.mig_pending.upper() != "N/A"
               and g.mig_current.upper() != "N/A" and g.mig_pending.strip().lower() != g.mig_current.strip().lower()]
    if pending:
        yield Hit(Status.AT_RISK, f"{len(pending)} GPU(s) have a MIG mode change pending: it takes effect only after a GPU "
                                  "reset, until then the advertised resources do not match the intended layout.",
                  affected=[Affected("gpu", g.uuid or g.bus_id) for g in pending],
                  evidence=[Evidence(SMI_XML, f"gpu {g.bus_id}: mig_mode current {g.mig_current}, pending {g.mig_pending}")
                            for g in pending[:MAX_QUOTED]], severity=Severity.MEDIUM,
                  data={"pending": [g.bus_id for g in pending]})


# -- GPU-K8S-008 -------------------------------------------------------------------------------------

@rule(
    "GPU-K8S-008",
    title="Device plugin cannot start: failed to create FS watcher: too many open files (inotify limit)",
    severity=Severity.HIGH,
    family="device-plugin",
    needs=("logs",),
    uses=("boot", "inotify"),
    automation="A1 (raise fs.inotify.max_user_instances, restart the plugin)",
    remedy="""
        1. Raise the inotify instance limit: `sysctl -w fs.inotify.max_user_instances=512` (or more) and persist it in
           /etc/sysctl.d/.
        2. Restart the device-plugin pod.
        3. Find the process holding many inotify instances (`find /proc/*/fd -lname anon_inode:inotify | cut -d/ -f3 |
           sort | uniq -c | sort -n`).
    """,
    references=("NVIDIA/gpu-operator#441", "intel/intel-device-plugins-for-kubernetes#2075", "kubernetes/kubernetes#64614",
                "NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go (start: newFSWatcher)"),
)
def fs_watcher_failed(facts: NodeFacts) -> Iterator[Hit]:
    """The plugin watches the kubelet's device-plugins directory with inotify to re-register
    after a kubelet restart; when the node is out of inotify instances it exits at start with
    "failed to create FS watcher: too many open files" and crash-loops.

    Reads the NVIDIA pods' logs and /proc/sys/fs/inotify/max_user_instances.

    CONFIRMED (high): the line in the plugin container's current instance (still failing).
    AT-RISK (low): only in the previous instance (it recovered; the limit is still tight).
    """
    cur, old = latest_instance(facts, _pod_events(facts, "plugin.fs-watcher-failed"))
    if not cur and not old:
        return
    ev = [e.evidence() for e in (cur or old)[-MAX_QUOTED:]]
    limit = (facts.maybe("inotify") or {}).get(MAX_USER_INSTANCES)
    if limit:
        ev.append(Evidence(MAX_USER_INSTANCES, limit.strip()))
    e = (cur or old)[-1]
    if cur:
        yield Hit(Status.CONFIRMED, "The device plugin exits at start: it cannot create an inotify watcher (too many "
                                    "open files / inotify instances); the node advertises no GPUs while it crash-loops.",
                  affected=[_plugin_who(e)], evidence=ev, data={"max_user_instances": (limit or "").strip() or None})
    else:
        yield Hit(Status.AT_RISK, "The device plugin's previous instance failed to create its inotify watcher; it runs "
                                  "now, but the node's inotify limit is tight.",
                  affected=[_plugin_who(e)], evidence=ev, severity=Severity.LOW,
                  data={"max_user_instances": (limit or "").strip() or None})


# -- GPU-K8S-009 -------------------------------------------------------------------------------------

#: the operator validator's stages in order, and the signatures a missing stage points at
STAGES = (
    ("driver-ready", ("GPU-DRV-001", "GPU-DRV-002", "GPU-DRV-005", "GPU-DRV-007")),
    ("toolkit-ready", ("GPU-K8S-004",)),
    ("cuda-ready", ("GPU-DEV-001", "GPU-DRV-003", "GPU-DRV-007", "GPU-K8S-010")),
    ("plugin-ready", ("GPU-K8S-002", "GPU-K8S-008", "GPU-K8S-004")),
)
STUCK_AFTER_S = 600.0


@rule(
    "GPU-K8S-009",
    title="GPU Operator stack stuck in Init: a validation stage never completed",
    severity=Severity.HIGH,
    family="device-plugin",
    needs=(),
    uses=("gpu_operator",),
    automation="A3 (diagnose the stage's signature)",
    remedy="""
        Find why the stage fails: `kubectl -n gpu-operator logs <nvidia-operator-validator pod> -c <stage>-validation`
        (driver-validation, toolkit-validation, cuda-validation, plugin-validation) and the operand pod of that stage
        (driver, container-toolkit, device-plugin). The finding names the catalog signatures that usually cause it;
        fix that, and the operands waiting in Init continue by themselves.
    """,
    references=("NVIDIA/gpu-operator cmd/nvidia-validator/main.go (status files in /run/nvidia/validations)",
                "NVIDIA/gpu-operator#1043", "NVIDIA/gpu-operator#1738", "NVIDIA/gpu-operator#130", "NVIDIA/gpu-operator#258"),
)
def operator_stuck(facts: NodeFacts) -> Iterator[Hit]:
    """The GPU Operator's validator writes one status file per stage into /run/nvidia/validations
    (driver-ready, toolkit-ready, cuda-ready, plugin-ready); the operand pods wait in Init for the
    file of the stage before them. A stage that never completes leaves the whole stack in Init.

    Reads the listing of /run/nvidia/validations (and driver-ready's content); skipped when the
    directory does not exist (no GPU Operator) or `workload-type` is not `container` (VM
    pass-through nodes validate other stages).

    CONFIRMED (high): a stage file is missing while an earlier one exists, on a live node where
    the newest file is older than 10 minutes (the validator retries every few seconds).
    AT-RISK (medium): a stage file is missing and its age cannot be told (a bundle, or no stage
    done yet): the first missing stage and the signatures it points at are named.
    """
    ov: OperatorValidations | None = facts.maybe("gpu_operator")
    if ov is None:
        return
    names = ov.names
    wt = ov.workload_type
    if wt and wt.strip() and wt.strip() != "container":
        return
    present = set(names)
    missing = [(s, codes) for s, codes in STAGES if s not in present]
    if not missing:
        return
    first, codes = missing[0]
    done = [s for s, _ in STAGES if s in present]
    ev = [Evidence(VALIDATIONS, "contains " + (", ".join(sorted(names)) if names else "nothing") + f"; {first} missing")]
    drv = ov.driver_ready
    if drv:
        ev.append(Evidence(f"{VALIDATIONS}/driver-ready", " ".join(drv.split())[:300]))
    age = None
    if done:
        mt = [ov.mtimes[s] for s in done if s in ov.mtimes]
        if mt:
            age = facts.now - max(mt)
    route = ", ".join(codes)
    if age is not None and age > STUCK_AFTER_S:
        yield Hit(Status.CONFIRMED, f"The GPU Operator has been stuck at its {first.replace('-ready', '')} validation for "
                                    f"{dur(age)} ({', '.join(done)} done): operand pods wait in Init. Usual causes: {route}.",
                  affected=[Affected("node", "gpu-operator", detail=f"{first} missing")], evidence=ev,
                  data={"first_missing": first, "done": done, "age_s": round(age, 1), "points_at": list(codes)})
    else:
        yield Hit(Status.AT_RISK, f"The GPU Operator's {first.replace('-ready', '')} validation has not completed"
                                  + (f" ({', '.join(done)} done)" if done else "")
                                  + f": operand pods wait in Init until it does. Usual causes: {route}.",
                  affected=[Affected("node", "gpu-operator", detail=f"{first} missing")], evidence=ev,
                  severity=Severity.MEDIUM, data={"first_missing": first, "done": done, "points_at": list(codes)})
