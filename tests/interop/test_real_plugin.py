"""Interoperability with the real NVIDIA k8s-device-plugin (v0.20.0), on a machine without a GPU.

The plugin is the upstream binary (tests/support/realplugin.py finds, unpacks and checks it). It
serves devices only when NVML answers, so it loads tests/support/nvml_fake.c, a libnvidia-ml.so.1
with one fake GPU; everything else — registration, ListAndWatch, GetPreferredAllocation (through
go-gpuallocator), Allocate and its DeviceSpecs, the Xid health loop — is the plugin's own code.
tools/gpu/nvml_inject_shim.c (LD_PRELOAD on the plugin only) makes its NVML hang, or hands it one
synthetic Xid event, on a trigger file. The kubelet side is tests/support/kubelet_standin.py on
gpuwarden's own protos. Every test is bounded; the plugin is always stopped.

Skipped, loudly and with the reason, only when the plugin cannot run here (binary missing or not
matching SHA256SUMS, no C compiler, no mount namespace).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest

from gpuwarden.agent import monitors as mon
from gpuwarden.agent.history import NodeHistory
from gpuwarden.findings import Status
from gpuwarden.grpcapi import client
from gpuwarden.parsers import kubelet_checkpoint
from gpuwarden.root import HostRoot
from tests.support import realplugin
from tests.support.gpunode import found, healthy, plugin_log
from tests.support.fake_kubelet import inline_monitors
from tests.support.kubelet_standin import KubeletStandIn
from tests.support.bundles import CHECKPOINT, GPU_UUID, bundle_file, copy_example

REPO = Path(__file__).resolve().parents[2]
RESOURCE = "nvidia.com/gpu"
DEADLINE = 1.0


@pytest.fixture(scope="module")
def plugin_kit():
    """(binary, fake NVML dir, injection shim); skips loudly when the real plugin cannot run here."""
    try:
        with realplugin.plugin_kit("gw-plugin-kit-") as kit:
            yield kit
    except realplugin.Unavailable as exc:
        pytest.skip(f"REAL DEVICE PLUGIN NOT RUN: {exc}")


@pytest.fixture
def node():
    """A short temp dir standing in for the plugin's /var/lib (unix socket paths are limited to 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(kit, node: Path, *args: str, dev_nodes=None, hang: bool = False, xid: bool = False, lost: bool = False,
         drop_caps=(),
         env: dict[str, str] | None = None):
    binary, fake, shim = kit
    env = {"LD_LIBRARY_PATH": str(fake), "GW_FAKE_NVML_UUID": GPU_UUID, **(env or {})}
    if hang or xid or lost:
        env.update(LD_PRELOAD=str(shim), GW_NVML_HANG_FILE=str(node / "hang"), GW_NVML_XID_FILE=str(node / "xid"),
                   GW_NVML_LOST_FILE=str(node / "lost"))
    return realplugin.RealPlugin(binary, ["--fail-on-init-error=false", *args], var_lib=node, env=env,
                                 dev_nodes=dev_nodes, log_path=node / "plugin.log", drop_caps=drop_caps)


def _dp_dir(node: Path) -> Path:
    return node / "kubelet/device-plugins"


def _registered(k: KubeletStandIn, p: realplugin.RealPlugin, updates: int = 1):
    """The endpoint once it sent `updates` ListAndWatch messages and the stand-in wrote them to its
    checkpoint (it writes right after, as the kubelet does: gpuwarden's probes read that file)."""
    try:
        ep = k.wait_for(RESOURCE, updates=updates, timeout=20)
    except TimeoutError as exc:
        pytest.fail(f"{exc}; plugin log:\n{p.log()[-3000:]}")
    healthy_ids = sorted(i for i, h in ep.devices.items() if h == "Healthy")
    end = time.monotonic() + 5
    while time.monotonic() < end:
        cp = kubelet_checkpoint.parse(Path(k.checkpoint_path).read_text())
        if cp is not None and sorted(cp.registered.get(RESOURCE, ())) == healthy_ids and RESOURCE in cp.registered:
            break
        time.sleep(0.02)
    return ep


def _admit_until_stopped(k: KubeletStandIn, pod: str, done: threading.Event | None) -> None:
    """An admission left hanging; it ends when the plugin is stopped (UNAVAILABLE) or the stand-in closes."""
    try:
        k.admit(pod, "cuda")
    except (grpc.RpcError, ValueError):  # ValueError: the stand-in closed the channel first
        return
    if done is not None:
        done.set()


