"""Real `gpuwarden controller` processes for the tests (the installed console script), as an operator
runs them: each in its own process group, gone with pytest, its JSON log lines in a file.

    procs = ControllerProcs(tmp_path)          # skips when the console script is not installed
    procs.start("ctl-a", kubeconfig, [...])    # extra flags after the common ones
    procs.ready("ctl-a")                       # its /readyz: the watches have filled their caches
    procs.lines("ctl-a")                       # its log records
    procs.close()                              # SIGKILL what is left, print each log's tail
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.apiserver import _die_with_parent


class ControllerProcs:
    def __init__(self, tmp_path: Path) -> None:
        self.exe = Path(sys.executable).with_name("gpuwarden")
        if not os.access(self.exe, os.X_OK):
            pytest.skip(f"the gpuwarden console script is not installed beside {sys.executable}")
        self.dir = tmp_path
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def start(self, name: str, kubeconfig: str, flags: list[str]) -> subprocess.Popen:
        self.logs[name] = self.dir / f"{name}.log"
        with open(self.logs[name], "wb") as out:
            self.procs[name] = subprocess.Popen(
                [str(self.exe), "controller", "--kubeconfig", kubeconfig, "--identity", name, "--execute",
                 "--listen", "127.0.0.1:0", *flags],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent)  # its own group; gone with pytest
        return self.procs[name]

    def lines(self, name: str) -> list[dict]:
        return [json.loads(x) for x in self.logs[name].read_text().splitlines() if x.startswith("{")]

    def ready(self, name: str) -> bool:
        addr = next((x["address"] for x in self.lines(name) if x["msg"] == "serving"), None)
        try:
            return bool(addr) and urllib.request.urlopen(f"http://{addr}/readyz", timeout=1).status == 200
        except OSError:
            return False

    def close(self, tail: int = 15) -> None:
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)
        for name, log in self.logs.items():
            if log.exists():
                print(f"--- {name}\n" + "\n".join(log.read_text().splitlines()[-tail:]))
