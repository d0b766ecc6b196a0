"""docs/install.md and the chart's NOTES.txt as a new user meets them (no API server needed here).

Every shell block of docs/install.md carries a doc-test marker and parses; the `local` blocks run
as written in a scratch directory beside a copy of deploy/, and what they write is used as the doc
says (the values file rendered by Helm's engine and loaded by the agent's own config loader, the
kustomize overlay built by kubectl). NOTES.txt is rendered by Helm's engine (helm-python-sdk) and
every command in it parses as a shell command. tests/k8s/test_install_doc_apiserver.py runs the
`apiserver` blocks and NOTES.txt's commands against the real test API server.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from gpuwarden.agent.config import from_mapping
from tests.support import docblocks

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "docs" / "install.md"
_spec = importlib.util.spec_from_file_location("gw_render_doc", REPO / "deploy" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

SH = docblocks.blocks(INSTALL, "sh")


def notes(overrides: dict | None = None) -> str:
    return next(v for k, v in render.template(overrides).items() if k.endswith("NOTES.txt"))


def notes_commands(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if re.match(r"^\s+(kubectl|helm) ", ln)]


@pytest.mark.parametrize("block", SH, ids=lambda b: b.id)
def test_every_block_is_marked_and_parses(block: docblocks.Block) -> None:
    assert block.mode in docblocks.MODES, f"{block.id}: no <!-- doc-test: ... --> marker before this block"
    if block.mode == "parse":
        assert block.why, f"{block.id}: a parse-only block says why it cannot run here"
    assert docblocks.bash_syntax_error(block.body) == "", block.body


def test_the_install_path_has_each_step() -> None:
    text = INSTALL.read_text()
    # the image is not published: the doc says so and shows image.repository
    assert "No public image is published" in text and "image.repository" in text
    # the GPU label is explained, with how to set it when nothing does
    assert "GPU Feature Discovery" in text and "kubectl label node" in text
    modes = [b.mode for b in SH]
    assert modes.count("apiserver") >= 3 and modes.count("local") >= 2


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The local blocks, run in order in one scratch directory beside a copy of deploy/."""
    d = tmp_path_factory.mktemp("install-doc")
    shutil.copytree(REPO / "deploy", d / "deploy")
    work = d / "work"
    work.mkdir()
    shutil.copytree(REPO / "deploy", work / "deploy")  # the overlay's ../deploy and the user's checkout
    env = {**os.environ}
    for b in (b for b in SH if b.mode == "local"):
        if "kubectl " in b.body and not shutil.which("kubectl"):
            pytest.skip("kubectl is not installed (it builds the kustomize overlay)")
        p = docblocks.run(b, work, env)
        assert p.returncode == 0, f"{b.id}:\n{b.body}\n{p.stdout}\n{p.stderr}"
        (work / f"out-{b.line}.txt").write_text(p.stdout)
    return work


def test_the_values_file_of_the_doc_renders_a_valid_agent_config(scratch: Path) -> None:
    values = yaml.safe_load((scratch / "my-values.yaml").read_text())
    objs = render.objects(values)
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and "agent.yaml" in o.get("data", {}))
    cfg = from_mapping(yaml.safe_load(cm["data"]["agent.yaml"]))
    assert cfg.remediate == "dry-run" and cfg.interval_s == 30 and cfg.root == "/host"
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/team/gpuwarden:0.1.0"


def test_the_kustomize_overlay_of_the_doc_sets_the_image(scratch: Path) -> None:
    out = "".join(p.read_text() for p in scratch.glob("out-*.txt"))
    images = set(re.findall(r"image:\s*(\S+)", out))
    assert images == {"registry.example.com/team/gpuwarden:0.1.0"}, out


def test_the_sample_agent_yaml_of_docs_agent_md_loads() -> None:
    [sample] = [b for b in docblocks.blocks(REPO / "docs" / "agent.md", "yaml") if "agent.yaml" in b.body]
    cfg = from_mapping(yaml.safe_load(sample.body))
    assert cfg.remediate == "dry-run" and cfg.kubelet_log


def test_the_chart_values_agent_block_is_a_valid_agent_config() -> None:
    from_mapping(render.load_values()["agent"]).validate()


def test_notes_commands_parse_as_shell() -> None:
    text = notes()
    cmds = notes_commands(text)
    assert len(cmds) >= 4, text
    for c in cmds:
        assert docblocks.bash_syntax_error(c) == "", c
    assert "custom-columns" in text and "no public image" in text


def test_the_daemonset_selects_gpu_nodes_by_any_known_label() -> None:
    ds = next(o for o in render.objects() if o["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {t["matchExpressions"][0]["key"] for t in terms}
    assert keys == {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    assert "nodeSelector" not in spec
    every = next(o for o in render.objects({"gpuNodeLabels": None}) if o["kind"] == "DaemonSet")
    assert "affinity" not in every["spec"]["template"]["spec"]


def _gpu_nodes(tmp_path: Path, nodes: list[dict], labels: dict) -> str:
    """The chart's gpuwarden.gpuNodes helper (NOTES.txt's count) on a NodeList of our own."""
    chart = tmp_path / "chart"
    shutil.copytree(render.CHART, chart)
    (chart / "templates" / "probe.yaml").write_text(
        "{{- $nodes := fromJson (toJson .Values.probeNodes) }}\n"
        "probe: {{ include \"gpuwarden.gpuNodes\" (dict \"nodes\" $nodes \"labels\" .Values.gpuNodeLabels) | quote }}\n")
    import helm_python as helm

    with helm.Chart.load(str(chart)) as c:
        out = c.render({"probeNodes": {"items": nodes}, "gpuNodeLabels": labels}, name="gpuwarden", namespace="x")
    return yaml.safe_load(next(v for k, v in out.items() if k.endswith("probe.yaml")))["probe"]


def test_notes_counts_the_nodes_the_daemonset_selects(tmp_path: Path) -> None:
    nodes = [{"metadata": {"name": "gfd", "labels": {"nvidia.com/gpu.present": "true"}}},
             {"metadata": {"name": "nfd", "labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}}},
             {"metadata": {"name": "cpu", "labels": {"kubernetes.io/os": "linux"}}},
             {"metadata": {"name": "bare"}}]
    default = render.load_values()["gpuNodeLabels"]
    assert _gpu_nodes(tmp_path / "a", nodes, default) == "gfd,nfd"
    assert _gpu_nodes(tmp_path / "b", nodes[2:], default) == ""
    assert _gpu_nodes(tmp_path / "c", nodes, None) == "gfd,nfd,cpu,bare"


def test_notes_say_who_may_run_the_kubectl_plugin() -> None:
    bound = notes({"kubectl": {"viewers": [{"name": "gpu-oncall"}], "checkers": [{"name": "gpu-sre"}]}})
    assert "1 viewer and 1 checker subject(s) are bound" in bound and "gpuwarden-kubectl-check" in bound
    assert "Who may run" not in notes({"kubectl": {"roles": False}})
