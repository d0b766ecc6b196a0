#!/usr/bin/env python3
"""Render deploy/manifests/ from the Helm chart with Helm's own engine (`helm template`).

    .venv/bin/python deploy/render.py            # rewrite deploy/manifests/gpuwarden.yaml and controller.yaml
    .venv/bin/python deploy/render.py --check    # exit 1 if a committed file is stale

The chart (deploy/helm/gpuwarden) is the one source: this renders it with the Helm v4 SDK
(the helm-python-sdk package, the test extra: `python3 -m venv .venv && .venv/bin/pip install -e
'.[test]'`; a Python without it gets a message saying so, exit 2), release "gpuwarden" in
values.namespace, and splits the objects into the agent's file (with its Namespace, which
`helm install --create-namespace` makes) and the controller's. `objects(overrides)` renders with
values on top of the defaults, as `helm template --set` does; the tests use it for every mode.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: what to run when the script's libraries are missing (the system python3 has neither)
SETUP = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]', then .venv/bin/python deploy/render.py"
if __name__ == "__main__":
    try:
        import helm_python  # noqa: F401
        import yaml  # noqa: F401
    except ModuleNotFoundError as exc:
        print(f"deploy/render.py: {exc.name} is not installed in {sys.executable}: it renders the chart with the Helm "
              f"SDK and PyYAML of the test extra: {SETUP}", file=sys.stderr)
        sys.exit(2)

import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE / "helm" / "gpuwarden"
OUT = {"agent": HERE / "manifests" / "gpuwarden.yaml", "controller": HERE / "manifests" / "controller.yaml"}
#: the chart's alerting rules as a plain Prometheus rule file (for a Prometheus without the operator)
RULES = HERE / "monitoring" / "gpuwarden.rules.yaml"
RELEASE = "gpuwarden"
HEADER = {
    "agent": "# Rendered by deploy/render.py (helm template) from deploy/helm/gpuwarden (default values): do not edit.\n",
    "controller": "# Rendered by deploy/render.py (helm template) from deploy/helm/gpuwarden (default values): do not "
                  "edit.\n# The gpuwarden controller (docs/controller.md); apply after gpuwarden.yaml (its namespace).\n",
}


def load_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def template(overrides: dict | None = None, kube_version: str | None = None) -> dict[str, str]:
    """`helm template gpuwarden deploy/helm/gpuwarden -n <namespace> [values] [--kube-version V]`: file name -> text.

    `kube_version` is the cluster's version the chart sees (`.Capabilities.KubeVersion`); None: the SDK's
    default (a recent release), as `helm template` without --kube-version.
    """
    import helm_python as helm

    namespace = {**load_values(), **(overrides or {})}["namespace"]
    with helm.Chart.load(str(CHART)) as chart:
        if kube_version is None:
            return chart.render(overrides or {}, name=RELEASE, namespace=namespace)
        # the SDK's render takes helm's --kube-version as the option `kube_version` (as its lint does), which
        # its Python wrapper's render() does not pass on: the same native call with that option added
        import json

        from helm_python import _native

        opts = {"name": RELEASE, "namespace": namespace, "kube_version": kube_version}
        return json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(overrides or {}),
                                              json.dumps(opts)))


def lint() -> dict:
    """`helm lint deploy/helm/gpuwarden`: {'messages': [...], 'errors': [...]}."""
    import helm_python as helm

    return helm.lint(str(CHART))


def objects(overrides: dict | None = None, kube_version: str | None = None) -> list[dict]:
    """Every object the chart renders, in file order (NOTES.txt left out)."""
    out: list[dict] = []
    for name, text in sorted(template(overrides, kube_version).items()):
        if name.endswith((".yaml", ".yml")):
            out += [d for d in yaml.safe_load_all(text) if d]
    return out


def component(obj: dict) -> str:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return "controller" if labels.get("app.kubernetes.io/component") == "controller" else "agent"


def manifests(overrides: dict | None = None) -> dict[Path, str]:
    """The plain manifests' text: the Namespace and the agent's objects; the controller's objects."""
    objs = objects(overrides)
    values = {**load_values(), **(overrides or {})}
    agent = [o for o in objs if component(o) == "agent"]
    labels = next((o["metadata"].get("labels") for o in agent if o["kind"] == "DaemonSet"), {})
    ns: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": values["namespace"],
                                                                             "labels": labels}}
    parts = {"agent": [ns, *agent], "controller": [o for o in objs if component(o) == "controller"]}
    return {OUT[k]: HEADER[k] + "".join("---\n" + yaml.safe_dump(o, sort_keys=False) for o in v)
            for k, v in parts.items()}


def rules_file(overrides: dict | None = None) -> str:
    """The PrometheusRule the chart renders (metrics.prometheusRule.enabled), as a Prometheus rule file."""
    values = {"metrics": {"prometheusRule": {"enabled": True}}}
    if overrides:
        values = {**overrides, "metrics": {**overrides.get("metrics", {}), **values["metrics"]}}
    [rule] = [o for o in objects(values) if o["kind"] == "PrometheusRule"]
    return ("# Rendered by deploy/render.py from deploy/helm/gpuwarden/files/alerts.yaml (the chart's PrometheusRule):"
            " do not edit.\n# promtool check rules deploy/monitoring/gpuwarden.rules.yaml\n"
            + yaml.dump(rule["spec"], Dumper=_BlockDumper, sort_keys=False, width=110))


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the rules' expressions) as YAML block scalars, as they are written."""


_BlockDumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s,
                                                                   style="|" if "\n" in s else None))


def main(argv: list[str]) -> int:
    stale = 0
    for path, text in {**manifests(), RULES: rules_file()}.items():
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                print(f"{path} is stale: run .venv/bin/python deploy/render.py", file=sys.stderr)
                stale = 1
        else:
            path.write_text(text)
            print(path)
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
