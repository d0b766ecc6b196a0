"""MPS (CUDA Multi-Process Service) failures."""

from __future__ import annotations

from typing import Any

from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.nvidia_smi import SMI_XML
from gpuwarden.logs.scan import LogEvent
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.facts.mps import PID_FILE, PIPE_ENV
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.fmt import ts

MAX_QUOTED = 4

REMEDY = """
Put the driver's compute utilities back where the NVIDIA runtime takes binaries from: on a
host-installed driver reinstall the package of the running branch (Ubuntu:
`apt-get install nvidia-compute-utils-<branch>`, e.g. -570); with the GPU Operator driver
container, let it finish and check /run/nvidia/driver/usr/bin/nvidia-cuda-mps-control (A3).
Then restart the MPS control daemon and device plugin pods once driver validation is complete
(A1), and regenerate the CDI spec if CDI is used (see GPU-DEV-004).
While no MPS daemon runs, reset GPUs left in EXCLUSIVE_PROCESS, or non-MPS CUDA jobs fail with
"all CUDA-capable devices are busy or unavailable": `nvidia-smi -i <uuid> -c DEFAULT` (A2).
"""


DIED_REMEDY = """
Restart the MPS control daemon pod (A1): its stop fails (no control daemon answers `quit`), it
exits and the kubelet starts it again, and the new one starts `nvidia-cuda-mps-control -d` over the
stale pipe directory. Then restart the MPS client pods: their CUDA contexts died with the server and
do not come back. Find why the control daemon died (the kernel log for an OOM kill of
nvidia-cuda-mps-control or nvidia-cuda-mps-server, `<res>/log/control.log` and `server.log` under the
MPS root). The failed stop leaves the GPUs in EXCLUSIVE_PROCESS until a daemon starts and stops cleanly.
"""


def _affected(ev: LogEvent) -> Affected:
    if ev.log.startswith("pod:"):
        ns, _, rest = ev.log[4:].partition("/")
        pod, _, container = rest.partition("/")
        return Affected("container", container, ns, detail=f"pod {pod}")
    return Affected("plugin", "mps-control-daemon", detail=f"seen in the {ev.log} log")


def _exclusive_gpus(facts: NodeFacts) -> list[Any]:
    driver = facts.maybe("driver")
    if driver is None or driver.smi is None:
        return []
    return [g for g in driver.smi.gpus
            if g.compute_mode.strip().lower().replace(" ", "_") in ("exclusive_process", "exclusive-process")]


def _compute_mode_ev(gpus: list[Any]) -> list[Evidence]:
    if not gpus:
        return []
    ids = ", ".join(g.uuid or g.bus_id for g in gpus)
    return [Evidence(SMI_XML, f"<compute_mode>{gpus[0].compute_mode}</compute_mode> on {len(gpus)} GPU(s): {ids}")]


def _branch_remedy(facts: NodeFacts) -> str | None:
    driver = facts.maybe("driver")
    if driver is None or driver.version is None:
        return None
    return REMEDY.strip() + (f"\nThis node runs driver {driver.version.version}: on Ubuntu, "
                             f"`apt-get install nvidia-compute-utils-{driver.version.branch}`.")


