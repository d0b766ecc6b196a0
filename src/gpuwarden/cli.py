"""The `gpuwarden` command: sub-commands and exit codes only; the work lives elsewhere.

Exit codes of `check`: 0 no finding at or above --fail-on; 1 findings at or above it;
2 usage error (bad arguments, unreadable bundle); 3 internal error; 4 not checked (the root is not
a directory, no rule selected or evaluable, no NVIDIA GPU on the node): never read as healthy.
A command loads only what it uses: heavy modules (kubernetes, grpc, PyYAML) are imported inside the
commands that need them, and `agent` and `controller`, whose options come from their configuration
modules, are built only when named (tests/test_perf_paths.py guards what `check` loads).
"""

from __future__ import annotations

import gc
import os
import re
import sys
from typing import Callable

import click

from gpuwarden import __version__, checkopts, checkrun
from gpuwarden.checkopts import PROBE_TIMEOUT_RANGE
from gpuwarden.checkrun import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_NOT_CHECKED, EXIT_OK, EXIT_USAGE  # noqa: F401

SEVERITIES = list(checkopts.SEVERITIES)


class Seconds(click.ParamType):
    """A finite number of seconds within [lo, hi]: inf, nan and 1e308 are no deadline a child can keep."""

    name = "seconds"

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        try:
            return checkopts.seconds(value, self.lo, self.hi)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _a_file(ctx, param, value):
    """-o/--output: an empty name is a usage error, never stdout or a traceback."""
    if value == "":
        raise click.BadParameter("is empty: name a file")
    return value


class Duration(click.ParamType):
    """A duration in the grammar of every flag and config file (`5`, `5s`, `500ms`, `1m`: parsers.duration),
    within [lo, hi] seconds: `check --probe-timeout` reads what `agent --probe-timeout` reads."""

    name = "duration"

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        try:
            return checkopts.duration(value, self.lo, self.hi)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)




class WholeHelpCommand(click.Command):
    """A command whose line in its group's list is its help's whole first paragraph.

    click cuts that line to fit the terminal ("Watch this GPU node: NodeConditions,..."); the
    group's list wraps it instead, so no description is cut.
    """

    def get_short_help_str(self, limit: int = 45) -> str:
        return super().get_short_help_str(limit=1 << 16)


class WholeHelpGroup(click.Group):
    """A group whose `@group.command()` commands list their help whole (WholeHelpCommand)."""

    command_class = WholeHelpCommand


class LazyGroup(WholeHelpGroup):
    """A command group whose costly commands are built when named (or listed by --help), not at import.

    `lazy` maps a command's name to a function that builds it: `agent` and `controller` take their
    options from their configuration modules, which a `check` must not pay for.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, Callable[[], click.Command]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in self.lazy:
            self.add_command(self.lazy[name](), name)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuwarden")
def main() -> None:
    """Find out why a GPU pod cannot use its GPU, or why a GPU node is dying — with evidence."""
    checkrun.startup()


# -- the node to look at: shared by `check` and `why` ---------------------------------------------------

def _click_extra(opt: checkopts.Opt) -> dict:
    """An option's click type (and check of an empty file name) by its kind in the table."""
    lo, hi = opt.bounds
    kw: dict = {"callback": _a_file} if opt.nonempty else {}
    if opt.type == "path":
        kw["type"] = click.Path()
    elif opt.type == "file":
        kw["type"] = click.Path(dir_okay=False)
    elif opt.type == "choice":
        kw["type"] = click.Choice(list(opt.choices))
    elif opt.type == "duration":
        kw["type"] = Duration(lo, hi)
    elif opt.type == "seconds":
        kw["type"] = Seconds(lo, hi)
    return kw


def _with_options(opts: tuple[checkopts.Opt, ...]) -> Callable:
    """The click options of `opts` (checkopts' table), in the table's order."""
    decorators = checkopts.click_options(opts, _click_extra)

    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


def _usage(run: Callable, *args, **kwargs):
    """run(...), its UsageError said by click as click says its own (`Error: ...`, exit 2)."""
    try:
        return run(*args, **kwargs)
    except checkrun.UsageError as exc:
        if exc.param_hint:
            raise click.BadParameter(exc.message, param_hint=exc.param_hint) from None
        raise click.UsageError(exc.message) from None


@main.command()
@_with_options(checkopts.CHECK)
def check(**params) -> None:
    """Run every rule on a node, a bundle or an example, and report what is wrong."""
    _usage(checkrun.check, **params)


