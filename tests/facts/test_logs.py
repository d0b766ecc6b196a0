"""The `logs` fact: where logs are found, how they are read, what the kubelet's plugin calls did."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuwarden.facts import FactUnavailable
from tests.support.bundles import CAPTURED, FIXTURES, SH, bundle, facts_of, live
from tests.support.kubelet_log import adding, alloc, gpa, kline, noise, syncloop

UID6 = "69e0758e-d625-4013-9258-df8b7ddf04e2"
UID1 = "cf97dd7e-bc61-44c1-8241-b47204a2e9b1"
JOURNAL = FIXTURES / "logs/incident5-journal/kubelet.journal.json"


def logs_of(root, **kw):
    return facts_of(root, now=CAPTURED, **kw).get("logs")


def calls(root, **kw):
    dm = logs_of(root, **kw).devicemanager
    return [(c.rpc, c.outcome, c.pod_uid, c.container) for c in dm.calls]


# --- locating and reading --------------------------------------------------------------------------

def test_bundle_kubelet_log_in_node_zone(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": gpa("20:39:03.753013", 45878, UID6, "neal-0729-6")
                             + noise("21:02:03.804324", 45878)})
    lf = logs_of(root)
    assert lf.tz == "/etc/timezone: Asia/Shanghai"
    (ev,) = lf.kubelet.of("kubelet.gpa.issue")
    assert ev.time == pytest.approx(dt.datetime(2025, 7, 30, 20, 39, 3, 753013, tzinfo=SH).timestamp())
    assert lf.kubelet.source == "/.gpuwarden/logs/kubelet.log" and lf.kubelet.format == "klog"


def test_bundle_journal_json_real_fixture(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"/.gpuwarden/logs/kubelet.journal.json": JOURNAL.read_bytes()}, tz=None)
    lf = logs_of(root)
    assert lf.kubelet.format == "journal-json" and lf.tz.startswith("UTC")  # journal times need no zone
    (ev,) = lf.kubelet.of("kubelet.gpa.issue")
    assert ev.time == pytest.approx(dt.datetime(2025, 7, 30, 20, 39, 3, 753013, tzinfo=SH).timestamp())
    assert ev.pid == 45878 and ev.fields["podUID"] == UID6
    (cli,) = lf.kubelet.of("runtime.container-cli-error")
    assert cli.fields["stage"] == "initialization error" and cli.fields["detail"].startswith("nvml error")
    (c,) = lf.devicemanager.calls
    assert c.outcome == "open" and c.pod == "mck-test/neal-0729-6-8686d45f8c-rgsr9"
    assert [p for _, p, _ in lf.devicemanager.queued_pods()] == ["mck-test/neal-0729-6-68b4895fb7-6868w",
                                                                 "mck-test/neal-0729-6-8686d45f8c-rgsr9"]


def test_live_syslog_is_filtered_to_kubelet(tmp_path: Path) -> None:
    messages = ("Jul 30 20:39:01 h containerd[800]: GetPreferredAllocation mentioned elsewhere\n"
                + gpa("20:39:03.753013", 45878, UID6, "c") + noise("20:50:00.000000", 45878))
    root = live(tmp_path, {"/var/log/messages": messages, "/etc/timezone": "Asia/Shanghai\n"})
    lf = logs_of(root)
    assert lf.kubelet.source == "/var/log/messages"
    assert [e.pid for e in lf.kubelet.events] == [45878]


def test_settings_path_wins(tmp_path: Path) -> None:
    root = live(tmp_path, {"/var/log/kubelet.log": noise("20:00:00.000000", 1),
                           "/opt/logs/k.txt": gpa("20:39:03.753013", 45878, UID6, "c")})
    lf = logs_of(root, kubelet_log="/opt/logs/k.txt")
    assert lf.kubelet.source == "/opt/logs/k.txt" and len(lf.kubelet.events) == 1


def test_newest_rotated_kubelet_log(tmp_path: Path) -> None:
    import os

    root = live(tmp_path, {"/var/log/kubelet/old.log": noise("10:00:00.000000", 1),
                           "/var/log/kubelet/new.log": gpa("20:39:03.753013", 45878, UID6, "c")})
    os.utime(tmp_path / "var/log/kubelet/old.log", (1, 1))
    assert logs_of(root).kubelet.source == "/var/log/kubelet/new.log"


def test_no_logs_at_all_is_unavailable_with_reason(tmp_path: Path) -> None:
    f = facts_of(bundle(tmp_path, {"/proc/version": "x"}))
    with pytest.raises(FactUnavailable, match="no kubelet, containerd, kernel or NVIDIA pod log"):
        f.get("logs")
    assert ("kubelet log", "no file; journald not read") in [(g.source, g.reason) for g in f.gaps()]


def test_kubelet_missing_is_a_gap_not_a_failure(tmp_path: Path) -> None:
    f = facts_of(bundle(tmp_path, {"/.gpuwarden/logs/kernel.log": "[  1.0] NVRM: Xid (PCI:0000:0f:00): 79, pid=1, "
                                                                "GPU has fallen off the bus.\n"}))
    lf = f.get("logs")
    assert lf.kubelet is None and lf.devicemanager is None and lf.not_found["kubelet"] == "no file; journald not read"
    (x,) = lf.kernel.of("kernel.xid")
    assert x.fields["xid"] == "79"


def test_probe_journal_hook(tmp_path: Path) -> None:
    root = live(tmp_path, {"/etc/timezone": "UTC\n"})
    f = facts_of(root, now=CAPTURED)
    f.set("probes", SimpleNamespace(extra={"journal": {"kubelet": JOURNAL.read_text()}}))
    lf = f.get("logs")
    assert lf.kubelet.source == "probes:journal:kubelet" and lf.kubelet.of("kubelet.gpa.issue")


def test_nvidia_pod_logs_only(tmp_path: Path) -> None:
    d = "/var/log/pods"
    err = ('2025-08-05T16:40:16.431856992+08:00 stderr F E0805 08:40:16.431856 303 main.go:213] Failed to start MPS '
           'daemon: exec: "nvidia-cuda-mps-control": executable file not found in $PATH\n')
    root = bundle(tmp_path, {
        f"{d}/gpu-operator_nvidia-device-plugin-mps-control-daemon-rpm7r_5b0d7c1e-2f43-4a8e-9c61-3d7e8f902a14/"
        "mps-control-daemon-ctr/12.log": err,
        f"{d}/gpu-operator_nvidia-device-plugin-mps-control-daemon-rpm7r_5b0d7c1e-2f43-4a8e-9c61-3d7e8f902a14/"
        "mps-control-daemon-ctr/10.log": err,
        f"{d}/gpu-operator_nvidia-device-plugin-mps-control-daemon-rpm7r_5b0d7c1e-2f43-4a8e-9c61-3d7e8f902a14/"
        "mps-control-daemon-ctr/11.log": "garbage\n",
        f"{d}/ml_trainer-0_8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b/trainer/0.log": err,
    })
    lf = logs_of(root)
    assert [s.source.rsplit("/", 1)[1] for s in lf.pods()] == ["12.log", "11.log"]  # newest two, NVIDIA pods only
    (e,) = lf.events("mps.binary-missing")
    assert e.log == "pod:gpu-operator/nvidia-device-plugin-mps-control-daemon-rpm7r/mps-control-daemon-ctr"
    assert lf.pod_names["8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"] == "ml/trainer-0"


@pytest.mark.parametrize("garbage", [
    bytes(random.Random(3).randrange(256) for _ in range(20_000)),
    b"\x00" * 4096,
    b"GetPreferredAllocation\n" * 5,  # anchors without a klog header: events without times, no crash
    gpa("20:39:03.753013", 45878, UID6, "c").encode()[:80],  # torn
])
def test_garbage_kubelet_log(tmp_path: Path, garbage: bytes) -> None:
    lf = logs_of(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": garbage}))
    assert lf.kubelet is not None and lf.devicemanager is not None


def test_max_bytes_reported_as_gap(tmp_path: Path) -> None:
    text = "".join(noise(f"20:{i // 60:02d}:{i % 60:02d}.000000", 1) for i in range(200))
    f = facts_of(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": text}), log_max_bytes=2048)
    f.get("logs")
    assert any("scanned the last 2048" in g.reason for g in f.gaps())


# --- what the plugin calls did -----------------------------------------------------------------------

def test_completed_admission_is_returned(tmp_path: Path) -> None:
    log = (gpa("19:37:03.951749", 26361, UID1, "neal-0729-1") + alloc("19:37:03.952761", 26361)
           + kline("19:37:03.954888", 26361, "pod_workers.go:770",
                   f'"Pod is being synced for the first time" pod="mck-test/x" podUID={UID1} updateType="create"')
           + noise("21:00:00.000000", 26361))
    assert calls(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log})) == [
        ("GetPreferredAllocation", "returned", UID1, "neal-0729-1"),
        ("Allocate", "returned", UID1, "neal-0729-1"),  # pod inherited from the GetPreferredAllocation line
    ]


def test_open_call_with_queue_and_silent_sync_loop(tmp_path: Path) -> None:
    log = (syncloop("20:39:02.000000", 45878) + kline("20:39:03.752764", 45878, "kubelet.go:2343",
                                                      '"SyncLoop ADD" source="api" pods=[mck-test/p6]')
           + gpa("20:39:03.753013", 45878, UID6, "neal-0729-6") + noise("20:40:00.000000", 45878)
           + adding("20:41:12.318452", 45878, "mck-test/p7")
           + adding("20:52:30.602117", 45878, "mck-test/p6", op="Gracefully deleting")
           + noise("21:02:03.804324", 45878))
    dm = logs_of(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log})).devicemanager
    (c,) = dm.open_calls()
    assert c.pod == "mck-test/p6" and c.container == "neal-0729-6"
    assert c.log_after_s == pytest.approx(23 * 60 + 0.051311, abs=1e-3)
    assert c.waited_s == pytest.approx(CAPTURED - c.event.time)
    assert [(op, p) for op, p, _ in dm.queued_pods()] == [("add", "mck-test/p7"), ("delete", "mck-test/p6")]
    assert dm.syncloop_after == 0
    assert dm.stalled(60) == [c] and dm.stalled(10_000) == []


def test_sync_loop_after_the_call_means_it_returned(tmp_path: Path) -> None:
    log = gpa("20:39:03.753013", 45878, UID6, "c") + syncloop("20:39:05.000000", 45878) + noise("21:00:00.0", 45878)
    assert calls(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log})) == [
        ("GetPreferredAllocation", "returned", UID6, "c")]


def test_rpc_error_is_failed(tmp_path: Path) -> None:
    log = (gpa("20:39:03.753013", 45878, UID6, "c")
           + kline("20:39:33.000000", 45878, "kubelet.go:2000", '"Failed to admit pod" err="device plugin '
                   'GetPreferredAllocation rpc failed with err: rpc error: code = Unavailable"', sev="E"))
    assert calls(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log})) == [
        ("GetPreferredAllocation", "failed", UID6, "c")]


def test_restart_ends_a_pending_call(tmp_path: Path) -> None:
    log = (gpa("20:39:03.753013", 45878, UID6, "c") + noise("20:50:00.000000", 45878)
           + kline("21:00:00.000000", 51000, "server.go:415", '"Kubelet version" kubeletVersion="v1.27.5"')
           + gpa("21:00:05.000000", 51000, UID6, "c") + alloc("21:00:05.100000", 51000) + syncloop("21:00:06.0", 51000))
    dm = logs_of(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log})).devicemanager
    first = dm.calls[0]
    assert first.outcome == "kubelet-restarted" and first.followed_by.sig == "kubelet.start"
    assert first.waited_s == pytest.approx(20 * 60 + 56.246987, abs=1e-3)
    assert dm.restarted_stalls(60) == [first] and dm.open_calls() == []


def test_allocate_without_pod_across_a_restart_is_unknown(tmp_path: Path) -> None:
    log = alloc("20:39:03.000000", 45878) + alloc("21:00:05.000000", 51000) + syncloop("21:00:06.0", 51000)
    dm = logs_of(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log})).devicemanager
    assert [c.outcome for c in dm.calls] == ["unknown", "returned"]
    assert dm.restarted_stalls(0) == []
