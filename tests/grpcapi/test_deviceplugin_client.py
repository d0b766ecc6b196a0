"""Device-plugin client against real gRPC servers on unix sockets.

The deadline tests are the point: incident 5 was a kubelet blocked forever on
a plugin stuck in nvmlInit, so every probe must come back within its timeout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from gpuwarden.grpcapi import client
from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2 as dp
from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from gpuwarden.grpcapi.client import PluginDevice
from tests.support.fake_kubelet import FakeDevicePlugin
from tests.support.protowire import ld, varint, vi

SLACK_S = 0.5
GPUS = [
    PluginDevice("GPU-aaaa", "Healthy", (0,)),
    PluginDevice("GPU-bbbb", "Unhealthy", (1,)),
    PluginDevice("GPU-cccc", "Healthy", (0, 1)),
]


@pytest.fixture
def plugin(sock_dir: Path):
    with FakeDevicePlugin(sock_dir / "nvidia-gpu.sock", GPUS) as p:
        yield p


# --------------------------------------------------------------------------
# happy paths


def test_options_ok(plugin: FakeDevicePlugin) -> None:
    r = client.plugin_options(plugin.socket_path, timeout=2)
    assert (r.ok, r.status) == (True, "ok")
    assert r.value == client.PluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
    assert r.rpc == "v1beta1.DevicePlugin/GetDevicePluginOptions"
    assert r.socket_path == plugin.socket_path and r.timeout_s == 2
    assert 0 <= r.elapsed_s < 2


def test_first_list_returns_devices_with_health_and_numa(plugin: FakeDevicePlugin) -> None:
    r = client.plugin_first_list(plugin.socket_path, timeout=2)
    assert r.status == "ok", r.detail
    assert r.value == tuple(GPUS)
    assert [d.healthy for d in r.value] == [True, False, True]


def test_first_list_returns_without_waiting_for_the_stream_to_end(plugin: FakeDevicePlugin) -> None:
    # The fake keeps the stream open like a real plugin; only cancel ends it.
    r = client.plugin_first_list(plugin.socket_path, timeout=3)
    assert r.ok and r.elapsed_s < 1.0
    t0 = time.monotonic()
    plugin.stop()
    assert time.monotonic() - t0 < 2.0


def test_preferred_allocation_ok(plugin: FakeDevicePlugin) -> None:
    r = client.plugin_preferred_allocation(
        plugin.socket_path, ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"], 2, must_include_device_ids=["GPU-cccc"], timeout=2
    )
    assert r.status == "ok", r.detail
    assert r.value == ("GPU-cccc", "GPU-aaaa")


def test_slow_answer_within_deadline_is_ok(sock_dir: Path) -> None:
    with FakeDevicePlugin(sock_dir / "p.sock", GPUS, delay_s={"GetDevicePluginOptions": 0.3}) as p:
        r = client.plugin_options(p.socket_path, timeout=2)
    assert r.ok and r.elapsed_s >= 0.3


def test_set_devices_pushes_update_on_open_stream(plugin: FakeDevicePlugin) -> None:
    """The fake behaves like a plugin reporting a GPU going bad (for agent tests)."""
    with grpc.insecure_channel(f"unix://{plugin.socket_path}") as ch:
        stream = dp_grpc.DevicePluginStub(ch).ListAndWatch(dp.Empty(), timeout=3)
        assert [d.health for d in next(stream).devices] == ["Healthy", "Unhealthy", "Healthy"]
        plugin.set_devices([("GPU-aaaa", "Unhealthy")])
        second = next(stream)
        stream.cancel()
    assert [(d.ID, d.health) for d in second.devices] == [("GPU-aaaa", "Unhealthy")]


# --------------------------------------------------------------------------
# deadlines and failures


@pytest.mark.parametrize(
    "method, call",
    [
        ("GetPreferredAllocation", lambda s, t: client.plugin_preferred_allocation(s, ["GPU-aaaa"], 1, timeout=t)),
        ("GetDevicePluginOptions", lambda s, t: client.plugin_options(s, timeout=t)),
        ("ListAndWatch", lambda s, t: client.plugin_first_list(s, timeout=t)),
    ],
)
def test_hung_plugin_times_out_within_deadline(sock_dir: Path, method: str, call) -> None:
    timeout = 1.0
    with FakeDevicePlugin(sock_dir / "stuck.sock", GPUS, hang_on={method}) as p:
        r = call(p.socket_path, timeout)
        assert (r.ok, r.status, r.value) == (False, "timeout", None)
        assert timeout * 0.9 <= r.elapsed_s < timeout + SLACK_S
        assert "1s" in r.detail
        assert p.calls == [method]  # the plugin really got the call and sat on it
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2.0, "stop() must not wait for hung handlers"


def test_stop_leaves_no_worker_threads(sock_dir: Path) -> None:
    p = FakeDevicePlugin(sock_dir / "stuck.sock", GPUS, hang_on={"GetPreferredAllocation"}).start()
    results = []
    callers = [
        threading.Thread(
            target=lambda: results.append(
                client.plugin_preferred_allocation(p.socket_path, ["GPU-aaaa"], 1, timeout=5)
            )
        )
        for _ in range(3)
    ]
    for t in callers:
        t.start()
    deadline = time.monotonic() + 3
    while len(p.calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    p.stop()
    assert time.monotonic() - t0 < 2.0
    for t in callers:
        t.join(5)
    assert not [t for t in threading.enumerate() if t.name.startswith("FakeDevicePlugin")]
    assert {r.status for r in results} <= {"unavailable", "error"}  # server went away mid-call
    assert not os.path.exists(p.socket_path)


def test_missing_socket_is_unavailable_fast(sock_dir: Path) -> None:
    r = client.plugin_options(str(sock_dir / "nope.sock"), timeout=5)
    assert (r.ok, r.status) == (False, "unavailable")
    assert r.elapsed_s < 0.1
    assert "no socket" in r.detail


def test_plain_file_is_not_a_socket(sock_dir: Path) -> None:
    f = sock_dir / "file.sock"
    f.write_text("")
    r = client.plugin_first_list(str(f), timeout=5)
    assert r.status == "unavailable" and r.elapsed_s < 0.1
    assert "not a unix socket" in r.detail


def test_stale_socket_with_nobody_listening_is_unavailable_not_a_hang(sock_dir: Path) -> None:
    path = str(sock_dir / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # file stays, nobody accepts: what a crashed plugin leaves behind
    for call in (
        lambda: client.plugin_options(path, timeout=5),
        lambda: client.plugin_first_list(path, timeout=5),
        lambda: client.plugin_preferred_allocation(path, ["x"], 1, timeout=5),
    ):
        r = call()
        assert r.status in {"unavailable", "error"}, r
        assert r.elapsed_s < 2.0


def test_listening_socket_that_never_speaks_grpc_times_out(sock_dir: Path) -> None:
    """Accepts connections at the kernel level but never answers the HTTP/2 handshake."""
    path = str(sock_dir / "mute.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    try:
        r = client.plugin_options(path, timeout=1.0)
    finally:
        s.close()
    assert r.status == "timeout"
    assert r.elapsed_s < 1.0 + SLACK_S


def test_method_missing_from_server_is_unimplemented(sock_dir: Path) -> None:
    # An old plugin: serves the service but has no GetPreferredAllocation.
    with FakeDevicePlugin(
        sock_dir / "old.sock", GPUS, unimplemented={"GetPreferredAllocation"}, get_preferred_allocation_available=False
    ) as p:
        r = client.plugin_preferred_allocation(p.socket_path, ["GPU-aaaa"], 1, timeout=2)
        assert (r.ok, r.status) == (False, "unimplemented")
        assert r.elapsed_s < 1.0
        opts = client.plugin_options(p.socket_path, timeout=2)
        assert opts.ok and opts.value.get_preferred_allocation_available is False


def test_server_error_is_error_with_code(sock_dir: Path) -> None:
    with FakeDevicePlugin(sock_dir / "bad.sock", GPUS, fail_on={"GetDevicePluginOptions": grpc.StatusCode.INTERNAL}) as p:
        r = client.plugin_options(p.socket_path, timeout=2)
    assert r.status == "error"
    assert r.detail.startswith("INTERNAL") and "injected failure" in r.detail


def test_nonpositive_timeout_is_a_caller_bug(plugin: FakeDevicePlugin) -> None:
    with pytest.raises(ValueError):
        client.plugin_options(plugin.socket_path, timeout=0)


# --------------------------------------------------------------------------
# socket discovery


def test_discover_plugin_sockets_filters_listing() -> None:
    names = [
        "kubelet.sock",
        "kubelet_internal_checkpoint",
        "DEPRECATION",
        "nvidia-gpu.sock",
        "nvidia.com-gpu.sock",
        "nvidia-mig-1g.10gb.sock",
        ".hidden.sock",
        "nvidia-gpu.sock",
    ]
    assert client.discover_plugin_sockets(names) == [
        "nvidia-gpu.sock",
        "nvidia-mig-1g.10gb.sock",
        "nvidia.com-gpu.sock",
    ]
    assert client.discover_plugin_sockets([]) == []


def test_plugin_socket_paths_keeps_only_real_sockets(sock_dir: Path) -> None:
    (sock_dir / "kubelet_internal_checkpoint").write_text("{}")
    (sock_dir / "fake.sock").write_text("")  # a file named like a socket
    with FakeDevicePlugin(sock_dir / "kubelet.sock"), FakeDevicePlugin(sock_dir / "nvidia-gpu.sock"):
        assert client.plugin_socket_paths(str(sock_dir)) == [str(sock_dir / "nvidia-gpu.sock")]
    assert client.plugin_socket_paths(str(sock_dir / "missing")) == []


# --------------------------------------------------------------------------
# import cost and wire compatibility


def test_importing_client_does_not_import_grpc_or_protobuf() -> None:
    src = str(Path(client.__file__).resolve().parents[2])
    code = (
        "import sys, gpuwarden.grpcapi.client as c; "
        "bad = [m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', 'google.protobuf'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": src})



def test_device_wire_format_matches_upstream_field_numbers() -> None:
    # Device{ID=1, health=2, topology=3{nodes=1{ID=1}}}
    raw = ld(1, "GPU-fef8089b") + ld(2, "Unhealthy") + ld(3, ld(1, vi(1, 1)) + ld(1, vi(1, 3)))
    d = dp.Device.FromString(raw)
    assert (d.ID, d.health, [n.ID for n in d.topology.nodes]) == ("GPU-fef8089b", "Unhealthy", [1, 3])
    assert d.SerializeToString() == raw
    lw = dp.ListAndWatchResponse.FromString(ld(1, raw) + ld(1, ld(1, "GPU-2")))
    assert [x.ID for x in lw.devices] == ["GPU-fef8089b", "GPU-2"]


def test_allocation_messages_wire_format() -> None:
    req = dp.ContainerPreferredAllocationRequest.FromString(ld(1, "a") + ld(1, "b") + ld(2, "b") + vi(3, 2))
    assert (list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size) == (["a", "b"], ["b"], 2)
    assert list(dp.ContainerPreferredAllocationResponse.FromString(ld(1, "b")).deviceIDs) == ["b"]
    assert dp.DevicePluginOptions.FromString(vi(1, 1) + vi(2, 1)) == dp.DevicePluginOptions(
        pre_start_required=True, get_preferred_allocation_available=True
    )
    car = dp.ContainerAllocateResponse.FromString(
        ld(1, ld(1, "NVIDIA_VISIBLE_DEVICES") + ld(2, "GPU-1"))  # map entry: key=1, value=2
        + ld(2, ld(1, "/usr/lib/nv") + ld(2, "/host/nv") + vi(3, 1))
        + ld(3, ld(1, "/dev/nvidia0") + ld(2, "/dev/nvidia0") + ld(3, "rw"))
        + ld(4, ld(1, "k") + ld(2, "v"))
        + ld(5, ld(1, "nvidia.com/gpu=0"))
    )
    assert dict(car.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}
    assert (car.mounts[0].container_path, car.mounts[0].host_path, car.mounts[0].read_only) == ("/usr/lib/nv", "/host/nv", True)
    spec = car.devices[0]
    assert (spec.container_path, spec.host_path, spec.permissions) == ("/dev/nvidia0", "/dev/nvidia0", "rw")
    assert dict(car.annotations) == {"k": "v"}
    assert [c.name for c in car.cdi_devices] == ["nvidia.com/gpu=0"]
    assert list(dp.ContainerAllocateRequest.FromString(ld(1, "x")).devices_ids) == ["x"]
    rr = dp.RegisterRequest.FromString(ld(1, "v1beta1") + ld(2, "nvidia-gpu.sock") + ld(3, "nvidia.com/gpu") + ld(4, vi(2, 1)))
    assert (rr.version, rr.endpoint, rr.resource_name, rr.options.get_preferred_allocation_available) == (
        "v1beta1",
        "nvidia-gpu.sock",
        "nvidia.com/gpu",
        True,
    )


def test_service_method_paths() -> None:
    fd = dp.DESCRIPTOR
    assert fd.package == "v1beta1"
    plugin = fd.services_by_name["DevicePlugin"]
    assert [m.name for m in plugin.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert plugin.methods_by_name["ListAndWatch"].server_streaming
    assert not plugin.methods_by_name["GetPreferredAllocation"].server_streaming
    assert [m.name for m in fd.services_by_name["Registration"].methods] == ["Register"]


def test_probes_do_not_need_the_generated_grpc_stubs(plugin, monkeypatch):
    """The *_pb2_grpc modules refuse to import on a grpcio older than the one that generated them (a GPU
    node's image had grpcio 1.84 against stubs from 1.85.1); the client builds its calls without them."""
    for mod in ("gpuwarden.grpcapi.deviceplugin_v1beta1_pb2_grpc", "gpuwarden.grpcapi.podresources_v1_pb2_grpc"):
        monkeypatch.setitem(sys.modules, mod, None)  # any import of it now raises ImportError
    sock = plugin.socket_path
    assert client.plugin_options(sock, 2.0).ok
    assert [d.id for d in client.plugin_first_list(sock, 2.0).value] == [g.id for g in GPUS]
    assert client.plugin_preferred_allocation(sock, ["GPU-aaaa"], 1, timeout=2.0).value == ("GPU-aaaa",)


@pytest.mark.parametrize("after,want", [(0.95, "timeout"), (0.1, "error")])
def test_cancelled_at_the_deadline_is_a_timeout(sock_dir, after, want):
    """A grpc-go server (the real NVIDIA plugin) resets a stream whose deadline expired: the client may see
    CANCELLED instead of DEADLINE_EXCEEDED. Late in the deadline that is a timeout; early, a plain error."""
    timeout = 1.0
    with FakeDevicePlugin(sock_dir / "nvidia-gpu.sock", GPUS, delay_s={"GetPreferredAllocation": after * timeout},
                          fail_on={"GetPreferredAllocation": grpc.StatusCode.CANCELLED}) as p:
        r = client.plugin_preferred_allocation(p.socket_path, ["GPU-aaaa"], 1, timeout=timeout)
    assert r.status == want and r.elapsed_s < timeout + SLACK_S
