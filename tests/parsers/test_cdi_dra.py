"""The CDI spec parser and the two DRA checkpoint parsers: upstream formats, and garbage (Hypothesis).

Formats: the kubelet's dra_manager_state as kubernetes' own checkpointer_test.go writes it; the
NVIDIA DRA driver's checkpoint.json (checkpointv.go, V2 beside its V1 copy, and a V1-only file);
CDI specs in nvcdi's YAML shape and as JSON.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.parsers import cdi, dra_checkpoint
from tests.support.dranode import CLAIM_UID, claim_spec, driver_checkpoint, kubelet_state

# verbatim from kubernetes pkg/kubelet/cm/dra/state/checkpointer_test.go ("single-claim-info-state")
UPSTREAM_STATE = ('{"Data":"{\\"kind\\":\\"DRACheckpoint\\",\\"apiVersion\\":\\"checkpoint.dra.kubelet.k8s.io/v1\\",'
                  '\\"Entries\\":[{\\"ClaimUID\\":\\"067798be-454e-4be4-9047-1aa06aea63f7\\",\\"ClaimName\\":\\"example\\",'
                  '\\"Namespace\\":\\"default\\",\\"PodUIDs\\":{\\"139cdb46-f989-4f17-9561-ca10cfb509a6\\":{}},'
                  '\\"DriverState\\":{\\"test-driver.cdi.k8s.io\\":{\\"Devices\\":[{\\"PoolName\\":\\"worker-1\\",'
                  '\\"DeviceName\\":\\"dev-1\\",\\"RequestNames\\":[\\"test request\\"],'
                  '\\"CDIDeviceIDs\\":[\\"example.com/example=cdi-example\\"]}]}}}]}","Checksum":1597924435}')


def test_kubelet_state_upstream_example() -> None:
    (c,) = dra_checkpoint.parse_kubelet(UPSTREAM_STATE).claims
    assert (c.uid, c.name, c.namespace, c.pod_uids) == ("067798be-454e-4be4-9047-1aa06aea63f7", "example", "default",
                                                         ("139cdb46-f989-4f17-9561-ca10cfb509a6",))
    (d,) = c.devices
    assert (d.driver, d.pool, d.device, d.cdi_ids) == ("test-driver.cdi.k8s.io", "worker-1", "dev-1",
                                                        ("example.com/example=cdi-example",))


def test_kubelet_state_old_layout() -> None:
    old = {"version": "v1", "entries": [{"DriverName": "gpu.nvidia.com", "ClassName": "gpu", "ClaimUID": "u1",
                                         "ClaimName": "c", "Namespace": "n", "PodUIDs": {"p": {}},
                                         "CDIDevices": {"gpu.nvidia.com": ["k8s.gpu.nvidia.com/claim=u1-gpu-0"]}}],
           "checksum": 1}
    (c,) = dra_checkpoint.parse_kubelet(json.dumps(old)).claims
    assert c.devices[0].cdi_ids == ("k8s.gpu.nvidia.com/claim=u1-gpu-0",)


def test_driver_checkpoint_v2_and_v1() -> None:
    cp = dra_checkpoint.parse_driver(driver_checkpoint([(CLAIM_UID, "c", "n", "gpu-0", "GPU-1")]))
    c = cp.claims[CLAIM_UID]
    assert (c.name, c.state, c.devices[0].uuid, c.devices[0].kind) == ("c", "PrepareCompleted", "GPU-1", "gpu")
    v1_only = json.loads(driver_checkpoint([(CLAIM_UID, "c", "n", "gpu-0", "GPU-1")]))
    del v1_only["v2"]
    c = dra_checkpoint.parse_driver(json.dumps(v1_only)).claims[CLAIM_UID]
    assert (c.name, c.state, c.devices[0].uuid) == ("", "PrepareCompleted", "GPU-1")


def test_cdi_spec_yaml_and_json() -> None:
    spec = cdi.parse(claim_spec(uvm=False))
    assert spec.kind == "k8s.gpu.nvidia.com/claim" and list(spec.devices) == [f"{CLAIM_UID}-gpu-0"]
    paths = set().union(*(e.paths() for e in spec.edits_for(f"{CLAIM_UID}-gpu-0")))
    assert "/dev/nvidia0" in paths and "/dev/nvidiactl" in paths and "/dev/nvidia-uvm" not in paths
    j = cdi.parse(json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [
        {"name": 0, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "major": 195, "minor": 0}]}}]}))
    assert j.devices["0"].device_nodes[0].major == 195 and j.qualified("0") == "nvidia.com/gpu=0"


def test_transient_name() -> None:
    k = "k8s.gpu.nvidia.com-claim"
    assert cdi.transient_id(f"k8s.gpu.nvidia.com-claim_{CLAIM_UID}.yaml", k) == CLAIM_UID
    assert cdi.transient_id("nvidia.yaml", k) is None
    assert cdi.transient_id(f"k8s.gpu.nvidia.com-claim_{CLAIM_UID}.yml", k) is None  # CDI reads no .yml


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400))
def test_parsers_never_raise_on_text(text: str) -> None:
    cdi.parse(text)
    dra_checkpoint.parse_kubelet(text)
    dra_checkpoint.parse_driver(text)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=20)
_keys = st.sampled_from(["Data", "Entries", "ClaimUID", "PodUIDs", "DriverState", "Devices", "CDIDeviceIDs", "v1", "v2",
                         "checksum", "preparedClaims", "preparedDevices", "devices", "gpu", "mig", "info", "device",
                         "kind", "containerEdits", "deviceNodes", "mounts", "path", "major", "name", "entries"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=6))
def test_parsers_never_raise_on_shaped_json(doc: dict) -> None:
    text = json.dumps(doc)
    cdi.parse(text)
    dra_checkpoint.parse_kubelet(text)
    dra_checkpoint.parse_driver(text)
    if isinstance(doc.get("Data"), (dict, list)):
        dra_checkpoint.parse_kubelet(json.dumps({"Data": json.dumps(doc["Data"])}))


def test_kubelet_state_roundtrip_of_helper() -> None:
    (c,) = dra_checkpoint.parse_kubelet(kubelet_state([("u", "n", "ns", ["p1", "p2"], "gpu-1", ["x/y=z"])])).claims
    assert c.pod_uids == ("p1", "p2") and c.devices[0].device == "gpu-1"


def test_driver_checkpoint_of_the_real_plugin_with_no_claim() -> None:
    """The real gpu-kubelet-plugin's checkpoint before any prepare (tests/fixtures/dra-node/ORIGIN.md)."""
    from tests.support.bundles import FIXTURES

    cp = dra_checkpoint.parse_driver((FIXTURES / "dra-node/checkpoint-empty.json").read_text())
    assert cp is not None and cp.claims == {} and cp.boot_id == "2749b50b-d232-4242-b524-df83984a81cd"
