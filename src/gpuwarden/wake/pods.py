"""A watch of this node's own pods: a pod the kubelet rejects at admission for a lost GPU is a wake.

The kubelet writes such a rejection only into the pod's status at its default verbosity
(`parsers.admission`), so the API server is where it is seen first. One watch, field-selected by
`spec.nodeName` (the answer grows with the node, never with the cluster), wakes the agent with
`Wake(source="pods", topic="admission", detail="ns/name: <reason>")` the moment the status is written;
the agent's admission rule then reads and judges it (this source judges nothing: the recognition is
`parsers.admission.gpu_rejection`'s).

Bounded like client-go's reflector: a list a page at a time, then a watch from its resourceVersion
with bookmarks and a read timeout (the server ends each watch after `watch_timeout_s`; the socket
read gives up 15 s later); a broken watch resumes from the last resourceVersion after a jittered
backoff (1 s doubling to 30 s while the API is down), and only 410 Gone relists. Thousands of failing
pods are a few wakes (`Burst`); the pods already woken for are remembered by uid, at most `max_seen`,
and a rejection older than the admission rule's window (10 minutes) wakes nothing.
While the API server is away nothing is emitted and the periodic check is the fallback.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from typing import Any

from gpuwarden.kube.errors import KubeError
from gpuwarden.parsers.admission import gpu_rejection
from gpuwarden.wake.base import Emit
from gpuwarden.wake.burst import Burst

PODS = "/api/v1/pods"
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 30.0
#: a rejection older than this wakes nothing: the admission rule counts only the last 10 minutes
#: (rules.lost_gpu.RECENT_S), and a node keeps its Failed pods for days
MAX_AGE_S = 600.0


class PodsWatch:
    """The node's pods watch (a `wake.base.Source`)."""

    name = "pods"

    def __init__(self, kube: Any, node: str, *, watch_timeout_s: int = 300, window_s: float = 1.0,
                 max_seen: int = 4096, backoff_max_s: float = BACKOFF_MAX_S, max_age_s: float = MAX_AGE_S,
                 log: Any = None) -> None:
        self.kube, self.node, self.watch_timeout_s, self.max_age_s = kube, node, watch_timeout_s, max_age_s
        self.window_s, self.max_seen, self.backoff_max_s, self.log = window_s, max_seen, backoff_max_s, log
        self.rv = ""  # where the next watch resumes ("" : list first)
        self.up = False  # the watch is open and following the server
        self.why = ""  # the latest failure, while not up
        self.lists = 0
        self.resumes = 0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._burst: Burst | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self._rng = random.Random()

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node}"

    # -- Source ------------------------------------------------------------------------------------
    def start(self, emit: Emit) -> str | None:
        if self.kube is None:
            return "no API server (--no-kube): pods are read by the periodic check only"
        if not self.node:
            return "no node name: the node's pods cannot be selected"
        self._burst = Burst(emit, "pods", "admission", self.window_s)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="wake-pods", daemon=True)
        self._thread.start()
        return None

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:  # unblock a watch waiting for its next event
            try:
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
        if self._burst is not None:
            self._burst.close()
        self.up = False

    # -- the watch thread --------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            try:
                if not self.rv:
                    self._list()
                self._watch()
                backoff = 0.0
            except Exception as exc:  # down, refused, timed out, garbage: the periodic check covers it
                if self._stop.is_set():
                    return
                self.up, self.why = False, f"{type(exc).__name__}: {str(exc)[:200]}"
                if isinstance(exc, KubeError) and exc.gone:
                    self.rv = ""
                elif self.rv:
                    self.resumes += 1
                if self.log is not None:
                    self.log.warn("wake-pods-failed", error=self.why, next="relist" if not self.rv else "resume")
                backoff = min(self.backoff_max_s, max(BACKOFF_MIN_S, backoff * 2))
                self._stop.wait(self._rng.uniform(0.5, 1.0) * backoff)

    def _list(self) -> None:
        """The node's pods a page at a time (each page dropped before the next); where the watch starts."""
        meta: dict = {}
        for pod in self.kube.iter_items(PODS, field_selector=self.selector, meta=meta):
            self._see(pod)
            if self._stop.is_set():
                return
        self.rv = str(meta.get("resourceVersion") or "")
        self.lists += 1

    def _watch(self) -> None:
        """One watch until the server ends it; raises on a break. An ERROR event (410 Expired) relists."""
        for ev in self.kube.watch(PODS, self.rv, self.watch_timeout_s, field_selector=self.selector,
                                  on_response=self._hold):
            if self._stop.is_set():
                return
            self.up, self.why = True, ""
            obj = ev.get("object") if isinstance(ev, dict) else None
            obj = obj if isinstance(obj, dict) else {}
            if ev.get("type") == "ERROR":
                code = obj.get("code")
                raise KubeError(code if isinstance(code, int) else 0, str(obj.get("reason") or "ERROR"),
                                str(obj.get("message") or ""))
            md = obj.get("metadata")
            rv = md.get("resourceVersion") if isinstance(md, dict) else None
            if isinstance(rv, str) and rv:
                self.rv = rv
            if ev.get("type") in ("ADDED", "MODIFIED"):
                self._see(obj)
        self._resp = None

    def _hold(self, resp: Any) -> None:
        self._resp = resp
        self.up, self.why = True, ""

    def _see(self, pod: dict) -> None:
        """A pod rejected at admission for a GPU, recently and not seen before: a wake (through the burst)."""
        r = gpu_rejection(pod)
        if r is None or self._burst is None:
            return
        now = time.time()
        if r.time is not None and r.time < now - self.max_age_s:
            return
        key = r.uid or r.ref
        if key in self._seen:
            return
        self._seen[key] = None
        if len(self._seen) > self.max_seen:
            self._seen.popitem(last=False)
        self._burst.offer(f"{r.ref}: {r.reason}: {', '.join(r.names[:2])}", seen=now)
