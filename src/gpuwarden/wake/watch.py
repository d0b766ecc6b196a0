"""inotify on what the seeds change: the kubelet's plugin directories and state, CDI specs, the NVIDIA nodes.

Each watched directory is opened beneath the root (`root.open_dir`) and named by a topic; a name filter
keeps, say, `/dev` to its `nvidia*` entries and `/var/lib/kubelet` to its DRA state file. A directory
that does not exist on this node is simply not watched (listed in `missing`). IN_Q_OVERFLOW (events
lost) asks for the full check, through the "all" topic the agent maps to every rule.

Bounded: one read of at most 64 KiB per poll wake-up; an event becomes at most one emit per topic per
read, and the queue folds the rest.
"""

from __future__ import annotations

import os
import select
import time
from typing import Any, Callable

from msgspec import Struct

from gpuwarden.wake.base import Emit, Wake, clip
from gpuwarden.wake.inotify import DIR_EVENTS, IN_Q_OVERFLOW, NODE_EVENTS, Inotify
from gpuwarden.wake.poller import Polled


class Watch(Struct, frozen=True):
    path: str  # a node directory
    topic: str
    prefix: tuple[str, ...] = ()  # only entries whose name starts with one of these ("" : every entry)
    mask: int = DIR_EVENTS  # what of its entries wakes the agent


#: what the seeds change, by topic (docs/agent.md "Event sources")
DEFAULT_WATCHES = (
    Watch("/var/lib/kubelet/device-plugins", "plugins"),  # plugin sockets, kubelet_internal_checkpoint
    Watch("/var/lib/kubelet/plugins_registry", "plugins"),
    Watch("/var/lib/kubelet/plugins", "dra"),  # one directory per DRA driver
    Watch("/var/lib/kubelet/plugins/gpu.nvidia.com", "dra"),  # dra.sock, checkpoint.json
    Watch("/var/lib/kubelet", "dra", ("dra_manager_state",)),
    Watch("/etc/cdi", "cdi"),
    Watch("/var/run/cdi", "cdi"),
    # device nodes wake only when made, removed or renamed: every CUDA process opens them read-write, and a
    # close after a write (the agent's own NVML probe's too) is no change of the node (GPU host, run 19)
    Watch("/dev", "devices", ("nvidia",), NODE_EVENTS),
    Watch("/dev/nvidia-caps", "devices", (), NODE_EVENTS),
)

#: the topic of an overflow: every rule (the agent reads it as "check everything now")
OVERFLOW_TOPIC = "all"


class WatchSource(Polled):
    name = "inotify"
    #: makes the inotify instance (bench/fleet_sim.py's thousands of agents share one instance and thread)
    new_inotify: Callable[[], Inotify] = Inotify

    def __init__(self, root: Any, watches: tuple[Watch, ...] = DEFAULT_WATCHES, clock: Any = time.time,
                 kubelet_root: str = "/var/lib/kubelet") -> None:
        self.root = root
        if kubelet_root.rstrip("/") != "/var/lib/kubelet":
            watches = tuple(Watch(kubelet_root.rstrip("/") + w.path[len("/var/lib/kubelet"):], w.topic, w.prefix, w.mask)
                            if w.path.startswith("/var/lib/kubelet") else w for w in watches)
        self.watches = watches
        self.clock = clock
        self._ino: Inotify | None = None
        self._emit: Emit | None = None
        self._by_wd: dict[int, Watch] = {}
        self.watched: list[str] = []
        self.missing: list[str] = []
        self.overflows = 0
        self.events = 0

    def start(self, emit: Emit) -> str | None:
        if not hasattr(self.root, "open_dir"):
            return "this root has no directories to watch (a built-in example does not change)"
        try:
            self._ino = self.new_inotify()
        except OSError as exc:
            return str(exc.strerror or exc)
        for w in self.watches:
            try:
                dfd = self.root.open_dir(w.path)
            except OSError:
                self.missing.append(w.path)
                continue
            try:
                wd = self._ino.watch_fd(dfd, w.mask)
            except OSError as exc:
                self.missing.append(f"{w.path} ({exc.strerror})")
                continue
            finally:
                os.close(dfd)
            self._by_wd[wd] = w
            self.watched.append(w.path)
        if not self._by_wd:
            self._ino.close()
            self._ino = None
            return "none of the watched directories is on this root"
        self._emit = emit
        self._listen([(self._ino.fd, select.POLLIN, self._ready)])
        return None

    def _ready(self, _ev: int) -> None:
        assert self._ino is not None
        hits: dict[str, str] = {}
        for e in self._ino.read():
            self.events += 1
            if e.mask & IN_Q_OVERFLOW:
                self.overflows += 1
                hits[OVERFLOW_TOPIC] = "inotify queue overflowed: events were lost, everything is checked"
                continue
            w = self._by_wd.get(e.wd)
            if w is None or (w.prefix and not e.name.startswith(w.prefix)):
                continue
            hits.setdefault(w.topic, f"{w.path.rstrip('/')}/{e.name}" if e.name else w.path)
        now = self.clock()
        for topic, detail in hits.items():
            if self._emit is not None:
                self._emit(Wake(self.name, topic, clip(detail), now))

    def stop(self) -> None:
        self._unlisten()
        if self._ino is not None:
            self._ino.close()
            self._ino = None
