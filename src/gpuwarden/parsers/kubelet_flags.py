"""kubelet's command line: flags override the config file."""

from __future__ import annotations


def parse(argv: list[str]) -> dict[str, str]:
    """`--flag=value`, `--flag value` and bare `--flag` (= "true")."""
    out: dict[str, str] = {}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") or (a.startswith("-") and len(a) > 1):
            name = a.lstrip("-")
            if "=" in name:
                k, v = name.split("=", 1)
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                out[name] = argv[i + 1]
                i += 1
            else:
                out[name] = "true"
        i += 1
    return out


def feature_gates(text: str) -> dict[str, bool]:
    out = {}
    for item in text.split(","):
        k, sep, v = item.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip().lower() == "true"
    return out
