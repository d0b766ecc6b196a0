"""The agent's incremental log scan (one LogCursors for its lifetime) reports what a whole-file
scan reports, check after check: log-based findings (Xid from the kernel log, the device plugin's
log, the kubelet's device-plugin calls) do not clear after the first check, and lines appended
between checks are seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden import engine
from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Report
from tests.support.gpunode import KMSG, add_kmsg, healthy, plugin_log
from tests.support.bundles import bundle_file, copy_example, open_dir, write

X79 = "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
X48 = ("NVRM: Xid (PCI:0000:00:06): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) "
       "has been detected on GPU in the framebuffer at physAddr 0x7fdf0de80 partition 5, subpartition 1")
FSW = ("I1122 02:12:20.000000       1 main.go:279] Starting FS watcher.",
       "Error: failed to create FS watcher: too many open files")


class _Quiet:
    def info(self, *a, **k): ...
    warn = error = info


def _agent(root) -> Agent:
    cfg = AgentConfig(node_name="gpu-node-a", kube=False, listen="", probes=False, grpc=False, boot_grace_s=0,
                      debounce_raise=2, debounce_clear=2)
    return Agent(cfg, root=root, log=_Quiet())


def _findings(rep: Report) -> list[tuple]:
    return sorted((f.code, f.status.value, f.summary, tuple((e.source, e.text) for e in f.evidence)) for f in rep.findings)


def _whole_file(root) -> list[tuple]:
    return _findings(engine.run(NodeFacts(root, Settings(probes=False)), engine.all_rules()))


def test_xid_and_plugin_log_findings_persist_across_incremental_checks(tmp_path: Path) -> None:
    b = healthy(tmp_path / "n")
    add_kmsg(b, X79)
    plugin_log(b, *FSW, n=3)
    write(b, "/proc/sys/fs/inotify/max_user_instances", "128\n")
    root = open_dir(b)
    agent = _agent(root)
    want = _whole_file(root)
    assert {"GPU-HW-002", "GPU-K8S-008"} <= {f[0] for f in want}  # Xid 79: fallen off the bus
    for _ in range(4):
        assert _findings(agent.check().report) == want
    assert len(agent.log_cursors) >= 2  # the kernel log and the plugin's log were scanned incrementally
    assert {"GPU-HW-002", "GPU-K8S-008"} <= set(agent.debounce.raised_keys())

    # a new Xid between checks: read from where the last scan stopped, merged with what came before
    f = bundle_file(b, KMSG)
    before = f.stat().st_size
    add_kmsg(b, X48, usec=30_000_000)
    assert f.stat().st_size > before
    got = _findings(agent.check().report)
    assert got == _whole_file(root)
    assert got != want and any("48" in text for f in got for _, text in f[3])  # the DBE, Xid 48, now too


@pytest.mark.parametrize("example", ["mig-nvml-hang", "mps-binary-missing", "cpu-manager-device-loss"])
def test_example_findings_equal_a_whole_file_scan_every_check(tmp_path: Path, example: str) -> None:
    root = open_dir(copy_example(example, tmp_path / "n"))
    agent = _agent(root)
    want = _whole_file(root)
    assert want
    for _ in range(3):
        assert _findings(agent.check().report) == want
