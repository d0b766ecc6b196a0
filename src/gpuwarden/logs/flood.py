"""A class of lines flooding a log, counted at C speed instead of line by line (issue 41).

A scan decodes and matches every line holding an anchor: ~10 µs of Python a line. 100,000 Xid 13 lines a
second (one application's graphics exceptions) then cost more than a core, and the agent fell behind the
log: a later, different Xid was read seconds late. Most of a flood is one *class* of line, which a
signature's `flood_class` groups name (kernel.xid: the device and the Xid number); its lines differ only
after the class's literal ("NVRM: Xid (PCI:0000:3b:00): 13,": pid, detail).

Once a class literal was matched LEARN_AFTER times line by line in a scan (and the line held every anchor
inside that literal, so the signatures it matches are decided by the literal), a block of the log is
counted in bulk when every anchor occurrence in it lies inside a known class literal: `bytes.count` per
anchor and per class, then only the block's last TAIL lines of each class are decoded (their times, pids
and details become the kept events). A block holding anything else (a new Xid, another GPU, another
signature's line) is read line by line as before, so a different fault in a flood is read exactly, and
found in the same check as the flood around it.
"""

from __future__ import annotations

from typing import Any, Sequence

#: slow-path hits of one class literal in a scan before its lines are counted in bulk
LEARN_AFTER = 32
#: classes counted in bulk in one scan (a flood is one or a few; more is not a flood of one class)
MAX_CLASSES = 16
#: literals being learned at once (bounded: a log of ever-different lines learns nothing)
MAX_LEARNING = 256
#: bytes one bulk test covers: a block holding a line of another class is read line by line (~700 lines)
BLOCK = 64 << 10
#: the latest lines of each class in a bulk-counted block that are decoded and kept as events
TAIL = 4


class FloodClass:
    __slots__ = ("literal", "sigs", "anchors")

    def __init__(self, literal: bytes, sigs: tuple[str, ...], anchors: dict[bytes, int]) -> None:
        self.literal, self.sigs, self.anchors = literal, sigs, anchors


class FloodClasses:
    """The flood classes of one scan: learned from the lines it matched, tested per block."""

    def __init__(self, anchors: Sequence[bytes]) -> None:
        self.anchors = tuple(anchors)
        self.classes: dict[bytes, FloodClass] = {}
        self._learning: dict[bytes, int] = {}
        self.bulk_lines = 0  # lines counted in bulk (the bench's and the tests' figure)

    def note(self, raw: bytes, literal: str, matched: tuple[str, ...]) -> None:
        """A line read one by one: it matched the signatures `matched`, its class literal is `literal`."""
        lit = literal.encode("utf-8", "replace")
        known = self.classes.get(lit)
        if known is not None:
            if known.sigs != matched:  # its lines do not all match alike: read them one by one again
                del self.classes[lit]
            return
        n = self._learning.get(lit, 0) + 1
        if n < LEARN_AFTER:
            if len(self._learning) >= MAX_LEARNING and lit not in self._learning:
                return
            self._learning[lit] = n
            return
        self._learning.pop(lit, None)
        if len(self.classes) >= MAX_CLASSES or lit not in raw:
            return
        inside = {a: lit.count(a) for a in self.anchors if a in lit}
        # every anchor of the line lies inside the literal: the signatures tried on a line of this class,
        # and what they match, are decided by the literal
        if not inside or any(raw.count(a) != inside.get(a, 0) for a in self.anchors):
            return
        if any(lit in other or other in lit for other in self.classes):
            return  # nested literals would count a line twice
        self.classes[lit] = FloodClass(lit, matched, inside)

    def seed(self, known: Any, sig_ids: set[str]) -> None:
        """Classes an earlier scan of the same file learned (literal -> signatures), for these signatures."""
        for lit, sigs in list(known.items())[:MAX_CLASSES]:
            if not set(sigs) <= sig_ids:
                continue
            inside = {a: lit.count(a) for a in self.anchors if a in lit}
            if inside and not any(lit in o or o in lit for o in self.classes):
                self.classes[lit] = FloodClass(lit, tuple(sigs), inside)

    def bulk(self, buf: Any, lo: int, hi: int) -> dict[bytes, int] | None:
        """Lines of each class in buf[lo:hi] when every anchor occurrence there lies inside a class literal
        (then nothing else in the block can match a signature); None when the block must be read line by line."""
        if not self.classes:
            return None
        counts = {lit: buf.count(lit, lo, hi) for lit in self.classes}
        if not any(counts.values()):
            return None
        for a in self.anchors:
            want = sum(n * self.classes[lit].anchors.get(a, 0) for lit, n in counts.items())
            if buf.count(a, lo, hi) != want:
                return None
        return counts

    def tail(self, buf: Any, lo: int, hi: int, lit: bytes, n: int) -> list[int]:
        """Line starts of the last min(n, TAIL) lines of class `lit` in buf[lo:hi], in file order."""
        out: list[int] = []
        end = hi
        while len(out) < min(n, TAIL):
            p = buf.rfind(lit, lo, end)
            if p < 0:
                break
            ls = buf.rfind(b"\n", lo, p) + 1
            out.append(ls if ls > lo else lo)
            end = ls if ls > lo else lo
            if end <= lo:
                break
        return out[::-1]

    def forget(self, lit: bytes) -> None:
        self.classes.pop(lit, None)