class TriageHelpCommand(WholeHelpCommand):
    """`why`: its help names the symptoms of the triage table (data/triage.yaml), read when help is shown,
    so that the help and the symptoms the command accepts cannot drift apart."""

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from gpuwarden import why as why_tree

        import inspect

        named = "\n".join(f"  {sid}" for sid in why_tree.symptoms())
        saved = self.help
        self.help = inspect.cleandoc(self.help or "").replace("{symptoms}", named)
        try:
            super().format_help_text(ctx, formatter)
        finally:
            self.help = saved


@main.command(cls=TriageHelpCommand)
@click.argument("symptom", nargs=-1, required=True)
@_with_options(checkopts.SOURCE)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), callback=_a_file, help="Write the answer here instead of stdout.")
@click.option("-v", "--verbose", is_flag=True, help="All evidence of every cause found.")
def why(symptom, root_dir, bundle, example, probes, probe_timeout, probe_access, kubelet_log, stall_seconds,
        log_window, fmt, output, verbose) -> None:
    """Why does this node show SYMPTOM? Runs the symptom's triage tree, most likely cause first.

    \b
    SYMPTOM, one of:
    {symptoms}

    or free text such as "NVML Unknown Error" or "Insufficient nvidia.com/gpu" (`gpuwarden why x` lists each
    symptom with its title). Exit 0 no cause found, 1 cause found,
    4 not checked (no NVIDIA GPU on the node, no evidence readable).
    """
    import json

    from gpuwarden import why as why_tree
    from gpuwarden.rules import all_rules

    text = " ".join(symptom)
    sym, cands = why_tree.match(text)
    if sym is None:
        known = "\n".join(f"  {s.id:20} {s.title}" for s in cands)
        click.echo(f"gpuwarden why: which symptom is {text!r}? Candidates:\n{known}", err=True)
        sys.exit(EXIT_USAGE)
    rules = all_rules()
    wanted = set(sym.rules)
    src = dict(root_dir=root_dir, bundle=bundle, example=example, probes=probes, probe_timeout=probe_timeout,
               probe_access=probe_access, kubelet_log=kubelet_log, stall_seconds=stall_seconds, log_window=log_window,
               text_on_stdout=checkrun.text_on_stdout(fmt, output))
    report = _usage(checkrun.run_on_source, src, [r for r in rules if r.code in wanted])
    res = why_tree.evaluate(sym, report, {r.code: r.title for r in rules})

    def write(stream) -> None:
        if fmt == "json":
            stream.write(json.dumps(res.to_json(), indent=2) + "\n")
        else:
            why_tree.render_text(res, stream, verbose=verbose)

    checkrun.emit(output, write)
    if res.causes:
        sys.exit(EXIT_FINDINGS)
    if report.not_checked:
        if not checkrun.text_on_stdout(fmt, output):  # else the answer on stdout said so, first and last
            click.echo(f"gpuwarden why: not checked: {report.not_checked}", err=True)
        sys.exit(EXIT_NOT_CHECKED)
    sys.exit(EXIT_OK)


@main.command("rules")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text")
def rules_cmd(fmt: str) -> None:
    """List every rule (markdown: the full reference, as docs/rules.md)."""
    from gpuwarden.rules import all_rules

    rs = all_rules()
    if fmt == "json":
        import json

        click.echo(json.dumps([{"code": r.code, "title": r.title, "severity": r.severity.label, "family": r.family,
                                "needs": list(r.needs), "automation": r.automation} for r in rs], indent=2))
        return
    if fmt == "markdown":
        from gpuwarden.render.rules_md import render

        click.echo(render(rs), nl=False)
        return
    for r in rs:
        click.echo(f"{r.code:13} {r.severity.label:8} {r.family:16} {r.title}")


@main.command()
@click.argument("code")
def explain(code: str) -> None:
    """Print the full explanation of one rule."""
    from gpuwarden.rules import get_rule

    r = get_rule(code)
    if r is None:
        click.echo(f"gpuwarden: no rule {code!r}; see `gpuwarden rules`", err=True)
        sys.exit(EXIT_USAGE)
    from gpuwarden.render import wording

    click.echo(f"{r.code} — {r.title}\n")
    click.echo(f"severity: {r.severity.label}   family: {r.family}   remediation: {wording.automation(r.automation)}")
    if r.scope == "api":
        from gpuwarden.render.rules_md import API_SCOPE

        click.echo(f"raised by: {API_SCOPE}\n")
    else:
        click.echo(f"needs: {', '.join(r.needs) or '-'}\n")
    click.echo(r.explanation + "\n")
    remedy = wording.without_catalog_labels(r.remedy)
    click.echo("Fix:\n" + "\n".join("  " + ln for ln in remedy.splitlines()) + "\n")
    if r.references:
        click.echo("References:\n" + "\n".join(f"  - {wording.reference(x)}" for x in r.references))


