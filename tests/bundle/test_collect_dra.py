"""`gpuwarden collect` on a real DRA node tree: the dra-uvm-missing example made real, with real unix
sockets bound at the DRA driver's registration and service paths. The bundle carries the kubelet's
claim state, the driver's checkpoint, the claim's CDI spec and the sockets' stat, and a check of it
says what a check of the live tree says.
"""

from __future__ import annotations

import json
import os
import socket
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main
from tests.support.bundles import example_root, materialize
from tests.support.dranode import DRA_SOCK, DRIVER_CP, REG_SOCK, STATE
from tests.support.dranode import EXAMPLE_SPEC_PATH as SPEC_PATH

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of /dev/nvidia* nodes needs root")


def _check(*args: str) -> list[tuple[str, str]]:
    r = CliRunner().invoke(main, ["check", *args, "--format", "json", "--no-probes", "--select", "GPU-DRA", "--select", "GPU-DEV", "--select", "GPU-K8S"])
    assert r.exit_code in (0, 1), (r.output, r.exception)
    return sorted((f["code"], f["status"]) for f in json.loads(r.stdout)["findings"])


def test_collect_and_check_a_dra_node(tmp_path: Path) -> None:
    tree = materialize(example_root("dra-uvm-missing"), tmp_path / "root")
    socks = []
    for p in (REG_SOCK, DRA_SOCK):
        path = tree / p.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        here = os.getcwd()
        os.chdir(path.parent)  # the tree's path is longer than sun_path: bind by a relative name
        try:
            s.bind(path.name)
        finally:
            os.chdir(here)
        socks.append(s)
    try:
        live = _check("--root", str(tree))
        out = tmp_path / "node.tar.gz"
        r = CliRunner().invoke(main, ["collect", "-o", str(out), "--root", str(tree), "--timeout", "3"])
        assert r.exit_code == 0, (r.output, r.exception)
    finally:
        for s in socks:
            s.close()
    assert ("GPU-DRA-010", "confirmed") in live
    with tarfile.open(out) as t:
        names = t.getnames()
        meta = json.loads(t.extractfile(next(n for n in names if n.endswith("meta.json"))).read())
    for p in (STATE, DRIVER_CP, SPEC_PATH):
        assert any(n.endswith("files" + p) for n in names), p
    assert meta["stat"][REG_SOCK]["kind"] == "other" and meta["stat"][DRA_SOCK]["kind"] == "other"
    assert "gpu.nvidia.com-reg.sock" in meta["listdir"]["/var/lib/kubelet/plugins_registry"]
    assert _check("--bundle", str(out)) == live
