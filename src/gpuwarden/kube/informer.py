"""Informers: list + watch caches of one resource, as client-go's reflector keeps them.

Everything is plain JSON dicts, every call has a timeout. An `Informer` lists a resource a page at a
time (`limit`/`continue`, each page trimmed before the next is read: peak memory is one page plus the
trimmed cache, not the whole list) and then watches it from the list's resourceVersion with bookmarks.
A broken watch (network, timeout, API restart) resumes from the last resourceVersion seen after a
jittered backoff; only 410 Gone (the version left etcd's history) or an ERROR event relists, as
client-go's reflector does. `sync()` does one list without a thread (tests, --no-watch).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

from gpuwarden.kube.client import Kube
from gpuwarden.kube.errors import KubeError


class Informer:
    """A list+watch cache of one resource (all namespaces), objects trimmed by `trim` (which may
    return None: the object is not kept, e.g. a pod that requests no GPU)."""

    def __init__(self, kube: Kube, path: str, trim: Callable[[dict], dict | None] | None = None,
                 field_selector: str = "", label_selector: str = "", name: str = "", log: Any = None) -> None:
        self.kube = kube
        self.path = path
        self.trim = trim or (lambda o: o)
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.name = name or path.rsplit("/", 1)[-1]
        self.log = log
        self.items: dict[str, dict] = {}
        self.rv = ""
        self.synced = False  # the cache follows the server (False while relisting)
        self.ever_synced = False  # the cache was filled once (until then it is empty, not "nothing there")
        self.changed = threading.Event()  # set on every change (the controller reconciles soon after)
        self.lists = 0  # full lists done (the first, then one per 410 Gone)
        self.resumes = 0  # watches restarted from the last resourceVersion after an error
        self._lock = threading.Lock()
        self._resp: Any = None
        self._rng = random.Random()

    @staticmethod
    def _key(obj: dict) -> str:
        m = obj.get("metadata") or {}
        return m.get("uid") or f"{m.get('namespace', '')}/{m.get('name', '')}"

    def sync(self) -> None:
        """One full list, a page at a time, each object trimmed as it arrives (replaces the cache)."""
        meta: dict = {}
        items = {}
        for o in self.kube.iter_items(self.path, self.label_selector, self.field_selector, meta=meta):
            kept = self.trim(o)
            if kept is not None:
                items[self._key(o)] = kept
        with self._lock:
            self.items = items
            self.rv = meta.get("resourceVersion", "")
            self.synced = self.ever_synced = True
        self.lists += 1
        self.changed.set()

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.items.values())

    def apply(self, ev: dict) -> bool:
        """Fold one watch event in; False when the watch must restart from a fresh list (an ERROR
        event: 410 Expired, the resourceVersion is too old)."""
        t, obj = ev.get("type"), ev.get("object") or {}
        if t == "ERROR":
            return False
        rv = (obj.get("metadata") or {}).get("resourceVersion", "")
        with self._lock:
            if t in ("ADDED", "MODIFIED"):
                kept = self.trim(obj)
                if kept is not None:
                    self.items[self._key(obj)] = kept
                else:
                    self.items.pop(self._key(obj), None)
            elif t == "DELETED":
                self.items.pop(self._key(obj), None)
            if rv:
                self.rv = rv
        if t != "BOOKMARK":
            self.changed.set()
        return True

    def run(self, stop: threading.Event, watch_timeout_s: int = 60) -> None:
        backoff = 0.0
        while not stop.is_set():
            try:
                if not self.synced:
                    self.sync()
                for ev in self.kube.watch(self.path, self.rv, watch_timeout_s, self.field_selector,
                                          self.label_selector, on_response=self._hold):
                    if stop.is_set():
                        return
                    if not self.apply(ev):
                        self.synced = False
                        break
                backoff = 0.0
            except Exception as exc:  # the watch broke: resume from self.rv, relist only on 410 Gone
                if stop.is_set():
                    return
                if isinstance(exc, KubeError) and exc.gone or not self.rv:
                    self.synced = False
                else:
                    self.resumes += 1
                if self.log:
                    self.log.warn("watch-failed", resource=self.name, error=str(exc),
                                  next="relist" if not self.synced else f"resume from {self.rv}")
                backoff = min(max(0.5, backoff * 2), 10.0)
                stop.wait(self._rng.uniform(0.5, 1.0) * backoff)

    def _hold(self, resp: Any) -> None:
        self._resp = resp

    def interrupt(self) -> None:
        """Unblock a watch waiting for data (at stop)."""
        r = self._resp
        if r is not None:
            try:
                r.shutdown() if hasattr(r, "shutdown") else r.close()
            except Exception:
                pass


def start_informers(informers: list[Informer], stop: threading.Event, timeout_s: float = 30.0) -> list[threading.Thread]:
    threads = []
    for inf in informers:
        t = threading.Thread(target=inf.run, args=(stop,), name=f"watch-{inf.name}", daemon=True)
        t.start()
        threads.append(t)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(i.ever_synced for i in informers) and not stop.is_set():
        time.sleep(0.05)
    return threads
