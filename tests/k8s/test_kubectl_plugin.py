"""`kubectl gpuwarden` against the real test API server: node view, one-shot check pod, fleet.

The plugin runs as a person would run it: under their own identity (alice, in the group gpu-sre),
bound by the chart's values (`kubectl.checkers`) to the chart's kubectl roles, with RBAC enforced
(tools/testapiserver --authz-file). Every invocation fails its test on a request refused (403), and
`test_the_plugin_uses_exactly_its_roles` on any granted (rule, verb) the plugin never used. The
tests' own set-up (Nodes, the agent, the kubelet) runs as the cluster admin.

The test server runs no kubelet, so the tests play its part for the check pod: they read the pod
the plugin created, run a real local `gpuwarden check --example ... --termination-message FILE`
and post that file as the container's termination message in the pod's status, as the kubelet
would. The node view reads what a real agent (gpuwarden.agent.loop.Agent) published.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden.examples import open_example
from gpuwarden.kube.client import Kube
from gpuwarden.kube.errors import KubeError
from gpuwarden.kubectl import checkpod
from gpuwarden.kubectl.cli import main
from gpuwarden.parsers.wallclock import format_rfc3339
from tests.support.agent_kube import cleanup_nodes, ensure_namespace, make_node, new_agent
from tests.support.apiserver import ApiServerUnavailable, start_apiserver
from tests.support.rbac import chart_authz, denied, least_privilege_report

pytestmark = pytest.mark.apiserver
REPO = Path(__file__).resolve().parents[2]
USER, GROUPS = "alice@example.com", ("gpu-sre",)
USER_TOKEN = os.urandom(12).hex()


@pytest.fixture(scope="module")
def apiserver():
    """This module's server: the chart's RBAC enforced, gpu-sre bound to its kubectl roles by the
    chart's own values, alice's token in gpu-sre; the release namespace (the check pods') exists."""
    authz, ids = chart_authz("off", {"execute": False}, [],
                             values={"kubectl": {"checkers": [{"kind": "Group", "name": GROUPS[0]}]}})
    authz["tokens"][USER_TOKEN] = {"user": USER, "groups": list(GROUPS), "extra": {}}
    try:
        server = start_apiserver(authz=authz)
    except ApiServerUnavailable as exc:
        pytest.skip(f"REAL API SERVER UNAVAILABLE: {exc}")
    server.authz, server.check_namespace = authz, ids.namespace
    ensure_namespace(Kube(server.api_client()), ids.namespace)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube(k8s):
    kb = Kube(k8s.api)
    yield kb
    cleanup_nodes(kb)


def plugin(k8s, *args: str):
    """`kubectl gpuwarden ARGS` as alice; fails the test on any request RBAC refused her."""
    seen = len(k8s.server.audit())
    r = CliRunner().invoke(main, [*args, "--kubeconfig", k8s.server.kubeconfig_for(USER_TOKEN)])
    refused = denied(k8s.server.audit()[seen:], USER)
    assert not refused, f"kubectl gpuwarden {' '.join(args)}: {USER} was refused {refused}"
    return r


def check_pods(kube: Kube, namespace: str) -> list[dict]:
    return kube.list_pods(namespace=namespace, label_selector="app.kubernetes.io/component=check")


class Kubelet(threading.Thread):
    """Plays the kubelet for one check pod: waits for it, checks its spec, posts a real report."""

    def __init__(self, kube: Kube, namespace: str, node: str, example: str, tmp: Path, message: bool = True):
        super().__init__(daemon=True)
        self.kube, self.ns, self.node, self.example, self.tmp, self.message = kube, namespace, node, example, tmp, message
        self.pod: dict | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 20
            while not (pods := check_pods(self.kube, self.ns)):
                assert time.monotonic() < deadline, "the plugin created no check pod"
                time.sleep(0.1)
            self.pod = pod = pods[0]
            term = self.tmp / "termination-log"
            p = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--example", self.example, "--format",
                                "json", "--termination-message", str(term)], capture_output=True, text=True,
                               timeout=60, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
            state = {"terminated": {"exitCode": p.returncode, "reason": "Error" if p.returncode else "Completed",
                                    "message": term.read_text() if self.message else ""}}
            status = {"status": {"phase": "Failed" if p.returncode else "Succeeded",
                                 "containerStatuses": [{"name": "check", "ready": False, "restartCount": 0,
                                                        "image": pod["spec"]["containers"][0]["image"],
                                                        "imageID": "", "state": state}]}}
            md = pod["metadata"]
            self.kube.request("PATCH", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/status", status,
                              content_type="application/merge-patch+json")
        except BaseException as e:  # reported by the test
            self.error = e


