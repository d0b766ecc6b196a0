#!/usr/bin/env python3
"""Run `gpuwarden agent` on a bundle directory (the agent's CLI takes --root or --example only).

    .venv/bin/python bench/agent_bundle.py BUNDLE_DIR [agent options, as `gpuwarden agent --help`]

The same as the `agent` command of gpuwarden.cli (options parsed by gpuwarden.agent.config, the
same Agent loop), except that the root is the bundle, opened as `--example` opens an example.
bench/run.py measures its CPU share and memory at the default interval. `--bench-log-cursors`
(taken out before the agent's options are parsed) gives every check's Settings one shared
gpuwarden.facts.logs.LogCursors: the agent's incremental log scan, before the agent wires it itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    bundle, argv = Path(sys.argv[1]), sys.argv[2:]
    if "--bench-log-cursors" in argv:
        # what the agent does once it keeps a LogCursors across checks (docs/performance.md): the
        # agent builds Settings(...) each check; give every one the same cursors
        argv.remove("--bench-log-cursors")
        import gpuwarden.facts as gf
        from gpuwarden.facts.logs import LogCursors

        cursors, base = LogCursors(), gf.Settings

        def settings(*a, **kw):
            kw.setdefault("log_cursors", cursors)
            return base(*a, **kw)

        gf.Settings = settings  # type: ignore[assignment,misc]
    from gpuwarden.agent.config import parse_args
    from gpuwarden.agent.loop import Agent
    from gpuwarden.examples import open_bundle_dir

    cfg, _ = parse_args(argv)
    return Agent(cfg.resolved(), root=open_bundle_dir(bundle, label=f"bundle:{bundle}")).run()


if __name__ == "__main__":
    sys.exit(main())
