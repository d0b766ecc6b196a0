"""`gpuwarden why SYMPTOM`: triage trees as data, the most likely cause first, what was ruled out."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuwarden import why as why_trees
from gpuwarden.cli import main
from gpuwarden.findings import Finding, Report, Severity, Skipped, Status
from gpuwarden.rules import all_rules
from tests.support.bundles import CAPTURE


def why(*args: str):
    return CliRunner().invoke(main, ["why", *args])


def test_tree_data_loads_and_names_real_rules() -> None:
    table = why_trees.symptoms()
    assert set(table) == {"nvml-unknown-error", "cuda-unknown-error", "pods-pending", "node-notready", "claim-pods-stuck"}
    codes = {r.code for r in all_rules()}
    for s in table.values():
        assert s.steps and set(s.rules) <= codes, (s.id, set(s.rules) - codes)


@pytest.mark.parametrize("text,want", [
    ("nvml-unknown-error", "nvml-unknown-error"),
    ("NVML Unknown Error", "nvml-unknown-error"),
    ("Failed to initialize NVML: Unknown Error", "nvml-unknown-error"),
    ("cudaGetDeviceCount returned 999 -> unknown error", "cuda-unknown-error"),
    ("CUDA error 802: system not yet initialized", "cuda-unknown-error"),
    ("0/8 nodes are available: 8 Insufficient nvidia.com/gpu", "pods-pending"),
    ("my pods are stuck pending", "pods-pending"),
    ("node NotReady", "node-notready"),
    ("pod stuck in ContainerCreating", "claim-pods-stuck"),
])
def test_symptom_matching(text: str, want: str) -> None:
    got, _ = why_trees.match(text)
    assert got is not None and got.id == want


def test_unknown_symptom_is_a_usage_error() -> None:
    r = why("the", "gpu", "is", "sad", "--example", "healthy")
    assert r.exit_code == 2 and "Candidates" in r.output and "pods-pending" in r.output


def test_nvml_unknown_error_on_cpu_manager_device_loss() -> None:
    r = why("NVML", "Unknown", "Error", "--example", "cpu-manager-device-loss")
    assert r.exit_code == 1, r.output
    out = r.stdout
    head, _, rest = out.partition("Ruled out (evaluated, nothing found):")
    assert "Most likely cause:" in head and "GPU-DEV-002" in head.split("Most likely cause:")[1].splitlines()[1]
    assert "GPU-DEV-003" in rest and "GPU-DRV-002" in rest
    assert "Could not be evaluated:" in rest and "GPU-DRV-006" in rest.split("Could not be evaluated:")[1]


def test_json_answer() -> None:
    r = why("cuda-unknown-error", "--example", "uvm-missing", "--format", "json")
    js = json.loads(r.stdout)
    assert js["schema"] == "gpuwarden.why/v1" and js["symptom"]["id"] == "cuda-unknown-error"
    assert js["causes"][0]["code"] == "GPU-DEV-001" and js["causes"][0]["step"] == 1
    assert "GPU-DRV-003" in {x["code"] for x in js["ruled_out"]}
    assert isinstance(js["not_evaluated"], list) and js["errors"] == [] and js["unknown_rules"] == []
    assert {"source": "kubelet log", "reason": "no file; journald not read"} in js["unavailable"]


def test_cuda_unknown_error_on_the_dra_example_names_the_claim() -> None:
    r = why("cuda-unknown-error", "--example", "dra-uvm-missing", "--format", "json")
    js = json.loads(r.stdout)
    assert r.exit_code == 1 and js["causes"][0]["code"] == "GPU-DRA-010"


def test_pods_pending_on_the_mig_hang_example() -> None:
    r = why("pods", "pending", "--example", "mig-nvml-hang", "--format", "json")
    js = json.loads(r.stdout)
    assert r.exit_code == 1 and js["causes"][0]["code"] == "GPU-K8S-001"


def test_healthy_capture_has_no_cause_and_gets_hints() -> None:
    r = why("node-notready", "--bundle", str(CAPTURE))
    assert r.exit_code == 0
    assert "No cause found" in r.stdout and "To look at by hand:" in r.stdout
    assert "GPU-HW-002" in r.stdout.split("Ruled out")[1]


def test_source_options_are_checks(tmp_path) -> None:
    r = why("pods-pending", "--example", "healthy", "--bundle", str(CAPTURE))
    assert r.exit_code == 2
    r = why("pods-pending", "--bundle", str(tmp_path / "nope.tgz"))
    assert r.exit_code == 2


def _finding(code: str, status: Status, sev: Severity) -> Finding:
    return Finding(code, status, sev, code, f"{code} summary")


def test_confirmed_before_at_risk_then_tree_order() -> None:
    sym = why_trees.symptoms()["pods-pending"]
    rep = Report(node={}, mode="bundle", findings=[
        _finding("GPU-K8S-001", Status.AT_RISK, Severity.HIGH),     # step 1, at risk
        _finding("GPU-K8S-003", Status.CONFIRMED, Severity.MEDIUM),  # step 3, confirmed
        _finding("GPU-K8S-002", Status.CONFIRMED, Severity.HIGH),    # step 2, confirmed
    ], skipped=[Skipped("GPU-DRV-006", "probes: disabled")])
    res = why_trees.evaluate(sym, rep, {r.code: r.title for r in all_rules()})
    assert [c.finding.code for c in res.causes] == ["GPU-K8S-002", "GPU-K8S-003", "GPU-K8S-001"]
    assert ("GPU-DRV-006", "probes: disabled") in res.not_evaluated
    assert "GPU-K8S-004" in [c for c, _, _ in res.ruled_out]


# --- not checked is never read as checked -------------------------------------------------------------


def _no_gpu_root(tmp_path):
    """A root whose PCI bus was read and holds no NVIDIA GPU, and no driver: a node with nothing to check."""
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    return str(tmp_path)


def test_not_checked_rules_nothing_out_and_says_so_first_and_last(tmp_path) -> None:
    r = why("nvml-unknown-error", "--root", _no_gpu_root(tmp_path), "--no-probes")
    assert r.exit_code == 4, r.output
    lines = r.stdout.splitlines()
    body = [ln for ln in lines[2:] if ln.strip()]  # after the symptom and node lines
    brief = json.loads(why("nvml-unknown-error", "--root", str(tmp_path), "--no-probes", "--format", "json").stdout)
    brief = brief["not_checked"].split(": ", 1)[0].split("; ", 1)[0]  # "no NVIDIA GPU on this host", or fewer rules run
    assert body[0].startswith(f"Not checked: {brief}")
    assert lines[-1] == f"Not checked: {brief}."
    assert "Ruled out" not in r.stdout and "No cause found" not in r.stdout
    assert r.stderr == ""  # said on stdout, not once more on stderr


def test_not_checked_json_has_nothing_ruled_out(tmp_path) -> None:
    r = why("nvml-unknown-error", "--root", _no_gpu_root(tmp_path), "--no-probes", "--format", "json")
    js = json.loads(r.stdout)
    assert r.exit_code == 4 and js["not_checked"]
    assert js["ruled_out"] == [] and js["causes"] == []
    sym = why_trees.symptoms()["nvml-unknown-error"]
    assert {x["code"] for x in js["not_evaluated"]} == set(sym.rules)
    assert "not checked" in r.stderr  # stdout is JSON: the reason is said on stderr too


def test_a_verdict_still_rules_out() -> None:
    """The negative: a report that is a verdict (a checked node, nothing found) rules its rules out."""
    sym = why_trees.symptoms()["pods-pending"]
    titles = {r.code: r.title for r in all_rules()}
    res = why_trees.evaluate(sym, Report(node={}, mode="bundle"), titles)
    assert res.not_evaluated == [] and len(res.ruled_out) == len(sym.rules)
    res = why_trees.evaluate(sym, Report(node={}, mode="bundle", not_checked="no rule was selected"), titles)
    assert res.ruled_out == [] and all(r == "not checked: no rule was selected" for _, r in res.not_evaluated)
