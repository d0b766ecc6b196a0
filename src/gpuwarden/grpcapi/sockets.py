"""The device plugins' sockets in the kubelet's device-plugins directory: a listing and stat(2).

Apart from the gRPC client (client.py), so that `check` finds the sockets to probe without
building the client's classes: the probe's child imports those (probes/plugin.py).
"""

from __future__ import annotations

import os
import stat
from typing import Iterable

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_REGISTRATION_SOCKET = "kubelet.sock"


def discover_plugin_sockets(names: Iterable[str]) -> list[str]:
    """Pick plugin sockets out of a listing of the device-plugins directory.

    Socket names are chosen by each plugin (nvidia-gpu.sock, nvidia.com-gpu.sock,
    ...); only the kubelet's own registration socket and non-socket files
    (checkpoint, DEPRECATION) share the directory.
    """
    return sorted(
        {
            n
            for n in names
            if n.endswith(".sock") and n != KUBELET_REGISTRATION_SOCKET and not n.startswith(".")
        }
    )


def plugin_socket_paths(root_dir: str = DEVICE_PLUGIN_DIR) -> list[str]:
    """Absolute paths of plugin sockets under root_dir; [] if it is unreadable."""
    try:
        names = os.listdir(root_dir)
    except OSError:
        return []
    paths = []
    for name in discover_plugin_sockets(names):
        path = os.path.join(os.path.abspath(root_dir), name)
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                paths.append(path)
        except OSError:
            continue
    return paths