def check_with_kubelet(kube, k8s, tmp_path, example: str, *args: str, message: bool = True):
    """`kubectl gpuwarden check NODE` on a fresh node while the test plays its kubelet: (result, kubelet)."""
    node = k8s.name("gpu-node")
    make_node(kube, node)
    namespace = k8s.server.check_namespace
    kubelet = Kubelet(kube, namespace, node, example, tmp_path, message=message)
    kubelet.start()
    r = plugin(k8s, "check", node, "-n", namespace, "--timeout", "30", *args)
    kubelet.join(30)
    assert kubelet.error is None, kubelet.error
    return r, kubelet


def test_check_runs_a_pinned_privileged_pod_and_reads_its_termination_message(kube, k8s, tmp_path):
    r, kubelet = check_with_kubelet(kube, k8s, tmp_path, "uvm-missing", "--image", "registry.example/gw:test")
    node = kubelet.node
    assert r.exit_code == 1, r.output  # a high finding
    assert "GPU-DEV-001" in r.stdout and "evidence:" in r.stdout and "fix:" in r.stdout
    # the pod was what `kubectl debug node/...` would run, and it is gone
    spec = kubelet.pod["spec"]
    c = spec["containers"][0]
    assert spec["nodeName"] == node and spec["hostPID"] is True and spec["hostNetwork"] is True
    assert spec["restartPolicy"] == "Never"
    assert spec["tolerations"] == [{"operator": "Exists"}] and spec["activeDeadlineSeconds"] > 30
    assert c["image"] == "registry.example/gw:test" and c["securityContext"]["privileged"] is True
    assert [c["command"][0], *c["args"][:5]] == ["gpuwarden", "check", "--root", "/host", "--format", "json"]
    assert c["terminationMessagePath"] == "/dev/termination-log"
    host = {m["mountPath"]: m for m in c["volumeMounts"]}["/host"]
    assert host["readOnly"] is True
    assert {v["name"]: v for v in spec["volumes"]}["host"]["hostPath"]["path"] == "/"
    assert check_pods(kube, k8s.server.check_namespace) == []


def test_check_json_is_the_report_the_node_gave(kube, k8s, tmp_path):
    r, _ = check_with_kubelet(kube, k8s, tmp_path, "mig-nvml-hang", "--format", "json")
    report = json.loads(r.stdout)
    assert report["schema"] == "gpuwarden.report/v1"
    assert {f["code"] for f in report["findings"]} == {"GPU-K8S-001", "GPU-DRV-004"}
    assert report["findings"][0]["evidence"]  # whole, not reduced


def test_check_too_big_for_the_message_falls_back_to_the_log_then_to_the_reduced_report(kube, k8s, tmp_path):
    """The test server serves no pods/log (no kubelet): the plugin says so and shows the reduced report."""
    r, _ = check_with_kubelet(kube, k8s, tmp_path, "driver-memory-cascade")
    assert r.exit_code == 1 and "GPU-NODE-001" in r.stdout
    assert "cannot read the pod's log" in r.stderr and "reduced to fit the termination message" in r.stderr
    assert check_pods(kube, k8s.server.check_namespace) == []


def test_check_without_a_report_says_so(kube, k8s, tmp_path):
    r, _ = check_with_kubelet(kube, k8s, tmp_path, "healthy", message=False)
    assert r.exit_code == 2 and "no readable report" in r.stderr and "Traceback" not in r.output


def test_check_times_out_with_the_reason_and_deletes_the_pod(kube, k8s):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    t0 = time.monotonic()
    r = plugin(k8s, "check", node, "-n", k8s.server.check_namespace, "--timeout", "2")
    assert time.monotonic() - t0 < 15
    assert r.exit_code == 2 and "did not finish within 2 s (phase Pending)" in r.stderr, r.output
    assert check_pods(kube, k8s.server.check_namespace) == []


