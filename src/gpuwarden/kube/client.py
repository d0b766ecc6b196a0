"""A thin REST client over the kubernetes package: plain dicts in and out, every call with one deadline.

The kubernetes client supplies configuration and authentication (in-cluster service account or
kubeconfig) and its HTTP pool; requests and answers stay JSON dicts so the agent, the controller
and the CLI's cluster commands do not pay for (or depend on) model validation, and the same code
talks to kube-apiserver and the test server. `gpuwarden check` never loads the kubernetes client.

Outages (docs/agent.md "When the API server is away"):
- **one deadline per call**: urllib3's default of 3 retries (4 connections, no delay, each with the
  full timeout) is turned off; a call is one attempt bounded by `timeout_s`.
- **jittered backoff**: after a call finds the API unreachable (no answer, a timeout, 502/503/504,
  429) further calls fail at once for a backoff window (1 s doubling to 60 s, each window drawn
  from 0.5–1× of it: equal jitter), so a check pays at most one deadline, and 5,000 agents do
  not return in lockstep.
- **fencing** (the controller): `fence`, when set, is asked before every write (any method but GET)
  for how long the write may take, and may refuse it (raise); the write's timeout is cut to that.
- **write gate** (the agent's breaker): `WRITE_GATE`, set by a thread for the span of an action, is
  entered right before each write of that thread is sent and left once it is answered; it may
  refuse the write (raise). Its check is made right before the send, not when a plan was made
  earlier (remediation/executor.py).
- **pages**: lists go by `limit`/`continue` (`iter_items`), so no answer holds a whole cluster.
"""

from __future__ import annotations

import json
import os
import random
import stat
import time
from contextlib import nullcontext
from contextvars import ContextVar
from typing import Any, Callable, ContextManager, Iterator
from urllib.parse import quote

from gpuwarden import safeyaml
from gpuwarden.kube.errors import KubeError, connection_error

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
DEFAULT_TIMEOUT_S = 10.0
PAGE_SIZE = 500
#: the Accept of a metadata-only list; JSON as the fallback for a server that cannot transform
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
#: a kubeconfig of a few hundred contexts with embedded certificates is well under this
MAX_KUBECONFIG_BYTES = 4 << 20
#: one answer (a page of PAGE_SIZE objects, a pod log) larger than this is refused, not parsed:
#: an endless response must not grow to GBs (a page of 500 big objects is ~10-100 MB)
MAX_RESPONSE_BYTES = 256 << 20
BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 60.0
#: entered around each write (any method but GET) the current thread sends, from right before it is sent
#: until it is answered; it may refuse the write by raising. The agent's executor sets it for the span of
#: one action: the breaker is re-read under its lock right before the action's write (remediation/executor.py)
WRITE_GATE: ContextVar[Callable[[], ContextManager[Any]] | None] = ContextVar("gpuwarden_write_gate", default=None)


def _q(s: str) -> str:
    return quote(s, safe="")


