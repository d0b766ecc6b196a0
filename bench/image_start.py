#!/usr/bin/env python3
"""The container image: its size, and how long it takes to start under runc (issue #13).

    sudo .venv/bin/python bench/image_start.py [--runs 9] [--out bench/results/image.json]

Builds the image from ./Dockerfile (tools/image/build.sh: no Docker engine needed), unpacks it
with umoci, then times, interleaved and `--runs` times each, the time to the first byte of output
and to exit of `gpuwarden --version` and `gpuwarden check --example uvm-missing --format json`
inside a new runc container, against the same commands from the checkout's venv on the host (the
peer, same run). Reports medians and the container/host ratio. Numbers, not pass/fail: the tests
(tests/packaging/test_image.py) say whether the image works.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.support import oci  # noqa: E402

COMMANDS = {"version": ["--version"], "check": ["check", "--example", "uvm-missing", "--format", "json"]}


def timed(argv: list[str]) -> tuple[float, float]:
    """(seconds to the first byte on stdout, seconds to exit) of one run of `argv`."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    assert p.stdout is not None
    p.stdout.read(1)
    first = time.perf_counter() - t0
    p.stdout.read()
    p.wait(120)
    return first, time.perf_counter() - t0


def layout_size(ref: str) -> dict:
    """Bytes of the image as shipped (compressed layers + config) and as unpacked on a node."""
    _, layout, tag = ref.split(":", 2)
    root = Path(layout)
    index = json.loads((root / "index.json").read_text())
    desc = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    blob = lambda d: root / "blobs" / d["digest"].replace(":", "/")  # noqa: E731
    manifest = json.loads(blob(desc).read_text())
    shipped = sum(layer["size"] for layer in manifest["layers"]) + manifest["config"]["size"]
    return {"compressed_bytes": shipped, "layers": len(manifest["layers"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/image.json")
    args = ap.parse_args()

    t0 = time.perf_counter()
    ref = oci.build()
    build_s = time.perf_counter() - t0
    work = Path(tempfile.mkdtemp(prefix="gpuwarden-image-bench-"))
    image = oci.Image.unpack(ref, work / "bundle")
    unpacked = int(subprocess.run(["du", "-sb", str(image.rootfs)], capture_output=True, text=True,
                                  check=True).stdout.split()[0])
    size = {**layout_size(ref), "unpacked_bytes": unpacked}

    samples: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.runs):
        for name, cmd in COMMANDS.items():
            c = oci.Container("runc", image.spec(cmd), work)
            samples.setdefault(f"container {name}", []).append(timed(c.argv("run", "--bundle", str(c.bundle), c.id)))
            c.delete()
            samples.setdefault(f"host {name}", []).append(timed([sys.executable, "-m", "gpuwarden", *cmd]))

    result = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.platform(),
              "runs": args.runs, "build_s": round(build_s, 1), "size": size, "medians_s": {}}
    print(f"image: {size['compressed_bytes'] / 1e6:.0f} MB compressed ({size['layers']} layers), "
          f"{unpacked / 1e6:.0f} MB unpacked; tools/image/build.sh took {build_s:.0f} s")
    print(f"{'command':<20} {'first output':>13} {'exit':>8}   (median of {args.runs})")
    for key, vals in samples.items():
        first = statistics.median(v[0] for v in vals)
        total = statistics.median(v[1] for v in vals)
        result["medians_s"][key] = {"first_output": round(first, 3), "exit": round(total, 3)}
        print(f"{key:<20} {first:>12.3f}s {total:>7.3f}s")
    for name in COMMANDS:
        c, h = result["medians_s"][f"container {name}"], result["medians_s"][f"host {name}"]
        result["medians_s"][f"ratio {name}"] = round(c["exit"] / h["exit"], 2)
        print(f"ratio container/host, {name}: {c['exit'] / h['exit']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
