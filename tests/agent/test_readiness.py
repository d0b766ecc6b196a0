"""/readyz is readiness, not liveness: 200 once a check completed and, with the Kubernetes API on,
the API server answered the agent's latest request; 503 saying why otherwise (docs/agent.md)."""

from __future__ import annotations

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.examples import open_example
from gpuwarden.kube.client import Kube
from tests.agent.test_agent_cycle import _get

#: a kubeconfig whose server refuses connections
REFUSING = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


class Quiet:
    def info(self, *a, **k): ...
    warn = error = info


def _agent(client=None, **kw):
    cfg = AgentConfig(node_name="gpu-node-a", listen="127.0.0.1:0", probes=False, grpc=False, boot_grace_s=0, **kw)
    return Agent(cfg, kube=client, root=open_example("uvm-missing"), log=Quiet())


def test_an_agent_that_cannot_reach_the_api_is_not_ready(tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text(REFUSING)
    a = _agent(client=Kube.from_config(str(kc), timeout_s=2), kube=True)
    a.start()
    try:
        url = f"http://{a.server.address}"
        a.check(), a.check()  # raised: conditions and Events are attempted, and fail
        code, body = _get(url + "/readyz")
        assert code == 503 and "cannot reach the API server: cannot connect to 127.0.0.1:1" in body, body
        assert _get(url + "/healthz")[0] == 200  # alive: not a reason to restart it
    finally:
        a.server.stop()


def test_an_agent_without_the_api_is_ready_after_a_check():
    a = _agent(kube=False)
    a.start()
    try:
        url = f"http://{a.server.address}"
        assert _get(url + "/readyz") == (503, "not ready: no successful check yet\n")
        a.check()
        assert _get(url + "/readyz") == (200, "ok\n")
    finally:
        a.server.stop()
