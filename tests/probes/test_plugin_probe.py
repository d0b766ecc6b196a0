"""The device-plugin probe of `check` (probes/plugin.py) against real gRPC servers on unix sockets.

`snapshot` runs here in-process (the fake servers' grpc threads live in this process, and forking a
process that runs grpc is not safe); the forked path is exercised end to end by
tests/interop/test_real_plugin.py through `gpuwarden check`.
"""

from __future__ import annotations

import time

import pytest

from gpuwarden.facts.probes import ProbeResults, _outcome
from gpuwarden.probes import plugin
from gpuwarden.probes.bounded import ChildResult
from gpuwarden.root import HostRoot
from tests.support.fake_kubelet import FakeDevicePlugin

GPU = "GPU-aaaa"




def _statuses(snap):
    return [(c["rpc"], c["status"]) for c in snap[0]["calls"]]


def test_the_three_calls_the_kubelet_makes(sock_dir):
    with FakeDevicePlugin(sock_dir / "nvidia-gpu.sock", [GPU]) as p:
        snap = plugin.snapshot([(p.socket_path, p.socket_path)], 1.0)
    assert snap[0]["socket"] == p.socket_path
    assert _statuses(snap) == [("GetDevicePluginOptions", "ok"), ("ListAndWatch", "ok"), ("GetPreferredAllocation", "ok")]


def test_a_hung_get_preferred_allocation_is_a_timeout_within_the_deadline(sock_dir):
    with FakeDevicePlugin(sock_dir / "nvidia-gpu.sock", [GPU], hang_on={"GetPreferredAllocation"}) as p:
        t0 = time.monotonic()
        snap = plugin.snapshot([(p.socket_path, p.socket_path)], 0.4)
        elapsed = time.monotonic() - t0
    assert _statuses(snap)[-1] == ("GetPreferredAllocation", "timeout") and elapsed < 0.4 * 3 + 0.5


def test_hung_options_skip_the_other_calls_and_no_preferred_call_without_the_option(sock_dir):
    with FakeDevicePlugin(sock_dir / "a.sock", [GPU], hang_on={"GetDevicePluginOptions"}) as a, \
            FakeDevicePlugin(sock_dir / "b.sock", [GPU], get_preferred_allocation_available=False) as b:
        snap = plugin.snapshot([(a.socket_path, a.socket_path), (b.socket_path, b.socket_path)], 0.4)
    assert [(c["rpc"], c["status"]) for c in snap[0]["calls"]] == [("GetDevicePluginOptions", "timeout")]
    assert [c["rpc"] for c in snap[1]["calls"]] == ["GetDevicePluginOptions", "ListAndWatch"]


def test_no_socket_no_child(sock_dir):
    assert plugin.start(HostRoot("/"), str(sock_dir), 1.0) is None
    assert plugin.start(HostRoot("/"), str(sock_dir / "missing"), 1.0) is None


def test_recorded_in_bundles_and_read_back():
    res = ProbeResults(plugin=ChildResult("ok", 0.01, [{"socket": "/s", "calls": []}]))
    doc = res.to_json()
    assert doc["nvml"] is None and doc["plugin"]["value"] == [{"socket": "/s", "calls": []}]
    assert _outcome(doc["plugin"]).value == [{"socket": "/s", "calls": []}] and _outcome(None) is None
