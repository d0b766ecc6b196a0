"""The issue's end-to-end measurements as tests: `check --root` on a tree whose links point out,
and a FIFO at /proc/<pid>/cmdline of a live tree."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main
from tests.support.bundles import example_root, materialize

CANARY = "CANARY-e2e-51a0"
#: node files the report quotes (identity) or whose unparsable lines it quotes
QUOTED = ["proc/sys/kernel/osrelease", "proc/sys/kernel/hostname", "proc/meminfo", "proc/devices",
          "proc/driver/nvidia/version", "var/lib/kubelet/config.yaml", "proc/zoneinfo"]


@pytest.mark.parametrize("how", ["absolute", "dotdot", "dir"])
def test_check_root_never_reads_through_a_link_out(tmp_path: Path, how: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text(f"{CANARY}\n{CANARY}: 1 kB\n")
    node = tmp_path / "node"
    for rel in QUOTED:
        p = node / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        depth = len(Path(rel).parts) - 1
        if how == "absolute":
            os.symlink(str(outside / "secret"), p)
        elif how == "dotdot":
            os.symlink("../" * (depth + 1) + "outside/secret", p)
        else:  # a directory link: /proc/sys -> the outside directory
            p.write_text("x\n")
    if how == "dir":
        os.symlink(str(outside), node / "var/log")
    r = CliRunner().invoke(main, ["check", "--root", str(node), "--no-probes", "--format", "json"])
    assert r.exit_code in (0, 1, 4), r.output
    assert CANARY not in r.output and CANARY not in r.stderr
    json.loads(r.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of /dev/nvidia* nodes needs root")
def test_a_fifo_cmdline_costs_nothing_and_drops_no_process(tmp_path: Path) -> None:
    """Issue 18: one FIFO at /proc/<pid>/cmdline stalled the check 5 s and dropped every process."""
    tree = materialize(example_root("uvm-missing"), tmp_path / "root")
    (tree / "proc/4242").mkdir()
    os.mkfifo(tree / "proc/4242/cmdline")
    (tree / "proc/4242/comm").write_text("stuck\n")
    t0 = time.monotonic()
    r = CliRunner().invoke(main, ["check", "--root", str(tree), "--no-probes", "--format", "json"])
    elapsed = time.monotonic() - t0
    js = json.loads(r.stdout)
    assert "GPU-DEV-001" in [f["code"] for f in js["findings"] if f["status"] == "confirmed"]
    assert elapsed < 4, elapsed
