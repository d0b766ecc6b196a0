"""The device plugin's real MPS control daemon (v0.20.0, `mps-control-daemon`) on a machine without a GPU.

Incident 5b's component. It runs as the Helm chart runs it (tests/support/mpsdaemon.py): its own mount
namespace with a temp MPS root on /mps, its config file (MPS sharing of nvidia.com/gpu, 4 replicas),
NVML from tests/support/nvml_fake.c (one fake GPU), a recording stand-in `nvidia-smi` first on its PATH
(the compute-mode calls it makes are recorded, nothing reaches a GPU), and
tests/support/mps_control_fake.sh installed as `nvidia-cuda-mps-control` where the driver would put it.
Everything else — config loading, the start order, the log lines, the 30 s retry, the exit — is the
daemon's own code; its output is written as containerd writes pod logs, and gpuwarden reads that.
The scenarios with the driver's real nvidia-cuda-mps-control and a CUDA client are
tests/gpu/mps_scenarios.py (docs/validation.md).

Skipped, loudly and with the reason, only where the daemon cannot run here (binary missing or not
matching SHA256SUMS, no C compiler, no mount namespace, not root: /mps must be created and mounted).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from gpuwarden.findings import Status
from tests.support import mpsdaemon, realplugin
from tests.support.gpunode import found, healthy
from tests.support.bundles import bundle_file

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-6a7f0b1c-0000-4000-8000-00000000f00d"
CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
POD_LOG = ("/var/log/pods/nvidia-device-plugin_nvidia-device-plugin-mps-control-daemon-ci7xq_"
           "0c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5/mps-control-daemon-ctr")
NOT_FOUND = 'Failed to start MPS daemon: exec: "nvidia-cuda-mps-control": executable file not found in $PATH'


@pytest.fixture(scope="module")
def kit():
    """(daemon binary, fake NVML dir); skips loudly when the real daemon cannot run here."""
    if os.geteuid() != 0:
        pytest.skip("REAL MPS CONTROL DAEMON NOT RUN: needs root (its /mps mount point and mount namespace)")
    work = Path(tempfile.mkdtemp(prefix="gw-mps-kit-"))
    try:
        binary = realplugin.unpack(name=mpsdaemon.BINARY)
        fake = realplugin.build_shim(REPO / "tests/support/nvml_fake.c", work / "fake", soname="libnvidia-ml.so.1")
        realplugin.namespace_prefix()
    except realplugin.Unavailable as exc:
        shutil.rmtree(work, ignore_errors=True)
        pytest.skip(f"REAL MPS CONTROL DAEMON NOT RUN: {exc}")
    created = mpsdaemon.ensure_mountpoint()
    yield binary, fake.parent
    mpsdaemon.cleanup_mountpoint(created)
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path):
    """A node's pieces: the host MPS root, the config volume, a driver bin dir holding the fake control."""
    d = Path(tempfile.mkdtemp(prefix="gw-mps-", dir="/tmp"))
    (d / "mps/shm").mkdir(parents=True)
    (d / "config.yaml").write_text(CONFIG)
    (d / "driver-bin").mkdir()
    shutil.copy(REPO / "tests/support/mps_control_fake.sh", d / "driver-bin/nvidia-cuda-mps-control")
    yield d
    for pid in _fake_daemons(d):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


def _fake_daemons(d: Path) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and str(d) in (p / "cmdline").read_bytes().decode(errors="replace"):
                out.append(int(p.name))
        except OSError:
            continue
    return out


def _daemon(kit, node: Path, *, hide: list[str] = (), restart: int = 0) -> mpsdaemon.MpsDaemon:
    binary, fake = kit
    return mpsdaemon.MpsDaemon(binary, node / "mps", node / "config.yaml", node / f"pod/{restart}.log",
                               node / "smi.record", path_dirs=[str(node / "driver-bin"), "/usr/bin", "/bin"],
                               hide=list(hide), env={"LD_LIBRARY_PATH": str(fake), "GW_FAKE_NVML_UUID": UUID},
                               work=node / f"ns{restart}")


def _node_with(tmp_path: Path, node: Path, logs: list[str], mps: bool = True, control_pid: int | None = None) -> Path:
    """The healthy example, plus the daemon's pod logs and its MPS root as it is now (a bundle)."""
    b = healthy(tmp_path)
    for i, name in enumerate(logs):
        bundle_file(b, f"{POD_LOG}/{i}.log").write_bytes((node / "pod" / name).read_bytes())
    if mps:  # the fake's pipe directory holds regular files only (no socket, no FIFO): copied as is
        shutil.copytree(node / "mps", bundle_file(b, "/run/nvidia/mps"), dirs_exist_ok=True)
    if control_pid is not None:
        bundle_file(b, f"/proc/{control_pid}/cmdline").write_bytes(b"nvidia-cuda-mps-control\0-d\0")
    return b


