"""Fixtures for tests against the real test API server (etcd + tools/testapiserver).

`apiserver` (session): builds the server if needed (a cold build takes minutes, once per
cache; $GPUWARDEN_TESTAPISERVER names a prebuilt binary), starts etcd and the server on
free loopback ports, and stops both at the end. When it cannot, every test using it is
skipped with the reason, which `-ra` prints in the summary; with
GPUWARDEN_REQUIRE_APISERVER=1 (CI) they fail instead.

`k8s` (function): a fresh ApiClient and a namespace of the test's own.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
for _p in (_ROOT / "src", _ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from tests.support.apiserver import ApiServerUnavailable, RunningApiServer, start_apiserver  # noqa: E402

REQUIRE_ENV = "GPUWARDEN_REQUIRE_APISERVER"


@pytest.fixture(scope="session")
def apiserver():
    try:
        server = start_apiserver()
    except ApiServerUnavailable as e:
        reason = f"REAL API SERVER UNAVAILABLE: {e}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason}\n({REQUIRE_ENV}=1 makes this a failure)", pytrace=False)
        pytest.skip(reason)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class K8s:
    """What a test gets: a client, its own namespace, and the server behind them."""

    api: object  # kubernetes.client.ApiClient
    namespace: str
    server: RunningApiServer

    def name(self, prefix: str) -> str:
        """A name unique to this test run, for cluster-scoped objects such as Nodes."""
        return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def k8s(apiserver, request):
    from kubernetes import client

    api = apiserver.api_client()
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-") or "t"
    namespace = f"{stem}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        yield K8s(api=api, namespace=namespace, server=apiserver)
    finally:
        try:
            client.CoreV1Api(api).delete_namespace(namespace)
        except Exception:
            pass  # the server's etcd is per session; nothing leaks past it
        api.close()


@pytest.fixture
def kube(k8s):
    """The admin's `Kube`, the namespace `ml`; the test's pods and Nodes are removed after it."""
    from gpuwarden.kube.client import Kube
    from tests.support.agent_kube import cleanup_nodes, delete_all_pods, ensure_namespace

    kb = Kube(k8s.api)
    ensure_namespace(kb, "ml")
    yield kb
    delete_all_pods(kb, "ml")
    cleanup_nodes(kb)

