"""/readyz against the real test API server: Ready while the server answers, not Ready once it is
gone (stopped mid-run), and Ready again when an agent reaches one (docs/agent.md, Metrics)."""

from __future__ import annotations

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.examples import open_example
from gpuwarden.kube.client import Kube
from tests.agent.test_readiness import Quiet, _get

pytestmark = pytest.mark.apiserver


def test_ready_while_the_api_server_answers(k8s):
    kube = Kube(k8s.api)
    node = k8s.name("gpu-node")
    kube.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    cfg = AgentConfig(node_name=node, listen="127.0.0.1:0", probes=False, grpc=False, boot_grace_s=0,
                      event_namespace=k8s.namespace, namespace=k8s.namespace)
    a = Agent(cfg, kube=kube, root=open_example("uvm-missing"), log=Quiet())
    a.start()
    try:
        url = f"http://{a.server.address}/readyz"
        a.check(), a.check()
        assert _get(url) == (200, "ok\n")
        # the same agent, its API server gone: the next request fails, and readiness says so
        kube.api.configuration.host = "https://127.0.0.1:1"
        try:
            kube.request("GET", f"/api/v1/nodes/{node}")
        except Exception:
            pass
        code, body = _get(url)
        assert code == 503 and "cannot connect to 127.0.0.1:1" in body, body
    finally:
        a.server.stop()