@main.command()
def examples() -> None:
    """List the built-in example nodes (`gpuwarden check --example NAME`)."""
    from gpuwarden import examples as ex

    for n in ex.names():
        click.echo(f"{n:26} {ex.describe(n)}")


@main.command()
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), callback=_a_file,
              help="Bundle to write (.tar.gz).")
@click.option("--root", "root_dir", default="/", show_default=True, type=click.Path(file_okay=False))
@click.option("--timeout", type=Seconds(0.01, 3600), default=10.0, show_default=True,
              help="Deadline of each command run.")
@click.option("--log-bytes", type=click.IntRange(0, 1 << 40), default=64 << 20, show_default=True,
              help="Keep at most this much of each log (the tail).")
def collect(output: str, root_dir: str, timeout: float, log_bytes: int) -> None:
    """Capture everything the rules read into a bundle, without secrets."""
    from gpuwarden.bundle.collect import collect as do_collect
    from gpuwarden.root import HostRoot

    if not root_dir or HostRoot(root_dir).usable is not None:
        click.echo(f"gpuwarden collect: --root {root_dir!r} cannot be opened as a directory", err=True)
        sys.exit(EXIT_USAGE)
    try:
        summary = do_collect(root_dir, output, cmd_timeout=timeout, log_bytes=log_bytes)
    except OSError as exc:  # a full disk, a read-only or missing directory: a message, and no torn bundle left
        click.echo(f"gpuwarden collect: cannot write {output}: {exc.strerror or exc}", err=True)
        if os.path.isfile(output):
            os.unlink(output)
        sys.exit(EXIT_USAGE)
    click.echo(summary)


