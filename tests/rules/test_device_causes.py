"""GPU-DEV-001..003 state the loss as proven and the cause only where the node shows it.

The trees are the built-in examples edited the way the issue's re-check edited them: the same
broken container on a node whose kubelet does NOT run the static CPU manager (flag, config and
state file agree), with runc >= 1.0, with the systemd driver but no reload dated after the
container's start. Each must keep the CONFIRMED loss and say "cause not determined", with the
candidates, what the node rules out, and the catch-all remedy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.findings import Status
from tests.support.bundles import (
    CID_GPU, GPU_DEVICES_LIST, copy_example, edit_meta, ev_lines, example_root, findings, open_dir, write,
)

KUBELET_NONE = ("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\n"
                "cpuManagerPolicy: none\n")
STATE_NONE = '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}'
CATCH_ALL = ("PASS_DEVICE_SPECS=true", "CDI", "runc >= 1.0.0")


def dev(root) -> list:
    return findings(root, "GPU-DEV")


def _assert_not_determined(f) -> None:
    assert f.status is Status.CONFIRMED  # the loss itself is read from the device policy
    assert "Cause not determined" in f.summary and "Cause (shown" not in f.summary
    assert f.data["cause"] == "not-determined"
    assert f.mechanism.startswith("cause not determined (candidates: ")
    assert all(fix in f.remedy for fix in CATCH_ALL)
    assert any(e.source == "candidate cause" and "resize" in e.text for e in f.evidence)
    assert any(e.source == "candidate cause" and "docker update" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_dev002_names_the_static_cpu_manager_only_where_the_node_shows_it() -> None:
    (f,) = dev(example_root("cpu-manager-device-loss"))
    assert f.code == "GPU-DEV-002" and f.title == "GPU devices dropped from a running container's device cgroup"
    assert f.summary.startswith("1 GPU container(s) lost access to nvidiactl or their GPU: trainer-0/trainer is denied "
                                "/dev/nvidiactl, /dev/nvidia0 (all in its /dev: given at start); running since ")
    assert "Cause (shown by this node): the static CPU manager's reconcile (cpuManagerPolicy=static)" in f.summary
    assert "runc 1.0.0-rc92 < 1.0.0 re-applies devices on update" in f.summary
    assert f.data["cause"] == "static-cpu-manager" and f.data["candidates"] == []
    assert "kubelet restart" in f.remedy or "restarting kubelet" in f.remedy


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_dev002_policy_none_keeps_the_loss_and_says_cause_not_determined(tmp_path: Path) -> None:
    """The issue's re-check: cpuManagerPolicy none in config and state file, cgroupfs driver."""
    b = copy_example("cpu-manager-device-loss", tmp_path)
    write(b, "/var/lib/kubelet/config.yaml", KUBELET_NONE)
    write(b, "/var/lib/kubelet/cpu_manager_state", STATE_NONE)
    (f,) = dev(open_dir(b))
    assert f.code == "GPU-DEV-002"
    _assert_not_determined(f)
    assert "static" not in f.title and "runc update" not in f.title
    assert "static CPU manager" not in f.summary
    ev = ev_lines(f)
    assert ("ruled out: static CPU manager: cpuManagerPolicy=none (/var/lib/kubelet/cpu_manager_state: "
            "policyName=none)") in ev or \
        "ruled out: static CPU manager: cpuManagerPolicy=none (/var/lib/kubelet/config.yaml: cpuManagerPolicy: none)" in ev
    assert ("ruled out: systemd daemon-reload: cgroupDriver=cgroupfs (/var/lib/kubelet/config.yaml: cgroupDriver: "
            "cgroupfs): systemd does not own the container's cgroup") in ev
    assert f.data["lost"] == {CID_GPU: ["/dev/nvidiactl", "/dev/nvidia0"]}


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_dev002_static_but_runc_1_0_rules_the_cpu_manager_out(tmp_path: Path) -> None:
    b = copy_example("cpu-manager-device-loss", tmp_path)
    write(b, "/.gpuwarden/commands/runc-version.txt", "runc version 1.1.12\ncommit: v1.1.12-0-g51d5e946\n")
    (f,) = dev(open_dir(b))
    assert f.code == "GPU-DEV-002"
    _assert_not_determined(f)
    assert "ruled out: static CPU manager: runc >= 1.0.0 skips devices on `runc update`" in ev_lines(f)


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_dev002_policy_by_default_is_ruled_out_citing_the_default(tmp_path: Path) -> None:
    b = copy_example("cpu-manager-device-loss", tmp_path)
    for p in ("/var/lib/kubelet/config.yaml", "/var/lib/kubelet/cpu_manager_state"):
        (b / "files" / p.lstrip("/")).unlink()
        edit_meta(b, lambda m, p=p: m.setdefault("remove", []).append(p))
    (f,) = dev(open_dir(b))
    _assert_not_determined(f)
    # ruled out on the kubelet's default, and the line says that is what it rests on
    assert "static CPU manager: cpuManagerPolicy=none (kubelet default (cpuManagerPolicy not set))" in f.data["ruled_out"]


