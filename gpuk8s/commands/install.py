"""`gpuk8s install`: the install flow (gpuk8s/flows.py) with its options, progress and report."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpuk8s import flows, ui
from gpuk8s.commands.common import finish, ignored_checks, load_bundle, passwords, usage_error
from gpuk8s.errors import GpuK8sError
from gpuk8s.install.prepare import playbooks_for, prepare
from gpuk8s.logs import log_path
from gpuk8s.options import (
    BundleHostOpt,
    BundleKeyOpt,
    BundleOpt,
    BundlePortOpt,
    InventoryOpt,
    KeepServingOpt,
    OnlyPhaseOpt,
    Output,
    OutputOpt,
    SkipPhasesOpt,
    phase_names,
)
from gpuk8s.phases.base import Options, PhaseSelectionError
from gpuk8s.report import cluster as report
from gpuk8s.report.live import LiveView


def register(app: typer.Typer, load_inventory: Callable[..., Any]) -> None:
    @app.command()
    def install(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512, help="Hosts worked on at once."),
        ignore: list[str] = typer.Option([], "--ignore", help="Preflight check id that must not block a host "
                                         "(repeatable; 'all' for every check)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Plan every phase read-only and print the exact "
                                     "commands and manifests it would run and apply. Changes nothing."),
        network: bool = typer.Option(False, "--network/--no-network",
                                     help="Also measure RTT and bandwidth during preflight."),
        prepare_only: bool = typer.Option(False, "--prepare-only", help="Stop after preparing the nodes."),
        skip_phases: list[str] = SkipPhasesOpt,
        only_phase: str | None = OnlyPhaseOpt,  # noqa: UP007
        kubeconfig_out: Path | None = typer.Option(  # noqa: UP007
            None, "--kubeconfig-out", help="Where to write the admin kubeconfig (mode 0600; default "
            "./CLUSTER.kubeconfig; with --kubeconfig-merge ~/.kube/config)."),
        force: bool = typer.Option(False, "--force", help="Replace an existing kubeconfig file that holds "
                                   "something else (never a symbolic link)."),
        kubeconfig_merge: bool = typer.Option(False, "--kubeconfig-merge", help="Add the cluster to an existing "
                                              "kubeconfig as context ADMIN@CLUSTER, keeping every other entry."),
        test_pods: bool = typer.Option(True, "--test-pods/--no-test-pods",
                                       help="Run one GPU test pod per GPU node during verification."),
        allow_reboot: bool = typer.Option(False, "--allow-reboot", help="Reboot a host whose MIG change needs it "
                                          "(GPU reset refused), wait for SSH and continue (docs/mig.md)."),
        bundle: Path | None = BundleOpt,  # noqa: UP007
        bundle_host: str | None = BundleHostOpt,  # noqa: UP007
        bundle_port: int = BundlePortOpt,
        bundle_key: Path | None = BundleKeyOpt,  # noqa: UP007
        keep_serving: bool = KeepServingOpt,
    ) -> None:
        """Preflight, prepare every host (toolkit, runtime, Kubernetes packages), then kubeadm init, CNI, join,
        the NVIDIA device plugin, and verification that every GPU is schedulable."""
        inv = load_inventory(inventory, output)
        skip = phase_names(skip_phases)
        try:  # a wrong phase name is told before any host is contacted
            flows.select_install(inv, skip, only_phase)
        except PhaseSelectionError as e:
            usage_error(e, output)
        if bundle is not None and prepare_only:
            usage_error(GpuK8sError("--prepare-only does not serve a bundle", "run install --bundle without it, "
                                    "or --only-phase prepare"), output)
        served = load_bundle(bundle, bundle_host, bundle_port, output, bundle_key, keep_serving)
        ignored = ignored_checks(inv, ignore)
        sudo = passwords(inv)
        view = LiveView(len(inv.hosts)) if output == Output.table and ui.is_terminal() else None
        if view:
            ui.say(ui.console(stderr=True), f"==> preflight, then playbooks {', '.join(playbooks_for(inv))} on "
                   f"{len(inv.hosts)} host(s), {concurrency} at a time{' (dry run)' if dry_run else ''}")
            view.live.start()
        on_event = view.event if view else None
        if prepare_only:
            try:
                prep = prepare(inv, concurrency=concurrency, ignore=ignored, sudo_passwords=sudo, dry_run=dry_run,
                               measure_network=network, on_event=on_event)
            finally:
                if view:
                    view.live.stop()

            def tables() -> None:
                if dry_run:
                    report.prepare_dry_run(prep)
                report.prepare_table(prep)
                if not prep.ok and log_path():
                    ui.say(ui.console(stderr=True), f"full detail in {log_path()}")

            finish(prep, output, tables)
        # on a terminal, phase lines go through the live view's console so they do not tear its display
        say = (lambda line: ui.say(view.live.console, line)) if view else report.phase_printer(output)
        options = Options(kubeconfig_out=kubeconfig_out, kubeconfig_force=force, kubeconfig_merge=kubeconfig_merge,
                          test_pods=test_pods, allow_reboot=allow_reboot, bundle=served)
        try:
            rep = flows.install(inv, concurrency=concurrency, ignore=ignored, sudo_passwords=sudo, options=options,
                                emit=say, on_event=on_event, dry_run=dry_run, measure_network=network, skip=skip,
                                only=only_phase)
        finally:
            if view:
                view.live.stop()
        finish(rep, output, lambda: report.plans(rep) if dry_run else report.render_cluster(rep, "install"))
