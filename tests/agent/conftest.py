"""Agent unit tests: no API server; synthetic live nodes (`node_dir`, tests/conftest.py) need mknod (root)."""

from __future__ import annotations

import shutil

import pytest

from tests.support.agent_nodes import short_tmpdir


@pytest.fixture
def sock_dir():
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)
