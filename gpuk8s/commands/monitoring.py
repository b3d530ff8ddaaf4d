"""`gpuk8s monitoring`: the monitoring phase alone on a running cluster (enable, upgrade, or `--remove`)."""

from pathlib import Path
from typing import Any

import typer

from gpuk8s import flows, ui
from gpuk8s.commands.common import finish, local_kubectl, passwords
from gpuk8s.errors import GpuK8sError
from gpuk8s.exitcodes import ExitCode
from gpuk8s.kube import monitoring as mon
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.phases.base import Context, Options, PhaseError
from gpuk8s.remote import Session
from gpuk8s.report import cluster as report


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command()
    def monitoring(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        remove: bool = typer.Option(False, "--remove", help="Delete every object gpuk8s's monitoring created "
                                    "(objects it did not create are left alone)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Show the manifests it would apply (or the objects "
                                     "it would delete) and, with prometheus: none, the scrape job. Changes nothing."),
        kubeconfig: Path | None = typer.Option(  # noqa: UP007
            None, "--kubeconfig", help="Use this machine's kubectl with this kubeconfig instead of kubectl on the "
            "first control plane."),
    ) -> None:
        """Deploy (or upgrade, or --remove) the DCGM exporter on every GPU node and Prometheus as the
        inventory's monitoring section says (docs/monitoring.md)."""
        inv = load_inventory(inventory, output)
        con = ui.console(stderr=True)
        if not inv.monitoring.enabled and not remove:
            ui.say(con, "monitoring is not enabled in the inventory: add 'monitoring: {enabled: true}' "
                        "(docs/monitoring.md), or pass --remove to take it out")
            raise typer.Exit(ExitCode.USAGE)
        kube = None if kubeconfig is None else local_kubectl(kubeconfig)
        sudo = passwords(inv) if kube is None else {}
        ctx = Context(inv, options=Options(), emit=report.phase_printer(output), sudo_passwords=sudo,
                      kube_client=kube)
        ctx.set_facts({})  # the plans of the inventory alone (no host is read)
        try:
            if kube is None:
                cp = inv.control_planes[0]
                ctx.sessions[cp.name] = Session(cp, sudo.get(cp.name))
                if not ctx.initialized():
                    raise PhaseError(f"{cp.name} runs no control plane yet", "run gpuk8s install first")
            else:
                ctx.initialized_cache = True
        except GpuK8sError as e:
            ctx.close()
            ui.say(con, f"cannot reach the cluster: {e.message}; {e.remedy}")
            raise typer.Exit(ExitCode.FAILED) from None
        rep = flows.monitoring(ctx, remove, dry_run)
        if output != Output.json and not remove and not dry_run and inv.monitoring.prometheus == "none" and rep.ok:
            ui.say(ui.console(), "# add this scrape job to your Prometheus:\n" + mon.scrape_config(inv).rstrip())
        finish(rep, output, lambda: report.plans(rep, "monitoring") if dry_run
               else report.render_cluster(rep, "monitoring"))
