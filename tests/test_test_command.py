"""`bash scripts/test --clean`: the one command that removes what the test command leaves (README, Development)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_clean_removes_what_the_test_command_leaves_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "test", tmp_path / "scripts" / "test")
    left = [".venv/bin/python", ".cache/testapiserver/bin/testapiserver", ".cache/image/x", ".pytest_cache/v",
            ".hypothesis/examples/x", ".grimp_cache/gpuwarden.data.json",  # hypothesis and import-linter (issue 44)
            ".cache-apiserver-build.log", "build/lib/x", "src/gpuwarden.egg-info/PKG-INFO",
            "src/gpuwarden/__pycache__/cli.cpython-311.pyc"]
    kept = ["src/gpuwarden/cli.py", "README.md", "tests/test_x.py", "docs/a.md"]
    for rel in left + kept:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    env = {k: v for k, v in os.environ.items() if k != "GPUWARDEN_CACHE"}
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "test"), "--clean"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("removing ") and ".venv" in r.stdout and ".cache " in r.stdout
    assert [p for p in left if (tmp_path / p).exists()] == []
    assert [p for p in ["src/gpuwarden/__pycache__", ".venv", ".cache", "build", ".hypothesis", ".grimp_cache"] if (tmp_path / p).exists()] == []
    assert all((tmp_path / p).exists() for p in kept)
    # a cache outside the checkout is named, never removed
    outside = tmp_path / "shared-cache"
    (outside / "testapiserver").mkdir(parents=True)
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "test"), "--clean"], capture_output=True, text=True,
                       timeout=60, env={**env, "GPUWARDEN_CACHE": str(outside)})
    assert r.returncode == 0 and "left alone: $GPUWARDEN_CACHE" in r.stdout and (outside / "testapiserver").is_dir()
