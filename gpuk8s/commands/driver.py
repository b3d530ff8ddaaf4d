"""`gpuk8s driver upgrade`: every node with driver: {manage: true} to the driver its inventory asks for, node by node
(or N at a time), GPU pods waited for, each node rebooted into its new driver, resumable
(gpuk8s/phases/driver_upgrade.py, docs/driver.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpuk8s import flows, ui
from gpuk8s.commands.common import confirm, failed, finish, load_bundle, passwords
from gpuk8s.errors import GpuK8sError
from gpuk8s.exitcodes import ExitCode
from gpuk8s.options import (
    BundleHostOpt,
    BundleKeyOpt,
    BundleOpt,
    BundlePortOpt,
    DrainTimeoutOpt,
    GpuPodTimeoutOpt,
    InventoryOpt,
    KeepServingOpt,
    MaxUnavailableOpt,
    Output,
    OutputOpt,
)
from gpuk8s.phases.base import Options
from gpuk8s.report import cluster as report


def register(app: typer.Typer, load_inventory: Any) -> None:
    driver_app = typer.Typer(help="The NVIDIA driver of nodes with driver: {manage: true} (docs/driver.md).",
                             no_args_is_help=True)
    app.add_typer(driver_app, name="driver")

    @driver_app.command()
    def upgrade(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        dry_run: bool = typer.Option(False, "--dry-run", help="Show what each node's upgrade would do, with the "
                                     "exact commands; change nothing."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
        max_unavailable: int = MaxUnavailableOpt,
        gpu_pod_timeout: float = GpuPodTimeoutOpt,
        drain_timeout: int = DrainTimeoutOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512),
        test_pods: bool = typer.Option(True, "--test-pods/--no-test-pods"),
        bundle: Path | None = BundleOpt,  # noqa: UP007
        bundle_host: str | None = BundleHostOpt,  # noqa: UP007
        bundle_port: int = BundlePortOpt,
        bundle_key: Path | None = BundleKeyOpt,  # noqa: UP007
        keep_serving: bool = KeepServingOpt,
    ) -> None:
        """Bring every managed node to the driver its inventory asks for (edit driver.branch or flavor, then run
        this): drained with GPU pods waited for, packages installed and held, rebooted, GPUs back, uncordoned."""
        inv = load_inventory(inventory, output)
        served = load_bundle(bundle, bundle_host, bundle_port, output, bundle_key, keep_serving)
        con = ui.console(stderr=True)
        if not any(h.gpu.driver.manage for h in inv.hosts):
            ui.say(con, "no host has driver: {manage: true}: gpuk8s does not manage any node's driver "
                        "(docs/driver.md)")
            raise typer.Exit(ExitCode.USAGE)
        confirm(dry_run, yes, "gpuk8s driver upgrade drains and reboots nodes",
                "Upgrade the driver of this inventory's managed nodes?")
        try:
            rep = flows.driver_upgrade(inv, concurrency=concurrency, sudo_passwords=passwords(inv),
                                       max_unavailable=max_unavailable, gpu_pod_timeout=gpu_pod_timeout,
                                       drain_timeout=drain_timeout, options=Options(test_pods=test_pods, bundle=served),
                                       emit=report.phase_printer(output), dry_run=dry_run)
        except GpuK8sError as e:
            failed(e, output)
        finish(rep, output, lambda: report.plans(rep, "driver upgrade") if dry_run
                                    else report.render_cluster(rep, "driver upgrade"))
