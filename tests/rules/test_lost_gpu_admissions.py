"""GPU-K8S-012 from the API server's rejected pods: the kubelet at its default verbosity logs no rejection,
but the pod's status says it (phase Failed, reason UnexpectedAdmissionError, "Pod was rejected: Allocate
failed due to …, which is unexpected": Kubelet.rejectPod, pkg/kubelet/cm/admission/errors.go; its
status.startTime is the rejection, set by the status manager). With a GPU the plugin reports lost, one such
pod naming a GPU in the last 10 minutes confirms the storm; pods rejected for anything else never count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden import engine
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Severity, Status
from tests.rules.test_hardware import SECOND_UUID, _later, _two_gpus
from tests.rules.test_lost_gpu import GPA_LOST, NVLINK_LOST, klog
from tests.support.bundles import GPU_UUID, open_dir
from tests.parsers.test_admission_rejections import CAPTURED, NOT_GPU, rejected
from tests.support.gpunode import healthy, plugin_log

CODE = "GPU-K8S-012"


def check(b: Path, pods: Any) -> list:
    calls = []

    def read() -> Any:
        calls.append(1)
        if isinstance(pods, Exception):
            raise pods
        return pods

    facts = NodeFacts(open_dir(b), Settings(admission_pods=read))
    rep = engine.run(facts, engine.select(engine.all_rules(), (CODE,)), mode="bundle")
    assert len(calls) <= 1
    return [f for f in rep.findings if f.code == CODE]


def plugin_lost(b: Path, uuid: str = GPU_UUID) -> None:
    plugin_log(b, klog(f"Marking device {uuid} as unhealthy: GPU is lost"))


@pytest.mark.rule(CODE, "positive")
def test_k8s012_plugin_lost_gpu_and_one_pod_rejected_at_admission_is_confirmed_with_the_pod_named(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    assert [f.status for f in check(b, [])] == [Status.AT_RISK]  # no rejection yet: at risk, not fenced
    [f] = check(b, [rejected("trainer-1", GPA_LOST)])
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    # the example's trainer-0 holds the GPU (rules/held_devices.py): named with it
    assert f.summary.startswith("GPU 0 (0000:00:06.0) of 1 (held by pod(s) ml/trainer-0) is lost and the kubelet "
                                "rejected 1 GPU pod(s) at admission since 2026-11-22 02:12:36Z (ml/trainer-1)")
    assert f.affected[0].uuid == GPU_UUID
    [p] = f.data["pods"]
    assert (p["namespace"], p["name"], p["uid"], p["time"]) == ("ml", "trainer-1", "uid-trainer-1", CAPTURED - 5)
    assert p["message"] == GPA_LOST
    assert any(e.source == "Pod ml/trainer-1 status (API server: pods of this node)"
               and e.text == f"rejected 2026-11-22 02:12:36Z (status.startTime): UnexpectedAdmissionError: {GPA_LOST}"
               for e in f.evidence)
    assert any("Marking device" in e.text for e in f.evidence)


@pytest.mark.rule(CODE, "positive")
def test_k8s012_replica_mig_and_device_id_rejections_count_on_the_lost_gpu_of_two(tmp_path: Path) -> None:
    b = _two_gpus(tmp_path)
    plugin_lost(b, SECOND_UUID)
    _later(b, 60)  # the plugin started 5 s before the capture: a minute of rejections since
    pods = [rejected("a", NVLINK_LOST, CAPTURED + 30),
            rejected("b", "requested number of devices unavailable for nvidia.com/gpu.shared. Requested: 1, Available: 0",
                     CAPTURED + 40, resources={"nvidia.com/gpu.shared": "1"}),
            rejected("c", "requested number of devices unavailable for nvidia.com/mig-1g.10gb. Requested: 1, Available: 0",
                     CAPTURED + 50, resources={"nvidia.com/mig-1g.10gb": "1"}),
            rejected("d", f"device plugin Allocate rpc failed with err: unknown device {SECOND_UUID}::3", CAPTURED + 55)]
    [f] = check(b, pods)
    assert f.status is Status.CONFIRMED and "GPU 1 (0000:00:07.0) of 2 is lost" in f.summary
    assert f.data["rejected"] == 4 and [p["name"] for p in f.data["pods"]] == ["a", "b", "c", "d"]
    assert f.affected[0].uuid == SECOND_UUID


@pytest.mark.rule(CODE, "negative")
def test_k8s012_rejections_for_anything_but_a_gpu_never_count(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    [f] = check(b, NOT_GPU)
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH


@pytest.mark.rule(CODE, "negative")
def test_k8s012_pods_rejected_long_ago_or_before_the_plugin_started_do_not_count(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    # the plugin's current instance started at CAPTURED - 5: a rejection before it was its predecessor's
    [f] = check(b, [rejected("old", GPA_LOST, CAPTURED - 601), rejected("older", GPA_LOST, CAPTURED - 86400),
                    rejected("before-restart", GPA_LOST, CAPTURED - 10)])
    assert f.status is Status.AT_RISK


@pytest.mark.rule(CODE, "negative")
def test_k8s012_rejections_without_a_lost_gpu_confirm_nothing_and_a_healthy_node_never_asks(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    assert check(b, RuntimeError("must not be read")) == []  # no GPU lost: the API is not asked
    assert check(b, [rejected("trainer-1", GPA_LOST)]) == []


@pytest.mark.rule(CODE, "negative")
def test_k8s012_api_unreadable_stays_at_risk_and_says_so(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    [f] = check(b, RuntimeError("HTTP 0 connection refused"))
    assert f.status is Status.AT_RISK
    assert any(e.text.startswith("not read: the API server: RuntimeError: HTTP 0") for e in f.evidence)
    [f] = check(b, {"kind": "Status"})  # garbage answer
    assert f.status is Status.AT_RISK


@pytest.mark.rule(CODE, "clears")
def test_k8s012_from_the_api_clears_when_rejections_stop_and_the_gpu_is_back(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    pods = [rejected("trainer-1", GPA_LOST)]
    assert check(b, pods)[0].status is Status.CONFIRMED
    _later(b, 601)  # ten minutes without a new rejection: the GPU is still lost, at risk again (not fenced)
    assert [f.status for f in check(b, pods)] == [Status.AT_RISK]
    plugin_log(b, klog("Starting to serve 'nvidia.com/gpu'"), n=1)  # the GPU is back, the plugin restarted
    assert check(b, pods) == []
