"""Device-plugin probe for `check`: the kubelet's own calls to each plugin socket, in a killable child.

The kubelet calls GetPreferredAllocation (then Allocate) at every GPU pod admission with no
deadline; in the NVIDIA plugin only GetPreferredAllocation reaches NVML, so a plugin whose NVML
hangs answers GetDevicePluginOptions and hangs there (incident 5a, measured with the real plugin:
docs/validation.md run 4). This asks those two side-effect-free calls with a deadline each, in a
forked child killed at the overall deadline, so `check` reports the hang without a kubelet log at
--v=4. The agent does the same from its plugin monitor instead (agent/monitors.py), so it leaves
this probe off (Settings.plugin_probe).

ListAndWatch is never called: the NVIDIA plugin (v0.20.0) never ends a cancelled stream, so each
call would leave a goroutine in the plugin for its lifetime, competing with the kubelet's stream for
health events (docs/security.md). GetPreferredAllocation's device IDs come from what the kubelet
recorded instead, its device-manager checkpoint (gpa_ids).

Each socket is opened beneath the node's root without following a link (open_sockets) and connected
to through that fd (confine.fd_address), which the forked child inherits: a socket under the root
that is a link to one outside is never connected to (docs/security.md).
"""

from __future__ import annotations

import os
from typing import Any

from msgspec import Struct

from gpuwarden import confine
from gpuwarden.grpcapi.sockets import discover_plugin_sockets
from gpuwarden.parsers import kubelet_checkpoint
from gpuwarden.probes.bounded import Pending, start_func

CHECKPOINT = "kubelet_internal_checkpoint"  # the device manager's, beside the plugin sockets
NVIDIA_GPU = "nvidia.com/gpu"


class GpaIds(Struct, frozen=True):
    """The device IDs to ask one socket's GetPreferredAllocation for, and where they came from
    (or, with no IDs, why the call is not evaluated)."""

    ids: tuple[str, ...]
    note: str


def resource_of(socket_name: str) -> str | None:
    """The resource the NVIDIA plugin serves on `socket_name`: it names its socket
    `nvidia-<name>.sock` for `nvidia.com/<name>` (internal/plugin/server.go); None for another name."""
    if socket_name.startswith("nvidia-") and socket_name.endswith(".sock") and len(socket_name) > 12:
        return "nvidia.com/" + socket_name[len("nvidia-"):-len(".sock")]
    return None


def _ids_for(cp: kubelet_checkpoint.Checkpoint, resource: str) -> tuple[tuple[str, ...], str]:
    """Registered (healthy) IDs of `resource`, else the IDs the kubelet allocated from it."""
    reg = tuple(dict.fromkeys(cp.registered.get(resource) or ()))
    if reg:
        return reg, f"RegisteredDevices[{resource}]"
    used = tuple(dict.fromkeys(i for e in cp.entries if e.resource == resource for i in e.device_ids))
    return used, f"PodDeviceEntries of {resource} (none registered healthy)"


def gpa_ids(checkpoint_text: str | None, socket_names: list[str], source: str = CHECKPOINT) -> dict[str, GpaIds]:
    """Per socket name, the IDs for its GetPreferredAllocation probe, from the kubelet's checkpoint text.

    A socket whose resource the checkpoint knows gets that resource's IDs; any other gets the IDs of
    the NVIDIA resources (nvidia.com/gpu first), and its note says so; with no IDs, the note says the
    call is not evaluated (never a guessed ID). Pure: `checkpoint_text` None is a missing file.
    """
    cp = kubelet_checkpoint.parse(checkpoint_text) if checkpoint_text is not None else None
    out: dict[str, GpaIds] = {}
    for name in socket_names:
        if cp is None:
            why = "missing or unreadable" if checkpoint_text is None else "not a device-manager checkpoint"
            out[name] = GpaIds((), f"not evaluated: no device IDs ({source} {why})")
            continue
        known = set(cp.registered) | {e.resource for e in cp.entries}
        res = resource_of(name)
        if res in known:
            ids, how = _ids_for(cp, res)
            if ids:
                out[name] = GpaIds(ids, f"{source} {how}")
                continue
        nvidia = sorted((r for r in known if r.startswith("nvidia.com/")), key=lambda r: (r != NVIDIA_GPU, r))
        for r in nvidia:
            ids, how = _ids_for(cp, r)
            if ids:
                out[name] = GpaIds(ids, f"{source} {how}: socket not matched to a resource"
                                        + (f" with IDs ({res})" if res else ""))
                break
        else:
            out[name] = GpaIds((), f"not evaluated: no device IDs for {res or name} in {source}")
    return out


