"""The controller's REST calls (over the agent's `Kube`) and informers (list + watch caches).

Everything is plain JSON dicts, every call has a timeout. An `Informer` lists a resource a page at a
time (`limit`/`continue`, each page trimmed before the next is read: peak memory is one page plus the
trimmed cache, not the whole list) and then watches it from the list's resourceVersion with bookmarks.
A broken watch (network, timeout, API restart) resumes from the last resourceVersion seen after a
jittered backoff; only 410 Gone (the version left etcd's history) or an ERROR event relists, as
client-go's reflector does. `sync()` does one list without a thread (tests, --no-watch).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any, Callable, Iterator
from urllib.parse import quote

from gpuwarden.agent.kube import MERGE, Kube, KubeError


def _q(s: str) -> str:
    return quote(s, safe="")


class ControllerKube(Kube):
    @classmethod
    def from_config(cls, kubeconfig: str = "", timeout_s: float = 10.0, context: str = "") -> "ControllerKube":
        """Like kubectl: --kubeconfig, else in-cluster when in a pod (and no context asked), else $KUBECONFIG
        or ~/.kube/config."""
        from kubernetes import client, config

        cfg = client.Configuration()
        if not kubeconfig and not context and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=kubeconfig or None, context=context or None,
                                    client_configuration=cfg)
        cfg.retries = False  # one attempt per call (see _one_attempt)
        return cls(client.ApiClient(cfg), timeout_s)

    # -- generic -----------------------------------------------------------------------------------
    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def get_or_none(self, path: str) -> dict | None:
        try:
            return self.request("GET", path)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def list(self, path: str, label_selector: str = "", field_selector: str = "") -> dict:
        """The whole list as one document ({"items": [...]}), read a page at a time."""
        meta: dict = {}
        items = list(self.iter_items(path, label_selector, field_selector, meta=meta))
        return {"metadata": meta, "items": items}

    def merge_patch(self, path: str, patch: dict) -> dict:
        return self.request("PATCH", path, patch, content_type=MERGE)

    # -- nodes, workloads --------------------------------------------------------------------------
    def list_nodes(self, label_selector: str = "") -> list[dict]:
        return list(self.iter_items("/api/v1/nodes", label_selector=label_selector))

    def list_all(self, api_version: str, plural: str) -> list[dict]:
        """Every object of a kind in all namespaces ([] when the API does not serve it)."""
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            return list(self.iter_items(f"{base}/{plural}"))
        except KubeError as exc:
            if exc.status in (404, 405):
                return []
            raise

    # -- leases ------------------------------------------------------------------------------------
    def lease_path(self, namespace: str, name: str = "") -> str:
        p = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases"
        return f"{p}/{_q(name)}" if name else p

    def get_lease(self, namespace: str, name: str, timeout: float | None = None) -> dict | None:
        try:
            return self.request("GET", self.lease_path(namespace, name), timeout=timeout)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def create_lease(self, namespace: str, lease: dict, timeout: float | None = None) -> dict:
        return self.request("POST", self.lease_path(namespace), lease, timeout=timeout)

    def replace_lease(self, namespace: str, name: str, lease: dict, timeout: float | None = None) -> dict:
        """PUT with the resourceVersion the lease carries: a concurrent write makes it fail with 409."""
        return self.request("PUT", self.lease_path(namespace, name), lease, timeout=timeout)

    # -- configmaps --------------------------------------------------------------------------------
    def create_configmap(self, namespace: str, cm: dict) -> dict:
        return self.request("POST", f"/api/v1/namespaces/{_q(namespace)}/configmaps", cm)

    def patch_configmap(self, namespace: str, name: str, patch: dict) -> dict:
        return self.merge_patch(f"/api/v1/namespaces/{_q(namespace)}/configmaps/{_q(name)}", patch)

    # -- watch -------------------------------------------------------------------------------------
    def watch(self, path: str, resource_version: str, timeout_s: int = 60, field_selector: str = "",
              label_selector: str = "", on_response: Callable[[Any], None] | None = None) -> Iterator[dict]:
        """Stream watch events ({"type", "object"}) until the server ends the watch."""
        q = [("watch", "1"), ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout_s))]
        if resource_version:
            q.append(("resourceVersion", resource_version))
        if field_selector:
            q.append(("fieldSelector", field_selector))
        if label_selector:
            q.append(("labelSelector", label_selector))
        m, url, hdrs, b, post = self.api.param_serialize("GET", path, query_params=q,
                                                         header_params={"Accept": "application/json"},
                                                         auth_settings=["BearerToken"])
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.api.call_api(m, url, hdrs, b, post, _request_timeout=(self.timeout_s, timeout_s + 15))
        except ApiException as exc:
            raise KubeError(exc.status or 0, exc.reason or "", exc.body or "") from None
        except Exception as exc:  # connection refused, timeouts
            raise KubeError(0, type(exc).__name__, str(exc)) from None
        raw = resp.response
        if not 200 <= resp.status < 300:
            body = raw.read().decode("utf-8", "replace")
            raise KubeError(resp.status, resp.reason or "", body)
        if on_response is not None:
            on_response(raw)
        buf = b""
        try:
            for chunk in raw.stream(amt=None, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
            if buf.strip():
                yield json.loads(buf)
        finally:
            raw.release_conn()


class Informer:
    """A list+watch cache of one resource (all namespaces), objects trimmed by `trim` (which may
    return None: the object is not kept, e.g. a pod that requests no GPU)."""

    def __init__(self, kube: ControllerKube, path: str, trim: Callable[[dict], dict | None] | None = None,
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
