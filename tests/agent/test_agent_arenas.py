"""The agent limits glibc's malloc arenas (agent/arenas.py), unless the operator set MALLOC_ARENA_MAX."""

from __future__ import annotations

import ctypes
import subprocess
import sys

from gpuwarden.agent import arenas


class _Mallopt:
    """A stand-in of ctypes' function object: takes argtypes/restype, records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


class _Libc:
    def __init__(self) -> None:
        self.mallopt = _Mallopt()


def test_sets_two_arenas_when_the_operator_did_not() -> None:
    libc = _Libc()
    assert arenas.limit_arenas(libc, env={}) is True
    assert libc.mallopt.calls == [(arenas.M_ARENA_MAX, 2)]


def test_leaves_the_operators_setting_and_a_libc_without_mallopt() -> None:
    libc = _Libc()
    assert arenas.limit_arenas(libc, env={"MALLOC_ARENA_MAX": "4"}) is False and libc.mallopt.calls == []
    assert arenas.limit_arenas(object(), env={}) is False


def test_on_this_machines_c_library_it_succeeds_where_glibc_is() -> None:
    code = ("import os; os.environ.pop('MALLOC_ARENA_MAX', None)\n"
            "from gpuwarden.agent.arenas import limit_arenas\nprint(limit_arenas())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    glibc = hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    assert out.stdout.split() == [str(glibc)], out.stderr
