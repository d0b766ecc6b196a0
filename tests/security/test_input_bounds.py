"""Every argument and config typed and bounded; not checked is never "fine" (issue 30, items 4 and 5).

Each test is one of the issue's reproductions: before the fix a traceback, a run of the live / in
place of an empty --bundle, "No problems found" on an empty root, an agent that checked nothing,
an alias bomb at 1.48 GB, a FIFO kubeconfig that blocked, an endless API answer parsed to 4.2 GB.
"""

from __future__ import annotations

import http.server
import json
import os
import resource
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden import safeyaml
from gpuwarden.agent import config as ac
from gpuwarden.agent.config import ConfigError
from gpuwarden.cli import main
from gpuwarden.kube import client as kube_client
from gpuwarden.kube.errors import KubeError


def _run(args: list[str]):
    r = CliRunner().invoke(main, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r


# --- 4. not checked is never "fine" -------------------------------------------------------------

@pytest.mark.parametrize("args", [["check", "--bundle", ""], ["check", "--example", ""],
                                  ["why", "nvml", "--bundle", ""], ["why", "nvml", "--example", ""]])
def test_an_empty_bundle_or_example_is_a_usage_error_not_the_live_root(args: list[str]) -> None:
    r = _run(args)
    assert r.exit_code == 2 and "is empty" in r.output
    assert "node" not in r.stdout  # no report at all: the live / was not checked in its place


def test_an_empty_root_is_not_checked(tmp_path: Path) -> None:
    r = _run(["check", "--root", str(tmp_path)])
    assert r.exit_code == 4
    lines = r.stdout.splitlines()
    assert lines[0].startswith("gpuwarden ") and "node unknown" in lines[0]  # never this machine's name
    assert lines[2].startswith("Not checked: only ") and "(a verdict needs at least 50%)" in lines[2]
    assert "No problems found" not in r.stdout
    js = json.loads(_run(["check", "--root", str(tmp_path), "--format", "json"]).stdout)
    assert js["summary"]["not_checked"].startswith("only ") and "hostname" not in js["node"]


def test_a_real_bundle_is_checked(tmp_path: Path) -> None:
    """The share is met by every example and capture: a healthy node is still "No problems found"."""
    r = _run(["check", "--example", "healthy"])
    assert r.exit_code == 0 and "No problems found" in r.stdout


@pytest.mark.parametrize("doc", [{"select": ["GPU-XXX-999"]}, {"ignore": ["GPU"]}, {"select": "GPU-DEV-001, GPU-XXX"},
                                 {"select": [["GPU-DEV-001"], {"a": 1}]}, {"ignore": [None]}, {"select": [1, 2]},
                                 {"select": ["GPU-DEV"], "ignore": ["GPU-DEV"]}])
def test_an_agent_whose_selection_runs_no_rule_does_not_start(tmp_path: Path, doc: dict) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError):
        ac.load_file(str(p)).validate()
    r = _run(["agent", "--config", str(p), "--print-config"])
    assert r.exit_code == 2 and r.output.startswith("gpuwarden agent: ") and len(r.output.splitlines()) == 1


def test_an_agent_selection_that_matches_starts(tmp_path: Path) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text("select: [GPU-DEV]\nignore: [GPU-DEV-005]\n")
    cfg = ac.load_file(str(p))
    cfg.validate()
    assert cfg.select == ["GPU-DEV"] and cfg.ignore == ["GPU-DEV-005"]


# --- 5. every config and argument typed and bounded ---------------------------------------------

def alias_bomb(key: str, levels: int = 9, width: int = 10) -> str:
    """The issue's bomb: nine levels of ten aliases under one key (10^9 items once expanded)."""
    lines = [f"{key}:", '  - &a0 ["confirmed"]']
    lines += [f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("key", ["select", "ignore", "condition_statuses"])
def test_an_alias_bomb_is_refused_quickly(tmp_path: Path, key: str) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(alias_bomb(key))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="more than 100,000 nodes once its aliases are expanded"):
        ac.load_file(str(p))
    assert time.perf_counter() - t0 < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 << 10  # KiB: < 50 MB more


@pytest.mark.parametrize("text", ["interval: 2020-13-45", "interval: !!int abc", "interval: !!float abc",
                                  "interval: " + "9" * 5000, "probes: !!bool maybe", "interval: !!timestamp garbage",
                                  "select: &a [*a]", "? [a, b]\n: 1", "interval: !!python/object/apply:os.getpid []"])
