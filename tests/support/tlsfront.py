"""A TLS front on loopback for the test API server, so that Go clients send their bearer tokens.

The test API server serves plain HTTP. client-go (clientcmd) puts a kubeconfig's token into the
request only for a TLS server (kubernetes/kubectl#744), so a Go binary given a token-bearing
kubeconfig for `http://` arrives as system:anonymous, which a server enforcing the chart's RBAC
refuses. This front terminates TLS with a throw-away self-signed certificate (made by the `openssl`
command) and passes the bytes on to the plain server unchanged, the `Authorization` header included:

    with TlsFront(server.url, workdir) as front:
        kubeconfig = front.kubeconfig(token, path)    # https://127.0.0.1:<port>, the front's CA

HTTP/1.1 only (no ALPN h2 offered: client-go falls back to HTTP/1.1); watches stream through.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlsplit


class Unavailable(RuntimeError):
    """No `openssl` command to make the certificate."""


class TlsFront:
    def __init__(self, upstream_url: str, workdir: str | Path) -> None:
        u = urlsplit(upstream_url)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert, key = self.dir / "front.crt", self.dir / "front.key"
        if not shutil.which("openssl"):
            raise Unavailable("no openssl command to make the TLS front's certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(self.cert)], check=True, capture_output=True, timeout=30)
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(self.cert, key)
        self._ls = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self._ls.getsockname()[1]}"
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="tlsfront").start()

    def kubeconfig(self, token: str, path: str | Path) -> Path:
        """A kubeconfig for this front that authenticates with `token` and trusts the front's certificate."""
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "gw",
               "clusters": [{"name": "gw", "cluster": {"server": self.url, "certificate-authority": str(self.cert)}}],
               "users": [{"name": "gw", "user": {"token": token}}],
               "contexts": [{"name": "gw", "context": {"cluster": "gw", "user": "gw"}}]}
        p = Path(path)
        p.write_text(json.dumps(doc, indent=1))
        return p

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True, name="tlsfront-conn").start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(30)
            tls = self._ctx.wrap_socket(raw, server_side=True)
            tls.settimeout(None)
            up = socket.create_connection(self.upstream, timeout=30)
            up.settimeout(None)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        with self._lock:
            self._socks += [tls, up]
        threading.Thread(target=self._pipe, args=(up, tls), daemon=True, name="tlsfront-down").start()
        self._pipe(tls, up)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                dst.sendall(b)
        except (OSError, ssl.SSLError):
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._ls.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> "TlsFront":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
