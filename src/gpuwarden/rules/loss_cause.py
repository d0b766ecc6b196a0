"""Why a running container lost GPU devices: the cause the node proves, or the candidates and what tells them apart.

The loss itself is read from the container's device policy (GPU-DEV-002/003 state it as proven).
The mechanism is a separate claim. Each candidate below re-applies the container's device rules
from a configuration that never listed the hook-injected NVIDIA devices; a cause is named as
proven only when the node shows that mechanism acting on this container:

* the static CPU manager: its reconcile loop sends every container's cpuset through CRI
  UpdateContainerResources (kubelet pkg/kubelet/cm/cpumanager reconcileState: on every change of
  the assignment, and once for every container after a kubelet restart); runc before 1.0
  re-applied the whole cgroup config on `runc update`, devices included (runc >= 1.0 skips them,
  opencontainers/runc#2994, #3019). Shown by cpuManagerPolicy=static (flag, config or
  cpu_manager_state) with runc < 1.0 or unknown; ruled out by policy none, by runc >= 1.0, or
  by devices listed in the spec (re-applied, so kept).
* `systemctl daemon-reload` with the systemd cgroup driver: systemd re-applies every unit's
  DeviceAllow, which lists only spec devices (NVIDIA/nvidia-container-toolkit#48). Shown by
  cgroupDriver=systemd and a reload after the container started: systemd flushes and re-creates
  its generator directories (/run/systemd/generator*) on every reload, so their mtime dates the
  last one. Ruled out for the devices cgroup with the cgroupfs driver.
* an in-place resize (InPlacePodVerticalScaling, KEP 1287: alpha 1.27, beta and on by default 1.33)
  or a hand-run `docker update` / `crictl update`: nothing on the node's disk dates them;
  always candidates, told apart by the pod's resize status and the runtime's event log.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct, field

from gpuwarden.findings import Evidence
from gpuwarden.facts.reapply import CPU_MANAGER_STATE
from gpuwarden.rules.fmt import ts

STATIC, RELOAD, UNKNOWN = "static-cpu-manager", "daemon-reload", "not-determined"

REMEDY = {
    STATIC: """
        1. Recreate the affected pods (their device cgroup is rebuilt at start).
        2. Permanent: make the device plugin return DeviceSpecs in Allocate (`PASS_DEVICE_SPECS=true`,
           helm `compatWithCPUManager=true`), or use CDI (`deviceListStrategy=cdi-cri`, toolkit jit-cdi);
           upgrade runc to >= 1.0.0 (it skips devices on update) and kubelet to >= 1.22.
        Note: restarting kubelet on an exposed node re-updates every container once and can break running GPU pods.
    """,
    RELOAD: """
        1. Recreate the affected pods.
        2. Create /dev/char links now: `nvidia-ctk system create-dev-char-symlinks --create-all`, and persist
           them with the udev rule from the NVIDIA container toolkit docs.
        3. Put devices in the spec (`PASS_DEVICE_SPECS=true`) or use CDI; upgrade runc to >= 1.2.5/1.3.0
           and systemd to >= 240; avoid gratuitous daemon-reloads on GPU nodes.
    """,
    UNKNOWN: """
        1. Recreate the affected pods (their device cgroup is rebuilt at start).
        2. Whatever re-applied the device rules, devices the runtime knows about survive it: make the
           device plugin return DeviceSpecs in Allocate (`PASS_DEVICE_SPECS=true`, helm
           `compatWithCPUManager=true`) or use CDI (`deviceListStrategy=cdi-cri`, toolkit jit-cdi);
           run runc >= 1.0.0 (skips devices on update); with the systemd cgroup driver also create the
           /dev/char links (`nvidia-ctk system create-dev-char-symlinks --create-all`).
        3. To find the mechanism, run the checks listed with each candidate in the finding.
    """,
}


class Cause(Struct):
    """The mechanism behind a device loss: proven (kind STATIC or RELOAD) or not determined."""

    kind: str
    line: str  # one sentence: the proven cause and what shows it, or "not determined: ..."
    evidence: list[Evidence] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)  # unproven: mechanism -- how to tell
    ruled_out: list[str] = field(default_factory=list)
    since: float | None = None  # the earliest the loss can have happened, when the cause dates it

    @property
    def proven(self) -> bool:
        return self.kind != UNKNOWN

    @property
    def sentence(self) -> str:
        """For the finding's summary: 'Cause (shown by the node): ...' or 'Cause not determined: ...'."""
        return f"Cause (shown by this node): {self.line}." if self.proven else f"Cause {self.line}."

    @property
    def mechanism(self) -> str:
        if self.proven:
            return self.line
        return "cause not determined (candidates: " + "; ".join(c.split(":")[0].split(" (")[0] for c in self.candidates) + ")"

    def data(self) -> dict[str, Any]:
        return {"cause": self.kind, "candidates": list(self.candidates), "ruled_out": list(self.ruled_out)}


