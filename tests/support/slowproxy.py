"""A TCP proxy on loopback that can slow down or cut off one client's path to the API server.

    with SlowProxy("127.0.0.1", 8080) as p:     # p.url: point one component's client here
        p.delay_s = 7.0                          # every request it sends now waits 7 s first
        p.reply_delay_s = 3.0                    # and every answer 3 s on its way back
        p.cut = True                             # new and open connections fail (a partition)

Each direction is a delay line: a chunk read at t is passed on at t + the delay in force when it
was read, the chunks behind it not waiting for it (latency, not a throttle). So each request
reaches the server `delay_s` late and its answer comes back `reply_delay_s` after it left: what a
congested network or an overloaded apiserver front shows to this component only, and why a request
the client gave up on may still land.
"""

from __future__ import annotations

import queue
import socket
import threading
import time


class SlowProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.delay_s = 0.0
        self.reply_delay_s = 0.0
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

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        line: queue.Queue = queue.Queue()
        threading.Thread(target=self._deliver, args=(line, src, dst), daemon=True).start()
        try:
            while True:
                data = src.recv(65536)
                if not data or self.cut:
                    break
                line.put((time.monotonic() + (self.delay_s if upstream else self.reply_delay_s), data))
        except OSError:
            pass
        line.put((time.monotonic() + (self.delay_s if upstream else self.reply_delay_s), b""))

    def _deliver(self, line: queue.Queue, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                due, data = line.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data or self.cut:
                    break
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
