"""Session fixtures: the sdist and wheel built once, and the wheel installed once in a fresh venv."""

from __future__ import annotations

import pytest

from tests.support import dist


@pytest.fixture(scope="session")
def dists(tmp_path_factory) -> dist.Dists:
    try:
        return dist.build(tmp_path_factory.mktemp("dist"))
    except dist.DistError as e:
        pytest.fail(f"building the sdist and wheel failed: {e}", pytrace=False)


@pytest.fixture(scope="session")
def installed(dists, tmp_path_factory) -> dist.Installed:
    """The wheel in a new venv; commands run from an empty temporary directory."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    try:
        return dist.install(dists.wheel, tmp_path_factory.mktemp("venv") / "v", cwd)
    except dist.DistError as e:
        pytest.fail(f"installing the wheel into a fresh venv failed: {e}", pytrace=False)
