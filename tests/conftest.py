"""Suite-wide pytest configuration.

The `rule` marker ties a test to a catalog code and says which side it covers:

    @pytest.mark.rule("GPU-DEV-001", "positive")   # the rule fires (CONFIRMED or AT-RISK)
    @pytest.mark.rule("GPU-DEV-001", "negative")   # the rule stays silent where it must

tests/test_catalog.py requires every registered rule to have at least one of each.

Root-only tests skip without root, saying so; GPUWARDEN_REQUIRE_ROOT_TESTS=1 (set by .ci/run as
root) turns those skips into failures (tests/support/root_only.py).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
for _p in (_ROOT / "src", _ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from tests.support.root_only import pytest_runtest_makereport  # noqa: E402,F401  the root-only switch

#: positive / negative cases, and "clears": the finding goes once its cause is gone (issue 32)
RULE_CASE_KINDS = ("positive", "negative", "clears")


@pytest.fixture
def sock_dir():
    """A short directory for unix sockets (sun_path holds 107 bytes), removed afterwards."""
    from tests.support.agent_nodes import short_tmpdir

    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def node_dir():
    """A short temporary directory for a synthetic live node (its sockets' paths must stay short);
    materialising an example needs mknod (root)."""
    import shutil

    from tests.support.agent_nodes import can_mknod, short_tmpdir

    if not can_mknod():
        pytest.skip("SYNTHETIC NODE UNAVAILABLE: materialising an example needs mknod (run as root)")
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "rule(code, kind): the test is a positive or negative case of a catalog rule (see tests/test_catalog.py)",
    )


def pytest_collection_modifyitems(config, items):
    """Reject malformed `rule` marks at collection time, so the catalog check can trust them."""
    import pytest

    for item in items:
        for mark in item.iter_markers("rule"):
            args = mark.args
            if len(args) != 2 or args[1] not in RULE_CASE_KINDS:
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.rule needs (code, 'positive'|'negative'|'clears'), got {args!r}"
                )
