"""docs/install.md's `apiserver` blocks and the chart's NOTES.txt commands, run as written with real
kubectl (and the kubectl-gpuwarden console script on PATH) against the real test API server.

The cluster is what `helm install` leaves: the chart rendered by Helm's engine, of which the
objects the test server serves (Namespace, ConfigMap, DaemonSet, Deployment) are created; two GPU
nodes, one labelled by "GFD" and one that the doc's `kubectl label node` block labels.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.support import docblocks

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gw_render_k8s_doc", REPO / "deploy" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)
SERVED = {("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
          ("apps/v1", "DaemonSet"): "/apis/apps/v1/namespaces/{ns}/daemonsets",
          ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments"}
NAMESPACE = "gpuwarden"  # the doc's and NOTES.txt's, literally


@pytest.fixture(scope="module")
def cluster(apiserver):
    """(env for the doc's commands, the doc's node name) on a cluster the chart was installed into."""
    from gpuwarden.kube.client import Kube
    from gpuwarden.kube.errors import KubeError

    kubectl = shutil.which("kubectl")
    script = shutil.which("kubectl-gpuwarden", path=str(Path(sys.executable).parent))
    if kubectl is None or script is None:
        pytest.skip(f"needs kubectl ({kubectl}) and the kubectl-gpuwarden console script ({script})")
    api = apiserver.api_client()
    kube = Kube(api)
    try:
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": NAMESPACE}})
    except KubeError as exc:
        if exc.status != 409:
            raise
    for o in render.objects({"namespace": NAMESPACE}):
        path = SERVED.get((o["apiVersion"], o["kind"]))
        if path:
            try:
                kube.request("POST", path.format(ns=NAMESPACE), o)
            except KubeError as exc:
                if exc.status != 409:
                    raise
    for name, labels in (("gpu-node-0", {"nvidia.com/gpu.present": "true"}), ("gpu-node-1", {})):
        try:
            kube.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                   "metadata": {"name": name, "labels": labels}})
        except KubeError as exc:
            if exc.status != 409:
                raise
    env = {**os.environ, "KUBECONFIG": apiserver.kubeconfig_path,
           "PATH": f"{Path(script).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    yield env, kube
    api.close()


def test_the_apiserver_blocks_of_install_md_run_as_written(cluster, tmp_path):
    env, kube = cluster
    ran = []
    for b in docblocks.blocks(REPO / "docs" / "install.md", "sh"):
        if b.mode != "apiserver":
            continue
        p = docblocks.run(b, tmp_path, env)
        assert p.returncode == 0, f"{b.id}:\n{b.body}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
        assert "Traceback" not in p.stderr
        ran.append(p.stdout)
    out = "\n".join(ran)
    assert len(ran) >= 4
    # the label block labelled the doc's node, and the node views then list it
    assert kube.request("GET", "/api/v1/nodes/gpu-node-1")["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert "gpu-node-0" in out and "gpu-node-1" in out
    assert "configmap/gpuwarden-breaker created" in out


def test_notes_txt_commands_run_against_the_api_server(cluster, tmp_path):
    from tests.deploy.test_install_doc import notes, notes_commands

    env, _ = cluster
    cmds = notes_commands(notes({"namespace": NAMESPACE}))
    for c in cmds:
        if " create configmap " in c:  # the breaker: opened, then closed again by the test
            c = f"{c} && kubectl -n {NAMESPACE} delete configmap gpuwarden-breaker"
        p = docblocks.run(docblocks.Block("NOTES.txt", 0, "sh", "apiserver", "", c), tmp_path, env)
        assert p.returncode == 0, f"{c}\n{p.stdout}\n{p.stderr}"
