"""The `cdi` and `dra` facts: CDI's directory precedence, claim specs, and the claim -> container join."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support.bundles import GPU_SPEC, GPU_UUID, POD_UID, bundle_file, facts_of, open_dir, write
from tests.support.dranode import CDI_ID, CLAIM_UID, SPEC_PATH, claim_spec, make_dra
from tests.support.gpunode import healthy

NODE_SPEC = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: {node}
"""


def test_later_directory_wins_and_same_priority_conflicts(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/etc/cdi/nvidia.yaml", NODE_SPEC.format(node="/dev/nvidia0"))
    write(b, "/var/run/cdi/nvidia.yaml", NODE_SPEC.format(node="/dev/nvidia1"))
    write(b, "/var/run/cdi/nvidia.yml", NODE_SPEC.format(node="/dev/nvidia2"))  # not a spec to CDI
    cdi = facts_of(open_dir(b)).get("cdi")
    f, name = cdi.resolve("nvidia.com/gpu=0")
    assert f.path == "/var/run/cdi/nvidia.yaml" and f.spec.devices[name].paths() == {"/dev/nvidia1"}
    assert [x.path for x in cdi.files] == ["/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml"]
    write(b, "/var/run/cdi/other.json", json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
                                                    "devices": [{"name": "0", "containerEdits": {}}]}))
    cdi = facts_of(open_dir(b)).get("cdi")
    assert cdi.resolve("nvidia.com/gpu=0") is None and "nvidia.com/gpu=0" in cdi.conflicts


def test_no_yaml_parser_without_yaml_specs(tmp_path: Path) -> None:
    """A node with only JSON specs (or none) never imports the YAML parser for them (issue 34)."""
    b = healthy(tmp_path)
    write(b, "/var/run/cdi/nvidia.json", json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []}))
    was = sys.modules.pop("yaml", None)
    try:
        facts_of(open_dir(b)).get("cdi")
        assert "yaml" not in sys.modules
    finally:
        if was is not None:
            sys.modules["yaml"] = was


def test_claim_joined_with_spec_pod_and_container(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    dra = facts_of(open_dir(b)).get("dra")
    (c,) = dra.claims
    assert c.uid == CLAIM_UID and c.pod_uids == (POD_UID,) and c.gpu_uuids() == [GPU_UUID]
    assert c.prepare_state == "PrepareCompleted" and c.spec is not None and c.spec.path == SPEC_PATH
    assert c.cdi_ids() == [CDI_ID]
    ((pod, ctr, why),) = c.containers
    assert pod.uid == POD_UID and ctr.name == "trainer" and "linux.devices has /dev/nvidia0" in why
    assert dra.registration["gpu.nvidia.com"].present and dra.service["gpu.nvidia.com"].present


def test_claim_joined_by_cdi_annotation(tmp_path: Path) -> None:
    """The annotation path (`cdi.k8s.io/<key>: <ids>`), with no device node of the spec in linux.devices."""
    b = healthy(tmp_path)
    make_dra(b, spec=claim_spec(gpu=None), containers_devices=[])
    f = bundle_file(b, GPU_SPEC)
    oci = json.loads(f.read_text())
    oci["annotations"]["cdi.k8s.io/gpu.nvidia.com_claim"] = CDI_ID
    f.write_text(json.dumps(oci))
    (c,) = facts_of(open_dir(b)).get("dra").claims
    ((_, _, why),) = c.containers
    assert "annotation cdi.k8s.io/gpu.nvidia.com_claim" in why
