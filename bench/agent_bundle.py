#!/usr/bin/env python3
"""Run `gpuwarden agent` on a bundle directory (the agent's CLI takes --root or --example only).

    .venv/bin/python bench/agent_bundle.py BUNDLE_DIR [agent options, as `gpuwarden agent --help`]

The same as the `agent` command of gpuwarden.cli (options parsed by gpuwarden.agent.config, the
same Agent loop), except that the root is the bundle, opened as `--example` opens an example.
bench/run.py measures its CPU share and memory at the default interval. The agent scans its logs
incrementally (one gpuwarden.logs.cursors.LogCursors for its lifetime); `$GPUWARDEN_SRC` names
another checkout's src/ to measure instead of this one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("GPUWARDEN_SRC") or str(REPO / "src"))


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    bundle, argv = Path(sys.argv[1]), sys.argv[2:]
    from gpuwarden.agent.config import parse_args
    from gpuwarden.agent.loop import Agent
    from gpuwarden.examples import open_bundle_dir

    cfg, _ = parse_args(argv)
    return Agent(cfg.resolved(), root=open_bundle_dir(bundle, label=f"bundle:{bundle}")).run()


if __name__ == "__main__":
    sys.exit(main())
