"""What an event source hands the agent: a wake-up naming what changed, never a verdict."""

from __future__ import annotations

from typing import Callable, Protocol

from msgspec import Struct


class Wake(Struct, frozen=True):
    """One thing a source saw change. `topic` selects the rules to re-check; `seen` (epoch s) is
    when the source saw it, the start of the fault-seen -> raised latency."""

    source: str  # "kmsg" | "logfile" | "inotify" | "psi" | "meminfo" | "nvml" | "pods"
    topic: str  # "log" | "devices" | "plugins" | "cdi" | "dra" | "memory" | "gpu" | "admission"
    detail: str = ""  # bounded (<= 256 chars), what changed: a path, a line excerpt, a GPU index
    seen: float = 0.0


Emit = Callable[[Wake], None]  # thread-safe, never blocks (the queue coalesces)


class Source(Protocol):
    """A started source emits Wakes until stopped; unavailable -> the periodic check covers it."""

    name: str

    def start(self, emit: Emit) -> str | None:
        """Start; return None, or why this source cannot run here (then nothing is emitted)."""

    def stop(self) -> None:
        """Stop and release everything (threads joined, children killed, fds closed)."""


#: every topic a Wake may carry, in the order a batch is checked
TOPICS = ("log", "devices", "plugins", "cdi", "dra", "memory", "gpu", "admission")
#: a Wake's detail is at most this long (a flood of long lines must not grow the queue)
DETAIL_MAX = 256


def clip(text: str | bytes) -> str:
    """A Wake's detail: one line, printable, at most DETAIL_MAX characters (bytes decoded leniently)."""
    if isinstance(text, bytes):
        text = text[: DETAIL_MAX * 4].decode("utf-8", "replace")
    line = " ".join(text.split())
    return line if len(line) <= DETAIL_MAX else line[: DETAIL_MAX - 1] + "…"
