"""Structured log lines on stderr for the cluster components (agent, controller): one JSON object
(or `key=value` text) per line, each with its UTC time to the millisecond."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

from gpuwarden import terminal
from gpuwarden.parsers.wallclock import format_rfc3339


class Log:
    """Structured log lines on stderr (JSON by default)."""

    def __init__(self, fmt: str = "json", stream: TextIO | None = None, **static: Any) -> None:
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self.static = static
        self._lock = threading.Lock()

    def _emit(self, level: str, msg: str, kv: dict) -> None:
        rec = {"ts": format_rfc3339(time.time(), 3), "level": level,
               "msg": msg, **self.static, **kv}
        if self.fmt == "json":
            line = json.dumps(rec, default=str, sort_keys=False)
        else:
            line = " ".join(f"{k}={terminal.safe(str(v))}" for k, v in rec.items())  # values may be a node's strings
        with self._lock:
            print(line, file=self.stream, flush=True)

    def info(self, msg: str, **kv: Any) -> None:
        self._emit("info", msg, kv)

    def warn(self, msg: str, **kv: Any) -> None:
        self._emit("warning", msg, kv)

    def error(self, msg: str, **kv: Any) -> None:
        self._emit("error", msg, kv)
