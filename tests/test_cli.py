"""The `gpuwarden` command: exit codes, JSON report, rules/explain/examples, usage errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden import __version__
from gpuwarden.cli import main
from tests.support.minischema import validate
from tests.support.bundles import CAPTURE, REPO, copy_example

SCHEMA = json.loads((REPO / "docs/report-schema.json").read_text())


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def report(*args: str) -> tuple[int, dict]:
    r = run("check", *args, "--format", "json")
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, json.loads(r.stdout)


# --- check: exit codes ----------------------------------------------------------------------------


@pytest.mark.parametrize("example,code", [
    ("healthy", 0), ("uvm-missing", 1), ("cpu-manager-device-loss", 1), ("systemd-reload-device-loss", 1),
    ("dra-uvm-missing", 1),
])
def test_check_example_exit_codes(example: str, code: int) -> None:
    assert run("check", "--example", example).exit_code == code


def test_fail_on_threshold() -> None:
    assert run("check", "--example", "uvm-missing", "--fail-on", "critical").exit_code == 0
    assert run("check", "--example", "uvm-missing", "--fail-on", "high").exit_code == 1
    assert run("check", "--example", "uvm-missing", "--fail-on", "info").exit_code == 1
    assert run("check", "--example", "uvm-missing", "--fail-on", "bogus").exit_code == 2


def test_select_and_ignore_change_the_outcome() -> None:
    assert run("check", "--example", "uvm-missing", "--select", "GPU-DEV-002").exit_code == 0
    assert run("check", "--example", "uvm-missing", "--ignore", "GPU-DEV-001").exit_code == 0
    assert run("check", "--example", "uvm-missing", "--select", "gpu-dev").exit_code == 1
    code, js = report("--example", "uvm-missing", "--select", "GPU-DEV-003")
    assert code == 0 and js["findings"] == [] and js["summary"]["rules_run"] == 1


# --- check: JSON ------------------------------------------------------------------------------------


def test_json_report_fields() -> None:
    code, js = report("--example", "uvm-missing")
    assert code == 1
    assert validate(js, SCHEMA) == []
    assert js["schema"] == "gpuwarden.report/v1" and js["tool_version"] == __version__
    assert js["mode"] == "example"
    assert js["node"] == {"hostname": "gpu-node-a", "kernel": "6.18.44-fc-v657-gpu", "driver": "580.159.04",
                          "gpus": 1, "cgroup": "v1/cgroupfs", "source": "example:uvm-missing"}
    (f,) = [x for x in js["findings"] if x["code"].startswith("GPU-DEV")]
    assert (f["code"], f["status"], f["severity"]) == ("GPU-DEV-001", "confirmed", "high")
    assert f["title"].startswith("/dev/nvidia-uvm denied to GPU containers")
    assert f["affected"] == [{"kind": "container", "name": "trainer-0/trainer", "namespace": "ml",
                              "uid": "8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b", "detail": "id 4c2f0b8e9a7d"},
                             {"kind": "plugin", "name": "nvidia-device-plugin-x7k2p", "namespace": "kube-system",
                              "uid": "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", "detail": "the device-plugin pod, pid 2301"}]
    assert {"source": "/proc/devices", "text": "238 nvidia-uvm"} in f["evidence"]
    assert all(set(e) == {"source", "text"} for e in f["evidence"])
    assert f["remedy"].startswith("1. Make sure the host nodes exist")
    assert f["references"][0].startswith("incident 1")
    assert isinstance(js["unavailable"], list) and isinstance(js["not_evaluated"], list)


def test_json_not_evaluated_on_a_node_without_kubelet() -> None:
    code, js = report("--bundle", str(CAPTURE))
    assert code == 0 and validate(js, SCHEMA) == []
    reasons = {n["code"]: n["reason"] for n in js["not_evaluated"]}
    for c in ("GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003"):
        assert "no kubepods cgroup under /sys/fs/cgroup" in reasons[c]
    assert js["mode"] == "bundle" and js["node"]["hostname"] == "vm"


def test_output_file(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    r = run("check", "--example", "healthy", "--format", "json", "-o", str(out))
    assert r.exit_code == 0 and r.stdout == ""
    assert json.loads(out.read_text())["findings"] == []
    bad = run("check", "--example", "healthy", "-o", str(tmp_path / "no/such/dir/r.json"))
    assert bad.exit_code == 2 and "cannot write the report" in bad.stderr


# --- check: text --------------------------------------------------------------------------------------


def test_text_report() -> None:
    r = run("check", "--example", "uvm-missing", "--no-color")
    assert r.exit_code == 1
    out = r.stdout
    assert "HIGH     CONFIRMED GPU-DEV-001" in out
    assert "container ml/trainer-0/trainer (id 4c2f0b8e9a7d)" in out
    assert "[/proc/devices]" in out and "fix:" in out
    assert "\033[" not in out
    assert "\033[" in run("check", "--example", "uvm-missing", "--color").stdout
    healthy = run("check", "--example", "healthy").stdout
    assert "No problems found." in healthy


# --- usage errors -----------------------------------------------------------------------------------


def test_mutually_exclusive_sources(tmp_path: Path) -> None:
    for args in (["--root", str(tmp_path), "--example", "healthy"], ["--bundle", str(CAPTURE), "--example", "healthy"],
                 ["--root", str(tmp_path), "--bundle", str(CAPTURE)]):
        r = run("check", *args)
        assert r.exit_code == 2 and "at most one of --root, --bundle, --example" in r.stderr


def test_unknown_example() -> None:
    r = run("check", "--example", "nope")
    assert r.exit_code == 2 and "no example node 'nope'" in r.stderr and "healthy" in r.stderr


def test_unreadable_bundles(tmp_path: Path) -> None:
    r = run("check", "--bundle", str(tmp_path / "missing.tar.gz"))
    assert r.exit_code == 2 and "no such bundle" in r.stderr
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"\x1f\x8b garbage, not gzip")
    r = run("check", "--bundle", str(junk))
    assert r.exit_code == 2 and "not a readable bundle" in r.stderr
    truncated = tmp_path / "truncated.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = (CAPTURE / "meta.json").read_bytes()
        ti = tarfile.TarInfo("bundle/meta.json")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    truncated.write_bytes(buf.getvalue()[:200])
    r = run("check", "--bundle", str(truncated))
    assert r.exit_code == 2 and "not a readable bundle" in r.stderr
    no_meta = tmp_path / "no-meta.tar.gz"
    with tarfile.open(no_meta, "w:gz") as tf:
        tf.add(CAPTURE / "ORIGIN.md", arcname="bundle/ORIGIN.md")
    r = run("check", "--bundle", str(no_meta))
    assert r.exit_code == 2 and "no meta.json" in r.stderr
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    r = run("check", "--bundle", str(empty_dir))
    assert r.exit_code == 2 and "no meta.json" in r.stderr
    bad_meta = copy_example("healthy", tmp_path)
    (bad_meta / "meta.json").write_text('{"captured_at": 17953')
    r = run("check", "--bundle", str(bad_meta))
    assert r.exit_code == 2 and "meta.json is unreadable" in r.stderr
    (bad_meta / "meta.json").write_text("[]")
    assert run("check", "--bundle", str(bad_meta)).exit_code == 2


def test_bundle_dir_is_accepted(tmp_path: Path) -> None:
    b = copy_example("uvm-missing", tmp_path)
    code, js = report("--bundle", str(b))
    assert code == 1 and [f["code"] for f in js["findings"] if f["code"].startswith("GPU-DEV")] == ["GPU-DEV-001"]
    assert js["node"]["source"] == f"bundle:{b}"


# --- rules, explain, examples, version -----------------------------------------------------------------


def test_rules() -> None:
    r = run("rules")
    assert r.exit_code == 0
    line = next(x for x in r.stdout.splitlines() if x.startswith("GPU-DEV-001"))
    assert "high" in line and "device-access" in line and "/dev/nvidia-uvm denied" in line
    js = json.loads(run("rules", "--format", "json").stdout)
    dev1 = next(x for x in js if x["code"] == "GPU-DEV-001")
    assert dev1["needs"] == ["driver", "gpu_access"] and dev1["severity"] == "high"
    assert [x["code"] for x in js] == sorted(x["code"] for x in js)


def test_explain() -> None:
    r = run("explain", "GPU-DEV-001")
    assert r.exit_code == 0
    out = r.stdout
    assert out.startswith("GPU-DEV-001 — /dev/nvidia-uvm denied")
    assert "severity: high   family: device-access" in out
    assert "needs: driver, gpu_access" in out
    assert "CUDA in a container needs /dev/nvidia-uvm" in out  # the docstring
    assert "Fix:\n  1. Make sure the host nodes exist" in out
    assert "References:\n  - incident 1" in out
    assert run("explain", "gpu-dev-002").exit_code == 0


def test_explain_unknown() -> None:
    r = run("explain", "NOPE")
    assert r.exit_code == 2 and "no rule 'NOPE'" in r.stderr


def test_examples() -> None:
    r = run("examples")
    assert r.exit_code == 0
    names = [ln.split()[0] for ln in r.stdout.splitlines()]
    from gpuwarden.examples import names as example_names

    assert names == example_names()  # sorted; other families add their own
    assert {"cpu-manager-device-loss", "healthy", "systemd-reload-device-loss", "uvm-missing"} <= set(names)
    assert "Incident 1" in r.stdout


def test_version() -> None:
    r = run("--version")
    assert r.exit_code == 0 and __version__ in r.stdout


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="this host has an NVIDIA driver")
def test_check_without_driver_checks_this_host_and_says_no_gpu() -> None:
    r = run("check", "--format", "json", "--no-probes")
    js = json.loads(r.stdout)
    assert js["node"]["source"] == "live:/"  # the host, never an example in its place
    if r.exit_code == 4:  # no NVIDIA GPU on the PCI bus either (this CI machine)
        assert js["summary"]["not_checked"].startswith("no NVIDIA GPU on this host")
        assert "--example" in js["summary"]["not_checked"]
        assert validate(js, SCHEMA) == []
    else:  # a GPU on the bus without its driver: GPU-DRV-001
        assert "GPU-DRV-001" in [f["code"] for f in js["findings"]]


@pytest.mark.parametrize("args, said", [
    (("--root", "/nonexistent-root"), "cannot be opened as a directory"),
    (("--root", "/dev/null"), "cannot be opened as a directory"),
    (("--root", ""), "is empty"),
    (("--example", "healthy", "--select", "GPU-XXX-999"), "no rule matches --select GPU-XXX-999"),
])
def test_not_checked_is_never_healthy(args, said) -> None:
    for cmd in (("check",), ("why", "nvml-unknown-error")):
        if cmd[0] == "why" and "--select" in args:
            continue
        r = run(*cmd, *args)
        assert r.exit_code == 4, (cmd, args, r.output)
        assert r.stdout.startswith("Not checked: ") and said in r.stdout and "No problems found" not in r.stdout
        r = run(*cmd, *args, "--format", "json")  # stdout stays JSON (here: nothing); the reason on stderr
        assert r.exit_code == 4 and said in r.stderr and r.stdout == ""


def test_not_checked_report_says_so_first_and_last(tmp_path) -> None:
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)  # a bus read, with no NVIDIA GPU on it
    r = run("check", "--root", str(tmp_path), "--no-probes")
    assert r.exit_code == 4, r.output
    body = [ln for ln in r.stdout.splitlines() if ln.strip()]
    verdict = next(ln for ln in body[1:] if not ln.startswith("  "))  # after the node's name and facts
    assert verdict.startswith("Not checked: ") and "no verdict of health" in verdict
    brief = verdict.removeprefix("Not checked: ").split(": ", 1)[0].split("; ", 1)[0]  # e.g. "no NVIDIA GPU on this host"
    assert body[-1].endswith(f"; not checked: {brief}.")
    assert "No problems found" not in r.stdout


def test_a_checked_report_ends_without_not_checked() -> None:
    r = run("check", "--example", "healthy")
    assert r.exit_code == 0 and "not checked" not in r.stdout.splitlines()[-1].lower()


def test_no_rule_evaluable_is_not_checked(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    r = run("check", "--root", str(tmp_path / "empty"), "--no-probes", "--select", "GPU-K8S-002", "--format", "json")
    assert r.exit_code == 4, r.output
    assert "could be evaluated" in json.loads(r.stdout)["summary"]["not_checked"]


# --- a real process ---------------------------------------------------------------------------------------


def test_real_subprocess() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), NO_COLOR="1")
    p = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--example", "uvm-missing", "--format", "json"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    js = json.loads(p.stdout)
    assert validate(js, SCHEMA) == []
    assert "GPU-DEV-001" in [f["code"] for f in js["findings"]]
    p = subprocess.run([sys.executable, "-m", "gpuwarden", "explain", "NOPE"], capture_output=True, text=True,
                       timeout=60, env=env, cwd=REPO)
    assert p.returncode == 2 and "Traceback" not in p.stderr


@pytest.mark.parametrize("args, code", [
    (("check", "--example", "healthy"), 0), (("check", "--example", "uvm-missing"), 1),
    (("check", "--example", "healthy", "--format", "json"), 0),
    (("why", "cuda-unknown-error", "--example", "uvm-missing"), 1), (("why", "pods-pending", "--example", "healthy"), 0),
])
def test_a_closed_pipe_ends_quietly_with_the_verdicts_code(args, code) -> None:
    """`check ... | head -1`: the reader is gone before the report is written; exit code as without it, no noise."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), NO_COLOR="1")
    p = subprocess.Popen([sys.executable, "-m", "gpuwarden", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=REPO)
    p.stdout.close()  # before the command writes anything: its first write meets EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == code, err
    assert err == ""


# --- help is never cut ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prog", ["gpuwarden", "kubectl-gpuwarden"])
def test_group_help_lists_each_command_whole(prog: str) -> None:
    import click

    from gpuwarden.kubectl.cli import main as kubectl_main

    group = main if prog == "gpuwarden" else kubectl_main
    r = CliRunner().invoke(group, ["--help"], terminal_width=80)
    assert r.exit_code == 0
    said = " ".join(r.stdout.split())
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        first = " ".join(group.get_command(ctx, name).help.split("\n\n")[0].split())
        assert first in said, (name, first)
    import re

    assert not re.search(r"\.\.\.$", r.stdout.split("Commands:")[1], re.M)  # click's cut ends a line in "..."


# --- one --probe-timeout for check and agent ----------------------------------------------------------------


@pytest.mark.parametrize("given, seconds", [("5", 5.0), ("500ms", 0.5), ("2s", 2.0), ("1m", 60.0)])
def test_probe_timeout_is_a_duration_as_the_agents(given: str, seconds: float) -> None:
    from gpuwarden.agent import config as agent_config
    from gpuwarden.cli import Duration, PROBE_TIMEOUT_RANGE

    assert Duration(*PROBE_TIMEOUT_RANGE).convert(given, None, None) == seconds
    assert agent_config.parse_args(["--probe-timeout", given])[0].probe_timeout_s == seconds
    assert agent_config.BOUNDS["probe_timeout_s"] == PROBE_TIMEOUT_RANGE
    assert run("check", "--example", "healthy", "--probe-timeout", given).exit_code == 0


@pytest.mark.parametrize("given", ["soon", "-1s", "0", "2h", "nan", "inf"])
def test_a_probe_timeout_that_is_no_duration_is_a_usage_error(given: str) -> None:
    r = run("check", "--example", "healthy", "--probe-timeout", given)
    assert r.exit_code == 2 and "--probe-timeout" in r.stderr, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    from gpuwarden.agent import config as agent_config

    with pytest.raises((agent_config.ConfigError, SystemExit)):
        agent_config.parse_args(["--probe-timeout", given])


@pytest.mark.parametrize("cmd", [("check",), ("why", "pods-pending")])
def test_an_unknown_example_is_said_plainly(cmd) -> None:
    r = run(*cmd, "--example", "nope")
    assert r.exit_code == 2
    assert r.stderr.startswith("gpuwarden: no example node 'nope'; known: ") and "healthy" in r.stderr
    assert '"' not in r.stderr  # not KeyError's quoted repr


def test_agent_help_has_no_option_cut_or_continued() -> None:
    """Each option's help is a whole sentence: none ends in "..." as if cut (the burst / refill pair did)."""
    import re

    r = CliRunner().invoke(main, ["agent", "--help"], terminal_width=100)
    assert r.exit_code == 0 and not re.search(r"(\.\.\.|…)$", r.stdout, re.M)
    assert "Token bucket per action kind: its burst" in " ".join(r.stdout.split())
