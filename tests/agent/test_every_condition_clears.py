"""Every rule that can raise a NodeCondition clears it once its cause is gone (issue 32, item 4).

Each case runs a real Agent (offline: its history, debounce and condition state, no API) on the
node one of the rule's positive tests builds, until the rule's code is raised (`debounce_raise`
checks), then on the same node with the cause gone (the healthy node it was built from: the
device reattached, the driver reloaded, the node rebooted, the plugin restarted …) and counts the
checks until the condition is cleared: exactly `debounce_clear`, never earlier, and the condition
type goes back to False. What "the cause is gone" means for a rule reading logs that stay on the
node (an Xid window, a plugin instance, a boot, a 10-minute storm window) is tested by that rule's
own `clears` tests beside its positive ones (tests/rules/).

tests/test_catalog.py requires a `clears` mark for every condition-raising rule.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.examples import open_example
from gpuwarden.kube.conditions import condition_type
from gpuwarden.root import HostRoot
from gpuwarden.rules.base import get_rule
from tests.rules import (test_device_causes as dc, test_devices as dv, test_driver as drv, test_hardware as hw,
                         test_kubelet_mps as km, test_memory as mem, test_plugin_runtime as pr)
from tests.probes import test_bounded_probes as bp
from tests.support.bundles import open_dir

RAISE, CLEAR = 2, 3


class Quiet:
    def info(self, *a, **k): ...
    warn = error = info


def _node_of(fn: Callable, tmp: Path):
    """Run a positive test (it asserts the finding) and return the root of the node it built."""
    if inspect.signature(fn).parameters:
        fn(tmp)
        [b] = [p.parent for p in tmp.rglob("meta.json")]
        return open_dir(b)
    fn()
    return None


#: code -> (positive test that builds the faulty node, example to use when the test builds none)
CASES = [
    pytest.param("GPU-DEV-001", dv.test_dev001_confirmed_on_uvm_missing, "uvm-missing",
                 marks=pytest.mark.rule("GPU-DEV-001", "clears")),
    pytest.param("GPU-DEV-002", dv.test_dev002_confirmed_on_cpu_manager_device_loss, "cpu-manager-device-loss",
                 marks=pytest.mark.rule("GPU-DEV-002", "clears")),
    pytest.param("GPU-DEV-003", dv.test_dev003_confirmed_on_systemd_reload_device_loss, "systemd-reload-device-loss",
                 marks=pytest.mark.rule("GPU-DEV-003", "clears")),
    pytest.param("GPU-DEV-004", pr.test_dev004_stale_node_link_and_cdi, None, marks=pytest.mark.rule("GPU-DEV-004", "clears")),
    pytest.param("GPU-DEV-005", pr.test_dev005_avc_denial, None, marks=pytest.mark.rule("GPU-DEV-005", "clears")),
    pytest.param("GPU-DRV-001", drv.test_drv001_gpu_node_without_module, None, marks=pytest.mark.rule("GPU-DRV-001", "clears")),
    pytest.param("GPU-DRV-002", drv.test_drv002_nvml_probe_error, None, marks=pytest.mark.rule("GPU-DRV-002", "clears")),
    pytest.param("GPU-DRV-003", drv.test_drv003_module_not_loaded_with_gpu_pods, None,
                 marks=pytest.mark.rule("GPU-DRV-003", "clears")),
    pytest.param("GPU-DRV-004", drv.test_drv004_persistence_off_and_driver_timeouts_confirmed, None,
                 marks=pytest.mark.rule("GPU-DRV-004", "clears")),
    pytest.param("GPU-DRV-005", drv.test_drv005_xid119_and_rminitadapter, None, marks=pytest.mark.rule("GPU-DRV-005", "clears")),
    pytest.param("GPU-DRV-007", drv.test_drv007_fabric_in_progress_confirmed, None,
                 marks=pytest.mark.rule("GPU-DRV-007", "clears")),
    pytest.param("GPU-HW-002", hw.test_hw002_xid79_confirmed_critical, None, marks=pytest.mark.rule("GPU-HW-002", "clears")),
    pytest.param("GPU-HW-003", hw.test_hw003_xid48_and_volatile_dbe, None, marks=pytest.mark.rule("GPU-HW-003", "clears")),
    pytest.param("GPU-HW-004", hw.test_hw004_remap_failure_confirmed_high, None, marks=pytest.mark.rule("GPU-HW-004", "clears")),
    pytest.param("GPU-HW-005", hw.test_hw005_nvlink_xids, None, marks=pytest.mark.rule("GPU-HW-005", "clears")),
    pytest.param("GPU-HW-006", hw.test_hw006_width_degraded_in_smi, None, marks=pytest.mark.rule("GPU-HW-006", "clears")),
    pytest.param("GPU-HW-007", hw.test_hw007_gpu_on_the_bus_not_in_the_driver, None,
                 marks=pytest.mark.rule("GPU-HW-007", "clears")),
    pytest.param("GPU-HW-008", hw.test_hw008_fatal_sxid_confirmed_per_switch_and_link, None,
                 marks=pytest.mark.rule("GPU-HW-008", "clears")),
    pytest.param("GPU-K8S-001", km.test_k8s001_confirmed_on_mig_nvml_hang, "mig-nvml-hang",
                 marks=pytest.mark.rule("GPU-K8S-001", "clears")),
    pytest.param("GPU-K8S-002", pr.test_k8s002_plugin_runs_without_a_socket, None, marks=pytest.mark.rule("GPU-K8S-002", "clears")),
    pytest.param("GPU-K8S-003", pr.test_k8s003_plugin_marked_unhealthy_on_xid63, None,
                 marks=pytest.mark.rule("GPU-K8S-003", "clears")),
    pytest.param("GPU-K8S-004", pr.test_k8s004_plugin_finds_no_nvml, None, marks=pytest.mark.rule("GPU-K8S-004", "clears")),
    pytest.param("GPU-K8S-005", pr.test_k8s005_allocated_but_absent, None, marks=pytest.mark.rule("GPU-K8S-005", "clears")),
    pytest.param("GPU-K8S-006", pr.test_k8s006_strategy_none_with_mig_enabled, None,
                 marks=pytest.mark.rule("GPU-K8S-006", "clears")),
    pytest.param("GPU-K8S-007", km.test_k8s007_confirmed_on_mps_binary_missing, "mps-binary-missing",
                 marks=pytest.mark.rule("GPU-K8S-007", "clears")),
    pytest.param("GPU-K8S-008", pr.test_k8s008_fs_watcher_crash_loop, None, marks=pytest.mark.rule("GPU-K8S-008", "clears")),
    pytest.param("GPU-K8S-010", pr.test_k8s010_requirement_error_logged, None, marks=pytest.mark.rule("GPU-K8S-010", "clears")),
    pytest.param("GPU-NODE-001", mem.test_incident_example_confirmed_critical, "driver-memory-cascade",
                 marks=pytest.mark.rule("GPU-NODE-001", "clears")),
]


def _agent(root) -> Agent:
    return Agent(AgentConfig(node_name="gpu-node-a", kube=False, listen="", probes=False, grpc=False, boot_grace_s=0,
                             debounce_raise=RAISE, debounce_clear=CLEAR), root=root, log=Quiet())


def _raise(a: Agent, code: str) -> str:
    ctype = condition_type(code, get_rule(code).family)
    raised = [a.check().transitions.get(code) for _ in range(RAISE)]
    assert raised[-1] == "raised", (code, raised)
    assert a.check().conditions[ctype] is True
    return ctype


def _clears(a: Agent, code: str, ctype: str) -> None:
    seen = [a.check() for _ in range(CLEAR)]
    assert [r.transitions.get(code) for r in seen] == [None] * (CLEAR - 1) + ["cleared"], code
    assert [r.conditions[ctype] for r in seen] == [True] * (CLEAR - 1) + [False]


@pytest.mark.parametrize("code, positive, example", CASES)
def test_the_condition_clears_after_debounce_clear_checks_once_the_cause_is_gone(code, positive, example, tmp_path):
    a = _agent(_node_of(positive, tmp_path) or open_example(example))
    ctype = _raise(a, code)
    a.root = open_example("healthy")  # the cause is gone
    _clears(a, code, ctype)


@pytest.mark.rule("GPU-K8S-009", "clears")
def test_operator_stack_stuck_clears_once_its_validations_complete(tmp_path):
    """Live tree (the operator's markers are read with their age): stuck at toolkit-ready for an hour, then done."""
    pr.test_k8s009_stuck_at_toolkit_live(tmp_path)
    host = tmp_path / "host"
    a = _agent(HostRoot(str(host)))
    ctype = _raise(a, "GPU-K8S-009")
    for s in ("toolkit-ready", "cuda-ready", "plugin-ready"):
        (host / "run/nvidia/validations" / s).write_text("")
    _clears(a, "GPU-K8S-009", ctype)


@pytest.mark.rule("GPU-K8S-011", "clears")
def test_mps_daemon_died_clears_once_a_daemon_serves_again(tmp_path):
    """Captured H100 nodes: the control daemon killed under its client, then the node with MPS healthy."""
    a = _agent(open_dir(km.DIED_MPS))
    ctype = _raise(a, "GPU-K8S-011")
    a.root = open_dir(km.HEALTHY_MPS)
    _clears(a, "GPU-K8S-011", ctype)


@pytest.mark.rule("GPU-DRV-006", "clears")
def test_nvml_hang_is_kept_while_nvml_is_not_asked_and_clears_once_it_answers(tmp_path):
    """A node without a probe record leaves the rule not evaluated: the raised fault stays (no probe is no
    proof); NVML answering again clears it after debounce_clear checks."""
    import json

    from tests.support.bundles import copy_example, write

    bp.test_a_timeout_the_kubelets_own_stalled_plugin_call_corroborates_is_confirmed(tmp_path / "hang")
    [b] = [p.parent for p in (tmp_path / "hang").rglob("meta.json")]
    a = _agent(open_dir(b))
    ctype = _raise(a, "GPU-DRV-006")
    a.root = open_example("healthy")  # no probe recorded: not evaluated
    assert [a.check().observed["GPU-DRV-006"] for _ in range(CLEAR + 1)] == ["unknown"] * (CLEAR + 1)
    ok = copy_example("healthy", tmp_path / "ok")
    write(ok, "/.gpuwarden/probes.json", json.dumps({"nvml": {"status": "ok", "elapsed_s": 0.1, "value": {"init": "ok"}}}))
    a.root = open_dir(ok)
    _clears(a, "GPU-DRV-006", ctype)


OWN_FAILURES = [
    # the probe child could not run or NVML could not be loaded in gpuwarden's own container: not the GPU's fault
    {"nvml": {"status": "error", "elapsed_s": 0.0, "detail": "fork failed: [Errno 12] Cannot allocate memory"}},
    {"nvml": {"status": "notfound", "elapsed_s": 0.0, "detail": "libnvidia-ml.so.1: cannot open shared object file"}},
    {"nvml": {"status": "error", "elapsed_s": 0.2, "value": None, "detail": "child exited 1 without a result"}},
    # the probe did not answer in time, once: gpuwarden's own deadline missed (GPU-DRV-006 at-risk), no verdict
    {"nvml": {"status": "timeout", "elapsed_s": 5.0, "detail": "snapshot did not return within 5s (child killed)"}},
]


@pytest.mark.parametrize("record", OWN_FAILURES, ids=["fork", "notfound", "child-exit", "timeout"])
def test_gpuwardens_own_probe_failures_are_never_a_hardware_verdict_and_never_latch(record, tmp_path):
    import json

    from gpuwarden import engine
    from gpuwarden.facts import NodeFacts
    from gpuwarden.findings import Status
    from tests.support.bundles import copy_example, write

    b = copy_example("healthy", tmp_path)
    write(b, "/.gpuwarden/probes.json", json.dumps(record))
    rep = engine.run(NodeFacts(open_dir(b)), engine.all_rules())
    assert [f.code for f in rep.findings if f.code.startswith("GPU-HW-")] == []
    confirmed = {f.code for f in rep.findings if f.status is Status.CONFIRMED}
    assert confirmed == set(), confirmed
    # and whatever the agent raised on it goes once the probe answers
    a = _agent(open_dir(b))
    for _ in range(RAISE):
        a.check()
    ok = copy_example("healthy", tmp_path / "ok")
    write(ok, "/.gpuwarden/probes.json", json.dumps({"nvml": {"status": "ok", "elapsed_s": 0.1, "value": {"init": "ok"}}}))
    a.root = open_dir(ok)
    last = [a.check() for _ in range(CLEAR)][-1]
    assert not any(last.conditions.values()), last.conditions


#: dcgm-exporter when DCGM's host engine is absent or down (its README's troubleshooting output, the
#: exporter's own wording: NVIDIA/dcgm-exporter), in the CRI log format of its pod
DCGM_ABSENT = "\n".join(f"2026-11-26T10:00:{i:02d}.000000000Z stderr F {line}" for i, line in enumerate([
    'level=INFO msg="Attempting to connect to remote hostengine at nvidia-dcgm:5555"',
    'level=ERROR msg="Failed to connect to remote hostengine" mode=standalone address=nvidia-dcgm:5555 '
    'error="error connecting to nv-hostengine: Host engine connection invalid/disconnected"',
] * 3)) + "\n"


def test_dcgm_absent_is_no_verdict_and_raises_nothing(tmp_path):
    """A node whose DCGM is gone (the eks-node-monitoring-agent #275 outage): gpuwarden reads no DCGM, and
    the exporter's errors in an NVIDIA pod log it does scan are no finding: no condition, nothing to clear."""
    from gpuwarden import engine
    from gpuwarden.facts import NodeFacts
    from tests.support.bundles import copy_example, write

    b = copy_example("healthy", tmp_path)
    write(b, "/var/log/pods/gpu-operator_nvidia-dcgm-exporter-x7k2p_0b8e1f52-6c1d-4d2a-9a51-2f0e7c3d4b6a/"
             "nvidia-dcgm-exporter/0.log", DCGM_ABSENT)
    base = {(f.code, f.status) for f in engine.run(NodeFacts(open_example("healthy")), engine.all_rules()).findings}
    rep = engine.run(NodeFacts(open_dir(b)), engine.all_rules())
    assert {(f.code, f.status) for f in rep.findings} == base
    a = _agent(open_dir(b))
    for _ in range(RAISE + 1):
        r = a.check()
    assert not any(r.conditions.values()), r.conditions
