"""Rules that do not apply to a node (the DRA rules where there is no DRA) are no gap: reported apart as
"not applicable", out of the not-checked count and of the share a verdict needs (issue 44: `check
--example healthy` said "No problems found" and "Not checked: 5 rule(s)", four of them DRA rules).
One mechanism for every symptom: a node with no NVIDIA GPU says so first, whichever tree `why` runs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuwarden import engine, why
from gpuwarden.cli import main
from gpuwarden.facts import NodeFacts, Settings
from tests.support.bundles import copy_example, edit_meta, example_root, open_dir, report_of

DRA_NODE_RULES = ["GPU-DRA-010", "GPU-DRA-011", "GPU-DRA-012", "GPU-DRA-013"]


def test_dra_rules_on_a_node_without_dra_are_not_applicable_not_unchecked() -> None:
    rep = report_of(example_root("healthy"))
    assert [s.code for s in rep.not_applicable] == DRA_NODE_RULES
    assert all("no DRA on this node" in s.reason for s in rep.not_applicable)
    assert [s.code for s in rep.skipped] == ["GPU-DRV-006"]  # what was really not checked
    assert not rep.not_checked and not rep.findings
    out = CliRunner().invoke(main, ["check", "--example", "healthy"]).output
    assert "Not checked: 1 rule(s) not evaluated: GPU-DRV-006" in out
    assert "Not applicable: 4 rule(s) (GPU-DRA-010, GPU-DRA-011, GPU-DRA-012, GPU-DRA-013): no DRA on this node." in out
    js = json.loads(CliRunner().invoke(main, ["check", "--example", "healthy", "--format", "json"]).output)
    assert [x["code"] for x in js["not_applicable"]] == DRA_NODE_RULES
    assert "GPU-DRA-010" not in {x["code"] for x in js["not_evaluated"]}


def test_a_dra_node_has_none_not_applicable() -> None:
    """The negative: on a DRA node the DRA rules run (one finds the fault)."""
    rep = report_of(example_root("dra-uvm-missing"))
    assert rep.not_applicable == []
    assert "GPU-DRA-010" in {f.code for f in rep.findings}


@pytest.mark.parametrize("path,record", [
    ("/var/lib/kubelet/plugins_registry", ["denied", "EACCES"]),
    ("/var/lib/kubelet/dra_manager_state", ["denied", "EACCES"]),
    ("/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json", ["error", "EIO"]),
])
def test_unreadable_dra_evidence_is_a_gap_not_an_absence(tmp_path, path, record) -> None:
    """DRA may be there unseen: a registry or state file that cannot be read leaves the rules not evaluated."""
    b = copy_example("healthy", tmp_path)
    edit_meta(b, lambda m: m["missing"].__setitem__(path, record))
    rep = report_of(open_dir(b))
    assert rep.not_applicable == []
    assert set(DRA_NODE_RULES) <= {s.code for s in rep.skipped}


def test_an_empty_root_is_not_called_a_node_without_dra(tmp_path) -> None:
    """No kubelet directory at all: nothing says DRA is absent, so the DRA rules are not evaluated, and
    the empty root stays not checked."""
    (tmp_path / "e").mkdir()
    rep = engine.run(NodeFacts(open_dir_live(tmp_path / "e"), Settings(probes=False)), mode="live")
    assert rep.not_applicable == []
    assert set(DRA_NODE_RULES) <= {s.code for s in rep.skipped}
    assert rep.not_checked.startswith("only ")


def open_dir_live(path):
    from gpuwarden.root import HostRoot

    return HostRoot(str(path))


def test_only_not_applicable_rules_selected_is_not_checked() -> None:
    r = CliRunner().invoke(main, ["check", "--example", "healthy", "--select", "GPU-DRA-01"])
    assert r.exit_code == 4 and "none of the 4 selected rule(s) applies to this node" in r.output
    assert "No problems found" not in r.output


def test_the_share_a_verdict_needs_counts_only_rules_that_apply() -> None:
    facts = NodeFacts(example_root("healthy"), Settings(probes=False))
    # 20 chosen, 10 of them not applicable: 4 of the 10 that apply is too few, 5 is half
    assert engine.not_checked(facts, 10, 4, [], chosen=20).startswith("only 4 of 10 ")
    assert engine.not_checked(facts, 10, 5, [], chosen=20) == ""
    assert engine.not_checked(facts, 0, 0, [], chosen=4) == "none of the 4 selected rule(s) applies to this node"


def _no_gpu_root(tmp_path):
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    return str(tmp_path)


@pytest.mark.parametrize("symptom", list(why.symptoms()))
def test_every_symptom_on_a_host_without_gpu_says_so_and_suggests_an_example(tmp_path, symptom) -> None:
    """`why claim-pods-stuck` said only that no rule could be evaluated; every tree now says what
    `why nvml-unknown-error` says: no NVIDIA GPU here, try --example."""
    r = CliRunner().invoke(main, ["why", symptom, "--root", _no_gpu_root(tmp_path), "--no-probes"])
    assert r.exit_code == 4, r.output
    body = [ln for ln in r.stdout.splitlines()[2:] if ln.strip()]
    assert body[0].startswith("Not checked: no NVIDIA GPU on this host") and "--example" in body[0], body[0]
    assert r.stdout.splitlines()[-1] == "Not checked: no NVIDIA GPU on this host."


def test_a_gpu_node_is_not_said_to_have_none() -> None:
    """The negative: a node with its GPU (an example) gets a verdict from the same tree."""
    r = CliRunner().invoke(main, ["why", "claim-pods-stuck", "--example", "dra-uvm-missing"])
    assert "no NVIDIA GPU" not in r.output and r.exit_code == 1
