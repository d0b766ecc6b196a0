"""/metrics, /healthz and /readyz on one small HTTP server thread, for the agent and the controller alike.

/healthz: 200 while the check loop is alive (a check started within 3 intervals + the probe
deadlines); 503 when the loop is stuck. /readyz: 200 once a check has completed and, with the Kubernetes
API on, the API server answered the agent's latest request (readiness, not liveness: an agent cut off
from the API is not restarted, it is shown not Ready).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class _Handler(BaseHTTPRequestHandler):
    server_version = "gpuwarden"
    agent_status: Callable[[], dict] = staticmethod(lambda: {})  # type: ignore[assignment]
    metrics_body: Callable[[], bytes] = staticmethod(lambda: b"")  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:  # quiet: scrapes every few seconds
        pass

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        st = type(self).agent_status()
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            self._send(200, type(self).metrics_body(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok = st.get("alive", False)
            self._send(200 if ok else 503, (b"ok\n" if ok else f"stuck: {st.get('detail', '')}\n".encode()))
        elif path == "/readyz":
            ok = st.get("ready", False)
            why = st.get("not_ready") or "no successful check yet"
            self._send(200 if ok else 503, b"ok\n" if ok else f"not ready: {why}\n".encode())
        else:
            self._send(404, b"not found: try /metrics, /healthz, /readyz\n")

    do_HEAD = do_GET


class StatusServer:
    def __init__(self, listen: str, status: Callable[[], dict], metrics: Callable[[], bytes]) -> None:
        host, _, port = listen.rpartition(":")
        handler = type("Handler", (_Handler,), {"agent_status": staticmethod(status),
                                                 "metrics_body": staticmethod(metrics)})
        self.httpd = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="gpuwarden-http", daemon=True)

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> "StatusServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
