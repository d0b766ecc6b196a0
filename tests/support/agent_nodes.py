"""Synthetic live nodes for the agent tests: a built-in example materialised as a real tree.

`synthetic_node(dest, example, uid_map)` recreates an example under `dest` (files, device nodes
by mknod, listings) and renames pod UIDs in file contents and paths, so the node's pods can carry
the UIDs a real API server assigned. The tree is read through a HostRoot, so the agent treats it
as a live node: its gRPC probes find the fake kubelet/plugin sockets placed inside it.
Device nodes need root (mknod); `can_mknod()` says whether this process can.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from gpuwarden.examples import open_example
from tests.support.bundles import POD_UID, materialize

DEVICE_PLUGIN_DIR = "var/lib/kubelet/device-plugins"
POD_RESOURCES_SOCKET = "var/lib/kubelet/pod-resources/kubelet.sock"


def can_mknod() -> bool:
    d = tempfile.mkdtemp(prefix="gwmk")
    try:
        os.mknod(os.path.join(d, "n"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(d, ignore_errors=True)


def short_tmpdir() -> Path:
    """A short path: unix socket paths inside the tree must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))


def _variants(uid: str) -> list[str]:
    return [uid, uid.replace("-", "_")]


def synthetic_node(dest: Path, example: str = "uvm-missing", uid_map: dict[str, str] | None = None) -> Path:
    root = materialize(open_example(example), dest)
    return rename_uids(root, uid_map or {})


def rename_uids(root: Path, uid_map: dict[str, str]) -> Path:
    """Rewrite pod UIDs in a materialised tree (contents and paths), e.g. after a pod was recreated."""
    pairs = []
    for old, new in uid_map.items():
        pairs += list(zip(_variants(old), _variants(new)))
    if not pairs:
        return root
    # contents first (regular files only), then paths, deepest first
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_file() or p.is_symlink():
                continue
            data = p.read_bytes()
            new = data
            for a, b in pairs:
                new = new.replace(a.encode(), b.encode())
            if new != data:
                p.write_bytes(new)
    for dirpath, dirs, files in os.walk(root, topdown=False):
        for name in dirs + files:
            renamed = name
            for a, b in pairs:
                renamed = renamed.replace(a, b)
            if renamed != name:
                os.rename(os.path.join(dirpath, name), os.path.join(dirpath, renamed))
    return root


def sock(root: Path, rel: str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


__all__ = ["POD_UID", "DEVICE_PLUGIN_DIR", "POD_RESOURCES_SOCKET", "can_mknod", "short_tmpdir", "synthetic_node", "rename_uids", "sock"]