@rule(
    "GPU-K8S-007",
    title="MPS control daemon broken: nvidia-cuda-mps-control missing after a driver upgrade",
    severity=Severity.HIGH,
    family="mps",
    needs=(),
    uses=("boot", "containers", "driver", "logs", "mps"),
    remedy=REMEDY,
    references=(
        "incident 5b (../shared/incidents/5-mig-nvml-hang-kubelet-blocked.zh.md, section 5.2)",
        "NVIDIA/k8s-device-plugin cmd/mps-control-daemon/{main.go,mps/daemon.go}, internal/plugin/mps.go",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/381",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/762",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/1105",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/1614",
    ),
    automation="A1",
)
def mps_control_missing(facts: NodeFacts):
    """MPS control daemon cannot start: nvidia-cuda-mps-control is not in the driver root.

    The device plugin's MPS control daemon sets the GPUs to EXCLUSIVE_PROCESS and then execs
    `nvidia-cuda-mps-control -d`, which the NVIDIA runtime injects from the driver root. When a
    driver upgrade removes the compute-utils package (nvidia-smi stays), the daemon logs
    `Failed to start MPS daemon: exec: "nvidia-cuda-mps-control": executable file not found in $PATH`,
    retries 30 s later by first stopping what it started, fails that too and exits 1: the
    container crash-loops (measured with the plugin's real daemon on an H100, docs/validation.md).
    Where the name is still on PATH but what it runs is gone (a wrapper script or link left behind)
    the same start fails with `exit status 127`. The GPUs stay in EXCLUSIVE_PROCESS (the daemon
    resets compute mode only on a clean stop), and MPS clients do not fail: their CUDA runs without
    MPS, as ordinary processes that take the whole GPU (measured: cuCtxCreate succeeds, no MPS
    server, no memory or thread limits), so with the GPU in EXCLUSIVE_PROCESS only one of them runs.

    CONFIRMED: either failure in the daemon's pod log (or a kubelet/containerd log) while no MPS
    control daemon runs; or MPS is configured (an MPS daemon pod, GFD label
    nvidia.com/mps.capable=true, a device-plugin config with sharing.mps, the host MPS root) while
    the binary is absent from a driver root that has nvidia-smi (/usr/bin, /usr/local/nvidia/bin,
    /run/nvidia/driver/usr/bin).
    AT-RISK (lower): the error was logged but the binary is present now and whether a daemon runs
    cannot be seen (restart the daemon); or GPUs are in EXCLUSIVE_PROCESS while no MPS daemon
    process runs. Nothing once an MPS control daemon runs again.
    """
    logs = facts.maybe("logs")
    mps = facts.maybe("mps")
    if logs is None and mps is None:
        try:
            facts.get("logs")
        except FactUnavailable as exc:
            raise FactUnavailable(f"no logs ({exc}) and no MPS facts") from exc
    errors = _start_errors(logs)
    present = mps.binary_present if mps is not None else None
    missing_at = mps.missing_where_utils_are() if mps is not None else []
    exclusive = _exclusive_gpus(facts)
    running = mps.daemon_running if mps is not None else None
    if errors and mps is not None and mps.control_pids:
        return  # it failed once, it runs now: recovered
    daemon_down = running is not True
    bin_ev = [Evidence(b.source, f"absent (nvidia-smi present in {b.dir})") for b in missing_at]
    mode_ev = _compute_mode_ev(exclusive) if daemon_down else []
    node_ev, clients = _never_started(mps)
    data: dict[str, Any] = {
        "binary_present": present,
        "missing_in": [b.dir for b in missing_at],
        "exclusive_gpus": [g.uuid or g.bus_id for g in exclusive],
        "daemon_running": running,
        "clients": [f"{c.pod}/{c.container}" for c in clients],
    }
    mode_note = (f"; {len(exclusive)} GPU(s) left in {exclusive[0].compute_mode}, where non-MPS CUDA jobs fail"
                 if mode_ev else "")
    client_note = (f"; {len(clients)} MPS client container(s) run without MPS ({_names(clients)}): no memory "
                   "or thread limits, one process per GPU in EXCLUSIVE_PROCESS" if clients else "")
    client_affected = [Affected("container", c.container, c.pod.split("/")[0], detail=f"pod {c.pod}, MPS client")
                       for c in clients]

    if errors:
        latest = errors[-MAX_QUOTED:]
        seen: dict[str, LogEvent] = {}
        for e in errors:
            seen[e.log] = e
        affected = [_affected(e) for e in seen.values()] + client_affected
        ev = [e.evidence() for e in reversed(latest)] + bin_ev + node_ev + mode_ev
        wrapper = [e for e in errors if e.sig == "mps.start-failed"]
        if present is True and running is None and not wrapper:
            yield Hit(
                Status.AT_RISK,
                f"The MPS control daemon failed {len(errors)} time(s) to exec nvidia-cuda-mps-control, "
                "but the binary is present in a driver root now: restart the MPS daemon pod to recover"
                + mode_note + ".",
                affected, ev, severity=Severity.MEDIUM, data=dict(data, errors=len(errors)),
                mechanism="The daemon found no nvidia-cuda-mps-control when it started; it does not retry a fixed root.",
            )
            return
        how = ("exec of nvidia-cuda-mps-control fails" if len(wrapper) < len(errors) else
               "nvidia-cuda-mps-control exits 127 (found on PATH, but what it runs is gone)")
        yield Hit(
            Status.CONFIRMED,
            f"The MPS control daemon cannot start: {how} "
            f"({len(errors)} time(s), last at {ts(latest[-1].time)})"
            + (f"; the binary is absent from {', '.join(b.dir for b in missing_at)} while nvidia-smi is there"
               if missing_at else "")
            + client_note + mode_note + ".",
            affected, ev, remedy=_branch_remedy(facts), data=dict(data, errors=len(errors), exit_127=len(wrapper)),
            mechanism=("The daemon execs nvidia-cuda-mps-control from the driver root injected by the NVIDIA "
                       "runtime; a driver upgrade that dropped the compute-utils package removed it."),
        )
        return

    if mps is not None and mps.configured and present is False:
        yield Hit(
            Status.CONFIRMED,
            "MPS is configured on this node but nvidia-cuda-mps-control is absent from "
            f"{', '.join(b.dir for b in missing_at)} (nvidia-smi is there): the MPS control daemon cannot start"
            + client_note + mode_note + ".",
            [Affected("plugin", "mps-control-daemon", detail=", ".join(mps.daemon_pods) or "MPS configured")]
            + client_affected,
            mps.configured[:MAX_QUOTED] + bin_ev + node_ev + mode_ev, remedy=_branch_remedy(facts), data=data,
            mechanism="The daemon execs nvidia-cuda-mps-control from the driver root; it is not there.",
        )
        return

    if mode_ev and mps is not None and mps.daemon_running is False:
        yield Hit(
            Status.AT_RISK,
            f"{len(exclusive)} GPU(s) are in {exclusive[0].compute_mode} compute mode but no MPS daemon runs: "
            "CUDA jobs that do not use MPS get one process per GPU and fail with \"all CUDA-capable devices are "
            "busy or unavailable\" (a crashed MPS daemon leaves this behind).",
            [Affected("gpu", g.uuid or g.bus_id, detail=g.compute_mode) for g in exclusive],
            mode_ev, severity=Severity.MEDIUM, data=data,
            remedy="If MPS is not meant to run: `nvidia-smi -i <uuid> -c DEFAULT` for each GPU (A2); "
                   "else restart the MPS control daemon pod (A1).",
            mechanism="The MPS daemon sets EXCLUSIVE_PROCESS on start and resets it only on a clean stop.",
        )