def test_plugin_registers_and_answers_our_protos(plugin_kit, node):
    with KubeletStandIn(_dp_dir(node)) as k, _run(plugin_kit, node) as p:
        ep = _registered(k, p)
        [reg] = k.registrations
        assert (reg.version, reg.endpoint, reg.resource_name) == ("v1beta1", "nvidia-gpu.sock", RESOURCE)
        assert reg.options.get_preferred_allocation_available and not reg.options.pre_start_required
        assert ep.devices == {GPU_UUID: "Healthy"}
        sock = str(_dp_dir(node) / "nvidia-gpu.sock")
        opts = client.plugin_options(sock, DEADLINE)
        assert opts.ok and opts.value.get_preferred_allocation_available
        first = client.plugin_first_list(sock, DEADLINE)
        assert first.ok and [(d.id, d.health) for d in first.value] == [(GPU_UUID, "Healthy")]
        pref = client.plugin_preferred_allocation(sock, [GPU_UUID], 1, timeout=DEADLINE)
        assert pref.ok and pref.value == (GPU_UUID,)
    assert p.proc.returncode is not None


def test_allocate_through_the_stand_in_writes_the_kubelet_checkpoint(plugin_kit, node):
    with KubeletStandIn(_dp_dir(node), log_path=str(node / "kubelet.log")) as k, \
            _run(plugin_kit, node, "--pass-device-specs") as p:
        _registered(k, p)
        a = k.admit("pod-1", "cuda")
    assert a.preferred == (GPU_UUID,) and a.device_ids == (GPU_UUID,)
    assert a.response.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_UUID
    # /dev/nvidia0 always; nvidiactl and nvidia-uvm only if they exist in the plugin's /dev (not here)
    assert ("/dev/nvidia0", "/dev/nvidia0", "rw") in [(d.container_path, d.host_path, d.permissions) for d in a.response.devices]
    cp = kubelet_checkpoint.parse((_dp_dir(node) / "kubelet_internal_checkpoint").read_text())
    [entry] = cp.entries
    assert (entry.pod_uid, entry.container, entry.resource, entry.device_ids) == ("pod-1", "cuda", RESOURCE, (GPU_UUID,))
    assert entry.alloc_resp == a.raw
    spec = kubelet_checkpoint.decode_alloc(entry.alloc_resp)
    assert spec.devices == tuple((d.container_path, d.host_path, d.permissions) for d in a.response.devices)
    assert spec.envs == dict(a.response.envs)
    assert cp.registered == {RESOURCE: [GPU_UUID]}
    log = (node / "kubelet.log").read_text()
    assert "Issuing a GetPreferredAllocation call for container" in log and "Making allocation request" in log


@pytest.mark.parametrize("strategy", ["volume-mounts", "envvar,volume-mounts"])
def test_volume_mounts_strategy_is_decoded_from_the_checkpoint(plugin_kit, node, strategy):
    """The device list as mounts (`--device-list-strategy=volume-mounts`): gpuwarden's decoder reads them."""
    with KubeletStandIn(_dp_dir(node)) as k, _run(plugin_kit, node, f"--device-list-strategy={strategy}") as p:
        _registered(k, p)
        a = k.admit("pod-1", "cuda")
    assert [(m.container_path, m.host_path) for m in a.response.mounts] == [
        (f"/var/run/nvidia-container-devices/{GPU_UUID}", "/dev/null")]
    spec = kubelet_checkpoint.decode_alloc(a.raw)
    assert spec.mounts == tuple((m.container_path, m.host_path, m.read_only) for m in a.response.mounts)
    assert spec.envs == dict(a.response.envs) and spec.annotations == dict(a.response.annotations)


def test_allocate_of_an_unknown_device_fails_as_upstream(plugin_kit, node):
    with KubeletStandIn(_dp_dir(node)) as k, _run(plugin_kit, node) as p:
        _registered(k, p)
        with pytest.raises(grpc.RpcError) as err:
            k.admit("pod-1", "cuda", device_ids=["GPU-not-on-this-node"])
    # the plugin returns a plain Go error: grpc-go sends it as UNKNOWN with the text
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert 'invalid allocation request for "nvidia.com/gpu"' in err.value.details()
    assert "unknown device: GPU-not-on-this-node" in err.value.details()
    assert kubelet_checkpoint.parse((_dp_dir(node) / "kubelet_internal_checkpoint").read_text()).entries == []