def test_starts_the_control_daemon_and_stops_it_cleanly(kit, node):
    """Start order and log lines of a healthy start; SIGTERM: `quit`, compute mode back, files removed."""
    with _daemon(kit, node) as d:
        assert d.wait_log('"Starting log tailer" resource="nvidia.com/gpu"', 20), d.log()[-3000:]
        ready = (node / "mps/.ready").exists() or d.wait_log("Control", 2)
        root = node / "mps/nvidia.com/gpu"
        state = sorted(p.name for p in root.iterdir()), sorted(p.name for p in (root / "pipe").iterdir())
        control = (root / "log/control.log").read_text()
        rc = d.stop()
    log = d.log()
    for line in ("Starting OS watcher.", "Loading configuration.", "Retrieving MPS daemons.",
                 '"Staring MPS daemon" resource="nvidia.com/gpu"', '"SELinux disabled, not updating context" '
                 'path="/mps/nvidia.com/gpu/pipe"', 'Received signal "terminated", shutting down.',
                 "Stopping MPS daemons.", '"Stopped MPS control daemon" resource="nvidia.com/gpu"'):
        assert line in log, (line, log[-3000:])
    assert ready and (node / "mps/.ready").exists() is False  # created once up, removed by the stop
    assert state == ([".started", "log", "pipe"], ["control", "nvidia-cuda-mps-control.pid"])
    # 4 replicas: a quarter of the fake GPU's memory pinned per client, 25 % of the threads
    assert "set_default_device_pinned_mem_limit 0 " in control and "set_default_active_thread_percentage 25" in control
    assert rc == 0
    assert [c.split(" -c ")[-1] for c in mpsdaemon.smi_calls(node / "smi.record")] == ["EXCLUSIVE_PROCESS", "DEFAULT"]
    assert sorted(p.name for p in (node / "mps/nvidia.com/gpu").iterdir()) == ["pipe"]  # .started and log/ removed


def test_missing_binary_fails_retries_and_exits_1_and_gpuwarden_says_k8s007(kit, node, tmp_path):
    """Incident 5b: the control binary absent from the daemon's view (hidden in its mount namespace)."""
    hidden = str(node / "driver-bin/nvidia-cuda-mps-control")
    with _daemon(kit, node, hide=[hidden]) as d:
        assert d.wait_log("Retrying in 30s...", 20), d.log()[-3000:]
        assert Path(hidden).exists()  # hidden from the daemon only
        # the 30 s timer and SIGHUP take the same path (goto restart: stop what was started, start again)
        d.signal(signal.SIGHUP)
        rc = d.wait_exit(20)
    log = d.log()
    assert NOT_FOUND in log and 'Failed to start one or more MPS deamons. Retrying in 30s...' in log
    assert ("error stopping plugins from previous run: error sending quit message: failed to start NVIDIA MPS "
            'command: exec: "nvidia-cuda-mps-control": executable file not found in $PATH') in log
    assert rc == 1
    # compute mode set for the start, never reset: the GPU stays in EXCLUSIVE_PROCESS
    assert [c.split(" -c ")[-1] for c in mpsdaemon.smi_calls(node / "smi.record")] == ["EXCLUSIVE_PROCESS"]
    root = node / "mps/nvidia.com/gpu"
    assert sorted(p.name for p in root.iterdir()) == ["log", "pipe"] and not any((root / "pipe").iterdir())
    [f] = found(_node_with(tmp_path, node, ["0.log"]), "GPU-K8S-007")
    assert f.status is Status.CONFIRMED and "exec of nvidia-cuda-mps-control fails (2 time(s)" in f.summary
    assert any("/run/nvidia/mps/nvidia.com/gpu/pipe" == e.source and e.text.startswith("empty") for e in f.evidence)
    assert found(_node_with(tmp_path / "b", node, ["0.log"]), "GPU-K8S-011") == []


def test_wrapper_whose_target_is_gone_exits_127(kit, node, tmp_path):
    """The name still on PATH, what it runs gone (a wrapper left by the old driver): `exit status 127`."""
    w = node / "driver-bin/nvidia-cuda-mps-control"
    w.write_text("#!/bin/sh\nexec /usr/local/nvidia/bin/gw-removed-nvidia-cuda-mps-control \"$@\"\n")
    with _daemon(kit, node) as d:
        assert d.wait_log("Retrying in 30s...", 20), d.log()[-3000:]
    assert "Failed to start MPS daemon: exit status 127" in d.log()
    [f] = found(_node_with(tmp_path, node, ["0.log"]), "GPU-K8S-007")
    assert f.status is Status.CONFIRMED and "exits 127" in f.summary and f.data["exit_127"] == 1


def test_control_daemon_killed_under_the_daemon_is_k8s011_not_k8s007(kit, node, tmp_path):
    """The control daemon dies; the plugin's daemon keeps running, unaware; .started and the pid file stay."""
    with _daemon(kit, node) as d:
        assert d.wait_log('"Starting log tailer"', 20), d.log()[-3000:]
        pid = int((node / "mps/nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid").read_text())
        running = _node_with(tmp_path / "running", node, ["0.log"], control_pid=pid)
        os.kill(pid, signal.SIGKILL)
        assert d.proc.poll() is None  # nothing noticed
        died = _node_with(tmp_path / "died", node, ["0.log"])
    assert found(running, "GPU-K8S-011") == [] and found(running, "GPU-K8S-007") == []
    [f] = found(died, "GPU-K8S-011")
    assert f.status is Status.CONFIRMED and f.data["pid"] == pid
    assert found(died, "GPU-K8S-007") == []
