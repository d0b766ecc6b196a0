"""`collect` keeps the process list GPU-K8S-011 reads (whether an MPS control daemon runs): every other user
process by its task name, no argv, no environ. A bundle of a node is then judged as the node is (issue 44:
a bundle of a host ran 27 rules where the live check ran 28, GPU-K8S-011 left out for want of processes)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden.bundle import collect as collect_mod
from gpuwarden.cli import main

SECRET = "hunter2-process-argv-secret"


def _tree(tmp_path: Path, procs: dict[int, tuple[str, str]]) -> Path:
    root = tmp_path / "root"
    for pid, (argv, comm) in procs.items():
        d = root / "proc" / str(pid)
        d.mkdir(parents=True)
        (d / "cmdline").write_bytes(argv.encode())
        (d / "comm").write_text(comm + "\n")
    (root / "proc" / "2").mkdir(parents=True)  # a kernel thread: no argv
    (root / "proc" / "2" / "cmdline").write_bytes(b"")
    (root / "proc" / "2" / "comm").write_text("kthreadd\n")
    return root


def _k8s011(*args: str) -> tuple[int, list[str]]:
    r = CliRunner().invoke(main, ["check", *args, "--select", "GPU-K8S-011", "--no-probes", "--format", "json"])
    js = json.loads(r.stdout)
    return js["summary"]["rules_run"], [f["code"] for f in js["findings"]]


def _collect(root: Path, out: Path) -> Path:
    r = CliRunner().invoke(main, ["collect", "-o", str(out), "--root", str(root), "--timeout", "3"])
    assert r.exit_code == 0, r.output
    return out


def test_a_bundle_runs_gpu_k8s_011_as_the_live_node_does(tmp_path) -> None:
    root = _tree(tmp_path, {100: (f"sshd\0-D\0--token={SECRET}\0", "sshd"), 101: ("bash\0", "bash")})
    bundle = _collect(root, tmp_path / "b.tar.gz")
    assert _k8s011("--root", str(root)) == (1, [])
    assert _k8s011("--bundle", str(bundle)) == (1, [])
    with tarfile.open(bundle) as tf:
        names = tf.getnames()
        blob = b"".join(tf.extractfile(m).read() for m in tf.getmembers() if m.isfile())
    assert "bundle/files/proc/100/comm" in names and "bundle/files/proc/101/comm" in names
    assert "bundle/files/proc/100/cmdline" not in names and "bundle/files/proc/2/comm" not in names
    assert SECRET.encode() not in blob  # the name only: no argv


def test_the_bundle_lists_the_process_by_name_only(tmp_path) -> None:
    """The bundle's process table holds the other processes by their task names, nothing more."""
    from gpuwarden.bundle.archive import open_bundle
    from gpuwarden.facts import NodeFacts, Settings

    bundle = _collect(_tree(tmp_path, {100: (f"sshd\0--token={SECRET}\0", "sshd")}), tmp_path / "b.tar.gz")
    r, keep = open_bundle(bundle)
    try:
        table = NodeFacts(r, Settings(probes=False)).get("processes")
        assert {p: t.argv for p, t in table.procs.items()} == {100: ("sshd",)}
    finally:
        keep.cleanup()


def test_the_list_is_bounded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(collect_mod, "MAX_LISTED_PROCESSES", 3)
    root = _tree(tmp_path, {pid: ("x\0", "x") for pid in range(100, 110)})
    bundle = _collect(root, tmp_path / "b.tar.gz")
    with tarfile.open(bundle) as tf:
        assert len([n for n in tf.getnames() if n.endswith("/comm")]) == 3


@pytest.mark.parametrize("name", ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"])
def test_an_mps_daemon_known_by_its_task_name_counts_as_running(tmp_path, name) -> None:
    root = _tree(tmp_path, {100: ("sshd\0", "sshd"), 200: ("x\0", name[:15])})
    bundle = _collect(root, tmp_path / "b.tar.gz")
    from gpuwarden.bundle.archive import open_bundle
    from gpuwarden.facts import NodeFacts, Settings

    r, keep = open_bundle(bundle)
    try:
        mps = NodeFacts(r, Settings(probes=False)).get("mps")
        assert mps.daemon_running is True
    finally:
        keep.cleanup()
