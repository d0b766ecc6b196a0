"""The device-plugin probe of `check` (probes/plugin.py) against real gRPC servers on unix sockets.

`snapshot` runs here in-process (the fake servers' grpc threads live in this process, and forking a
process that runs grpc is not safe); the forked path is exercised end to end by
tests/interop/test_real_plugin.py through `gpuwarden check`.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.facts.probes import ProbeResults, _outcome
from gpuwarden.probes import plugin
from gpuwarden.probes.bounded import ChildResult
from gpuwarden.root import HostRoot
from tests.support.fake_kubelet import FakeDevicePlugin, write_checkpoint

GPU = "GPU-aaaa"
FROM = "checkpoint RegisteredDevices[nvidia.com/gpu]"


def _statuses(snap):
    return [(c["rpc"], c["status"]) for c in snap[0]["calls"]]


def _cp(registered=None, entries=()):
    return json.dumps({"Data": {"RegisteredDevices": registered or {}, "PodDeviceEntries": [
        {"PodUID": "u", "ContainerName": "c", "ResourceName": r, "DeviceIDs": {"0": ids}} for r, ids in entries]}})


def test_the_kubelets_calls_and_never_list_and_watch(sock_dir):
    with FakeDevicePlugin(sock_dir / "nvidia-gpu.sock", [GPU]) as p:
        snap = plugin.snapshot([(p.socket_path, p.socket_path, (GPU,), FROM)], 1.0)
    assert snap[0]["socket"] == p.socket_path
    assert _statuses(snap) == [("GetDevicePluginOptions", "ok"), ("GetPreferredAllocation", "ok")]
    assert snap[0]["calls"][1]["ids_from"] == FROM and "ListAndWatch" not in p.calls


def test_a_hung_get_preferred_allocation_is_a_timeout_within_the_deadline(sock_dir):
    with FakeDevicePlugin(sock_dir / "nvidia-gpu.sock", [GPU], hang_on={"GetPreferredAllocation"}) as p:
        t0 = time.monotonic()
        snap = plugin.snapshot([(p.socket_path, p.socket_path, (GPU,), FROM)], 0.4)
        elapsed = time.monotonic() - t0
    assert _statuses(snap)[-1] == ("GetPreferredAllocation", "timeout") and elapsed < 0.4 * 2 + 0.5


def test_hung_options_skip_the_other_calls_and_no_preferred_call_without_the_option(sock_dir):
    with FakeDevicePlugin(sock_dir / "a.sock", [GPU], hang_on={"GetDevicePluginOptions"}) as a, \
            FakeDevicePlugin(sock_dir / "b.sock", [GPU], get_preferred_allocation_available=False) as b:
        snap = plugin.snapshot([(a.socket_path, a.socket_path, (GPU,), FROM), (b.socket_path, b.socket_path, (GPU,), FROM)], 0.4)
    assert [(c["rpc"], c["status"]) for c in snap[0]["calls"]] == [("GetDevicePluginOptions", "timeout")]
    assert [c["rpc"] for c in snap[1]["calls"]] == ["GetDevicePluginOptions"] and b.calls == ["GetDevicePluginOptions"]


def test_no_ids_is_not_evaluated_with_the_reason(sock_dir):
    with FakeDevicePlugin(sock_dir / "nvidia-gpu.sock", [GPU], hang_on={"GetPreferredAllocation"}) as p:
        snap = plugin.snapshot([(p.socket_path, p.socket_path, (), "not evaluated: no device IDs (x missing)")], 0.4)
    assert _statuses(snap) == [("GetDevicePluginOptions", "ok"), ("GetPreferredAllocation", "not evaluated")]
    assert snap[0]["calls"][1]["detail"].startswith("not evaluated") and p.calls == ["GetDevicePluginOptions"]


# -- the IDs for GetPreferredAllocation: the kubelet's checkpoint ----------------------------------------------

def test_resource_of_the_nvidia_plugins_socket_names():
    assert plugin.resource_of("nvidia-gpu.sock") == "nvidia.com/gpu"
    assert plugin.resource_of("nvidia-mig-1g.10gb.sock") == "nvidia.com/mig-1g.10gb"
    assert plugin.resource_of("nvidia-.sock") is None and plugin.resource_of("other.sock") is None


def test_socket_matched_to_its_resource():
    cp = _cp({"nvidia.com/gpu": [GPU, "GPU-b"], "nvidia.com/mig-1g.10gb": ["MIG-1"]})
    got = plugin.gpa_ids(cp, ["nvidia-gpu.sock", "nvidia-mig-1g.10gb.sock"], "cp")
    assert got["nvidia-gpu.sock"] == plugin.GpaIds((GPU, "GPU-b"), "cp RegisteredDevices[nvidia.com/gpu]")
    assert got["nvidia-mig-1g.10gb.sock"].ids == ("MIG-1",)


def test_unmatched_socket_uses_nvidia_gpu_first_and_says_so():
    cp = _cp({"nvidia.com/a": ["A"], "nvidia.com/gpu": [GPU], "example.com/x": ["X"]})
    [g] = plugin.gpa_ids(cp, ["vendor.sock"]).values()
    assert g.ids == (GPU,) and "not matched" in g.note


def test_no_registered_ids_fall_back_to_the_allocated_ones():
    """A GPU marked Unhealthy leaves RegisteredDevices (the kubelet keeps healthy ones); it stays allocated."""
    [g] = plugin.gpa_ids(_cp({"nvidia.com/gpu": []}, [("nvidia.com/gpu", [GPU])]), ["nvidia-gpu.sock"]).values()
    assert g.ids == (GPU,) and "PodDeviceEntries" in g.note


@pytest.mark.parametrize("text, why", [(None, "missing"), ("garbage{", "not a device-manager checkpoint"),
                                       (_cp({"example.com/x": ["X"]}), "no device IDs for nvidia.com/gpu"),
                                       (_cp({"nvidia.com/gpu": []}), "no device IDs for nvidia.com/gpu")])
def test_no_ids_is_not_evaluated_never_a_guess(text, why):
    [g] = plugin.gpa_ids(text, ["nvidia-gpu.sock"]).values()
    assert g.ids == () and g.note.startswith("not evaluated") and why in g.note


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=200), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4)).map(json.dumps)),
       st.lists(st.text(max_size=20), max_size=3))
def test_garbage_checkpoints_never_raise(text, names):
    got = plugin.gpa_ids(text, names)
    assert set(got) == set(names) and all(g.ids or g.note.startswith("not evaluated") for g in got.values())


def test_read_through_the_root(sock_dir):
    write_checkpoint(sock_dir, {"nvidia.com/gpu": [GPU]})
    got = plugin.read_gpa_ids(HostRoot("/"), str(sock_dir), [f"{sock_dir}/nvidia-gpu.sock"])
    assert got[f"{sock_dir}/nvidia-gpu.sock"].ids == (GPU,)


def test_no_socket_no_child(sock_dir):
    assert plugin.start(HostRoot("/"), str(sock_dir), 1.0) is None
    assert plugin.start(HostRoot("/"), str(sock_dir / "missing"), 1.0) is None


def test_recorded_in_bundles_and_read_back():
    res = ProbeResults(plugin=ChildResult("ok", 0.01, [{"socket": "/s", "calls": []}]))
    doc = res.to_json()
    assert doc["nvml"] is None and doc["plugin"]["value"] == [{"socket": "/s", "calls": []}]
    assert _outcome(doc["plugin"]).value == [{"socket": "/s", "calls": []}] and _outcome(None) is None
