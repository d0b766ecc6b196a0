"""A thin REST client over the kubernetes package: plain dicts in and out, every call with one deadline.

The kubernetes client supplies configuration and authentication (in-cluster service account or
kubeconfig) and its HTTP pool; requests and answers stay JSON dicts so the agent does not pay for
(or depend on) model validation, and the same code talks to kube-apiserver and the test server.
Imported only by the agent: `gpuwarden check` never loads the kubernetes client.

Outages (docs/agent.md "When the API server is away"):
- **one deadline per call**: urllib3's default of 3 retries (4 connections, no delay, each with the
  full timeout) is turned off; a call is one attempt bounded by `timeout_s`.
- **jittered backoff**: after a call finds the API unreachable (no answer, a timeout, 502/503/504,
  429) further calls fail at once for a backoff window (1 s doubling to 60 s, full jitter), so a
  check pays at most one deadline, and 5,000 agents do not return in lockstep.
- **pages**: lists go by `limit`/`continue` (`iter_items`), so no answer holds a whole cluster.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any, Iterator
from urllib.parse import quote

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
DEFAULT_TIMEOUT_S = 10.0
PAGE_SIZE = 500
BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 60.0
#: answers that mean "the API server (or etcd behind it) is not serving now": back off
UNAVAILABLE = (0, 429, 502, 503, 504)


class KubeError(Exception):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        self.status, self.reason, self.body = status, reason, body
        msg = body
        try:
            msg = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            pass
        super().__init__(f"HTTP {status} {reason}: {msg}".strip())

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def unavailable(self) -> bool:
        """The API did not serve the call (down, overloaded, etcd away): worth trying again later."""
        return self.status in UNAVAILABLE

    @property
    def gone(self) -> bool:
        """410: a watch's resourceVersion or a list's continue token has expired."""
        return self.status == 410


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
        _one_attempt(api_client)

    @classmethod
    def from_config(cls, kubeconfig: str = "", timeout_s: float = DEFAULT_TIMEOUT_S) -> "Kube":
        from kubernetes import client, config

        cfg = client.Configuration()
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(client_configuration=cfg)
        cfg.retries = False  # one attempt per call (see _one_attempt)
        return cls(client.ApiClient(cfg), timeout_s)

    def close(self) -> None:
        try:
            self.api.close()
        except Exception:
            pass

    # -- plumbing ----------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
                content_type: str | None = None, timeout: float | None = None) -> dict:
        text = self.request_text(method, path, body, query, content_type, timeout)
        return json.loads(text) if text.strip() else {}

    def request_text(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
                     content_type: str | None = None, timeout: float | None = None,
                     accept: str = "application/json") -> str:
        """The answer's body as text (pod logs are text/plain); KubeError on any failure."""
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
        from kubernetes.client.exceptions import ApiException

        self.requests += 1
        try:
            deadline = self.timeout_s if timeout is None else max(0.05, min(timeout, self.timeout_s))
            resp = self.api.call_api(m, url, hdrs, b, post, _request_timeout=deadline)
            data = resp.read()
        except ApiException as exc:
            self.reachable = bool(exc.status)
            raise self._failed(KubeError(exc.status or 0, exc.reason or "", exc.body or "")) from None
        except Exception as exc:  # connection refused, timeouts: the API server is unreachable
            from gpuwarden.kubeerrors import connection_error

            self.reachable, self.unreachable_why = False, connection_error(exc)
            raise self._failed(KubeError(0, "unreachable", self.unreachable_why)) from None
        self.reachable = True
        text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else str(data or "")
        if not 200 <= resp.status < 300:
            raise self._failed(KubeError(resp.status, resp.reason or "", text))
        self._backoff_s = 0.0
        return text

    def _failed(self, exc: KubeError) -> KubeError:
        """Open (or widen) the backoff window when the API is unavailable; full jitter."""
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
                   limit: int = PAGE_SIZE, meta: dict | None = None) -> Iterator[dict]:
        """Every item of a list, a page (`limit`) at a time; `meta` receives the list's metadata
        (its resourceVersion: where a watch resumes). A continue token that expired (410) restarts
        the list once from the start, as client-go's pager falls back to a full list."""
        base: list[tuple[str, str]] = [("limit", str(limit))]
        if label_selector:
            base.append(("labelSelector", label_selector))
        if field_selector:
            base.append(("fieldSelector", field_selector))
        token, restarted = "", False
        while True:
            try:
                doc = self.request("GET", path, query=base + ([("continue", token)] if token else []))
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

    # -- nodes -------------------------------------------------------------------------------------
    def get_node(self, name: str) -> dict:
        return self.request("GET", f"/api/v1/nodes/{_q(name)}")

    def patch_node_status(self, name: str, patch: dict, content_type: str = SMP) -> dict:
        return self.request("PATCH", f"/api/v1/nodes/{_q(name)}/status", patch, content_type=content_type)

    def patch_node(self, name: str, patch: Any, content_type: str = SMP) -> dict:
        return self.request("PATCH", f"/api/v1/nodes/{_q(name)}", patch, content_type=content_type)

    # -- pods --------------------------------------------------------------------------------------
    def list_pods(self, node_name: str | None = None, label_selector: str = "", namespace: str = "") -> list[dict]:
        path = f"/api/v1/namespaces/{_q(namespace)}/pods" if namespace else "/api/v1/pods"
        return list(self.iter_items(path, label_selector, f"spec.nodeName={node_name}" if node_name else ""))

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
        try:
            return self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/configmaps/{_q(name)}")
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    # -- events ------------------------------------------------------------------------------------
    def create_event(self, namespace: str, event: dict) -> dict:
        return self.request("POST", f"/api/v1/namespaces/{_q(namespace)}/events", event)

    def patch_event(self, namespace: str, name: str, patch: dict) -> dict:
        return self.request("PATCH", f"/api/v1/namespaces/{_q(namespace)}/events/{_q(name)}", patch,
                            content_type=MERGE)

    def list_events(self, namespace: str = "", field_selector: str = "", label_selector: str = "") -> list[dict]:
        path = f"/api/v1/namespaces/{_q(namespace)}/events" if namespace else "/api/v1/events"
        return list(self.iter_items(path, label_selector, field_selector))


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
