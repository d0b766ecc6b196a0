#!/usr/bin/env python3
"""The agent's requests to the API server in one simulated hour, counted by the server itself.

    .venv/bin/python bench/agent_api.py [--hours 1] > FILE.json

Starts the test API server (tools/testapiserver + etcd, docs/testing-apiserver.md), registers a
Node per example and runs the agent's check loop on it (`healthy`: a quiet node; `uvm-missing`: a
node with a fault that is raised), its clock moving 60 s a check. Prints the requests by verb,
resource and subresource from the server's `apiserver_request_total`. PYTHONPATH selects the
gpuwarden to measure (e.g. an older checkout's src/). tests/k8s/test_agent_api_load.py holds the
budget: on a quiet node, one condition heartbeat per 5 minutes and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))
sys.path.append(str(REPO / "src"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=1.0)
    a = ap.parse_args()
    import gpuwarden
    from gpuwarden.kube.client import Kube
    from gpuwarden.examples import open_example
    from tests.support.agent_kube import agent_hour, ensure_namespace, make_node
    from tests.support.apiserver import start_apiserver

    out: dict = {"gpuwarden": str(Path(gpuwarden.__file__).parents[1]), "hours": a.hours}
    with start_apiserver() as s:
        kube = Kube(s.api_client())
        ensure_namespace(kube, "ml")
        for ex in ("healthy", "uvm-missing"):
            make_node(kube, f"node-{ex}")
            counts, agent = agent_hour(kube, s.url, f"node-{ex}", open_example(ex), "default", hours=a.hours)
            out[ex] = {"checks": agent.checks, "raised": agent.debounce.raised_keys(),
                       "requests": {" ".join(x for x in k if x): v for k, v in sorted(counts.items())}}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
