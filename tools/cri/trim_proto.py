"""Cuts the CRI proto (k8s.io/cri-api runtime/v1 api.proto) down to the calls the tests make.

    python3 tools/cri/trim_proto.py API.PROTO OUT.PROTO

Keeps the RuntimeService rpcs in KEEP and the messages and enums they reach (top-level blocks,
found by brace matching; a nested type goes with its parent), in the source's order, with the
source's licence header and package. The source is Debian's golang-k8s-cri-api-dev (upstream
k8s.io/cri-api, `pkg/apis/runtime/v1/api.proto`); the version goes into the header.
"""

from __future__ import annotations

import re
import sys

KEEP = ("Version", "Status", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "PodSandboxStatus", "ListPodSandbox",
        "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer", "ListContainers",
        "ContainerStatus", "UpdateContainerResources")
SCALARS = {"string", "bytes", "bool", "int32", "int64", "uint32", "uint64", "double", "float", "map",
           "repeated", "optional", "returns", "stream", "rpc", "message", "enum", "reserved"}


def blocks(text: str) -> list[tuple[str, str, str]]:
    """Top-level (kind, name, text) blocks, comments just above each included."""
    out, i = [], 0
    pat = re.compile(r"^((?:[ \t]*//[^\n]*\n)*)(message|enum|service)\s+(\w+)\s*\{", re.M)
    while (m := pat.search(text, i)):
        depth, j = 0, m.end() - 1
        while True:
            c = text[j]
            depth += c == "{"
            depth -= c == "}"
            j += 1
            if depth == 0:
                break
        out.append((m.group(2), m.group(3), text[m.start():j]))
        i = j
    return out


def main() -> int:
    src, dest, version = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "?"
    text = open(src, encoding="utf-8").read()
    header = text[: text.index("service RuntimeService")]
    bl = blocks(text)
    types = {name: body for kind, name, body in bl if kind != "service"}
    svc = next(body for kind, name, body in bl if name == "RuntimeService")
    rpcs = [m for m in re.finditer(r"((?:[ \t]*//[^\n]*\n)*)[ \t]*rpc (\w+)\((\w+)\) returns \((\w+)\) \{\}\n", svc)
            if m.group(2) in KEEP]
    want, todo = set(), [t for m in rpcs for t in (m.group(3), m.group(4))]
    while todo:
        t = todo.pop()
        if t in want or t not in types:
            continue
        want.add(t)
        body = re.sub(r"//[^\n]*", "", types[t])
        todo.extend(w for w in re.findall(r"\b([A-Z]\w*)\b", body) if w not in SCALARS)
    out = [f"// Trimmed by tools/cri/trim_proto.py from k8s.io/cri-api {version} (Debian golang-k8s-cri-api-dev):\n"
           f"// only the RuntimeService calls the CRI tests make, and the types they reach.\n", header,
           "service RuntimeService {\n", "".join(m.group(0) for m in rpcs), "}\n\n"]
    out += [body + "\n\n" for kind, name, body in bl if kind != "service" and name in want]
    open(dest, "w", encoding="utf-8").write("".join(out))
    print(f"{len(rpcs)} rpcs, {len(want)} types", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