def _start_errors(logs: Any) -> list[LogEvent]:
    """Failed starts of nvidia-cuda-mps-control, once per line: not found, or found but exiting 127."""
    if logs is None:
        return []
    out = {(e.source, e.offset): e for e in logs.events("mps.binary-missing")}
    for e in logs.events("mps.start-failed"):
        if e.get("error").strip() == "exit status 127":
            out.setdefault((e.source, e.offset), e)
    return sorted(out.values(), key=lambda e: (e.time or 0.0, e.source, e.offset))


def _names(clients: list[Any]) -> str:
    return ", ".join(f"{c.pod}/{c.container}" for c in clients[:MAX_QUOTED]) + (" ..." if len(clients) > MAX_QUOTED else "")


def _never_started(mps: Any) -> tuple[list[Evidence], list[Any]]:
    """The MPS root of a daemon that never started (pipe directory empty), and its clients."""
    if mps is None:
        return [], []
    ev, clients = [], []
    for r in mps.resources:
        if r.never_started:
            ev.append(Evidence(f"{r.path}/pipe", f"empty: no control socket, no {PID_FILE}, no .started "
                                                 "(the MPS control daemon never started for this resource)"))
            clients += mps.clients_of(r)
    return ev[:MAX_QUOTED], clients


@rule(
    "GPU-K8S-011",
    title="MPS control daemon died under its clients",
    severity=Severity.HIGH,
    family="mps",
    needs=("mps",),
    remedy=DIED_REMEDY,
    references=(
        "NVIDIA/k8s-device-plugin cmd/mps-control-daemon/{main.go,mps/daemon.go} (Start, Stop, .started)",
        "docs/validation.md (issue 25: the daemon's MPS control daemon killed under a running client)",
    ),
    automation="A1",
)
def mps_daemon_died(facts: NodeFacts):
    """The MPS control daemon of a shared resource is gone while the plugin's daemon believes it runs.

    The device plugin's MPS control daemon writes `<res>/.started` once `nvidia-cuda-mps-control -d`
    is up and removes it only on a clean stop (`quit`); the control daemon writes its pid to
    `<res>/pipe/nvidia-cuda-mps-control.pid`. When the control daemon (and its server) is killed —
    OOM killer, a crash, a node-level `pkill` — the plugin's daemon does not notice: its pod stays
    Running and logs nothing. Measured on an H100: a client running through MPS failed its next call
    with CUDA_ERROR_MPS_RPC_FAILURE (806) 0.15 s after the kill; restarting the daemon pod (its stop
    fails, it exits 1, leaving the GPU in EXCLUSIVE_PROCESS) brought a new control daemon up in
    0.1 s over the stale pipe files, and a new client ran through it.

    Told apart from GPU-K8S-007 (a daemon that never started): `.started` and the pid file exist
    and the control log shows a daemon that served; after a failed start both are absent.

    On a DRA node the NVIDIA DRA driver runs one daemon per claim with its files under
    `<kubelet root>/plugins/gpu.nvidia.com/mps/<id>/{pipe,log}`; its template writes
    `log/startup.log` ("startup complete") where the device plugin's writes `.started`, and its
    clients are the containers of the claims whose CDI spec mounts that `pipe` (docs/dra.md).

    CONFIRMED: `.started` present with the control daemon's pid file or control log, and no
    nvidia-cuda-mps-control process runs on the node (processes visible; the pid in the file is of
    the daemon pod's pid namespace, so it is quoted, not compared). Not evaluated when the node's
    processes cannot be seen.
    """
    mps = facts.get("mps")
    if mps.daemon_running is None:
        raise FactUnavailable("processes not visible: cannot tell whether an MPS control daemon runs")
    if mps.control_pids:
        return  # a control daemon runs (its pid file holds a pid of its own namespace: not compared)
    for r in mps.resources:
        if not r.started or (r.pid is None and not r.control_log):
            continue
        clients = mps.clients_of(r)
        last = r.control_log[-1] if r.control_log else ""
        ev = [Evidence(f"{r.path}/{r.started_file}", "present: the daemon started MPS for this resource and never stopped it"),
              Evidence(r.pid_file if r.pid is not None else f"{r.path}/pipe",
                       f"{r.pid if r.pid is not None else 'no pid file'}: no nvidia-cuda-mps-control process runs on the node")]
        if last:
            ev.append(Evidence(r.control_log_path, f"last line: {last}"))
        ev += [Evidence(c.source, f"{PIPE_ENV}={c.pipe}") for c in clients[:MAX_QUOTED]]
        pods = ", ".join(mps.daemon_pods) or "the MPS control daemon pod"
        yield Hit(
            Status.CONFIRMED,
            f"The MPS control daemon for {r.name}" + (f" (pid {r.pid})" if r.pid is not None else "")
            + f" is gone while {pods} still reports it started"
            + (f"; {len(clients)} MPS client container(s) ({_names(clients)}) lost their MPS server: their CUDA "
               "calls fail (CUDA_ERROR_MPS_RPC_FAILURE)" if clients else "")
            + ".",
            [Affected("plugin", "mps-control-daemon", detail=pods)]
            + [Affected("container", c.container, c.pod.split("/")[0], detail=f"pod {c.pod}, MPS client") for c in clients],
            ev, data={"resource": r.name, "pid": r.pid, "clients": [f"{c.pod}/{c.container}" for c in clients]},
            mechanism="The plugin's daemon started nvidia-cuda-mps-control -d and only watches its log; nothing "
                      "restarts the control daemon when it dies.",
        )
