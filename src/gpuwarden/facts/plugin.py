"""The NVIDIA device plugin's process: when it started, what its /dev holds, how it is configured.

The plugin decides which device nodes go into every GPU container's Allocate
response by stat()ing paths inside its own container, whose /dev is a snapshot
taken when the plugin container started (incident 1).
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.containers import _dev_view
from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.facts.processes import read_bounded
from gpuwarden.parsers import proc_pid

PLUGIN_BINARIES = ("nvidia-device-plugin", "k8s-device-plugin", "nvidia-device-plugin-ctr")
#: plugin settings that change device injection; values are not secret
ENV_ALLOW = ("PASS_DEVICE_SPECS", "DEVICE_LIST_STRATEGY", "DEVICE_ID_STRATEGY", "MIG_STRATEGY",
             "FAIL_ON_INIT_ERROR", "DP_DISABLE_HEALTHCHECKS", "NVIDIA_DRIVER_ROOT", "CONTAINER_DRIVER_ROOT",
             "NVIDIA_VISIBLE_DEVICES", "DEVICE_DISCOVERY_STRATEGY", "CONFIG_FILE", "NVIDIA_MIG_MONITOR_DEVICES",
             "DP_ENABLE_HEALTHCHECKS")


class PluginProcess(Struct):
    """A running device plugin: argv, environment and its view of /dev."""
    pid: int
    argv: tuple[str, ...]
    started_at: float | None
    env: dict[str, str]
    dev_view: dict[str, tuple[int, int]] | None
    sources: list[str] = field(default_factory=list)

    @property
    def pass_device_specs(self) -> bool | None:
        v = self.env.get("PASS_DEVICE_SPECS")
        if v is None:
            for a in self.argv:
                if a.startswith("--pass-device-specs"):
                    return not a.endswith("=false")
            return None
        return v.strip().lower() in ("true", "1", "yes")


class PluginFacts(Struct):
    """The node's running device plugins."""
    processes: list[PluginProcess]


@fact("plugin")
def collect_plugin(facts: NodeFacts) -> PluginFacts:
    procs = facts.maybe("processes")
    if procs is None:
        raise FactUnavailable("process table unavailable")
    found = []
    for p in procs.procs.values():
        if p.exe_name not in PLUGIN_BINARIES:
            continue
        if any("mps-control-daemon" in a for a in p.argv):
            continue
        got = read_bounded(facts, [p.pid], ("environ",)) or {}
        env_raw = got.get(p.pid, {}).get("environ")
        env = {} if env_raw is None else proc_pid.environ(env_raw, ENV_ALLOW)
        found.append(PluginProcess(p.pid, p.argv, procs.start_time(facts, p.pid), env,
                                   _dev_view(facts, p.pid),
                                   [f"/proc/{p.pid}/cmdline", f"/proc/{p.pid}/root/dev"]))
    return PluginFacts(found)


class PluginPod(Struct, frozen=True):
    """The pod the device plugin runs in: the one pod whose container cgroups hold a plugin process."""
    namespace: str
    name: str
    uid: str
    pid: int


@fact("plugin_pod")
def collect_plugin_pod(facts: NodeFacts) -> PluginPod:
    """The plugin's process matched to the pod whose container cgroup holds its pid; exactly one such pod,
    else unavailable (none, or several: a fix must not name a guess)."""
    plugin, containers = facts.maybe("plugin"), facts.maybe("containers")
    if plugin is None or containers is None:
        raise FactUnavailable("no device-plugin process or no containers read")
    pids = {p.pid for p in plugin.processes}
    pods = {(pod.namespace, pod.name, pod.uid, pid) for pod, c in containers.containers() for pid in set(c.pids) & pids}
    if len({p[:3] for p in pods}) != 1:
        raise FactUnavailable(f"{len({p[:3] for p in pods})} pods hold a device-plugin process")
    return PluginPod(*sorted(pods)[0])
