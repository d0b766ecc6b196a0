"""The agent's demo serves /metrics on loopback and a free port, said in its output: two demos run side by
side, and none listens on every interface (issue 44: both took 0.0.0.0:9465). The real agent keeps its
configured address."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from gpuwarden.agent.config import EXAMPLE_LISTEN, AgentConfig, parse_args


def test_the_demo_listens_on_loopback_and_a_free_port():
    cfg, _ = parse_args(["--example", "uvm-missing", "--no-kube"])
    assert cfg.listen == EXAMPLE_LISTEN == "127.0.0.1:0"


@pytest.mark.parametrize("args,file,listen", [
    ([], None, AgentConfig().listen),  # the real agent (no --example): the DaemonSet's address
    (["--example", "uvm-missing", "--listen", "0.0.0.0:19465"], None, "0.0.0.0:19465"),  # asked for: kept
    (["--example", "uvm-missing", "--listen", ""], None, ""),
    (["--example", "uvm-missing"], "listen: 127.0.0.1:19466\n", "127.0.0.1:19466"),
])
def test_a_configured_address_is_kept(tmp_path, args, file, listen):
    if file is not None:
        (tmp_path / "agent.yaml").write_text(file)
        args = [*args, "--config", str(tmp_path / "agent.yaml")]
    cfg, _ = parse_args(["--no-kube", *args])
    assert cfg.listen == listen
    assert AgentConfig().listen == "0.0.0.0:9465"


def _demo() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuwarden", "agent", "--example", "healthy", "--no-kube",
                             "--cycles", "2", "--interval", "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def test_two_demos_run_side_by_side_and_say_where_they_serve():
    a, b = _demo(), _demo()
    outs = [p.communicate(timeout=120)[1] for p in (a, b)]
    assert [a.returncode, b.returncode] == [0, 0], outs
    addresses = []
    for err in outs:
        serving = [json.loads(ln) for ln in err.splitlines() if '"serving"' in ln]
        assert len(serving) == 1, err
        addresses.append(serving[0]["address"])
    for addr in addresses:
        host, port = addr.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
    assert addresses[0] != addresses[1]


def test_the_demo_is_not_reachable_on_other_interfaces():
    """Nothing listens on a non-loopback address of this host at the demo's port."""
    p = subprocess.Popen([sys.executable, "-m", "gpuwarden", "agent", "--example", "healthy", "--no-kube",
                          "--cycles", "50", "--interval", "0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = p.stderr.readline()
        while line and '"serving"' not in line:
            line = p.stderr.readline()
        port = int(json.loads(line)["address"].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # loopback serves
        others = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
        others = {a for a in others if not a.startswith("127.")}
        for addr in others:
            with pytest.raises(OSError):
                socket.create_connection((addr, port), timeout=2).close()
    finally:
        p.kill()
        p.wait(timeout=30)
