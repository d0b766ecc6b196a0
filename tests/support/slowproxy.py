"""A TCP proxy on loopback that can slow down or cut off one client's path to the API server.

    with SlowProxy("127.0.0.1", 8080) as p:     # p.url: point one component's client here
        p.delay_s = 7.0                          # every request it sends now waits 7 s first
        p.cut = True                             # new and open connections fail (a partition)

The delay is applied to each chunk the client sends (one chunk carries one small request), so
each request reaches the server `delay_s` late and its answer comes back that much later: what a
congested network or an overloaded apiserver front shows to this component only.
"""

from __future__ import annotations

import socket
import threading
import time


class SlowProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.delay_s = 0.0
        self.cut = False
        self._ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._ls.bind(("127.0.0.1", 0))
        self._ls.listen(64)
        self.url = f"http://127.0.0.1:{self._ls.getsockname()[1]}"
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="slowproxy").start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._ls.accept()
            except OSError:
                return
            if self.cut:
                c.close()
                continue
            try:
                u = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                c.close()
                continue
            with self._lock:
                self._socks += [c, u]
            threading.Thread(target=self._pump, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, delayed: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self.cut:
                    break
                if delayed and self.delay_s > 0:
                    time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._stop.set()
        self._ls.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass

    def __enter__(self) -> "SlowProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
