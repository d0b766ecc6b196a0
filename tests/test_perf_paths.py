"""What keeps `gpuwarden check` cheap (docs/performance.md): no heavy imports, the fast paths of
BundleRoot and the data loaders give the same answers as the slow ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuwarden.root import BundleRoot, Missing, norm

REPO = Path(__file__).resolve().parents[1]
#: what no `check --format json` imports: the Kubernetes client and gRPC (the healthy example's
#: checkpoint holds an AllocResp, a protobuf message, decoded without protobuf), the commands and
#: layers a check does not run, and the renderers of other formats; and from the standard library
#: secrets, hashlib and random (a temporary file's name is os.urandom's; secrets loads the other two);
#: click (checkopts parses check's arguments), dataclasses (records are msgspec Structs) and
#: typing_extensions (issue 34: with inspect, ~45% of a healthy check's instructions before)
NOT_FOR_CHECK = ("kubernetes", "grpc", "google.protobuf", "prometheus_client", "secrets", "hashlib", "random",
                 "click", "dataclasses", "typing_extensions",
                 "gpuwarden.agent", "gpuwarden.controller", "gpuwarden.remediation", "gpuwarden.kubectl",
                 "gpuwarden.kube", "gpuwarden.options",
                 "gpuwarden.bundle", "gpuwarden.bpf", "gpuwarden.why", "gpuwarden.render.text",
                 "gpuwarden.render.packed", "gpuwarden.render.rules_md")


#: what a check of these examples does not import either: it starts no probe child (`select`, `signal`),
#: reads RFC 3339 times without `calendar` (which loads `locale`), and its one YAML file, the kubelet
#: config, is a plain block mapping that safeyaml reads without PyYAML; no `pathlib` either (nor the
#: `urllib.parse` and `ipaddress` it loads): roots, examples and data files are paths as strings;
#: issue 34, docs/performance.md §10
NOT_FOR_EXAMPLE_CHECK = ("calendar", "locale", "select", "signal", "yaml", "pathlib", "urllib", "ipaddress")


def _check_modules(args: list[str]) -> tuple[int, list[str], str]:
    """(exit code, modules loaded, stderr) of `gpuwarden check --format json ARGS` in a fresh interpreter."""
    code = ("import json, runpy, sys\n"
            f"sys.argv = ['gpuwarden', 'check', '--format', 'json', '-o', {os.devnull!r}, *{args!r}]\n"
            "try:\n    runpy.run_module('gpuwarden', run_name='__main__')\n"
            "except SystemExit as e:\n    code = e.code\n"
            "print(json.dumps({'exit': code, 'modules': sorted(sys.modules)}))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["exit"], res["modules"], out.stderr


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


@pytest.mark.parametrize("args", [["--example", "healthy"], ["--example", "mps-binary-missing"]])
def test_check_loads_only_what_it_uses(args: list[str]) -> None:
    code, modules, err = _check_modules(args)
    assert code in (0, 1), err
    # inspect cleans a remedy's text: only a check that finds something reads one
    assert _loaded(modules, NOT_FOR_CHECK + NOT_FOR_EXAMPLE_CHECK + (("inspect",) if code == 0 else ())) == []


def test_live_check_of_a_node_without_yaml_files_imports_no_yaml_parser_nor_grpc_client(tmp_path: Path) -> None:
    """PyYAML is for a YAML file of the node (kubelet config, MPS config, a CDI spec) only; the
    agent's and controller's option modules, which need it, are built only for those commands. The
    device-plugin probe lists sockets without the gRPC client, which only its child imports."""
    code, modules, err = _check_modules(["--root", str(tmp_path)])
    assert code in (0, 1, 4), err
    assert _loaded(modules, NOT_FOR_CHECK + ("yaml", "gpuwarden.grpcapi.client")) == []


def test_gpu_access_decodes_the_allocate_response_without_protobuf() -> None:
    from gpuwarden.examples import open_example
    from gpuwarden.facts import NodeFacts, Settings

    ga = NodeFacts(open_example("healthy"), Settings(probes=False)).get("gpu_access")
    ca = next(c for c in ga.containers if c.container.name == "trainer")
    assert ca.alloc is not None and "/dev/nvidia-uvm" in [d[0] for d in ca.alloc.devices]
    assert ca.alloc.envs["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")


@pytest.mark.parametrize("name", ["known_versions.yaml", "log_signatures.yaml", "triage.yaml", "xid.yaml", "sxid.yaml"])
def test_shipped_yaml_same_with_libyaml(name: str) -> None:
    text = (REPO / "src/gpuwarden/data" / name).read_text(encoding="utf-8")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    assert yaml.load(text, Loader=loader) == yaml.safe_load(text)  # noqa: S506


def _bundle(tmp: Path, files: dict[str, bytes], meta: dict) -> BundleRoot:
    for p, data in files.items():
        f = tmp / "files" / p.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    (tmp / "meta.json").write_text(json.dumps(meta))
    return BundleRoot(tmp)


def _listdir_reference(root: BundleRoot, path: str) -> list[str] | Missing:
    """BundleRoot.listdir as written before the child index (one pass over the manifest per call)."""
    p = norm(path)
    names: set[str] = set()
    found = False
    d = root.files / p.lstrip("/")
    if d.is_dir():
        found = True
        names.update(os.listdir(d))
    prefix = p.rstrip("/") + "/"
    for key in list(root._stats) + list(root._links):
        if key.startswith(prefix):
            rest = key[len(prefix):]
            if rest:
                names.add(rest.split("/", 1)[0])
                found = True
    listed = root.meta.get("listdir", {}).get(p)
    if listed is not None:
        names.update(listed)
        found = True
    return sorted(names) if found else root._gap(p)


def test_bundle_listdir_index_matches_a_scan_of_the_manifest(tmp_path: Path) -> None:
    stats = {k: {"path": k, "kind": "chr", "major": 195, "minor": i} for i, k in enumerate(
        ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1", "/proc/7/root/dev/nvidia0", "/odd//double", "relative/x",
         "/trailing/", "/"])}
    links = {"/proc/7/fd/3": "/dev/nvidia0", "/proc/7/fd/10": "/dev/nvidiactl", "/proc/8/fd/1": "pipe:[1]",
             "/dev/char/195:0": "../nvidia0"}
    root = _bundle(tmp_path, {"/proc/7/cmdline": b"x\0", "/dev/shm/f": b""}, {
        "stat": stats, "readlink": links, "listdir": {"/proc/7/root/dev": ["null", "nvidia0"]}})
    for p in ["/", "/dev", "/dev/", "/dev/nvidia-caps", "/proc", "/proc/7", "/proc/7/fd", "/proc/8/fd", "/proc/7/root",
              "/proc/7/root/dev", "/odd", "/odd/", "/trailing", "/dev/char", "/nothing", "relative", "/proc/9/fd"]:
        assert root.listdir(p) == _listdir_reference(root, p), p


def test_bundle_read_bytes_bounds_and_gaps(tmp_path: Path) -> None:
    root = _bundle(tmp_path, {"/a": b"0123456789" * 300_000, "/d/f": b"x"},
                   {"missing": {"/gone": ["denied", "EACCES"]}})
    assert root.read_bytes("/a", 5) == b"01234"
    assert len(root.read_bytes("/a")) == 3_000_000 and root.read_bytes("/a", 0) == b""
    assert root.read_bytes("/a", 2_500_001)[-2:] == b"90"
    assert isinstance(root.read_bytes("/d"), Missing) and root.read_bytes("/d").kind == "missing"
    assert root.read_bytes("/gone") == Missing("/gone", "denied", "EACCES")
    assert isinstance(root.read_bytes("/a/x"), Missing)  # under a file: ENOTDIR
    st = root.stat("/d")
    assert st.kind == "dir" and root.stat("/d/f").kind == "file" and root.stat("/d/f").size == 1
    assert isinstance(root.stat("/nope"), Missing)


# -- start-up: pre-parsed tables, rules and facts imported on demand ------------------------------------

def test_preparsed_tables_are_current_and_equal_to_the_yaml() -> None:
    """data/preparsed.json is what `python -m gpuwarden.datafiles` writes now: regenerate it after
    editing a table (a stale one is only slower: its YAML is parsed instead)."""
    from gpuwarden import datafiles

    shipped = json.loads(datafiles.PREPARSED.read_text(encoding="utf-8"))
    assert shipped == json.loads(json.dumps(datafiles.preparsed_now())), "run: python -m gpuwarden.datafiles"
    assert {t["file"] for t in shipped["tables"]} == {p.name for p in datafiles.DATA.glob("*.yaml")}
    for t in shipped["tables"]:
        assert t["doc"] == yaml.safe_load(t["yaml"]) == yaml.safe_load(datafiles.read_text(t["file"]))


def test_tables_loaded_without_a_yaml_parser_and_edited_text_still_parsed() -> None:
    code = ("import sys\nfrom gpuwarden import datafiles, known_versions, why, xid\nfrom gpuwarden.logs import signatures as logsignatures\n"
            "xid.table(); known_versions.catalog(); why.symptoms(); logsignatures.all_signatures()\n"
            "print('yaml' in sys.modules)\n"
            "t = datafiles.read_text('xid.yaml') + '\\n# edited\\n'\n"
            "assert xid.load(t) == xid.table()\nprint('yaml' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_rule_module_index_matches_the_registry() -> None:
    from gpuwarden.rules import all_rules, base

    by_module: dict[str, set[str]] = {}
    for r in all_rules():
        by_module.setdefault(r.func.__module__, set()).add(r.code)
    assert by_module == {m: set(codes) for m, codes in base._RULE_MODULES.items()}


def test_fact_module_index_matches_the_registry() -> None:
    from gpuwarden.facts import node

    node.registered_facts()
    assert {name: fn.__module__ for name, fn in node._COLLECTORS.items() if not name.startswith("test-")} \
        == node._FACT_MODULES


_SELECTIONS = [["GPU-DRV-006"], ["GPU-DEV"], ["GPU-K8S-001", "GPU-HW-00"], ["GPU-NODE"], ["GPU-K8S-007"]]


@pytest.mark.parametrize("example", ["healthy", "uvm-missing", "driver-memory-cascade", "mps-binary-missing"])
def test_lazy_selection_gives_the_report_of_a_full_load(example: str) -> None:
    """A fresh process that imports only the selected rules' modules (and the facts they ask for)
    reports what the same selection reports with every rule and fact module loaded."""
    code = ("import json, sys\nfrom gpuwarden import engine\nfrom gpuwarden.examples import open_example\n"
            "from gpuwarden.facts import NodeFacts, Settings, node\n"
            f"sel = {_SELECTIONS!r}\nfull = 'full' in sys.argv\nout = []\n"
            "for s in sel:\n"
            "    if full:\n        engine.all_rules(); node.registered_facts()\n"
            "    rules = engine.select(engine.rules_for(s), s)\n"
            f"    r = engine.run(NodeFacts(open_example({example!r}), Settings(probes=False)), rules, mode='example')\n"
            "    d = r.to_json(); d.pop('generated_at', None); d['summary'].pop('duration_s', None)\n"
            "    out.append(d)\n"
            "    if len(out) == 1:\n        mods = sorted(m for m in sys.modules if m.startswith('gpuwarden.rules.'))\n"
            "print(json.dumps({'reports': out, 'rule_modules': mods}))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    got = {}
    for mode in ("lazy", "full"):
        p = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, env=env, timeout=120)
        got[mode] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else p.stderr
    assert isinstance(got["lazy"], dict), got["lazy"]
    assert got["lazy"]["reports"] == got["full"]["reports"]
    # GPU-DRV-006 alone: its module (and the helpers it imports), not the other seven families
    assert "gpuwarden.rules.driver" in got["lazy"]["rule_modules"]
    assert "gpuwarden.rules.runtime" not in got["lazy"]["rule_modules"]
    assert "gpuwarden.rules.runtime" in got["full"]["rule_modules"]


# -- the agent's steady state: each distinct OCI spec read once per process -----------------------------

def _containers(root) -> tuple[list, list]:
    import msgspec

    from gpuwarden.facts import NodeFacts, Settings

    f = NodeFacts(root, Settings(probes=False))
    cf = f.get("containers")
    return [msgspec.to_builtins(c) for p in cf.pods for c in p.containers], f.gaps()


@pytest.mark.parametrize("example", ["healthy", "uvm-missing", "cpu-manager-device-loss", "systemd-reload-device-loss",
                                     "mps-binary-missing"])
def test_remembered_spec_views_give_the_containers_of_a_fresh_parse(example: str) -> None:
    from gpuwarden.examples import open_example
    from gpuwarden.facts import containers

    containers._SPEC_VIEWS.clear()
    cold = _containers(open_example(example))
    assert containers._SPEC_VIEWS
    assert _containers(open_example(example)) == cold


def test_a_changed_or_malformed_spec_is_read_again(tmp_path: Path) -> None:
    from gpuwarden.facts import containers
    from tests.support.bundles import GPU_SPEC, bundle_file, copy_example, open_dir

    b = copy_example("healthy", tmp_path / "n")
    spec = bundle_file(b, GPU_SPEC)
    doc = json.loads(spec.read_text())
    first, _ = _containers(open_dir(b))
    doc["annotations"]["io.kubernetes.cri.container-name"] = "renamed"
    spec.write_text(json.dumps(doc))
    renamed, _ = _containers(open_dir(b))
    assert "renamed" in {c["name"] for c in renamed} and "renamed" not in {c["name"] for c in first}
    doc["linux"] = ["not", "an", "object"]  # valid JSON of the wrong shape: a gap, every time
    spec.write_text(json.dumps(doc))
    for _ in range(2):
        got, gaps = _containers(open_dir(b))
        assert any(g.source == GPU_SPEC and "unexpected spec layout" in g.reason for g in gaps)
        c = next(c for c in got if c["spec_source"] == GPU_SPEC)
        assert c["spec_devices"] is None and c["annotations"]["io.kubernetes.cri.container-name"] == "renamed"
    assert len(containers._SPEC_VIEWS) <= containers.SPEC_VIEWS_MAX


def test_performance_doc_gives_one_budget_per_command() -> None:
    """docs/performance.md "Budgets": no command has two budgets (a row's command is its first `code`)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "performance.md").read_text()
    table = text.split("## Budgets", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| what ")]
    whats = [ln.split(" | ")[0][2:] for ln in rows]
    commands = [m.group(1) for w in whats if (m := re.search(r"`([^`]+)`", w))]
    assert len(rows) >= 10 and "check --example healthy --format json" in commands
    assert len(commands) == len(set(commands)), sorted(c for c in commands if commands.count(c) > 1)
    assert len(whats) == len(set(whats))
    assert sum("check --example healthy --format json" in w for w in whats) == 1
