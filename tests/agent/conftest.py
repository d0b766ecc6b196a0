"""Agent unit tests: no API server; synthetic live nodes need mknod (root)."""

from __future__ import annotations

import shutil

import pytest

from tests.support.agent_nodes import can_mknod, short_tmpdir


@pytest.fixture
def node_dir():
    if not can_mknod():
        pytest.skip("SYNTHETIC NODE UNAVAILABLE: materialising an example needs mknod (run as root)")
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sock_dir():
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)
