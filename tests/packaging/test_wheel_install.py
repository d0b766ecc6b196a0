"""What users install is what was tested: the wheel, installed in a fresh venv, run from elsewhere.

The sdist and the wheel are built as `python -m build` builds them (the wheel from the sdist);
the wheel goes into a new venv with its dependencies; every command runs from an empty
temporary directory with no PYTHONPATH. A file the packaging drops fails here, not on a user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support import dist
from tests.support.minischema import validate

SCHEMA = json.loads((dist.REPO / "docs/report-schema.json").read_text())

# Every built-in example: the exit code of `check` and the finding codes it must report.
# Written out, not computed from the source tree, so both cannot be wrong the same way.
EXAMPLES = {
    "healthy": (0, set()),
    "uvm-missing": (1, {"GPU-DEV-001"}),
    "cpu-manager-device-loss": (1, {"GPU-DEV-002"}),
    "systemd-reload-device-loss": (1, {"GPU-DEV-003"}),
    "driver-memory-cascade": (1, {"GPU-NODE-001"}),
    "egl-framebuffer-escape": (1, {"GPU-NODE-001"}),
    "mig-nvml-hang": (1, {"GPU-K8S-001", "GPU-DRV-004"}),
    "mps-binary-missing": (1, {"GPU-K8S-007", "GPU-DRV-004"}),
    "mps-binary-missing-h100": (1, {"GPU-K8S-007"}),
    "dra-uvm-missing": (1, {"GPU-DRA-010"}),
}

pytestmark = pytest.mark.packaging


def test_the_installed_package_is_the_one_run(installed) -> None:
    p = installed.run(str(installed.python), "-c", "import gpuwarden, sys; print(gpuwarden.__file__); print(sys.path)")
    file = Path(p.stdout.splitlines()[0])
    assert file.is_relative_to(installed.venv), p.stdout
    assert str(dist.REPO) not in p.stdout, f"the checkout leaks into the installed run: {p.stdout}"


def test_installed_files_equal_the_source_tree(installed) -> None:
    pkg = installed.site_packages() / "gpuwarden"
    assert dist.tree_files(pkg) == dist.source_files()


def test_wheel_and_sdist_carry_every_package_file(dists) -> None:
    want = dist.source_files()
    with zipfile.ZipFile(dists.wheel) as z:
        in_wheel = {n[len("gpuwarden/"):] for n in z.namelist() if n.startswith("gpuwarden/") and not n.endswith("/")}
    with tarfile.open(dists.sdist) as t:
        names = [m.name.split("/", 1)[1] for m in t.getmembers() if m.isfile()]
    in_sdist = {n[len("src/gpuwarden/"):] for n in names if n.startswith("src/gpuwarden/")}
    assert in_wheel == want, f"wheel: missing {sorted(want - in_wheel)[:10]}, extra {sorted(in_wheel - want)[:10]}"
    assert in_sdist == want, f"sdist: missing {sorted(want - in_sdist)[:10]}, extra {sorted(in_sdist - want)[:10]}"
    assert {"pyproject.toml", "README.md", "MANIFEST.in"} <= set(names)


def test_every_example_is_tested_here(installed) -> None:
    listed = {line.split()[0] for line in installed.run("gpuwarden", "examples").stdout.splitlines() if line.strip()}
    assert listed == set(EXAMPLES)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_check_from_the_wheel(installed, example: str) -> None:
    rc, codes = EXAMPLES[example]
    p = installed.run("gpuwarden", "check", "--example", example, "--format", "json", check=False)
    assert p.returncode == rc, p.stderr
    report = json.loads(p.stdout)
    validate(report, SCHEMA)
    assert {f["code"] for f in report["findings"]} == codes
    # and the same report, field for field, as the checkout gives
    src = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--example", example, "--format", "json"],
                         cwd=dist.REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(dist.REPO / "src")})
    assert dist.stable(report) == dist.stable(json.loads(src.stdout))


@pytest.mark.parametrize("argv,needle", [
    (["gpuwarden", "--version"], "0.1.0"),
    (["gpuwarden", "rules"], "GPU-DEV-001"),
    (["gpuwarden", "explain", "GPU-K8S-001"], "GPU-K8S-001"),
    (["gpuwarden", "why", "cuda-unknown-error", "--example", "uvm-missing"], "GPU-DEV-001"),
    (["gpuwarden", "check", "--example", "mig-nvml-hang"], "GPU-K8S-001"),
    (["gpuwarden", "agent", "--example", "uvm-missing", "--no-kube", "--cycles", "1", "--interval", "1s",
      "--listen", "", "--boot-grace", "0", "--debounce-raise", "1"], "GPU-DEV-001"),
    (["python", "-m", "gpuwarden", "--version"], "0.1.0"),
    (["kubectl-gpuwarden", "--help"], "check NODE"),
    (["kubectl-gpuwarden", "check", "--help"], "--timeout"),
])
def test_cli_smoke_from_the_wheel(installed, argv: list[str], needle: str) -> None:
    if argv[0] == "python":
        argv = [str(installed.python), *argv[1:]]
    p = installed.run(*argv, check=False)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    assert needle in p.stdout + p.stderr
    assert "Traceback" not in p.stderr


def test_usage_error_from_the_wheel(installed) -> None:
    p = installed.run("gpuwarden", "check", "--example", "no-such-node", check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
