"""A thin REST client over the kubernetes package: plain dicts in and out, every call with a timeout.

The kubernetes client supplies configuration and authentication (in-cluster service account or
kubeconfig) and its HTTP pool; requests and answers stay JSON dicts so the agent does not pay for
(or depend on) model validation, and the same code talks to kube-apiserver and the test server.
Imported only by the agent: `gpuwarden check` never loads the kubernetes client.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
DEFAULT_TIMEOUT_S = 10.0


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


def _q(s: str) -> str:
    return quote(s, safe="")


class Kube:
    def __init__(self, api_client: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.api = api_client
        self.timeout_s = timeout_s
        #: whether the latest request reached the API server (None: none made yet), and why not
        self.reachable: bool | None = None
        self.unreachable_why = ""

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
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        m, url, hdrs, b, post = self.api.param_serialize(
            method, path, query_params=query or None, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.api.call_api(m, url, hdrs, b, post, _request_timeout=timeout or self.timeout_s)
        except ApiException as exc:
            self.reachable = bool(exc.status)
            raise KubeError(exc.status or 0, exc.reason or "", exc.body or "") from None
        except Exception as exc:  # connection refused, timeouts: the API server is unreachable
            from gpuwarden.kubeerrors import connection_error

            self.reachable, self.unreachable_why = False, connection_error(exc)
            raise KubeError(0, "unreachable", self.unreachable_why) from None
        self.reachable = True
        data = resp.read()
        text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else str(data or "")
        if not 200 <= resp.status < 300:
            raise KubeError(resp.status, resp.reason or "", text)
        return text

    # -- nodes -------------------------------------------------------------------------------------
    def get_node(self, name: str) -> dict:
        return self.request("GET", f"/api/v1/nodes/{_q(name)}")

    def patch_node_status(self, name: str, patch: dict, content_type: str = SMP) -> dict:
        return self.request("PATCH", f"/api/v1/nodes/{_q(name)}/status", patch, content_type=content_type)

    def patch_node(self, name: str, patch: Any, content_type: str = SMP) -> dict:
        return self.request("PATCH", f"/api/v1/nodes/{_q(name)}", patch, content_type=content_type)

    # -- pods --------------------------------------------------------------------------------------
    def list_pods(self, node_name: str | None = None, label_selector: str = "", namespace: str = "") -> list[dict]:
        q: list[tuple[str, str]] = []
        if node_name:
            q.append(("fieldSelector", f"spec.nodeName={node_name}"))
        if label_selector:
            q.append(("labelSelector", label_selector))
        path = f"/api/v1/namespaces/{_q(namespace)}/pods" if namespace else "/api/v1/pods"
        return list(self.request("GET", path, query=q).get("items") or [])

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

    def list_events(self, namespace: str = "", field_selector: str = "") -> list[dict]:
        q = [("fieldSelector", field_selector)] if field_selector else []
        path = f"/api/v1/namespaces/{_q(namespace)}/events" if namespace else "/api/v1/events"
        return list(self.request("GET", path, query=q).get("items") or [])