class Kube:
    def __init__(self, api_client: Any, timeout_s: float = DEFAULT_TIMEOUT_S,
                 rng: random.Random | None = None) -> None:
        self.api = api_client
        self.timeout_s = timeout_s
        #: whether the latest request reached the API server (None: none made yet), and why not
        self.reachable: bool | None = None
        self.unreachable_why = ""
        self._rng = rng or random.Random()
        self._backoff_s = 0.0
        self._down_until = 0.0  # monotonic: calls fail at once until then
        self.backoff_max_s = BACKOFF_MAX_S
        self.requests = 0  # calls sent (not those refused by the backoff)
        #: asked before each write: the seconds it may take, or raises (the controller's Lease fence)
        self.fence: Callable[[], float] | None = None
        self.last_write_sent = 0.0  # time.time() the latest write (any method but GET) left, past every gate
        _one_attempt(api_client)

    @classmethod
    def from_config(cls, kubeconfig: str = "", timeout_s: float = DEFAULT_TIMEOUT_S, context: str = "") -> "Kube":
        """Like kubectl: --kubeconfig, else in-cluster when in a pod (and no context asked), else $KUBECONFIG
        or ~/.kube/config."""
        from kubernetes import client, config

        cfg = client.Configuration()
        if not kubeconfig and not context and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            for path in _kubeconfig_paths(kubeconfig):
                check_kubeconfig(path)
            config.load_kube_config(config_file=kubeconfig or None, context=context or None,
                                    client_configuration=cfg)
        cfg.retries = False  # one attempt per call (see _one_attempt)
        return cls(client.ApiClient(cfg), timeout_s)

    def close(self) -> None:
        try:
            self.api.close()
        except Exception:
            pass

    # -- plumbing ----------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
                content_type: str | None = None, timeout: float | None = None,
                accept: str = "application/json") -> dict:
        text = self.request_text(method, path, body, query, content_type, timeout, accept)
        return json.loads(text) if text.strip() else {}

    def request_text(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
                     content_type: str | None = None, timeout: float | None = None,
                     accept: str = "application/json") -> str:
        """The answer's body as text (pod logs are text/plain); KubeError on any failure."""
        if self.fence is not None and method != "GET":
            allowed = self.fence()  # raises when this write may not be sent at all
            timeout = allowed if timeout is None else min(timeout, allowed)
        left = self._down_until - time.monotonic()
        if left > 0:
            raise KubeError(0, "Backoff", f"the API server was unreachable; next try in {left:.1f}s")
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        m, url, hdrs, b, post = self.api.param_serialize(
            method, path, query_params=query or None, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )
        gate = WRITE_GATE.get() if method != "GET" else None
        with gate() if gate is not None else nullcontext():  # may refuse the write (raises): nothing sent
            return self._send(m, url, hdrs, b, post, method, timeout)

    def _send(self, m: str, url: str, hdrs: Any, b: Any, post: Any, method: str, timeout: float | None) -> str:
        from kubernetes.client.exceptions import ApiException

        self.requests += 1
        if method != "GET":
            self.last_write_sent = time.time()
        try:
            deadline = self.timeout_s if timeout is None else max(0.05, min(timeout, self.timeout_s))
            resp = self.api.call_api(m, url, hdrs, b, post, _request_timeout=deadline)
            data = _read_capped(resp)
        except ApiException as exc:
            self.reachable = bool(exc.status)
            raise self._failed(KubeError(exc.status or 0, exc.reason or "", exc.body or "")) from None
        except KubeError as exc:  # an answer too long to read: the server is there, but not serving sanely
            self.reachable = True
            raise self._failed(exc) from None
        except Exception as exc:  # connection refused, timeouts: the API server is unreachable
            self.reachable, self.unreachable_why = False, connection_error(exc)
            raise self._failed(KubeError(0, "unreachable", self.unreachable_why)) from None
        self.reachable = True
        text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else str(data or "")
        if not 200 <= resp.status < 300:
            raise self._failed(KubeError(resp.status, resp.reason or "", text))
        self._backoff_s = 0.0
        return text

    def _failed(self, exc: KubeError) -> KubeError:
        """Open (or widen) the backoff window when the API is unavailable: equal jitter (0.5–1× the
        window), so a fleet does not return in lockstep yet each window stays at least half long."""
        if exc.unavailable:
            self._backoff_s = min(self.backoff_max_s, max(BACKOFF_MIN_S, 2 * self._backoff_s))
            self._down_until = time.monotonic() + self._rng.uniform(0.5, 1.0) * self._backoff_s
        else:
            self._backoff_s = 0.0
        return exc

    @property
    def backing_off(self) -> bool:
        return time.monotonic() < self._down_until

    def iter_items(self, path: str, label_selector: str = "", field_selector: str = "",
                   limit: int = PAGE_SIZE, meta: dict | None = None, accept: str = "application/json",
                   cached: bool = False) -> Iterator[dict]:
        """Every item of a list, a page (`limit`) at a time; `meta` receives the list's metadata
        (its resourceVersion: where a watch resumes). A continue token that expired (410) restarts
        the list once from the start, as client-go's pager falls back to a full list.

        `cached`: served from the API server's watch cache (`resourceVersion=0`, as the kubelet lists
        its node's pods and client-go's informers start), not read from etcd. A selective list (one
        node's pods among 60,000) read from etcd makes the server decode every object of the kind: 3.5-8 s
        at 10,000 pods on the test server, the 10 s deadline at 60,000; from the cache 0.02 s. The cache
        may answer in one page whatever `limit` says (the test server does), so only for lists bounded
        by what they select (one node's pods: its max-pods), and the view may be a moment old: only for
        reads whose writes are guarded (uid, resourceVersion preconditions)."""
        base: list[tuple[str, str]] = [("limit", str(limit))]
        if label_selector:
            base.append(("labelSelector", label_selector))
        if field_selector:
            base.append(("fieldSelector", field_selector))
        first = [("resourceVersion", "0")] if cached else []  # a continued page carries its own (the token's)
        token, restarted = "", False
        while True:
            try:
                doc = self.request("GET", path, query=base + ([("continue", token)] if token else first), accept=accept)
            except KubeError as exc:
                if not (exc.gone and token and not restarted):
                    raise
                token, restarted = "", True
                continue
            md = doc.get("metadata") or {}
            if meta is not None:
                meta.clear()
                meta.update(md)
            yield from doc.pop("items", None) or []
            token = md.get("continue") or ""
            if not token:
                return

    # -- generic -----------------------------------------------------------------------------------
    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def get_or_none(self, path: str, timeout: float | None = None) -> dict | None:
        try:
            return self.request("GET", path, timeout=timeout)
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

    # -- nodes -------------------------------------------------------------------------------------
    def get_node(self, name: str) -> dict:
        return self.request("GET", f"/api/v1/nodes/{_q(name)}")

    def patch_node_status(self, name: str, patch: dict, content_type: str = SMP) -> dict:
        return self.request("PATCH", f"/api/v1/nodes/{_q(name)}/status", patch, content_type=content_type)

    def patch_node(self, name: str, patch: Any, content_type: str = SMP) -> dict:
        return self.request("PATCH", f"/api/v1/nodes/{_q(name)}", patch, content_type=content_type)

    def list_nodes(self, label_selector: str = "") -> list[dict]:
        return list(self.iter_items("/api/v1/nodes", label_selector=label_selector))

    def list_all(self, api_version: str, plural: str, metadata_only: bool = False) -> list[dict]:
        """Every object of a kind in all namespaces ([] when the API does not serve it). With
        `metadata_only`, only their metadata (PartialObjectMetadata, as client-go's metadata informers
        ask): a scan for an annotation does not download every spec and status of the cluster."""
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        accept = METADATA_ONLY if metadata_only else "application/json"
        try:
            return list(self.iter_items(f"{base}/{plural}", accept=accept))
        except KubeError as exc:
            if exc.status in (404, 405):
                return []
            raise

    # -- pods --------------------------------------------------------------------------------------
    def list_pods(self, node_name: str | None = None, label_selector: str = "", namespace: str = "",
                  phase: str = "") -> list[dict]:
        """Pods, paged; one node's (`node_name`: field-selected) from the watch cache, as the kubelet
        reads them: an agent's read of its own pods costs the same on a node of a 60,000-pod cluster
        as of a 100-pod one (`iter_items` `cached`)."""
        path = f"/api/v1/namespaces/{_q(namespace)}/pods" if namespace else "/api/v1/pods"
        fields = [f"spec.nodeName={node_name}" if node_name else "", f"status.phase={phase}" if phase else ""]
        return list(self.iter_items(path, label_selector, ",".join(f for f in fields if f), cached=bool(node_name)))

    def get_pod(self, namespace: str, name: str) -> dict:
        return self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}")

    def delete_pod(self, namespace: str, name: str, uid: str = "", grace_s: int | None = None) -> dict:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            body["preconditions"] = {"uid": uid}  # never delete a same-named successor
        if grace_s is not None:
            body["gracePeriodSeconds"] = int(grace_s)
        return self.request("DELETE", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}", body)

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> dict:
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        return self.request("POST", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/eviction", body)

    # -- configmaps --------------------------------------------------------------------------------
    def get_configmap(self, namespace: str, name: str) -> dict | None:
        return self.get_or_none(f"/api/v1/namespaces/{_q(namespace)}/configmaps/{_q(name)}")

    def create_configmap(self, namespace: str, cm: dict) -> dict:
        return self.request("POST", f"/api/v1/namespaces/{_q(namespace)}/configmaps", cm)

    def patch_configmap(self, namespace: str, name: str, patch: dict) -> dict:
        return self.merge_patch(f"/api/v1/namespaces/{_q(namespace)}/configmaps/{_q(name)}", patch)

    # -- leases ------------------------------------------------------------------------------------
    def lease_path(self, namespace: str, name: str = "") -> str:
        p = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases"
        return f"{p}/{_q(name)}" if name else p

    def get_lease(self, namespace: str, name: str, timeout: float | None = None) -> dict | None:
        return self.get_or_none(self.lease_path(namespace, name), timeout)

    def create_lease(self, namespace: str, lease: dict, timeout: float | None = None) -> dict:
        return self.request("POST", self.lease_path(namespace), lease, timeout=timeout)

    def replace_lease(self, namespace: str, name: str, lease: dict, timeout: float | None = None) -> dict:
        """PUT with the resourceVersion the lease carries: a concurrent write makes it fail with 409."""
        return self.request("PUT", self.lease_path(namespace, name), lease, timeout=timeout)

    # -- events ------------------------------------------------------------------------------------
    def create_event(self, namespace: str, event: dict) -> dict:
        return self.request("POST", f"/api/v1/namespaces/{_q(namespace)}/events", event)

    def patch_event(self, namespace: str, name: str, patch: dict) -> dict:
        return self.request("PATCH", f"/api/v1/namespaces/{_q(namespace)}/events/{_q(name)}", patch,
                            content_type=MERGE)

    def iter_events(self, namespace: str = "", field_selector: str = "", label_selector: str = "") -> Iterator[dict]:
        """Events a page at a time: a node may have tens of thousands; keep only what you need of each.
        Read from etcd, not the watch cache: the cache may answer all of a node's 25,000 Events in one page."""
        path = f"/api/v1/namespaces/{_q(namespace)}/events" if namespace else "/api/v1/events"
        return self.iter_items(path, label_selector, field_selector)

    def list_events(self, namespace: str = "", field_selector: str = "", label_selector: str = "") -> list[dict]:
        return list(self.iter_events(namespace, field_selector, label_selector))

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
            body = _read_capped(resp, 1 << 20).decode("utf-8", "replace")
            raise KubeError(resp.status, resp.reason or "", body)
        if on_response is not None:
            on_response(raw)
        buf = b""
        try:
            for chunk in _stream_chunks(raw):
                buf += chunk
                if len(buf) > MAX_RESPONSE_BYTES:  # one event without end: not parsed to GBs
                    raw.close()
                    raise KubeError(0, "TooLarge", f"a watch event longer than {MAX_RESPONSE_BYTES >> 20} MiB")
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield _event(line)
            if buf.strip():
                yield _event(buf)
        finally:
            raw.release_conn()


def _stream_errors() -> tuple[type[BaseException], ...]:
    """What a watch stream raises when it breaks mid-way: urllib3's own errors (ProtocolError on a
    connection cut mid-chunk, ReadTimeoutError), http.client's (IncompleteRead), the socket's (OSError)."""
    import http.client

    import urllib3.exceptions

    return urllib3.exceptions.HTTPError, http.client.HTTPException, OSError


def _stream_chunks(raw: Any) -> Iterator[bytes]:
    """The watch's chunks; a stream that breaks is a KubeError (status 0: unavailable, resume), never
    urllib3's exception: every caller (the informers, the agent's pods watch) handles KubeError."""
    errors = _stream_errors()
    it = iter(raw.stream(amt=None, decode_content=False))
    while True:
        try:
            chunk = next(it)
        except StopIteration:
            return
        except errors as exc:
            raise KubeError(0, type(exc).__name__, f"the watch stream broke: {exc}") from None
        yield chunk


def _event(line: bytes) -> dict:
    """One watch event; a line that is not a JSON object is a KubeError (the stream is not trusted further)."""
    try:
        ev = json.loads(line)
    except ValueError as exc:
        raise KubeError(0, "BadWatchEvent", f"a watch line that is not JSON ({exc}): {line[:120]!r}") from None
    if not isinstance(ev, dict):
        raise KubeError(0, "BadWatchEvent", f"a watch line that is not an object: {line[:120]!r}")
    return ev

def _read_capped(resp: Any, limit: int | None = None) -> bytes:
    """The body of a response, refused (KubeError) past `limit` bytes (MAX_RESPONSE_BYTES): read in
    chunks from the unpreloaded urllib3 response, whose connection is closed, not drained, when too long."""
    limit = MAX_RESPONSE_BYTES if limit is None else limit
    raw = getattr(resp, "response", None)
    if raw is None or not hasattr(raw, "stream"):  # a client whose response is already in memory
        data = resp.read()
        data = data if isinstance(data, (bytes, bytearray)) else str(data or "").encode()
        if len(data) > limit:
            raise KubeError(0, "TooLarge", f"an answer longer than {limit >> 20} MiB")
        return bytes(data)
    chunks, total = [], 0
    for chunk in raw.stream(1 << 20, decode_content=True):
        total += len(chunk)
        if total > limit:
            raw.close()
            raise KubeError(0, "TooLarge", f"an answer longer than {limit >> 20} MiB (not read further)")
        chunks.append(chunk)
    raw.release_conn()
    return b"".join(chunks)


def _kubeconfig_paths(kubeconfig: str) -> list[str]:
    """The files the kubernetes client will read, as kubectl looks for them."""
    if kubeconfig:
        return [kubeconfig]
    env = os.environ.get("KUBECONFIG", "")
    return [p for p in env.split(os.pathsep) if p] if env else [os.path.expanduser("~/.kube/config")]


def check_kubeconfig(path: str) -> None:
    """ValueError unless `path` is a regular file of at most MAX_KUBECONFIG_BYTES holding bounded YAML
    (gpuwarden.safeyaml), like the agent's config: a FIFO is refused unread, a 100 MB file or an alias
    bomb before the kubernetes client parses it. A file that cannot be opened is left to the client's
    own message (errors.config_error says where it looked)."""
    try:
        fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"kubeconfig {path}: not a regular file")
        if st.st_size > MAX_KUBECONFIG_BYTES:
            raise ValueError(f"kubeconfig {path}: larger than {MAX_KUBECONFIG_BYTES >> 20} MiB; not a kubeconfig")
        chunks, total = [], 0
        while total <= MAX_KUBECONFIG_BYTES:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > MAX_KUBECONFIG_BYTES:
        raise ValueError(f"kubeconfig {path}: larger than {MAX_KUBECONFIG_BYTES >> 20} MiB; not a kubeconfig")
    try:
        safeyaml.load(b"".join(chunks))
    except safeyaml.YamlError as exc:
        raise ValueError(f"kubeconfig {path}: not YAML: {exc}") from None


def _one_attempt(api_client: Any) -> None:
    """Turn off urllib3's default retries (3, undelayed, each with the full timeout) on this client:
    one call is one attempt within one deadline; trying again is the caller's, with backoff."""
    cfg = getattr(api_client, "configuration", None)
    if cfg is None or getattr(cfg, "retries", None) is not None or not hasattr(api_client, "rest_client"):
        return
    from kubernetes.client import rest

    cfg.retries = False
    try:
        api_client.rest_client.pool_manager.clear()
    except Exception:
        pass
    api_client.rest_client = rest.RESTClientObject(cfg)
