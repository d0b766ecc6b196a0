"""Canaries outside a node's root: what a side effect that escapes the root would hit.

A file whose bytes and mtime must not change (and a directory that must gain no name), a listening
unix socket that must receive no connection, and a live process that must receive no signal.
Used by tests/security (the side-effect reproductions and their property-based tests).
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
from pathlib import Path

DEFAULT = b"CANARY-4e2b outside the node's root\n"


class CanaryFile:
    def __init__(self, path: Path, content: bytes = DEFAULT) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # an mtime no write of now can keep
        self.content = content
        self.names_before = self.outside_names()

    def outside_names(self) -> list[str]:
        return sorted(os.listdir(self.path.parent))

    def assert_unchanged(self) -> None:
        st = os.lstat(self.path)
        assert not os.path.islink(self.path), f"{self.path} was replaced by a link"
        assert self.path.read_bytes() == self.content, f"{self.path} was written"
        assert st.st_mtime_ns == 1_000_000_000, f"{self.path} was touched"
        assert self.outside_names() == self.names_before, f"{self.path.parent} gained or lost a name"


class CanaryListener:
    """A unix socket listening outside the root; assert_untouched: no connection arrived."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)

    def __enter__(self) -> "CanaryListener":
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def pending(self) -> bool:
        ready, _, _ = select.select([self.sock], [], [], 0.01)
        return bool(ready)

    def assert_untouched(self) -> None:
        assert not self.pending(), f"something connected to {self.path}"


class CanaryProcess:
    """A live process of this machine; assert_alive: it was not signalled to death."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["sleep", "120"])
        self.pid = self.proc.pid

    def __enter__(self) -> "CanaryProcess":
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"canary process {self.pid} was killed ({self.proc.returncode})"
