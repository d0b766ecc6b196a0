"""The wire contract of our protos, pinned field by field to upstream (docs/grpc.md "Wire contract vs upstream").

Checked against k8s.io/kubelet v0.36.3 as vendored by NVIDIA k8s-device-plugin v0.20.0 (deviceplugin
v1beta1) and kubernetes staging podresources/v1 (plus ClaimResource.share_id, k8s >= 1.34). A change
here must come from upstream, never from us: renumbering breaks the wire silently.
"""

from __future__ import annotations

import pytest

from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2 as dp
from gpuwarden.grpcapi import podresources_v1_pb2 as pr

FIELDS = {
    dp: {
        "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
        "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
        "Device": {"ID": 1, "health": 2, "topology": 3},
        "ContainerPreferredAllocationRequest": {"available_deviceIDs": 1, "must_include_deviceIDs": 2,
                                                "allocation_size": 3},
        "ContainerAllocateResponse": {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
        "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
        "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
        "CDIDevice": {"name": 1},
    },
    pr: {
        "ContainerResources": {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
        "DynamicResource": {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
        "ClaimResource": {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4, "share_id": 5},
        "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
    },
}


@pytest.mark.parametrize("mod,message", [(m, n) for m, msgs in FIELDS.items() for n in msgs])
def test_field_numbers_match_upstream(mod, message):
    desc = getattr(mod, message).DESCRIPTOR
    assert {f.name: f.number for f in desc.fields} == FIELDS[mod][message]


def test_services_and_methods():
    def methods(mod, svc):
        return [m.name for m in mod.DESCRIPTOR.services_by_name[svc].methods]

    assert methods(dp, "Registration") == ["Register"]
    assert methods(dp, "DevicePlugin") == ["GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation",
                                           "Allocate", "PreStartContainer"]
    assert methods(pr, "PodResourcesLister") == ["List", "GetAllocatableResources", "Get"]
    assert dp.DESCRIPTOR.package == "v1beta1" and pr.DESCRIPTOR.package == "v1"
