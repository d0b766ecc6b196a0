"""Runs the GPU-machine reproductions (tests/gpu/validate.py) when a GPU and root are present."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

pytestmark = [pytest.mark.gpu, pytest.mark.root]


@pytest.mark.skipif(not Path("/proc/driver/nvidia/gpus").exists(), reason="no NVIDIA GPU on this host")
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cgroups, bpf, mount)")
def test_reproductions(tmp_path):
    p = subprocess.run([sys.executable, str(HERE / "validate.py"), "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