def _counting_rpcs(monkeypatch) -> list[str]:
    """Every RPC gpuwarden's client opens from now on (the stand-in's own calls are not counted).

    The agent's monitor makes them in this process (inline_monitors), not in its forked child: the
    stand-in serves gRPC from this process, and the count is kept here."""
    inline_monitors(monkeypatch)
    seen: list[str] = []
    real = client.rpc_method

    def counted(channel, method, *a, **k):
        seen.append(method.rsplit("/", 1)[-1])
        return real(channel, method, *a, **k)

    monkeypatch.setattr(client, "rpc_method", counted)
    return seen


def test_agent_monitor_sees_a_registered_healthy_plugin(plugin_kit, node, monkeypatch):
    res = mon.MonitorResult()
    rpcs = _counting_rpcs(monkeypatch)
    with KubeletStandIn(_dp_dir(node)) as k, _run(plugin_kit, node) as p:
        _registered(k, p)
        mon.probe_plugins(HostRoot("/"), str(_dp_dir(node)), DEADLINE, NodeHistory(), None, time.time(), res)
    assert res.findings == [] and res.observed["GPU-K8S-001"] == "good"
    assert rpcs == ["GetDevicePluginOptions", "GetPreferredAllocation"]  # never ListAndWatch
    assert res.registered == {RESOURCE: (GPU_UUID,)}  # health from the kubelet's checkpoint


def test_many_agent_probes_leave_the_kubelets_health_stream_alone(plugin_kit, node, monkeypatch):
    """The plugin's ListAndWatch loop never ends a cancelled stream, and every open one waits on the same
    health channel (internal/plugin/server.go, v0.20.0): Go hands each event to the longest waiter, so
    after the first event the next ones would go to streams gpuwarden left behind, never to the kubelet.
    After 50 agent probes gpuwarden has opened no ListAndWatch, and each of two Xid events reaches the
    kubelet stand-in's stream (with 50 probes' ListAndWatch instead, the second one does not: the
    control in docs/performance.md §9); the checkpoint shows the GPU gone from the healthy devices."""
    rpcs = _counting_rpcs(monkeypatch)
    with KubeletStandIn(_dp_dir(node)) as k, _run(plugin_kit, node, xid=True) as p:
        _registered(k, p)
        for i in range(50):
            res = mon.MonitorResult()
            mon.probe_plugins(HostRoot("/"), str(_dp_dir(node)), DEADLINE, NodeHistory(), None, float(i), res)
            assert res.observed["GPU-K8S-001"] == "good", res.findings
        for n in (2, 3):  # two Xid events, two messages on the kubelet's stream
            (node / "xid").write_text("63\n")  # the shim removes it once the event is handed out
            ep = _registered(k, p, updates=n)  # the health loop waits 5 s per NVML event wait
        res = mon.MonitorResult()
        mon.probe_plugins(HostRoot("/"), str(_dp_dir(node)), DEADLINE, NodeHistory(), None, 51.0, res)
    assert ep.devices == {GPU_UUID: "Unhealthy"} and ep.updates == 3
    assert "ListAndWatch" not in rpcs and rpcs.count("GetPreferredAllocation") == 50  # 50 × options + GPA
    assert res.registered == {RESOURCE: ()}  # the kubelet dropped it from RegisteredDevices


def test_hung_nvml_blocks_the_stand_ins_admission_not_gpuwarden(plugin_kit, node, monkeypatch):
    """Incident 5a through the real plugin: options still answer, GetPreferredAllocation (asked for the IDs
    in the kubelet's checkpoint) never does; the kubelet (no deadline, serial admission) is stuck,
    gpuwarden reports within its deadline."""
    inline_monitors(monkeypatch)  # the stand-in serves gRPC from this process: no forked gRPC client
    res = mon.MonitorResult()
    with KubeletStandIn(_dp_dir(node)) as k, _run(plugin_kit, node, hang=True) as p:
        _registered(k, p)
        (node / "hang").touch()
        second_done = threading.Event()
        first = threading.Thread(target=_admit_until_stopped, args=(k, "pod-1", None), daemon=True)
        second = threading.Thread(target=_admit_until_stopped, args=(k, "pod-2", second_done), daemon=True)
        first.start()
        second.start()
        first.join(3)
        assert first.is_alive() and not second_done.is_set()  # hung, and the next admission queued behind it
        t0 = time.monotonic()
        mon.probe_plugins(HostRoot("/"), str(_dp_dir(node)), DEADLINE, NodeHistory(), None, time.time(), res)
        elapsed = time.monotonic() - t0
        assert p.wait_log("nvmlInit hangs now", 5)
    first.join(5)
    second.join(5)
    assert not first.is_alive() and not second.is_alive()  # stopping the plugin released both
    assert elapsed < 2 * DEADLINE + 1
    [f] = res.findings
    assert (f.code, f.status) == ("GPU-K8S-001", Status.CONFIRMED)
    assert "GetPreferredAllocation" in f.summary and res.observed["GPU-K8S-001"] == "bad"


