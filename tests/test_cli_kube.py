"""The commands that talk to Kubernetes, as a user without a cluster meets them: click-styled help,
errors that say where the kubeconfig was looked for and what to pass, no client-library text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main
from gpuwarden.kubectl.cli import main as kubectl_main
from tests.agent.test_readiness import REFUSING

RAW = ("ConfigException", "MaxRetryError", "HTTPSConnectionPool", "Traceback", "NewConnectionError")


@pytest.fixture
def no_cluster(tmp_path, monkeypatch):
    """No kubeconfig anywhere, not in a pod."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for v in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(v, raising=False)
    return tmp_path


@pytest.fixture
def refusing(tmp_path, monkeypatch):
    """A kubeconfig whose server refuses connections."""
    p = tmp_path / "kubeconfig"
    p.write_text(REFUSING)
    monkeypatch.setenv("KUBECONFIG", str(p))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return p


@pytest.mark.parametrize("args", [["fleet"], ["controller", "--once"], ["release", "breaker"],
                                  ["agent", "--example", "healthy", "--cycles", "1"]])
def test_no_kubeconfig_says_where_it_looked(no_cluster, args):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    err = r.stderr
    assert err.startswith(f"gpuwarden {args[0]}: no Kubernetes configuration found"), err
    assert "~/.kube/config (missing)" in err and "$KUBECONFIG (unset)" in err and "--kubeconfig FILE" in err
    assert ("--no-kube" in err) == (args[0] == "agent")
    assert not any(x in err for x in RAW), err


def test_a_missing_kubeconfig_file_is_named(no_cluster):
    r = CliRunner().invoke(main, ["fleet", "--kubeconfig", str(no_cluster / "nope")])
    assert r.exit_code == 2 and f"--kubeconfig {no_cluster / 'nope'} (missing)" in r.stderr, r.stderr


def test_the_kubectl_plugin_names_itself(no_cluster):
    for args in (["fleet"], ["node", "n1"], ["check", "n1"]):
        r = CliRunner().invoke(kubectl_main, args)
        assert r.exit_code == 2
        assert r.stderr.startswith(f"kubectl gpuwarden {args[0]}: no Kubernetes configuration found"), r.stderr


def _script(name: str) -> Path:
    exe = Path(sys.executable).parent / name
    if not exe.exists():
        pytest.skip(f"the {name} console script is not installed next to this interpreter")
    return exe


def test_a_refusing_server_is_named_without_library_text(refusing):
    """A fresh process (the kubernetes client reads $KUBECONFIG when it is imported)."""
    for exe, prog in ((_script("gpuwarden"), "gpuwarden"), (_script("kubectl-gpuwarden"), "kubectl gpuwarden")):
        p = subprocess.run([str(exe), "fleet"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2
        assert p.stderr.startswith(f"{prog} fleet: cannot list Nodes: cannot connect to 127.0.0.1:1: Connection refused"), \
            p.stderr
        assert not any(x in p.stderr for x in RAW) and len(p.stderr) < 200, p.stderr


@pytest.mark.parametrize("command", ["agent", "controller"])
def test_agent_and_controller_help_are_click(command):
    r = CliRunner().invoke(main, [command, "--help"])
    assert r.exit_code == 0
    assert r.output.startswith(f"Usage: main {command} [OPTIONS]") or r.output.startswith(
        f"Usage: gpuwarden {command} [OPTIONS]"), r.output[:80]
    assert "Options:" in r.output and "[default: " in r.output and "-h, --help" in r.output


def test_agent_precedence_defaults_env_file_flags(tmp_path, monkeypatch):
    """defaults < environment < --config FILE < flags, through the command itself."""
    monkeypatch.setenv("NODE_NAME", "from-env")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    f = tmp_path / "agent.yaml"
    f.write_text("interval: 5m\nnamespace: from-file\nremediate: true\n")
    r = CliRunner().invoke(main, ["agent", "--config", str(f), "--namespace", "from-flag", "--print-config"])
    assert r.exit_code == 0, r.output
    import yaml

    got = yaml.safe_load(r.output)
    assert got["node_name"] == "from-env" and got["namespace"] == "from-flag"
    assert got["interval"] == 300 and got["remediate"] == "dry-run" and got["debounce_raise"] == 2
    bad = CliRunner().invoke(main, ["agent", "--remediate", "maybe"])
    assert bad.exit_code == 2 and "'maybe' is not one of" in bad.output


def test_real_console_script_without_a_cluster(no_cluster):
    """As installed: the console script, a fresh process, no kubeconfig."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(no_cluster)
    p = subprocess.run([str(_script("gpuwarden")), "fleet"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "no Kubernetes configuration found" in p.stderr and "Traceback" not in p.stderr