def determine(facts: Any, started: list[float | None], hook_injected: list[bool | None],
              after: str = "the container started") -> Cause:
    """The cause of a loss in containers that had the devices at `started` (process start times, or
    the last time the agent saw them allowed: `after` says which, for the evidence).

    `hook_injected`: per container, True when the spec lists no NVIDIA device (only then can a
    re-apply from the spec drop them), False when it does, None when the spec was not read.
    """
    kub = facts.maybe("kubelet")
    rt = facts.maybe("runtime")
    dates = facts.maybe("reapply")
    ev: list[Evidence] = []
    policy = getattr(kub, "cpu_manager_policy", "") if kub is not None else ""
    driver = getattr(kub, "cgroup_driver", "") if kub is not None else ""
    if kub is not None:
        ev.append(Evidence("kubelet", f"cpuManagerPolicy={policy} ({kub.cpu_manager_policy_source})"))
        ev.append(Evidence("kubelet", f"cgroupDriver={driver} ({kub.cgroup_driver_source})"))
    runc_new = rt.runc_at_least((1, 0, 0)) if rt is not None else None
    runc = rt.runc_version if rt is not None and rt.runc_version else ""
    if runc:
        ev.append(Evidence("runc --version", f"runc {runc}"))
    in_spec = bool(hook_injected) and all(h is False for h in hook_injected)
    first_start = min((s for s in started if s), default=None)
    last_start = max((s for s in started if s), default=None)
    ruled_out: list[str] = []
    candidates: list[str] = []

    # the static CPU manager's reconcile -> `runc update`
    if policy == "static" and runc_new is not True and not in_spec:
        t = dates.cpu_manager_state_at if dates is not None else None
        if t is not None and first_start is not None and t >= first_start:
            ev.append(Evidence(CPU_MANAGER_STATE, f"written {ts(t)}, after {after}: the CPU manager "
                                                  "changed assignments then, and its reconcile updates every container"))
        how = f"runc {runc} < 1.0.0 re-applies devices on update" if runc else "runc version unknown (< 1.0.0 re-applies devices on update)"
        return Cause(STATIC, "the static CPU manager's reconcile (cpuManagerPolicy=static) updates every "
                     f"container's cpuset through `runc update`; {how}", ev, ruled_out=ruled_out)
    if policy == "static":
        ruled_out.append("static CPU manager: " + ("runc >= 1.0.0 skips devices on `runc update`" if runc_new
                                                   else "the spec lists the NVIDIA devices, so an update re-applies them"))
    elif policy:
        ruled_out.append(f"static CPU manager: cpuManagerPolicy={policy} ({kub.cpu_manager_policy_source})")
    else:
        candidates.append("the static CPU manager's reconcile (`runc update`): cpuManagerPolicy unknown; read the "
                          "kubelet's --cpu-manager-policy, config.yaml and cpu_manager_state")

    # systemd daemon-reload
    reload_t, reload_src = (dates.reload_at, dates.reload_source) if dates is not None else (None, "")
    if driver == "systemd":
        if reload_t is not None and last_start is not None and reload_t > last_start and not in_spec:
            ev.append(Evidence(reload_src, f"re-created {ts(reload_t)}, after {after} ({ts(last_start)}): "
                                           "systemd re-creates it on every daemon-reload"))
            return Cause(RELOAD, f"a `systemctl daemon-reload` at {ts(reload_t)} (systemd cgroup driver) "
                         "re-applied the scope's DeviceAllow, which lists only the spec's devices",
                         ev, ruled_out=ruled_out, since=reload_t)
        if reload_t is not None:
            ev.append(Evidence(reload_src, f"re-created {ts(reload_t)} (last daemon-reload), "
                               + (f"before {after}" if last_start and reload_t <= last_start
                                  else "container start time unknown")))
        candidates.append(f"a `systemctl daemon-reload` (systemd cgroup driver): none dated after {after} here; "
                          "check `journalctl _PID=1 | grep -i reload` for one since")
    elif driver:
        ruled_out.append(f"systemd daemon-reload: cgroupDriver={driver} ({kub.cgroup_driver_source}): systemd does "
                         "not own the container's cgroup")
    else:
        candidates.append("a `systemctl daemon-reload`, if the kubelet uses the systemd cgroup driver (unknown here)")

    candidates.append("an in-place pod resize (InPlacePodVerticalScaling: alpha in 1.27, on by default from 1.33): "
                      "check the pod's PodResizeInProgress / PodResizePending conditions (status.resize before 1.33), "
                      "its containers' allocatedResources and the kubelet's log about the resize")
    candidates.append("a hand-run or agent `docker update` / `crictl update` / direct write to devices.deny: check "
                      "`docker events --filter event=update`, the runtime's log and the audit log")
    return Cause(UNKNOWN, "not determined: nothing on this node shows which re-apply dropped them (the candidates "
                 "and what tells them apart are in the evidence)", ev, candidates, ruled_out)


def code_for(facts: Any, cause: Cause) -> str:
    """GPU-DEV-002 for a proven CPU-manager cause or a loss outside systemd; GPU-DEV-003 for a proven
    daemon-reload or any unexplained loss under the systemd cgroup driver."""
    if cause.kind == STATIC:
        return "GPU-DEV-002"
    if cause.kind == RELOAD:
        return "GPU-DEV-003"
    kub = facts.maybe("kubelet")
    return "GPU-DEV-003" if kub is not None and getattr(kub, "cgroup_driver", "") == "systemd" else "GPU-DEV-002"


def evidence_lines(cause: Cause) -> list[Evidence]:
    """The cause's own evidence, then each candidate and each ruled-out mechanism as a line."""
    out = list(cause.evidence)
    out += [Evidence("candidate cause", c) for c in cause.candidates]
    out += [Evidence("ruled out", r) for r in cause.ruled_out]
    return out
