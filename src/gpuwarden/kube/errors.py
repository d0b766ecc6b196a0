"""What a failed Kubernetes call means: `KubeError` (and whether to try again), and why a
connection or a configuration failed, in words an operator can act on.

The kubernetes client reports a missing configuration as `Invalid kube-config file. No
configuration found.` and an unreachable server as a 300-character urllib3 `MaxRetryError`. These
say instead where the configuration was looked for and what to pass, or which server could not be
reached and how.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

DEFAULT_KUBECONFIG = "~/.kube/config"
#: answers that mean "the API server (or etcd behind it) is not serving now": back off
UNAVAILABLE = (0, 429, 502, 503, 504)


class KubeError(Exception):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        self.status, self.reason, self.body = status, reason, body
        msg = body
        try:
            msg = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            pass
        super().__init__(f"HTTP {status} {reason}: {msg}".strip())

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def unavailable(self) -> bool:
        """The API did not serve the call (down, overloaded, etcd away): worth trying again later."""
        return self.status in UNAVAILABLE

    @property
    def gone(self) -> bool:
        """410: a watch's resourceVersion or a list's continue token has expired."""
        return self.status == 410


def retryable(exc: Exception) -> bool:
    """The API did not serve the call (unreachable, a timeout, 5xx, 429): keep the item for later.
    Any other answer (400, 403, 422) would refuse it again: it is dropped, with a log line."""
    status = getattr(exc, "status", None)
    return status is None or status in (0, 429) or status >= 500


def _state(path: str) -> str:
    p = os.path.expanduser(path)
    if not os.path.exists(p):
        return "missing"
    return "present" if os.access(p, os.R_OK) else "unreadable"


def where_looked(kubeconfig: str = "", context: str = "") -> list[str]:
    """The places a kubectl-like client looks for its configuration, in order, with what was found."""
    if kubeconfig:
        return [f"--kubeconfig {kubeconfig} ({_state(kubeconfig)})"]
    out = []
    if context:
        out.append(f"--context {context} (needs a kubeconfig file)")
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        out.append("the in-cluster service account (KUBERNETES_SERVICE_HOST is set)")
    else:
        out.append("the in-cluster service account (not in a pod: KUBERNETES_SERVICE_HOST is unset)")
    env = os.environ.get("KUBECONFIG", "")
    if env:
        out += [f"$KUBECONFIG {p} ({_state(p)})" for p in env.split(os.pathsep) if p]
    else:
        out.append(f"$KUBECONFIG (unset), then {DEFAULT_KUBECONFIG} ({_state(DEFAULT_KUBECONFIG)})")
    return out


def config_error(exc: BaseException, kubeconfig: str = "", context: str = "", no_kube_flag: bool = False) -> str:
    """A configuration that could not be loaded: what it said, where it was looked for, what to pass."""
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    said = re.sub(r"^Invalid kube-config file\. ", "", said).rstrip(".")
    head = ("no Kubernetes configuration found" if said.lower() == "no configuration found"
            else f"the Kubernetes configuration could not be loaded ({said})")
    hint = "Pass --kubeconfig FILE (and --context NAME)"
    if no_kube_flag:
        hint += ", or --no-kube to run without the API server"
    return f"{head}; looked at {'; '.join(where_looked(kubeconfig, context))}. {hint}."


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


def connection_error(exc: BaseException) -> str:
    """urllib3's MaxRetryError and friends as `cannot connect to 127.0.0.1:6443: Connection refused`."""
    reason: Any = getattr(exc, "reason", None) or exc
    # MaxRetryError carries the pool; with retries off (kube/client.py) the error is urllib3's own
    # NewConnectionError or timeout, which carries the connection (its `pool` is deprecated)
    pool = (getattr(exc, "pool", None) if type(exc).__name__ == "MaxRetryError" else None) or \
        next((c for c in (getattr(reason, "conn", None), getattr(exc, "conn", None)) if c is not None), None)
    where = f"{pool.host}:{pool.port}" if pool is not None and getattr(pool, "host", None) else "the API server"
    kind = type(reason).__name__
    text = str(reason)
    if "Timeout" in kind or "timed out" in text:
        return f"no answer from {where} before the deadline (timed out)"
    if "SSL" in kind or "CERTIFICATE" in text.upper():
        m = re.search(r"\[SSL[^\]]*\] ([^(]+)", text)
        return f"TLS with {where} failed: {m[1].strip() if m else kind} (check the kubeconfig's server and CA)"
    m = _ERRNO.search(text)
    if m:
        return f"cannot connect to {where}: {m[1].strip()}"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return f"cannot resolve {where}"
    return f"cannot reach {where}: {kind}"
