"""The command blocks of a Markdown document, as the tests execute them (not copies of them).

A fenced block is preceded by a marker that says how the tests treat it:

    <!-- doc-test: apiserver -->          run against the real test API server
    <!-- doc-test: local -->              run in a scratch directory beside a copy of deploy/
    <!-- doc-test: parse (why) -->        only parsed by `bash -n` (needs a registry, a cluster...)

Every `sh` block must carry one (an unmarked block fails the tests: nothing is silently skipped).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

_BLOCK = re.compile(r"(?:<!--\s*doc-test:\s*(?P<mode>[a-z]+)(?P<why>[^>]*?)\s*-->\s*\n)?```(?P<lang>\w*)\n(?P<body>.*?)```",
                    re.S)
MODES = ("apiserver", "local", "parse")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    mode: str  # one of MODES, or "" when unmarked
    why: str
    body: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(path: Path, lang: str | None = None) -> list[Block]:
    text = path.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        if lang is not None and m["lang"] != lang:
            continue
        line = text.count("\n", 0, m.start("body"))
        out.append(Block(path.name, line, m["lang"], m["mode"] or "", (m["why"] or "").strip(" ()"), m["body"]))
    return out


def bash_syntax_error(script: str) -> str:
    """bash -n's complaint about `script`, or "" when it parses."""
    p = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=10)
    return p.stderr.strip() if p.returncode else ""


#: run a block as a script: stop at the first failing command, except a gpuwarden command's exit 1
#: (it means "findings", the answer the command exists to give)
PRELUDE = """set -uo pipefail -o errtrace
_fail() { echo "doc block failed (exit $1): $2" >&2; exit "$1"; }
trap 'rc=$?; case "$BASH_COMMAND" in gpuwarden*|"kubectl gpuwarden"*) [ $rc -le 1 ] || _fail $rc "$BASH_COMMAND";; \\
*) _fail $rc "$BASH_COMMAND";; esac' ERR
"""


def run(block: Block, cwd: Path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", PRELUDE + block.body], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