@pytest.mark.rule("GPU-DEV-003", "positive")
def test_dev003_names_the_reload_it_dates() -> None:
    (f,) = dev(example_root("systemd-reload-device-loss"))
    assert f.code == "GPU-DEV-003" and "daemon-reload" not in f.title
    assert "Cause (shown by this node): a `systemctl daemon-reload` at 2026-11-22 02:12:40Z" in f.summary
    assert "lost at or after 2026-11-22 02:12:40Z" in f.summary
    assert f.data["cause"] == "daemon-reload"
    assert any(line.startswith("/run/systemd/generator: re-created 2026-11-22 02:12:40Z, after the container started")
               for line in ev_lines(f))
    assert "create-dev-char-symlinks" in f.remedy


@pytest.mark.rule("GPU-DEV-003", "positive")
@pytest.mark.parametrize("when", ["none", "before-start"])
def test_dev003_without_a_reload_after_the_start_says_not_determined(tmp_path: Path, when: str) -> None:
    b = copy_example("systemd-reload-device-loss", tmp_path)

    def move(m: dict) -> None:
        if when == "none":
            m["stat"].pop("/run/systemd/generator")
        else:
            m["stat"]["/run/systemd/generator"].update(mtime=1795313530.0, ctime=1795313530.0)  # boot+3 s

    edit_meta(b, move)
    (f,) = dev(open_dir(b))
    assert f.code == "GPU-DEV-003"
    _assert_not_determined(f)
    assert any("daemon-reload" in c and "journalctl" in c for c in f.data["candidates"])
    assert "create-dev-char-symlinks" in f.remedy  # the catch-all names the systemd-path fix too
    if when == "before-start":
        assert any("(last daemon-reload), before the container started" in line for line in ev_lines(f))


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_dev001_plugin_ctime_alone_is_a_candidate_not_a_cause(tmp_path: Path) -> None:
    """Only the ctime ordering suggests a stale plugin (its /dev was not captured; its Allocate, per the
    checkpoint, listed nvidia-uvm): the denial is proven, the cause is not."""
    b = copy_example("uvm-missing", tmp_path)
    healthy = example_root("healthy")
    write(b, "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
          healthy.read_text("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"))

    def plugin_dev_unknown(m: dict) -> None:
        m["listdir"].pop("/proc/2301/root/dev", None)
        for k in [k for k in m["stat"] if k.startswith("/proc/2301/root/dev/")]:
            m["stat"].pop(k)
        m.setdefault("remove", []).append("/proc/2301/root/dev")

    edit_meta(b, plugin_dev_unknown)
    (f,) = [f for f in dev(open_dir(b)) if f.code == "GPU-DEV-001"]
    assert f.status is Status.CONFIRMED
    assert f.data["stale_plugin"] is False and f.data["cause"] == "not-determined"
    assert "Cause not determined: candidates are a device plugin whose /dev predates the node (it started before" \
        in f.summary
    assert f"{GPU_DEVICES_LIST}: /dev/nvidia-uvm (c 238:0): no entry allows c 238:0 rw " \
           "(entries for major 238: c *:* m; b *:* m)" in ev_lines(f)
