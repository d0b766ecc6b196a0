"""The GPU scenarios find what they launch (tools/gpu), checked here without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parents[1]
TOOLS = REPO / "tools/gpu"


def test_every_file_a_scenario_launches_exists() -> None:
    p = subprocess.run([sys.executable, str(HERE / "validate.py"), "--list"], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    launched = [line.split(" ", 1)[1] for line in p.stdout.splitlines() if line.startswith("launches ")]
    # the workers the device-access, memory, plugin and MPS scenarios start, and both NVML shims
    for name in ("cuda_worker.py", "uvm_worker.py", "gl_worker.py", "gpu_fill.py", "legit_load.py", "mps_client.py",
                 "nvml_hang_shim.c", "nvml_inject_shim.c"):
        assert f"tools/gpu/{name}" in launched, p.stdout
    assert all((REPO / f).is_file() for f in launched)
    assert "untouched-host" in p.stdout.splitlines()


def test_tests_gpu_holds_only_the_scenarios_and_their_tests() -> None:
    """Workers, shims and probes live in tools/gpu; nothing here still names them under tests/gpu."""
    scenarios = {"validate.py", "memory_scenarios.py", "mps_scenarios.py", "plugin_scenarios.py", "dra_scenarios.py",
                 "cri_scenarios.py"}
    here = {f.name for f in HERE.iterdir() if f.is_file()}
    assert here - scenarios == {f for f in here if f.startswith("test_")}
    moved = [f.name for f in TOOLS.iterdir() if f.is_file()]
    for f in scenarios:
        text = (HERE / f).read_text()
        assert not [m for m in moved if f"tests/gpu/{m}" in text], f
