"""`kubectl-gpuwarden`: the console script behind `kubectl gpuwarden ...` (krew's plugin convention).

kubectl finds an executable named `kubectl-gpuwarden` on PATH and hands it every argument after
`gpuwarden`; the kubeconfig comes from --kubeconfig/--context, $KUBECONFIG or ~/.kube/config, as
kubectl's own. Exit codes: 0 nothing wrong, 1 findings (or a failing node), 2 usage or API error,
4 not checked (`check`: the node has no NVIDIA GPU, or no rule could read its evidence).
"""

from __future__ import annotations

import io
import json
import sys
import time

import click

from gpuwarden import __version__
from gpuwarden.cli import (EXIT_FINDINGS, EXIT_NOT_CHECKED, EXIT_OK, EXIT_USAGE, SEVERITIES, KubeText, Seconds,
                           WholeHelpGroup, _kube,
                           _since, api_error, emit_view, fleet)

_kube_opts = [
    click.option("--kubeconfig", type=click.Path(dir_okay=False), help="kubeconfig file (default: $KUBECONFIG, "
                 "~/.kube/config)."),
    click.option("--context", help="kubeconfig context."),
]


def _with_kube(f):
    for opt in reversed(_kube_opts):
        f = opt(f)
    return f


@click.group("kubectl-gpuwarden", cls=WholeHelpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubectl-gpuwarden")
def main() -> None:
    """gpuwarden from a laptop: `kubectl gpuwarden fleet | node NODE | check NODE`.

    \b
    fleet: every GPU node's gpuwarden conditions and findings, worst first.
    node:  one node's findings as its agent published them (NodeConditions, Events).
    check: a one-shot check of a node in a short-lived privileged pod (when no agent runs there).
    """


main.add_command(fleet)


@main.command()
@click.argument("node", type=KubeText("name"))
@_with_kube
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--since", default="24h", show_default=True, help="Events this recent.")
def node(node, kubeconfig, context, fmt, since) -> None:
    """One node's findings as the agent published them: its gpuwarden NodeConditions and Events.

    Exit 1 when a gpuwarden condition is True or the node is not Ready.
    """
    from gpuwarden.kube.errors import KubeError
    from gpuwarden.kubectl import nodeview

    since_s = _since(since)
    kube = _kube(kubeconfig, context, "kubectl gpuwarden node")
    try:
        obj, events = nodeview.gather(kube, node)
    except KubeError as exc:
        click.echo(f"kubectl gpuwarden node: {'no node ' + repr(node) if exc.not_found else api_error(exc)}", err=True)
        sys.exit(EXIT_USAGE)
    finally:
        kube.close()
    now = time.time()
    view = nodeview.build(obj, events, now, since_s)
    emit_view(view, fmt, lambda v: nodeview.render_text(v, now))
    sys.exit(EXIT_FINDINGS if view["node"]["state"] == "failing" or any(
        c["status"] == "True" for c in view["node"]["conditions"].values()) else EXIT_OK)


@main.command()
@click.argument("node", type=KubeText("name"))
@_with_kube
@click.option("-n", "--namespace", type=KubeText("namespace"), default="gpuwarden", show_default=True,
              help="Namespace of the check pod: the chart's release namespace, where its check role is and "
                   "privileged pods are allowed.")
@click.option("--image", default=None, help="gpuwarden image [default: ghcr.io/gpuwarden/gpuwarden:VERSION].")
@click.option("--timeout", type=Seconds(1, 86400), default=120.0, show_default=True,
              help="Seconds to wait for the pod to finish (image pull included); then it is deleted.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on", type=click.Choice(SEVERITIES), default="medium", show_default=True,
              help="Exit 1 when a finding at or above this severity exists.")
@click.option("-v", "--verbose", is_flag=True, help="All evidence, gaps and references.")
def check(node, kubeconfig, context, namespace, image, timeout, fmt, fail_on, verbose) -> None:
    """Check NODE now, through a short-lived privileged pod pinned to it (like `kubectl debug node/NODE`).

    The pod (host PID, the host's root read-only at /host) runs `gpuwarden check --root /host
    --format json`; the report comes back in its termination message (or its log), and the pod is
    deleted, whatever happens.
    """
    from gpuwarden.findings import Report, Severity
    from gpuwarden.kubectl import checkpod
    from gpuwarden.render import text as render_text

    kube = _kube(kubeconfig, context, "kubectl gpuwarden check")
    try:
        out = checkpod.run(kube, node, namespace, image or checkpod.IMAGE, timeout_s=timeout,
                           on_created=lambda p: click.echo(
                               f"pod {namespace}/{p['metadata']['name']} on node {node}: running the check…",
                               err=True))
    except checkpod.CheckError as exc:
        click.echo(f"kubectl gpuwarden check: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    finally:
        kube.close()
    for note in out.notes:
        click.echo(f"note: {note}", err=True)
    if out.report is None:
        sys.exit(EXIT_USAGE)
    if fmt == "json":
        click.echo(json.dumps(out.report, indent=2))
    else:
        buf = io.StringIO()
        render_text.render(Report.from_json(out.report), buf, verbose=verbose)
        click.echo(buf.getvalue(), nl=False)
    threshold = Severity.parse(fail_on)
    worst = max((Severity.parse(f["severity"]) for f in out.report.get("findings") or []), default=None)
    if worst is not None and worst >= threshold:
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_NOT_CHECKED if (out.report.get("summary") or {}).get("not_checked") else EXIT_OK)


def run() -> None:
    """The console script's entry: `kubectl gpuwarden fleet | head -1` is no error, as for `gpuwarden`
    (checkrun.ReaderSafeStdout says why); click's group does the rest."""
    from gpuwarden import checkrun

    checkrun.reader_safe_stdout()
    main()
