"""`gpuk8s reset`: take nodes out of the cluster and reset their hosts (gpuk8s/phases/reset.py), or tear the
whole cluster down with --all. The plan is shown first; a change needs a yes (or --yes)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpuk8s import findings as fm
from gpuk8s import flows, ui
from gpuk8s.commands.common import passwords
from gpuk8s.errors import GpuK8sError
from gpuk8s.exitcodes import ExitCode
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.phases.reset import NodeOutcome, Refusal, order, refusal
from gpuk8s.report import reset as report
from gpuk8s.report.cluster import phase_printer


def register(app: typer.Typer, load_inventory: Callable[..., Any]) -> None:
    @app.command()
    def reset(
        hosts: list[str] = typer.Argument(None, help="Hosts of the inventory to take out of the cluster and reset."),
        all_hosts: bool = typer.Option(False, "--all", help="Tear the whole cluster down: workers first, then the "
                                       "other control planes, the first control plane last."),
        purge: bool = typer.Option(False, "--purge", help="Also remove the packages and repositories gpuk8s "
                                   "installed and restore the files it changed from /var/lib/gpuk8s/backup."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan with the exact commands; change "
                                     "nothing."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask (required when not on a terminal)."),
        drain_timeout: int = typer.Option(300, "--drain-timeout", min=1, max=86400,
                                          help="Seconds a node's drain may take (PodDisruptionBudgets respected)."),
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512),
    ) -> None:
        """Drain nodes, kubeadm reset them, remove what kubeadm leaves behind and delete their Node objects."""
        inv = load_inventory(inventory, output)
        con = ui.console(stderr=True)
        if all_hosts == bool(hosts):
            ui.say(con, "name the hosts to reset, or --all for the whole cluster (not both)")
            raise typer.Exit(ExitCode.USAGE)
        unknown = [n for n in hosts or [] if n not in {h.name for h in inv.hosts}]
        if unknown:
            ui.say(con, f"not in the inventory: {', '.join(unknown)}")
            raise typer.Exit(ExitCode.USAGE)
        targets = list(inv.hosts) if all_hosts else [h for h in inv.hosts if h.name in set(hosts)]
        sudo = passwords(inv)
        try:
            present = flows.cluster_nodes(inv, sudo)
        except GpuK8sError as e:
            ui.say(con, f"cannot ask the cluster which nodes it has: {e.message}; {e.remedy}")
            raise typer.Exit(ExitCode.FAILED) from None
        members = [h.name for h in inv.control_planes if h.name in present]
        # etcd's quorum counts on the control planes that are up, not on their Node objects
        refused = refusal(inv, targets, all_hosts, members, ready=[n for n in members if present[n]])
        if refused is not None:
            _refuse(refused, output)
        ordered = order(inv, targets)
        if output == Output.table:
            report.plan_table(ordered, present, purge)
        say = phase_printer(output)
        if dry_run:
            rep, _ = flows.reset(inv, ordered, concurrency=concurrency, sudo_passwords=sudo, purge=purge,
                                 drain_timeout=drain_timeout, all_hosts=all_hosts, emit=say, dry_run=True)
            if output == Output.json:
                ui.emit_json({**rep.to_json(), "order": [h.name for h in ordered]})
            else:
                report.plans(rep)
            raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.FAILED)
        if not yes:
            if not (sys.stdin.isatty() and output == Output.table):
                ui.say(con, "gpuk8s reset changes hosts and the cluster: pass --yes to confirm when not "
                            "interactive (see the plan with --dry-run)")
                raise typer.Exit(ExitCode.USAGE)
            what = "the whole cluster" if all_hosts else ", ".join(h.name for h in ordered)
            if not typer.confirm(f"Reset {what}{' and purge' if purge else ''}?", default=False):
                ui.say(con, "nothing was done")
                raise typer.Exit(ExitCode.USAGE)
        rep, outcomes = flows.reset(inv, ordered, concurrency=concurrency, sudo_passwords=sudo, purge=purge,
                                    drain_timeout=drain_timeout, all_hosts=all_hosts, emit=say)
        if output == Output.json:
            ui.emit_json({**rep.to_json(), "order": [h.name for h in ordered],
                          "nodes": [{**o.to_json(), "finding": finding(o).to_json()} for o in outcomes]})
        else:
            report.result_table(rep, outcomes)
        raise typer.Exit(ExitCode.OK if rep.ok else ExitCode.FAILED)


def finding(o: NodeOutcome) -> fm.Finding:
    subject = fm.node(o.name)
    if o.status == "reset":
        return fm.passed(o.id, o.message, subject=subject)
    return fm.failed(o.id, o.message, o.remedy, subject=subject)


def _refuse(r: Refusal, output: Output) -> None:
    f = fm.failed(r.id, r.message, r.remedy, subject=fm.cluster())
    if output == Output.json:
        ui.emit_json({"ok": False, "refused": f.to_json()})
    else:
        ui.say(ui.console(stderr=True), f"refused ({r.id}): {r.message}\n    fix: {r.remedy}", "red")
    raise typer.Exit(ExitCode.USAGE)
