"""MPS (CUDA Multi-Process Service) failures."""

from __future__ import annotations

from typing import Any

from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.logscan import LogEvent
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.fmt import ts

SMI_XML = "/.gpuwarden/commands/nvidia-smi-q-x.xml"
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
    `nvidia-cuda-mps-control`, which the NVIDIA runtime injects from the driver root. When a
    driver upgrade removes the compute-utils package (nvidia-smi stays), the daemon
    crash-loops with `exec: "nvidia-cuda-mps-control": executable file not found in $PATH`,
    MPS-shared resources disappear, and the GPUs may be left in EXCLUSIVE_PROCESS (the daemon
    resets compute mode only on a clean stop).

    CONFIRMED: that error in a kubelet, containerd or NVIDIA pod log (CRI files under
    /var/log/pods); or MPS is configured (an MPS daemon pod, GFD label
    nvidia.com/mps.capable=true, a device-plugin config with sharing.mps, the host MPS root)
    while the binary is absent from a driver root that has nvidia-smi (/usr/bin,
    /usr/local/nvidia/bin, /run/nvidia/driver/usr/bin).
    AT-RISK (lower): the error was logged but the binary is present now (restart the daemon);
    or GPUs are in EXCLUSIVE_PROCESS while no MPS daemon process runs.
    """
    logs = facts.maybe("logs")
    mps = facts.maybe("mps")
    if logs is None and mps is None:
        try:
            facts.get("logs")
        except FactUnavailable as exc:
            raise FactUnavailable(f"no logs ({exc}) and no MPS facts") from exc
    errors = logs.events("mps.binary-missing") if logs is not None else []
    present = mps.binary_present if mps is not None else None
    missing_at = mps.missing_where_utils_are() if mps is not None else []
    exclusive = _exclusive_gpus(facts)
    daemon_down = mps is None or mps.daemon_running is not True
    bin_ev = [Evidence(b.source, f"absent (nvidia-smi present in {b.dir})") for b in missing_at]
    mode_ev = _compute_mode_ev(exclusive) if daemon_down else []
    data: dict[str, Any] = {
        "binary_present": present,
        "missing_in": [b.dir for b in missing_at],
        "exclusive_gpus": [g.uuid or g.bus_id for g in exclusive],
        "daemon_running": mps.daemon_running if mps is not None else None,
    }
    mode_note = (f"; {len(exclusive)} GPU(s) left in {exclusive[0].compute_mode}, where non-MPS CUDA jobs fail"
                 if mode_ev else "")

    if errors:
        latest = errors[-MAX_QUOTED:]
        seen: dict[str, LogEvent] = {}
        for e in errors:
            seen[e.log] = e
        affected = [_affected(e) for e in seen.values()]
        ev = [e.evidence() for e in reversed(latest)] + bin_ev + mode_ev
        if present is True:
            yield Hit(
                Status.AT_RISK,
                f"The MPS control daemon failed {len(errors)} time(s) to exec nvidia-cuda-mps-control, "
                "but the binary is present in a driver root now: restart the MPS daemon pod to recover"
                + mode_note + ".",
                affected, ev, severity=Severity.MEDIUM, data=dict(data, errors=len(errors)),
                mechanism="The daemon found no nvidia-cuda-mps-control when it started; it does not retry a fixed root.",
            )
            return
        yield Hit(
            Status.CONFIRMED,
            f"The MPS control daemon cannot start: exec of nvidia-cuda-mps-control fails "
            f"({len(errors)} time(s), last at {ts(latest[-1].time)})"
            + (f"; the binary is absent from {', '.join(b.dir for b in missing_at)} while nvidia-smi is there"
               if missing_at else "")
            + mode_note + ".",
            affected, ev, remedy=_branch_remedy(facts), data=dict(data, errors=len(errors)),
            mechanism=("The daemon execs nvidia-cuda-mps-control from the driver root injected by the NVIDIA "
                       "runtime; a driver upgrade that dropped the compute-utils package removed it."),
        )
        return

    if mps is not None and mps.configured and present is False:
        yield Hit(
            Status.CONFIRMED,
            "MPS is configured on this node but nvidia-cuda-mps-control is absent from "
            f"{', '.join(b.dir for b in missing_at)} (nvidia-smi is there): the MPS control daemon cannot start"
            + mode_note + ".",
            [Affected("plugin", "mps-control-daemon", detail=", ".join(mps.daemon_pods) or "MPS configured")],
            mps.configured[:MAX_QUOTED] + bin_ev + mode_ev, remedy=_branch_remedy(facts), data=data,
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