def read_gpa_ids(root: Any, socket_dir: str, socket_paths: list[str]) -> dict[str, GpaIds]:
    """gpa_ids for the sockets at the node paths `socket_paths`, the checkpoint read beneath the root
    (keyed by node path)."""
    path = f"{socket_dir.rstrip('/')}/{CHECKPOINT}"
    text = root.read_text(path)
    by_name = gpa_ids(text if isinstance(text, str) else None, [p.rsplit("/", 1)[-1] for p in socket_paths], path)
    return {p: by_name[p.rsplit("/", 1)[-1]] for p in socket_paths}


def open_sockets(root: Any, socket_dir: str) -> list[tuple[str, int]]:
    """(node path, O_PATH fd) of each plugin socket in the node directory `socket_dir`, opened beneath
    the root (HostRoot.open_socket); a link or a non-socket is left out. The caller closes the fds."""
    names = root.listdir(socket_dir)
    out: list[tuple[str, int]] = []
    if not isinstance(names, list):
        return out
    for name in discover_plugin_sockets(names):
        path = f"{socket_dir.rstrip('/')}/{name}"
        try:
            out.append((path, root.open_socket(path)))
        except OSError:
            continue
    return out


def close_all(opened: list[tuple[str, int]]) -> None:
    for _, fd in opened:
        os.close(fd)


def offers_preferred(options: Any) -> bool:
    """Whether a GetDevicePluginOptions result says the plugin serves GetPreferredAllocation."""
    return bool(options.ok and options.value is not None and options.value.get_preferred_allocation_available)


def ask(address: str, ids: tuple[str, ...], timeout: float) -> tuple[Any, Any]:
    """The kubelet's calls to one plugin socket, in a child: (GetDevicePluginOptions, GetPreferredAllocation
    for `ids`, or None when the plugin does not offer it or there are no IDs to ask for)."""
    from gpuwarden.grpcapi import client

    options = client.plugin_options(address, timeout)
    if offers_preferred(options) and ids:
        return options, client.plugin_preferred_allocation(address, list(ids), 1, timeout=timeout)
    return options, None


def snapshot(sockets: list[tuple[str, str, tuple[str, ...], str]], timeout: float) -> list[dict[str, Any]]:
    """Runs in the child: per plugin socket (its node path, the address to connect to, the IDs for
    GetPreferredAllocation and their source), each call's status, time and detail (plain data).
    GetPreferredAllocation with no IDs is listed as "not evaluated", with the reason."""
    out = []
    for shown, sock, ids, note in sockets:
        options, gpa = ask(sock, ids, timeout)
        calls = [_row(options)]
        if gpa is not None:
            calls.append({**_row(gpa), "ids_from": note})
        elif offers_preferred(options):
            calls.append({"rpc": "GetPreferredAllocation", "status": "not evaluated", "elapsed_s": 0.0,
                          "detail": note, "timeout_s": timeout})
        out.append({"socket": shown, "calls": calls})
    return out


def _row(c: Any) -> dict[str, Any]:
    return {"rpc": c.rpc.rsplit("/", 1)[-1], "status": c.status, "elapsed_s": round(c.elapsed_s, 3),
            "detail": c.detail, "timeout_s": c.timeout_s}


def start(root: Any, socket_dir: str, timeout: float) -> Pending | None:
    """Start the probe now (None: no plugin socket to ask); at most two calls per socket, each
    bounded by `timeout`, the child killed after all of them could have timed out. `socket_dir` is
    a node path under the live root `root`."""
    opened = open_sockets(root, socket_dir)  # cheap: a listing and an open per socket, no grpc in this process
    if not opened:
        return None
    try:
        ids = read_gpa_ids(root, socket_dir, [path for path, _ in opened])
        sockets = [(path, confine.fd_address(fd), ids[path].ids, ids[path].note) for path, fd in opened]
        return start_func(snapshot, sockets, timeout, timeout=2 * timeout * len(sockets) + 1.0)
    finally:
        close_all(opened)  # the child holds its own copies
