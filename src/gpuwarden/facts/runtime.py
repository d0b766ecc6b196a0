"""Container runtime facts: runc and toolkit versions, toolkit mode (CDI specs are the `cdi` section's).

Versions come from captured command outputs (`/.gpuwarden/commands/<tool>-version.txt`),
which `collect` writes and the live probes refresh.
"""

from __future__ import annotations

import re

from msgspec import Struct, field

from gpuwarden.facts.node import NodeFacts, fact
from gpuwarden.parsers import lazyre
from gpuwarden.parsers.nvidia_version import version_tuple

_RUNC = lazyre.compile(r"runc version\s+(\S+)")
_PRERELEASE = lazyre.compile(r"^v?[0-9]+(?:\.[0-9]+)*-(?:rc|alpha|beta|pre|dev)", re.I)
_SYSTEMD = lazyre.compile(r"systemd\s+([0-9]+)")
_CTK = lazyre.compile(r"(?:NVIDIA Container Toolkit CLI|nvidia-ctk|cli-version|version)[:\s]+v?([0-9]+\.[0-9]+\.[0-9]+\S*)", re.I)
TOOLKIT_CONFIGS = (
    "/etc/nvidia-container-runtime/config.toml",
    "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
)


class RuntimeFacts(Struct):
    """Versions and modes of runc, systemd and the NVIDIA Container Toolkit."""
    runc_version: str | None = None
    systemd_version: int | None = None
    toolkit_version: str | None = None
    toolkit_mode: str | None = None  # legacy | cdi | csv | jit-cdi | auto
    toolkit_config_source: str | None = None
    sources: list[str] = field(default_factory=list)

    def runc_tuple(self) -> tuple[int, ...] | None:
        return version_tuple(self.runc_version) if self.runc_version else None

    def runc_at_least(self, want: tuple[int, ...]) -> bool | None:
        """runc >= want, in SemVer order: a pre-release (1.0.0-rc92) sorts below its release (1.0.0).

        version_tuple drops the pre-release suffix, so a bare tuple comparison would call
        1.0.0-rc92 "1.0.0". A Debian revision (1.1.12-0ubuntu2) is not a pre-release.
        """
        have = self.runc_tuple()
        if not have:
            return None
        n = max(len(have), len(want))
        a, b = have + (0,) * (n - len(have)), tuple(want) + (0,) * (n - len(want))
        if a != b:
            return a > b
        return not _PRERELEASE.match(self.runc_version or "")


def _cmd(facts: NodeFacts, name: str) -> str | None:
    return facts.read_text(f"/.gpuwarden/commands/{name}")


@fact("runtime")
def collect_runtime(facts: NodeFacts) -> RuntimeFacts:
    rt = RuntimeFacts()
    text = _cmd(facts, "runc-version.txt")
    if text and (m := _RUNC.search(text)):
        rt.runc_version = m.group(1)
        rt.sources.append("/.gpuwarden/commands/runc-version.txt")
    text = _cmd(facts, "systemctl-version.txt")
    if text and (m := _SYSTEMD.search(text)):
        rt.systemd_version = int(m.group(1))
    text = _cmd(facts, "nvidia-ctk-version.txt")
    if text and (m := _CTK.search(text)):
        rt.toolkit_version = m.group(1)
    for path in TOOLKIT_CONFIGS:
        cfg = facts.read_text(path)
        if cfg is None:
            continue
        rt.toolkit_config_source = path
        m = re.search(r'^\s*mode\s*=\s*"([^"]+)"', cfg, re.M)
        rt.toolkit_mode = m.group(1) if m else "auto"
        break
    return rt