def test_check_of_a_pod_that_failed_before_its_container_ran(kube, k8s):
    """activeDeadlineSeconds or an eviction ends the pod with no container result: say so, at once."""
    node = k8s.name("gpu-node")
    make_node(kube, node)

    def fail_it():
        deadline = time.monotonic() + 20
        while not (pods := check_pods(kube, k8s.server.check_namespace)) and time.monotonic() < deadline:
            time.sleep(0.1)
        md = pods[0]["metadata"]
        kube.request("PATCH", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/status",
                     {"status": {"phase": "Failed", "reason": "DeadlineExceeded",
                                 "message": "Pod was active on the node longer than the specified deadline"}},
                     content_type="application/merge-patch+json")

    t = threading.Thread(target=fail_it, daemon=True)
    t.start()
    t0 = time.monotonic()
    r = plugin(k8s, "check", node, "-n", k8s.server.check_namespace, "--timeout", "30")
    t.join(20)
    assert time.monotonic() - t0 < 15
    assert r.exit_code == 2 and "ended (Failed: DeadlineExceeded" in r.stderr, r.output
    assert check_pods(kube, k8s.server.check_namespace) == []


def test_check_unknown_node_creates_nothing(kube, k8s):
    r = plugin(k8s, "check", "no-such-node", "-n", k8s.server.check_namespace, "--timeout", "5")
    assert r.exit_code == 2 and "no node 'no-such-node'" in r.stderr
    assert check_pods(kube, k8s.server.check_namespace) == []


def test_node_shows_what_the_agent_published(kube, k8s):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    agent, _ = new_agent(kube, node, open_example("uvm-missing"), k8s.namespace)
    agent.check()
    agent.check()  # debounce_raise=2: raised
    r = plugin(k8s, "node", node, "--format", "json")
    assert r.exit_code == 1, r.output
    view = json.loads(r.stdout)
    gda = view["node"]["conditions"]["GPUDeviceAccess"]
    assert (gda["status"], gda["reason"]) == ("True", "GpuDev001")
    assert view["node"]["conditions"]["GPUDriver"]["status"] == "False"
    assert any(f["code"] == "GPU-DEV-001" and f["source"] == "event" for f in view["node"]["findings"])
    # the agent's Event about its pod is on the Node, the pod related: listed under the pod, not as a node finding
    assert [(p["pod"], p["reason"]) for p in view["podEvents"]] == [("ml/trainer-0", "GpuDev001")]
    assert len([f for f in view["node"]["findings"] if f["source"] == "event"]) == 1
    text = plugin(k8s, "node", node)
    assert text.exit_code == 1
    assert "GPUDeviceAccess" in text.stdout and "GpuDev001" in text.stdout and "GPU-DEV-001" in text.stdout


def test_node_reads_events_by_what_they_are_about(kube, k8s):
    """An Event is filed under the object it is about: one labelled for this node or reported by its name
    but about another Node is not this node's, and one about this Node shows whatever its label says
    (the chart's policy keeps an agent from writing either; docs/security.md)."""
    node, other = k8s.name("gpu-node"), k8s.name("gpu-node")
    make_node(kube, node)
    make_node(kube, other)

    def ev(about: str, label: str, reason: str) -> None:
        kube.create_event("default", {
            "metadata": {"name": f"{about}.{reason.lower()}", "labels": {"gpuwarden.io/node": label}},
            "involvedObject": {"kind": "Node", "name": about, "apiVersion": "v1"}, "type": "Warning",
            "reason": reason, "message": f"{reason}: probe", "count": 1, "reportingComponent": "gpuwarden",
            "source": {"component": "gpuwarden", "host": label}, "reportingInstance": label,
            "firstTimestamp": format_rfc3339(time.time()), "lastTimestamp": format_rfc3339(time.time())})

    ev(other, node, "GpuDrv004")  # labelled and reported as `node`, about `other`
    ev(node, other, "GpuHw002")  # about `node`, whatever its label
    view = json.loads(plugin(k8s, "node", node, "--format", "json").stdout)
    assert [f["code"] for f in view["node"]["findings"] if f["source"] == "event"] == ["GPU-HW-002"]