@pytest.mark.parametrize("hung", [True, False])
def test_check_asks_the_plugin_and_reports_a_hang_within_its_deadline(plugin_kit, hung):
    """`gpuwarden check` on a live root asks the plugin socket the kubelet's calls in a killable child:
    GPU-K8S-001 confirmed when GetPreferredAllocation hangs (no kubelet log needed), nothing when it answers."""
    root = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    var_lib = root / "var/lib"
    try:
        with KubeletStandIn(_dp_dir(var_lib)) as k, _run(plugin_kit, var_lib, hang=True) as p:
            _registered(k, p)
            if hung:
                (var_lib / "hang").touch()
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--root", str(root), "--select",
                                  "GPU-K8S-001", "--probe-timeout", "1", "--format", "json"],
                                 capture_output=True, text=True, timeout=60,
                                 env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
            elapsed = time.monotonic() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    findings = json.loads(out.stdout)["findings"]
    if not hung:
        assert findings == [], findings
        return
    [f] = findings
    assert (f["code"], f["status"]) == ("GPU-K8S-001", "confirmed") and "GetPreferredAllocation" in f["summary"]
    assert any(e["source"].startswith("probe:plugin ") and "no answer within 1s" in e["text"] for e in f["evidence"])
    assert elapsed < 15  # three 1 s calls at most, plus interpreter start-up


def test_xid_marks_the_gpu_unhealthy_over_list_and_watch_and_gpuwarden_names_it(plugin_kit, node, tmp_path):
    """The plugin's health path: one synthetic Xid 63 (row-remap recorded: NVIDIA says IGNORE) from NVML's
    event wait; the plugin marks the GPU Unhealthy for good; gpuwarden reads the plugin's own log line."""
    with KubeletStandIn(_dp_dir(node)) as k, _run(plugin_kit, node, xid=True) as p:
        _registered(k, p)
        (node / "xid").write_text("63\n")
        ep = _registered(k, p, updates=2)  # the health loop waits 5 s per NVML event wait
    assert ep.devices == {GPU_UUID: "Unhealthy"}  # over the stand-in's (the kubelet's) ListAndWatch stream
    doc = json.loads((_dp_dir(node) / "kubelet_internal_checkpoint").read_text())
    assert doc["Data"]["RegisteredDevices"] == {RESOURCE: []}  # the kubelet keeps healthy devices only
    lines = [ln for ln in p.log().splitlines() if "marking device as unhealthy" in ln]
    assert lines == [f"{lines[0].split('] ')[0]}] XidCriticalError: Xid=63 on Device={GPU_UUID}; marking device as unhealthy."]
    # gpuwarden on a node holding that log (the plugin pod's) and that checkpoint
    b = healthy(tmp_path)
    plugin_log(b, lines[0])
    bundle_file(b, CHECKPOINT).write_text(json.dumps(doc))
    [f] = found(b, "GPU-K8S-003")
    assert f.status is Status.CONFIRMED and f.data == {"gpu": GPU_UUID, "xids": [63]}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mknod in the plugin's own /dev")
