"""Shared fixtures for the gRPC client tests.

The path shim lets `gpuwarden` (src layout) and `tests.support` import without
an install; it is a no-op once pytest's `pythonpath` or an editable install
provides them.
"""

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
for _p in (_ROOT / "src", _ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


@pytest.fixture
def sock_dir():
    """Short directory for unix sockets: sun_path is limited to 107 bytes."""
    d = tempfile.mkdtemp(prefix="gw-", dir="/tmp")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