def agent(**values) -> None:
    """Watch this GPU node: NodeConditions, Events, /metrics, guarded remediation.

    \b
    The demo, anywhere (its plan within seconds):
      gpuwarden agent --example uvm-missing --no-kube --dry-run --cycles 3

    With --example the agent checks every second unless --interval is set, so it raises the
    example's fault and prints its remediation plan within seconds; --no-kube prints the writes
    instead of sending them.

    Every option is also a key of the --config FILE (YAML, snake_case, durations without `_s`).
    Precedence: defaults < environment (NODE_NAME, POD_NAMESPACE) < --config FILE < flags.
    docs/agent.md describes each option and shows a sample agent.yaml.
    """
    from gpuwarden.agent import config as agent_config

    # the kubernetes client is imported only from here on
    try:
        cfg = agent_config.from_flags(values)
        if values.get("print_config"):
            click.echo(agent_config.to_yaml(cfg.resolved()), nl=False)
            return
        cfg = cfg.resolved()
    except agent_config.ConfigError as exc:
        click.echo(f"gpuwarden agent: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    from gpuwarden.agent.loop import Agent

    try:
        runner = Agent(cfg)
    except Exception as exc:  # no root, no kubeconfig, ...
        click.echo(f"gpuwarden agent: {_kube_config_error(exc, cfg.kubeconfig, '', no_kube=cfg.kube)}", err=True)
        sys.exit(EXIT_USAGE)
    gc.set_threshold(*checkrun.DEFAULT_GC_THRESHOLD)
    sys.exit(runner.run())


def controller(**values) -> None:
    """Stop a workload from killing GPU nodes in turn; open the agents' breaker in a storm.

    Dry run unless --execute. Precedence: defaults < environment (POD_NAMESPACE, POD_NAME) < flags.
    docs/controller.md describes each option.
    """
    from gpuwarden.agent import config as agent_config
    from gpuwarden.controller import config as controller_config

    try:
        cfg = controller_config.from_flags(values).resolved()
    except agent_config.ConfigError as exc:
        click.echo(f"gpuwarden controller: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    from gpuwarden.kube.client import Kube
    from gpuwarden.controller.loop import Controller

    try:
        kube = Kube.from_config(cfg.kubeconfig, context=cfg.context)
    except Exception as exc:  # no kubeconfig, no service account
        click.echo(f"gpuwarden controller: {_kube_config_error(exc, cfg.kubeconfig, cfg.context)}", err=True)
        sys.exit(EXIT_USAGE)
    gc.set_threshold(*checkrun.DEFAULT_GC_THRESHOLD)
    sys.exit(Controller(cfg, kube).run())


def _agent_command() -> click.Command:
    from gpuwarden.agent import config as agent_config

    return click.command("agent", cls=WholeHelpCommand, params=agent_config.command_params(),
                         context_settings={"max_content_width": 110})(agent)


def _controller_command() -> click.Command:
    from gpuwarden.controller import config as controller_config

    return click.command("controller", cls=WholeHelpCommand, params=controller_config.command_params(),
                         context_settings={"max_content_width": 110})(controller)


main.lazy.update(agent=_agent_command, controller=_controller_command)


def _kube_config_error(exc: Exception, kubeconfig: str, context: str, no_kube: bool = False) -> str:
    """A kubeconfig that could not be loaded, said with where it was looked for; anything else as it is."""
    from gpuwarden.kube.errors import config_error

    if type(exc).__name__ == "ConfigException" or isinstance(exc, (FileNotFoundError, PermissionError)):
        return config_error(exc, kubeconfig, context, no_kube_flag=no_kube)
    return f"cannot start: {type(exc).__name__}: {exc}"


def api_error(exc: Exception) -> str:
    """A KubeError for people: an unreachable server says which and how, without the HTTP 0 status."""
    return str(getattr(exc, "body", "") or exc) if getattr(exc, "status", None) == 0 else str(exc)


def _kube(kubeconfig: str | None, context: str | None, who: str):
    """A client as kubectl would configure it; a usage error saying where the config was looked for.

    `who` is the command as the user typed it (`gpuwarden fleet`, `kubectl gpuwarden node`).
    """
    from gpuwarden.kube.client import Kube

    try:
        return Kube.from_config(kubeconfig or "", context=context or "")
    except Exception as exc:
        click.echo(f"{who}: {_kube_config_error(exc, kubeconfig or '', context or '')}", err=True)
        sys.exit(EXIT_USAGE)


def _prog(command: str) -> str:
    """`gpuwarden fleet`, or `kubectl gpuwarden fleet` when run as the kubectl plugin."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root().command.name if ctx is not None else ""
    return f"kubectl gpuwarden {command}" if root == "kubectl-gpuwarden" else f"gpuwarden {command}"


def emit_view(view: dict, fmt: str, text) -> None:
    """Print a view (fleet, node) as JSON, or as the text `text(view)` renders from a terminal-safe
    copy of it (its Event and condition messages are what a node's agent wrote: gpuwarden.terminal)."""
    import json

    if fmt == "json":
        click.echo(json.dumps(view, indent=2))
    else:
        from gpuwarden import terminal

        click.echo(text(terminal.tree(view)), nl=False)


def _since(since: str) -> float:
    """--since as seconds; a usage error (exit 2) when it is not a duration."""
    from gpuwarden.parsers.duration import DurationError, parse_duration

    try:
        return parse_duration(since)
    except DurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--since")


class KubeText(click.ParamType):
    """A Kubernetes name (RFC 1123 label or subdomain) or a label selector, checked before any request:
    a byte that is no UTF-8 (`$'\\xff'`), a slash or a 10 KB value is a usage error, never a traceback."""

    PATTERNS = {
        "namespace": (re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"), "a DNS label (a-z, 0-9, '-'; 63 at most)"),
        "name": (re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9.]*[a-z0-9])?"),
                 "a DNS subdomain (a-z, 0-9, '-', '.'; 253 at most)"),
        "selector": (re.compile(r"[A-Za-z0-9_.\-/=!,() ]{0,4096}"), "a label selector (key=value, key in (a,b), !key)"),
    }

    def __init__(self, kind: str) -> None:
        self.kind = self.name = kind

    def convert(self, value, param, ctx):
        pattern, what = self.PATTERNS[self.kind]
        if not isinstance(value, str) or not pattern.fullmatch(value):
            self.fail(f"{ascii(value)[:80]} is not {what}", param, ctx)
        return value


_kube_options = [
    click.option("--kubeconfig", type=click.Path(dir_okay=False), help="kubeconfig file (default: $KUBECONFIG, "
                 "~/.kube/config; in a pod, the service account)."),
    click.option("--context", help="kubeconfig context."),
    click.option("--gpuwarden-namespace", "gw_namespace", type=KubeText("namespace"), default="gpuwarden",
                 show_default=True, help="Namespace of the controller's Lease and of the agents' breaker ConfigMap."),
    click.option("--breaker-configmap", type=KubeText("name"), default="gpuwarden-breaker", show_default=True,
                 help="The agents' circuit breaker ConfigMap."),
]


def _with_kube_options(f):
    for opt in reversed(_kube_options):
        f = opt(f)
    return f


@main.command()
@_with_kube_options
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--since", default="1h", show_default=True, help="Findings and decisions (Events) this recent.")
@click.option("--lease-name", type=KubeText("name"), default="gpuwarden-controller", show_default=True,
              help="The controller's Lease.")
@click.option("-l", "--selector", type=KubeText("selector"), default="",
              help="Only nodes matching this label selector (a GPU pool).")
@click.option("--dra-driver", type=KubeText("name"), default=None, metavar="DRIVER",
              help="Count the GPU devices this DRA driver's ResourceSlices advertise (gpu.nvidia.com) against "
                   "the usable GPUs, and name the slices of dead nodes; needs resourceslices and "
                   "devicetaintrules list (the chart's viewer role with agent.dra_driver).")
def fleet(kubeconfig, context, gw_namespace, breaker_configmap, fmt, since, lease_name, selector, dra_driver) -> None:
    """Every GPU node's gpuwarden conditions and latest findings, worst first; quarantined workloads."""
    import time

    from gpuwarden.kube.errors import KubeError
    from gpuwarden.controller import fleet as fl
    from gpuwarden.controller.dra_watch import read_for_fleet

    since_s = _since(since)
    kube = _kube(kubeconfig, context, _prog("fleet"))
    try:
        nodes, events, workloads, breaker, lease, warnings = fl.gather(kube, gw_namespace, gw_namespace,
                                                                       breaker_configmap, lease_name, selector)
        dra_read = read_for_fleet(kube, dra_driver) if dra_driver else None
        warnings += dra_read[2] if dra_read else []
    except KubeError as exc:
        click.echo(f"{_prog('fleet')}: cannot list Nodes: {api_error(exc)}", err=True)
        sys.exit(EXIT_USAGE)
    finally:
        kube.close()
    now = time.time()
    view = fl.build(nodes, events, workloads, breaker, lease, now, since_s, warnings,
                    dra_read[:2] if dra_read else None, not selector)
    emit_view(view, fmt, lambda v: fl.render_text(v, now))


@main.command()
@click.argument("workload", metavar="WORKLOAD")
@_with_kube_options
@click.option("-n", "--namespace", default="", help="Namespace, when WORKLOAD is KIND/NAME.")
@click.option("--dry-run", is_flag=True, help="Print what would be restored; change nothing.")
@click.option("--force", is_flag=True, help="Drop the quarantine even if the workload was changed since "
                                              "(its current replicas/suspend are kept).")
def release(workload, kubeconfig, context, gw_namespace, breaker_configmap, namespace, dry_run, force) -> None:
    """Undo a quarantine: `release deployment/NS/NAME` (job/, statefulset/, ...), or `release breaker`.

    Restores what the `gpuwarden.io/quarantine` annotation recorded (replicas, suspend), removes the
    workload from the GPU pool taint (the taint goes with its last holder), and records
    `gpuwarden.io/quarantine-released`. `release breaker` closes the agents' circuit breaker.
    Exit 0 done, 1 nothing done (not quarantined, or changed since: see --force), 2 error.
    """
    import time

    from gpuwarden.kube.events import EventRecorder, ObjectRef
    from gpuwarden.controller import actions
    from gpuwarden.controller.model import WORKLOAD_KINDS, WorkloadRef

    by = f"gpuwarden-release/{os.environ.get('USER') or 'cli'}"
    if workload.strip().lower() == "breaker":
        kube = _kube(kubeconfig, context, "gpuwarden release")
        out = actions.close_breaker(kube, gw_namespace, breaker_configmap, time.time(), by, dry_run)
        obj = ObjectRef("ConfigMap", breaker_configmap, gw_namespace)
    else:
        try:
            ref = WorkloadRef.parse(workload, namespace)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="WORKLOAD")
        kube = _kube(kubeconfig, context, "gpuwarden release")
        out = actions.release_workload(kube, ref, time.time(), by, dry_run=dry_run, force=force)
        obj = ObjectRef(ref.kind, ref.name, ref.namespace, api_version=ref.api_version if ref.kind in WORKLOAD_KINDS else "")
    prefix = "[dry-run] would " if out.result == "dry-run" else ""
    click.echo(f"{prefix}{out.detail}" if out.result in ("done", "dry-run") else f"gpuwarden release: {out.detail}",
               err=out.result not in ("done", "dry-run"))
    if out.result == "done":
        reason = "BreakerClosed" if obj.kind == "ConfigMap" else "QuarantineReleased"
        EventRecorder(kube, by, gw_namespace).emit(obj, "Normal", reason, f"{out.detail} (by {by})", action="release")
    kube.close()
    sys.exit({"done": EXIT_OK, "dry-run": EXIT_OK, "skipped": EXIT_FINDINGS}.get(out.result, EXIT_USAGE))


if __name__ == "__main__":  # pragma: no cover
    main()