def test_incident1_plugin_without_uvm_in_its_dev_omits_it_and_gpuwarden_says_why(plugin_kit, node, tmp_path):
    """The plugin stats /dev/nvidia-uvm in its own /dev: absent there, absent from every Allocate — unless the
    plugin holds CAP_MKNOD, with which NVML re-creates the node at init (seen on an H100, docs/validation.md)."""
    nodes = [("nvidiactl", 195, 255), ("nvidia0", 195, 0)]
    uvm = [("nvidia-uvm", 238, 0), ("nvidia-uvm-tools", 238, 1)]
    specs, raws = {}, {}
    # the fake NVML creates the uvm nodes at init where it can, as the real one did on the H100
    heal = {"GW_FAKE_NVML_UVM_MAJOR": "238"}
    with KubeletStandIn(_dp_dir(node)) as k:
        # the remedy: the same kubelet, the plugin restarted once the node exists, the pod recreated;
        # "healed": the same stale /dev, but the plugin keeps CAP_MKNOD: NVML re-creates the node
        for name, extra, drop in (("stale", [], [realplugin.CAP_MKNOD]), ("full", uvm, [realplugin.CAP_MKNOD]),
                                  ("healed", [], [])):
            n = len(k.registrations)
            # without CAP_MKNOD, as the Helm chart runs it (capabilities: drop ALL)
            with _run(plugin_kit, node, "--pass-device-specs", dev_nodes=nodes + extra, drop_caps=drop, env=heal) as p:
                try:
                    k.wait_for(RESOURCE, after=n, timeout=20)
                except TimeoutError as exc:
                    pytest.fail(f"{exc}; plugin log:\n{p.log()[-3000:]}")
                caps = realplugin.capabilities(p.pid)
                assert bool(caps["CapEff"] & (1 << realplugin.CAP_MKNOD)) is (not drop)
                assert Path(f"/proc/{p.pid}/exe").resolve().name == "nvidia-device-plugin"
                a = k.admit(f"pod-{name}", "cuda")
                k.forget(f"pod-{name}")
            specs[name] = [x.container_path for x in a.response.devices]
            raws[name] = a.raw
        assert [r.endpoint for r in k.registrations] == ["nvidia-gpu.sock"] * 3
    assert specs["stale"] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert specs["full"] == specs["healed"] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"]
    # the stale plugin's real bytes in incident 1's node: gpuwarden quotes them as the omission
    b = copy_example("uvm-missing", tmp_path)
    doc = json.loads(bundle_file(b, CHECKPOINT).read_text())
    doc["Data"]["PodDeviceEntries"][0]["AllocResp"] = base64.b64encode(raws["stale"]).decode()
    bundle_file(b, CHECKPOINT).write_text(json.dumps(doc))
    [f] = found(b, "GPU-DEV-001")
    assert f.status is Status.CONFIRMED and f.data["stale_plugin"] is True
    assert any("plugin's Allocate returned devices /dev/nvidiactl, /dev/nvidia0 (no /dev/nvidia-uvm)" in e.text
               for e in f.evidence)


def test_a_lost_gpu_fails_every_preferred_allocation_and_gpuwarden_confirms_the_storm(plugin_kit, node, tmp_path):
    """One GPU lost (the shim answers NVML_ERROR_GPU_IS_LOST for it once the trigger file exists): the plugin's
    topology-aware GetPreferredAllocation (go-gpuallocator over every GPU) fails for every request while
    ListAndWatch still says Healthy; gpuwarden reads the kubelet's line for that error as GPU-K8S-012,
    and nothing once the GPU is back."""
    from tests.rules.test_lost_gpu import KUBELET_LOG, kubelet_event
    from tests.support.bundles import write

    with KubeletStandIn(_dp_dir(node)) as k, _run(plugin_kit, node, lost=True) as p:
        _registered(k, p)
        (node / "lost").write_text("0\n")
        errors = []
        for pod in ("pod-1", "pod-2", "pod-3"):
            with pytest.raises(grpc.RpcError) as err:
                k.admit(pod, "cuda")
            errors.append(err.value)
        listed = dict(k.endpoints[RESOURCE].devices)  # the stand-in's (the kubelet's) stream
        (node / "lost").unlink()
        back = k.admit("pod-4", "cuda")
    assert all(e.code() == grpc.StatusCode.UNKNOWN for e in errors)
    detail = errors[0].details()
    assert detail.startswith("error getting list of preferred allocation devices: unable to get device link information")
    assert detail.endswith("GPU is lost"), detail
    assert listed == {GPU_UUID: "Healthy"}  # still advertised
    assert back.device_ids == (GPU_UUID,)
    # the kubelet's wording around the plugin's error (manager.go, admission), on a node holding it
    msg = (f"Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: "
           f"code = {errors[0].code().name.title()} desc = {detail}, which is unexpected")
    b = healthy(tmp_path)
    write(b, KUBELET_LOG, kubelet_event(msg))
    [f] = found(b, "GPU-K8S-012")
    assert f.status is Status.CONFIRMED and f.severity.label == "critical" and f.data["failures"] == 1