def test_node_without_agent_and_unknown_node(kube, k8s):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    r = plugin(k8s, "node", node)
    assert r.exit_code == 0 and "no gpuwarden conditions" in r.stdout
    r = plugin(k8s, "node", "no-such-node")
    assert r.exit_code == 2 and "no node 'no-such-node'" in r.stderr


def test_fleet_is_gpuwarden_fleet(kube, k8s):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    r = plugin(k8s, "fleet", "--format", "json")
    assert r.exit_code == 0, r.output
    assert node in [n["name"] for n in json.loads(r.stdout)["nodes"]]


def test_kubectl_finds_the_plugin_on_path(kube, k8s):
    """`kubectl gpuwarden ...`: real kubectl, the console script on PATH, as an operator runs it."""
    kubectl = shutil.which("kubectl")
    script = shutil.which("kubectl-gpuwarden", path=str(Path(sys.executable).parent))
    if kubectl is None or script is None:
        pytest.skip(f"needs kubectl ({kubectl}) and the kubectl-gpuwarden console script ({script}) on PATH")
    node = k8s.name("gpu-node")
    make_node(kube, node)
    env = {**os.environ, "PATH": f"{Path(script).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": k8s.server.kubeconfig_for(USER_TOKEN)}
    p = subprocess.run([kubectl, "gpuwarden", "node", node], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert f"node {node}:" in p.stdout


def test_pod_manifest_is_valid_for_the_api(kube, k8s):
    """The API server takes the manifest as it is (names, namespaces)."""
    body = checkpod.pod_manifest("n1", k8s.namespace)
    created = kube.request("POST", f"/api/v1/namespaces/{k8s.namespace}/pods", body)
    try:
        assert created["spec"]["containers"][0]["args"][-2:] == ["--termination-message", "/dev/termination-log"]
    finally:
        try:
            kube.delete_pod(k8s.namespace, body["metadata"]["name"], grace_s=0)
        except KubeError:
            pass


def test_the_plugin_uses_exactly_its_roles(kube, k8s, tmp_path):
    """fleet, node and check (its report through the log too), as alice: the plugin was refused
    nothing in this module, and used every (rule, verb) the chart's kubectl roles grant her."""
    node = k8s.name("gpu-node")
    make_node(kube, node)
    assert plugin(k8s, "fleet").exit_code == 0
    assert plugin(k8s, "node", node).exit_code == 0
    r, _ = check_with_kubelet(kube, k8s, tmp_path, "driver-memory-cascade")  # too big: pods/log
    assert r.exit_code == 1 and "cannot read the pod's log" in r.stderr
    refused, unused = least_privilege_report(k8s.server.audit(), k8s.server.authz, USER, GROUPS)
    assert not refused, f"{USER} was refused: {refused}"
    assert not unused, f"{USER} is granted and never used: {unused}"


def test_node_keeps_the_newest_events_of_a_stream():
    """25,000 Events of one node are read as a stream: the newest MAX_EVENTS are kept, trimmed."""
    from gpuwarden.kubectl import nodeview

    def events():
        for i in range(3 * nodeview.MAX_EVENTS):
            yield {"metadata": {"name": f"e{i}", "managedFields": [{"x": "y" * 100}]}, "reason": "GpuDrv003",
                   "type": "Warning", "message": "m" * 5000, "involvedObject": {"kind": "Node", "name": "n"},
                   "lastTimestamp": format_rfc3339(1_800_000_000 + (i * 7919) % 100_000)}

    kept = nodeview.newest(events())
    assert len(kept) == nodeview.MAX_EVENTS
    times = [e["lastTimestamp"] for e in kept]
    assert times == sorted(times, reverse=True)
    everything = sorted((format_rfc3339(1_800_000_000 + (i * 7919) % 100_000) for i in range(3 * nodeview.MAX_EVENTS)),
                        reverse=True)
    assert times == everything[:nodeview.MAX_EVENTS]
    assert "managedFields" not in kept[0]["metadata"] and len(kept[0]["message"]) <= 512
    view = nodeview.build({"metadata": {"name": "n"}}, kept, 1_800_100_000.0)
    assert view["eventsCapped"] and "the newest 500" in nodeview.render_text(view, 1_800_100_000.0)
