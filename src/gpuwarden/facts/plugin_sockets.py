"""The `plugin_sockets` fact: the kubelet's device-plugins directory, its sockets and their mtimes.

On start the kubelet deletes every file there but its checkpoint and creates kubelet.sock; a
registered plugin's socket older than kubelet.sock did not come back (GPU-K8S-002).
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.root import Missing, StatInfo

DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"


class PluginSockets(Struct):
    """The device-plugin sockets of the kubelet's directory."""
    directory: str
    names: list[str]  # the directory's entries, as listed
    #: kubelet.sock and nvidia*.sock -> their mtime (the link itself, not followed); absent: unreadable
    mtimes: dict[str, float] = field(default_factory=dict)

    @property
    def nvidia(self) -> list[str]:
        return [n for n in self.names if n.endswith(".sock") and n.startswith("nvidia")]


@fact("plugin_sockets")
def collect_plugin_sockets(facts: NodeFacts) -> PluginSockets:
    kub = facts.maybe("kubelet")
    d = f"{kub.root_dir if kub is not None else DEFAULT_KUBELET_ROOT}/device-plugins"
    names = facts.root.listdir(d)
    if isinstance(names, Missing):
        raise FactUnavailable(f"{d}: {names.kind}")
    out = PluginSockets(d, names)
    for s in ((["kubelet.sock"] + out.nvidia) if "kubelet.sock" in names else []):
        st = facts.root.stat(f"{d}/{s}", follow=False)
        if isinstance(st, StatInfo) and st.mtime:
            out.mtimes[s] = st.mtime
    return out
