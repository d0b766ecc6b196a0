"""The switch that makes root-only tests fail instead of skipping: GPUWARDEN_REQUIRE_ROOT_TESTS=1.

Tests that need root (mknod of device nodes, cgroup writes, bpf(2), mount namespaces, dropping to
another uid) skip elsewhere, saying so. Where the suite runs as root (CI: `.ci/run` sets the switch
when uid is 0), such a skip means the machine lost what those tests need, or a test's own check went
wrong: with the switch set it is reported as a failure. A skip is root-only when its reason says so
("needs root", "needs mknod", "run as root"), the wording every such skip in this suite uses; other
skips (no GPU, no cgroup v2 hierarchy, no kubectl) stay skips.

A pytest plugin: tests/conftest.py registers its hook; `pytest -p tests.support.root_only` elsewhere.
"""

from __future__ import annotations

import os
import re

import pytest

ENV = "GPUWARDEN_REQUIRE_ROOT_TESTS"
#: the wording of a root-only skip's reason
ROOT_ONLY = re.compile(r"\bneeds? (?:root|mknod)\b|\brun as root\b", re.IGNORECASE)


def required() -> bool:
    return os.environ.get(ENV) == "1"


def skip_reason(report: pytest.TestReport) -> str | None:
    """The reason of a skipped (not xfailed) test's report, else None."""
    if not report.skipped or hasattr(report, "wasxfail") or not isinstance(report.longrepr, tuple):
        return None
    return str(report.longrepr[2])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    reason = skip_reason(report)
    if reason is not None and required() and ROOT_ONLY.search(reason):
        report.outcome = "failed"
        report.longrepr = f"{reason}\n{ENV}=1: this root-only test must run here, not skip"
    return report
