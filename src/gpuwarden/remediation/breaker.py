"""The cluster-wide circuit breaker: ConfigMap `gpuwarden-breaker` in the agent's namespace.

`data.open: "true"` stops every action on every node, read fresh before each check's actions
(no cache, so flipping it takes effect within one interval). An optional `data.reason` is quoted
in logs. When the ConfigMap cannot be read (API down, RBAC), the breaker counts as open: an agent
that cannot see the stop switch does not act. A missing ConfigMap means closed.

The read before a plan's actions is not enough: an action's write leaves later (it reads its object
first; a check of a busy node takes its time), and a breaker opened in between must still stop it.
`Gate` reads the breaker again right before each write of an action is sent, under one lock held until
the write is answered (kube.client.WRITE_GATE): no write of an action leaves after a read that found
the breaker open, and none on a decision older than one read of the ConfigMap.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

from msgspec import Struct

DEFAULT_NAME = "gpuwarden-breaker"


class BreakerState(Struct, frozen=True):
    open: bool
    why: str


def check(kube: Any, namespace: str, name: str = DEFAULT_NAME) -> BreakerState:
    try:
        cm = kube.get_configmap(namespace, name)
    except Exception as exc:
        return BreakerState(True, f"cannot read ConfigMap {namespace}/{name} ({exc}): not acting")
    if cm is None:
        return BreakerState(False, f"no ConfigMap {namespace}/{name}")
    data = cm.get("data") or {}
    value = str(data.get("open", "")).strip().lower()
    if value in ("true", "yes", "1"):
        reason = data.get("reason", "")
        return BreakerState(True, f"ConfigMap {namespace}/{name} has data.open={data.get('open')!r}"
                                  + (f" ({reason})" if reason else ""))
    return BreakerState(False, f"ConfigMap {namespace}/{name} data.open={data.get('open', '')!r}")


class BreakerOpen(Exception):
    """An action's write refused before it was sent: the breaker is open (or cannot be read)."""


class Gate:
    """The breaker, read again right before each write of an action is sent, under a lock held until the
    write is answered (docstring above).

    `state` is the last read; once it says open, later writes are refused without reading again until
    the next plan reads it afresh (`check` before the plan's actions)."""

    def __init__(self, kube: Any, namespace: str, name: str = DEFAULT_NAME) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.lock = threading.Lock()
        self.state: BreakerState | None = None
        self.passed = 0  # writes let through
        self.refused = 0  # writes refused

    @contextmanager
    def write(self) -> Iterator[None]:
        with self.lock:
            if self.state is None or not self.state.open:
                self.state = check(self.kube, self.namespace, self.name)
            if self.state.open:
                self.refused += 1
                raise BreakerOpen(f"the breaker opened before this write was sent: {self.state.why}")
            self.passed += 1
            yield
