"""parsers.proc_pid: /proc/uptime as the kernel writes it (the agent's boot grace and the process table's boot time read it)."""

from __future__ import annotations


def test_uptime_reads_what_the_kernel_writes_and_nothing_else() -> None:
    from gpuwarden.parsers.proc_pid import uptime

    assert uptime("12345.67 98765.43\n") == 12345.67
    assert uptime("12345.67") == 12345.67  # truncated after the first field
    assert uptime("12345 1\n") == 12345.0
    for bad in ("", "nan 1\n", "-5.0 1\n", "1e9 1\n", "inf 1\n", "12,5 1\n", " 12.5 1\n"):
        assert uptime(bad) is None, bad
