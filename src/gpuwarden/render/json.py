"""`--format json`: the versioned report schema (docs/report-schema.md)."""

from __future__ import annotations

import json
from typing import TextIO

from gpuwarden.findings import Report


def render(report: Report, out: TextIO) -> None:
    json.dump(report.to_json(), out, indent=2, sort_keys=False)
    out.write("\n")
