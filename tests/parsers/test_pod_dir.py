"""The one parser of /var/log/pods/<ns>_<pod>_<uid> directory names, and the fact helper both the
containers and the memory sections name pods with."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.facts import NodeFacts
from gpuwarden.facts.containers import pod_names
from gpuwarden.parsers.cri_log import parse_pod_dir
from gpuwarden.root import HostRoot

UID = "8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"


@pytest.mark.parametrize("name,want", [
    (f"ml_trainer-0_{UID}", ("ml", "trainer-0", UID)),
    (f"gpu-operator_nvidia-device-plugin-daemonset-x7k2p_{UID}", ("gpu-operator", "nvidia-device-plugin-daemonset-x7k2p", UID)),
    (f"kube-system_etcd.node-1_{UID}", ("kube-system", "etcd.node-1", UID)),
])
def test_pod_dir_names(name: str, want: tuple[str, str, str]) -> None:
    assert parse_pod_dir(name) == want


@pytest.mark.parametrize("name", ["", "x", f"ml__{UID}", f"_trainer_{UID}", "ml_trainer_", "ml_trainer_not-a-uid!",
                                  f"ml_a_b_{UID}", f"ml_trainer_{UID}/c", "ml_trainer_zzzzzzzz"])
def test_other_names_are_no_pod(name: str) -> None:
    assert parse_pod_dir(name) is None


def test_pod_names_of_a_node(tmp_path: Path) -> None:
    for d in (f"ml_trainer-0_{UID}", "not-a-pod", f"a_b_c_{UID}", "ns_pod_11111111-2222"):
        (tmp_path / "var/log/pods" / d).mkdir(parents=True)
    assert pod_names(NodeFacts(HostRoot(str(tmp_path)))) == {UID: ("ml", "trainer-0"), "11111111-2222": ("ns", "pod")}


def test_no_pod_log_directory(tmp_path: Path) -> None:
    assert pod_names(NodeFacts(HostRoot(str(tmp_path)))) == {}
