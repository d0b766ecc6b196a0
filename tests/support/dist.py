"""Build the sdist and the wheel as a user gets them, and install the wheel into a fresh venv.

The editable install the tests use reads the source tree, so it hides anything the packaging
drops (the examples' files/.gpuwarden/ went missing from wheels that way). Here the wheel is
built from the sdist (what `python -m build` does), installed with its dependencies into a new
venv outside the source tree, and run from a temporary working directory with no PYTHONPATH,
so nothing of the checkout can stand in for what was installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "gpuwarden"

BUILD_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 600


class DistError(RuntimeError):
    """Building or installing failed; the message carries the tail of the tool's output."""


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Installed:
    """A venv with the wheel installed: run its console scripts from `cwd` with `env`."""

    venv: Path
    cwd: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONNOUSERSITE"] = "1"
        return env

    def site_packages(self) -> Path:
        out = self.run(str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        return Path(out.stdout.strip())

    def run(self, *argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return _run(list(argv), cwd=self.cwd, env=self.env, timeout=timeout, check=check)


def build(out: Path) -> Dists:
    """`python -m build`: the sdist from a clean copy of the checkout, then the wheel from that sdist.

    The copy holds only what git would (tracked and untracked-but-not-ignored files), as a fresh
    clone does: a stale src/*.egg-info/SOURCES.txt in the checkout would otherwise feed setuptools
    the file list of an earlier build and hide what the current configuration drops.
    """
    tree = out / "tree"
    for rel in _checkout_files():
        dest = tree / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest)
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(tree)], cwd=out, timeout=BUILD_TIMEOUT_S)
    (sdist,) = out.glob("gpuwarden-*.tar.gz")
    (wheel,) = out.glob("gpuwarden-*.whl")
    return Dists(sdist=sdist, wheel=wheel)


def install(wheel: Path, venv: Path, cwd: Path) -> Installed:
    """A fresh venv (no system site-packages) with `wheel` and its dependencies from the index."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    _run([base, "-m", "venv", str(venv)], cwd=cwd, timeout=120)
    inst = Installed(venv=venv, cwd=cwd)
    inst.run(str(inst.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel),
             timeout=INSTALL_TIMEOUT_S)
    return inst


def _checkout_files(under: str = "") -> list[str]:
    """Files git would put in a commit (tracked, and untracked but not ignored), relative to the repo."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              "--", under or "."], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise DistError(f"git ls-files: {e}") from None
    return [p for p in out.split("\0") if p and (REPO / p).is_file()]


def source_files() -> set[str]:
    """The package's files in the checkout, relative to src/gpuwarden."""
    return {p[len("src/gpuwarden/"):] for p in _checkout_files("src/gpuwarden")}


def tree_files(root: Path) -> set[str]:
    """Files under an installed or unpacked package directory, bytecode left out."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not _compiled(p)}


def stable(report: dict) -> dict:
    """A JSON report without what changes from run to run (time of day, duration): to compare runs."""
    out = {k: v for k, v in report.items() if k != "generated_at"}
    out["summary"] = {k: v for k, v in report["summary"].items() if k != "duration_s"}
    return out


def _compiled(p: Path) -> bool:
    return "__pycache__" in p.parts or p.suffix in (".pyc", ".pyo")


def _run(argv: list[str], cwd: Path, timeout: float, env: dict | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise DistError(f"{argv[0]} {' '.join(argv[1:3])}: no result after {timeout:.0f} s") from e
    if check and p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).splitlines()[-25:])
        raise DistError(f"{' '.join(argv[:4])} exited {p.returncode}:\n{tail}")
    return p