def test_yaml_constructor_errors_are_one_line_exit_2(tmp_path: Path, text: str) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(text + "\n")
    with pytest.raises(ConfigError, match="not YAML: "):
        ac.load_file(str(p))
    r = _run(["agent", "--config", str(p), "--print-config"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output


def test_safeyaml_loads_what_configs_hold() -> None:
    assert safeyaml.load("a: &x [1, 2]\nb: *x\nc: {d: 2020-01-02}\n")["b"] == [1, 2]
    assert safeyaml.load("") is None and safeyaml.load_all("a: 1\n---\nb: 2\n") == [{"a": 1}, {"b": 2}]
    with pytest.raises(safeyaml.YamlError, match="more than one document"):
        safeyaml.load("a: 1\n---\nb: 2\n")


@pytest.mark.parametrize("args", [
    ["check", "--example", "healthy", "--probe-timeout", "inf"], ["check", "--example", "healthy", "--probe-timeout", "nan"],
    ["check", "--example", "healthy", "--probe-timeout", "1e308"], ["check", "--example", "healthy", "--probe-timeout", "0"],
    ["check", "--example", "healthy", "--stall-seconds", "nan"], ["why", "nvml", "--example", "healthy",
                                                                   "--probe-timeout", "-inf"],
    ["collect", "-o", "x.tgz", "--timeout", "nan"], ["collect", "-o", "x.tgz", "--timeout", "inf"],
    ["collect", "-o", "x.tgz", "--timeout", "1e308"], ["collect", "-o", "x.tgz", "--log-bytes", "-1"],
])
def test_numeric_arguments_out_of_range_are_usage_errors(args: list[str]) -> None:
    r = _run(args)
    assert r.exit_code == 2 and "Invalid value for" in r.output


@pytest.mark.parametrize("cmd", [["check", "--example", "healthy"], ["why", "nvml", "--example", "healthy"]])
@pytest.mark.parametrize("target", ["/dev/full", "/proc/self/mem", "", "/nonexistent/dir/report"])
def test_output_errors_are_one_line(cmd: list[str], target: str) -> None:
    r = _run(cmd + ["-o", target])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1].startswith(("gpuwarden: cannot write the report to ", "Error: Invalid"))


def test_output_to_an_unwritable_directory_is_one_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = _run(["check", "--example", "healthy", "-o", str(ro / "report.txt")])
    finally:
        ro.chmod(0o700)
    if os.geteuid() == 0:
        assert r.exit_code == 0  # root writes anyway
    else:
        assert r.exit_code == 2 and "cannot write the report" in r.output


def test_collect_to_an_empty_output_is_a_usage_error() -> None:
    r = _run(["collect", "-o", ""])
    assert r.exit_code == 2 and "is empty" in r.output


@pytest.mark.parametrize("flag", ["--selector", "--lease-name", "--gpuwarden-namespace", "--breaker-configmap"])
@pytest.mark.parametrize("value", ["\udcff", "a/b", "x" * 5000])
def test_fleet_names_and_selectors_are_validated_before_any_request(flag: str, value: str) -> None:
    if flag == "--selector" and value == "a/b":
        return  # a prefixed label key: a valid selector
    r = _run(["fleet", "--kubeconfig", "/nonexistent", flag, value])
    assert r.exit_code == 2 and "Invalid value for" in r.output


def test_fleet_kubeconfig_fifo_huge_and_bomb_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo)
    done: list = []
    t = threading.Thread(target=lambda: done.append(_run(["fleet", "--kubeconfig", str(fifo)])), daemon=True)
    t.start()
    t.join(10)
    assert done and done[0].exit_code == 2 and "not a regular file" in done[0].output
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(100 << 20)  # 100 MB (sparse): refused unread
    t0 = time.perf_counter()
    r = _run(["fleet", "--kubeconfig", str(big)])
    assert r.exit_code == 2 and "larger than 4 MiB" in r.output and time.perf_counter() - t0 < 5
    bomb = tmp_path / "bomb"
    bomb.write_text(alias_bomb("users"))
    r = _run(["fleet", "--kubeconfig", str(bomb)])
    assert r.exit_code == 2 and "aliases are expanded" in r.output


class _Endless(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        chunk = b'{"items": [' + b'{"a": 1},' * 100_000
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass

    def log_message(self, *a) -> None:
        pass


def test_an_endless_api_answer_is_refused_not_parsed(tmp_path: Path, monkeypatch) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        kc = tmp_path / "kubeconfig"
        kc.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{srv.server_address[1]}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
        monkeypatch.setattr(kube_client, "MAX_RESPONSE_BYTES", 16 << 20)
        kube = kube_client.Kube.from_config(str(kc), timeout_s=10)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        with pytest.raises(KubeError, match="longer than 16 MiB"):
            kube.get("/api/v1/nodes")
        assert time.perf_counter() - t0 < 10
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10  # KiB
        kube.close()
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("args", [["node", "\udcff"], ["check", "n1", "--timeout", "nan"], ["check", "n1", "--timeout", "inf"],
                                  ["check", "n1", "-n", "\udcff"], ["check", "a/b"]])
def test_the_kubectl_plugin_validates_names_and_deadlines(args: list[str]) -> None:
    from gpuwarden.kubectl.cli import main as kubectl_main

    r = CliRunner().invoke(kubectl_main, args + ["--kubeconfig", "/nonexistent"])
    assert r.exit_code == 2 and "Invalid value for" in r.output and "Traceback" not in r.output
