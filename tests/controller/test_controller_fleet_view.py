"""`gpuwarden fleet` as a function of what was read (no API server) and the controller's options."""

from __future__ import annotations

import json

import pytest

from gpuwarden.agent.config import ConfigError
from gpuwarden.controller import fleet
from gpuwarden.controller.config import ControllerConfig, parse_args
from gpuwarden.controller.model import is_gpu_node
from gpuwarden.controller.quarantine import ANNOTATION
from gpuwarden.parsers.wallclock import format_rfc3339
from tests.controller.objects import T0, deployment, node, node_event


def nodes():
    return [
        node("gpu-ok"),
        node("gpu-dead", ready="Unknown", ready_at=T0 - 300,
             conds={"GPUUnchargedMemory": ("True", T0 - 400, "GpuNode001", "31 GiB of host memory uncharged")}),
        node("gpu-plugin", conds={"GPUDevicePlugin": ("True", T0 - 50, "GpuK8s001", "GetPreferredAllocation hangs"),
                                  "GPUDriver": ("False", T0 - 9000)}),
        node("gpu-cordoned"),
        node("cpu-1", gpus=0),
        node("labelled", gpus=0, labels={"nvidia.com/gpu.present": "true"}),
    ]


def test_gpu_node_definition():
    by = {n["metadata"]["name"]: n for n in nodes()}
    assert not is_gpu_node(by["cpu-1"])
    assert is_gpu_node(by["labelled"]) and is_gpu_node(by["gpu-ok"])
    assert is_gpu_node(node("cond-only", gpus=0, conds={"GPUDriver": ("False", T0)}))


def test_worst_first_with_findings_quarantines_breaker_and_leader():
    ns = nodes()
    ns[3]["spec"]["unschedulable"] = True
    events = [node_event("gpu-dead", "GpuNode001", T0 - 400, T0 - 100, count=4, message="GPU-NODE-001: 31 GiB"),
              node_event("gpu-ok", "GpuDev001", T0 - 99999),  # too old for --since
              {**node_event("x", "WorkloadQuarantined", T0 - 60), "involvedObject": {
                  "kind": "Deployment", "namespace": "ml", "name": "trainer"}}]
    rec = {"at": format_rfc3339(T0 - 60), "nodes": ["gpu-a", "gpu-dead"], "undo": {"kind": "Deployment", "replicas": 3},
           "chain": [{"node": "gpu-a", "failedAt": "t1", "signals": ["Ready=Unknown"], "pod": "ml/p1"},
                     {"node": "gpu-dead", "failedAt": "t2", "signals": ["Ready=Unknown"], "pod": "ml/p2"}]}
    dep = {**deployment("trainer", replicas=0, annotations={ANNOTATION: json.dumps(rec)}), "kind": "Deployment"}
    breaker = {"metadata": {"name": "gpuwarden-breaker", "namespace": "gpuwarden"},
               "data": {"open": "true", "reason": "gpuwarden controller: 3 of 3 GPU nodes"}}
    lease = {"metadata": {"name": "gpuwarden-controller", "namespace": "gpuwarden"},
             "spec": {"holderIdentity": "ctl-0", "leaseDurationSeconds": 15, "renewTime": format_rfc3339(T0 - 2)}}
    view = fleet.build(ns, events, [dep], breaker, lease, T0, 3600)
    names = [r["name"] for r in view["nodes"]]
    assert names == ["gpu-dead", "gpu-plugin", "gpu-cordoned", "gpu-ok", "labelled"]
    dead = view["nodes"][0]
    assert dead["state"] == "failing" and dead["ready"] == "Unknown"
    assert [f["code"] for f in dead["findings"]] == ["GPU-NODE-001", "GPU-NODE-001"]  # event (newer), condition
    assert dead["findings"][0]["count"] == 4
    assert view["nodes"][1]["state"] == "degraded" and view["nodes"][3]["findings"] == []
    assert view["summary"] == {"gpuNodes": 5, "failing": 1, "degraded": 2, "ok": 2, "quarantined": 1}
    assert view["quarantined"][0]["workload"] == "deployment/ml/trainer"
    assert view["breaker"]["open"] is True and view["controller"]["leader"] == "ctl-0"
    assert view["controller"]["current"] is True
    assert view["decisions"][0]["reason"] == "WorkloadQuarantined"
    json.dumps(view)  # serialisable
    text = fleet.render_text(view, T0)
    lines = text.splitlines()
    table = lines.index(next(ln for ln in lines if ln.startswith("NODE")))
    assert lines[table + 1].startswith("gpu-dead") and "FAIL" in lines[table + 1]
    assert "OPEN: the agents take no action" in text and "leader ctl-0, renewed 2s ago" in text
    assert "QUARANTINED WORKLOADS" in text and "nodes gpu-a -> gpu-dead" in text and "replicas=3" in text
    assert "gpuwarden release deployment/ml/trainer" in text
    assert "GPU-NODE-001" in text and "x4" in text


def test_empty_cluster_says_why():
    view = fleet.build([node("cpu", gpus=0)], [], [], None, None, T0)
    text = fleet.render_text(view, T0)
    assert "no GPU nodes" in text and "closed (no breaker ConfigMap)" in text and "has not run" in text


def test_controller_options():
    c = parse_args(["--window", "45m", "--storm-nodes", "5", "--actions", "workload,taint", "--execute",
                    "--skip-namespaces", "kube-system", "--skip-namespaces", "monitoring"])
    assert c.window_s == 2700 and c.storm_nodes == 5 and c.actions == ["workload", "taint"] and c.execute
    assert c.skip_namespaces == ["kube-system", "monitoring"]
    d = parse_args([]).resolved()
    assert d.execute is False and d.actions == ["workload", "node"] and d.cascade_nodes == 2 and d.window_s == 1800
    assert d.agent_namespace == d.namespace and d.namespace in d.skipped_namespaces
    for bad in (["--actions", "nuke"], ["--cascade-nodes", "1"], ["--window", "soon"],
                ["--lease-duration", "5s", "--renew-deadline", "10s"]):
        with pytest.raises(ConfigError):
            parse_args(bad)
    from click.testing import CliRunner

    from gpuwarden.cli import main

    assert "[default: 1800s]" in CliRunner().invoke(main, ["controller", "--help"]).output
    assert ControllerConfig().storm_fraction == 0.3
