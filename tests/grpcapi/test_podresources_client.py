"""Pod-resources client against a real gRPC PodResourcesLister on a unix socket."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpuwarden.grpcapi import client
from gpuwarden.grpcapi import podresources_v1_pb2 as pr
from gpuwarden.grpcapi.client import PodDevices, ResourceDevices
from tests.support.fake_kubelet import FakePodResources
from tests.support.protowire import ld, varint, vi

SLACK_S = 0.5
ROWS = [
    PodDevices("ml", "train-0", "trainer", "nvidia.com/gpu", ("GPU-aaaa", "GPU-bbbb"), (0,)),
    PodDevices("ml", "train-0", "sidecar", "nvidia.com/gpu", ("GPU-cccc",), (1,)),
    PodDevices("ml", "train-0", "trainer", "example.com/nic", ("nic-1",)),
    PodDevices("infer", "svc-7f9", "server", "nvidia.com/mig-1g.10gb", ("MIG-1111",), (0,)),
    PodDevices("infer", "svc-7f9", "server", "gpu.nvidia.com", ("gpu-3",), source="dra", claim="infer/svc-gpu"),
]


@pytest.fixture
def kubelet(sock_dir: Path):
    with FakePodResources(sock_dir / "kubelet.sock", ROWS) as k:
        yield k


def test_list_maps_pods_containers_to_device_ids(kubelet: FakePodResources) -> None:
    r = client.pod_resources_list(kubelet.socket_path, timeout=2)
    assert (r.ok, r.status, r.rpc) == (True, "ok", "v1.PodResourcesLister/List")
    # The fake sends one ContainerDevices per device, like the kubelet; the
    # client merges them back per (container, resource).
    assert sorted(r.value, key=repr) == sorted(ROWS, key=repr)


def test_list_empty_node(sock_dir: Path) -> None:
    with FakePodResources(sock_dir / "k.sock") as k:
        r = client.pod_resources_list(k.socket_path, timeout=2)
    assert r.ok and r.value == ()


def test_list_accepts_answers_above_grpc_default_4mib(sock_dir: Path) -> None:
    ids = tuple(f"GPU-{i:06d}-" + "x" * 1000 for i in range(5000))  # ~5 MiB
    with FakePodResources(sock_dir / "k.sock", [PodDevices("a", "b", "c", "nvidia.com/gpu", ids)]) as k:
        r = client.pod_resources_list(k.socket_path, timeout=5)
    assert r.status == "ok", r.detail
    assert r.value[0].device_ids == ids


def test_allocatable_merged_per_resource(sock_dir: Path) -> None:
    alloc = {"nvidia.com/gpu": ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"], "example.com/nic": ["nic-1"]}
    with FakePodResources(sock_dir / "k.sock", ROWS, allocatable=alloc) as k:
        r = client.pod_resources_allocatable(k.socket_path, timeout=2)
    assert r.status == "ok", r.detail
    assert set(r.value) == {
        ResourceDevices("nvidia.com/gpu", ("GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd")),
        ResourceDevices("example.com/nic", ("nic-1",)),
    }


def test_get_one_pod(kubelet: FakePodResources) -> None:
    r = client.pod_resources_get(kubelet.socket_path, "infer", "svc-7f9", timeout=2)
    assert r.status == "ok", r.detail
    assert set(r.value) == {row for row in ROWS if row.pod == "svc-7f9"}


def test_get_unknown_pod_is_error(kubelet: FakePodResources) -> None:
    r = client.pod_resources_get(kubelet.socket_path, "ml", "ghost", timeout=2)
    assert r.status == "error" and r.detail.startswith("NOT_FOUND")


def test_get_on_old_kubelet_is_unimplemented(sock_dir: Path) -> None:
    with FakePodResources(sock_dir / "k.sock", ROWS, unimplemented={"Get", "GetAllocatableResources"}) as k:
        assert client.pod_resources_get(k.socket_path, "ml", "train-0", timeout=2).status == "unimplemented"
        assert client.pod_resources_allocatable(k.socket_path, timeout=2).status == "unimplemented"
        assert client.pod_resources_list(k.socket_path, timeout=2).ok


def test_hung_kubelet_times_out_within_deadline(sock_dir: Path) -> None:
    with FakePodResources(sock_dir / "k.sock", ROWS, hang_on={"List"}) as k:
        r = client.pod_resources_list(k.socket_path, timeout=0.8)
    assert (r.ok, r.status, r.value) == (False, "timeout", None)
    assert r.elapsed_s < 0.8 + SLACK_S


def test_missing_socket_is_unavailable_fast(sock_dir: Path) -> None:
    r = client.pod_resources_list(str(sock_dir / "kubelet.sock"), timeout=5)
    assert r.status == "unavailable" and r.elapsed_s < 0.1


def test_unavailable_code_from_server(sock_dir: Path) -> None:
    with FakePodResources(sock_dir / "k.sock", fail_on={"List": grpc.StatusCode.UNAVAILABLE}) as k:
        r = client.pod_resources_list(k.socket_path, timeout=2)
    assert r.status == "unavailable"


# --------------------------------------------------------------------------
# wire compatibility: bytes built by hand from the upstream field numbers



def test_container_devices_wire_format() -> None:
    # ContainerDevices{resource_name=1, device_ids=2 (repeated), topology=3{nodes=1{ID=1}}}
    raw = ld(1, "nvidia.com/gpu") + ld(2, "GPU-1") + ld(2, "GPU-2") + ld(3, ld(1, vi(1, 1)))
    cd = pr.ContainerDevices.FromString(raw)
    assert (cd.resource_name, list(cd.device_ids), [n.ID for n in cd.topology.nodes]) == (
        "nvidia.com/gpu",
        ["GPU-1", "GPU-2"],
        [1],
    )
    assert cd.SerializeToString() == raw


def test_list_response_wire_format_end_to_end() -> None:
    claim_resource = (
        ld(1, ld(1, "gpu.nvidia.com/gpu=gpu-3")) + ld(2, "gpu.nvidia.com") + ld(3, "node-a") + ld(4, "gpu-3")
    )
    dynamic = ld(2, "svc-gpu") + ld(3, "infer") + ld(4, claim_resource)
    container = (
        ld(1, "server")
        + ld(2, ld(1, "nvidia.com/gpu") + ld(2, "GPU-1"))
        + ld(3, varint(4) + varint(5))  # packed int64 cpu_ids
        + ld(4, ld(1, "hugepages-1Gi") + vi(2, 1 << 30) + ld(3, ld(1, vi(1, 0))))
        + ld(5, dynamic)
    )
    raw = ld(1, ld(1, "svc-7f9") + ld(2, "infer") + ld(3, container))
    resp = pr.ListPodResourcesResponse.FromString(raw)
    pod = resp.pod_resources[0]
    c = pod.containers[0]
    assert (pod.name, pod.namespace, c.name) == ("svc-7f9", "infer", "server")
    assert list(c.cpu_ids) == [4, 5]
    assert (c.memory[0].memory_type, c.memory[0].size) == ("hugepages-1Gi", 1 << 30)
    cr = c.dynamic_resources[0].claim_resources[0]
    assert (cr.driver_name, cr.pool_name, cr.device_name, cr.cdi_devices[0].name) == (
        "gpu.nvidia.com",
        "node-a",
        "gpu-3",
        "gpu.nvidia.com/gpu=gpu-3",
    )
    # and the client's flattening of the same bytes
    rows = client._pod_rows(pod)
    assert rows == [
        PodDevices("infer", "svc-7f9", "server", "nvidia.com/gpu", ("GPU-1",)),
        PodDevices("infer", "svc-7f9", "server", "gpu.nvidia.com", ("gpu-3",), source="dra", claim="infer/svc-gpu"),
    ]


def test_allocatable_and_get_wire_format() -> None:
    a = pr.AllocatableResourcesResponse.FromString(
        ld(1, ld(1, "nvidia.com/gpu") + ld(2, "GPU-1")) + ld(2, varint(0) + varint(1)) + ld(3, ld(1, "memory"))
    )
    assert (a.devices[0].device_ids[0], list(a.cpu_ids), a.memory[0].memory_type) == ("GPU-1", [0, 1], "memory")
    g = pr.GetPodResourcesRequest.FromString(ld(1, "train-0") + ld(2, "ml"))
    assert (g.pod_name, g.pod_namespace) == ("train-0", "ml")
    assert pr.GetPodResourcesResponse.FromString(ld(1, ld(1, "p"))).pod_resources.name == "p"


def test_service_method_paths() -> None:
    fd = pr.DESCRIPTOR
    assert fd.package == "v1"
    svc = fd.services_by_name["PodResourcesLister"]
    assert [m.full_name for m in svc.methods] == [
        "v1.PodResourcesLister.List",
        "v1.PodResourcesLister.GetAllocatableResources",
        "v1.PodResourcesLister.Get",
    ]
