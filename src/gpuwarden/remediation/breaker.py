"""The cluster-wide circuit breaker: ConfigMap `gpuwarden-breaker` in the agent's namespace.

`data.open: "true"` stops every action on every node, read fresh before each check's actions
(no cache, so flipping it takes effect within one interval). An optional `data.reason` is quoted
in logs. When the ConfigMap cannot be read (API down, RBAC), the breaker counts as open: an agent
that cannot see the stop switch does not act. A missing ConfigMap means closed.
"""

from __future__ import annotations

from typing import Any

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
