"""`gpuk8s upgrade`: the cluster to the next Kubernetes minor (or --to 1.N, one minor at a time), in kubeadm's
order, resumable (gpuk8s/phases/upgrade.py, docs/upgrade.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpuk8s import findings, flows, ui
from gpuk8s.commands.common import confirm, failed, finish, ignored_checks, load_bundle, passwords, usage_error
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
    OnlyPhaseOpt,
    Output,
    OutputOpt,
    SkipPhasesOpt,
    phase_names,
)
from gpuk8s.phases.base import Options, PhaseSelectionError
from gpuk8s.phases.upgrade import UpgradeRefused
from gpuk8s.report import upgrade as report
from gpuk8s.report.cluster import phase_printer


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command()
    def upgrade(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        to: str | None = typer.Option(None, "--to", help="The minor to reach, 1.N (default: the next one); "  # noqa: UP007
                                      "every minor on the way must be in gpuk8s's version matrix."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Show what the first minor's upgrade would do, "
                                     "with the exact commands; change nothing."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
        max_unavailable: int = MaxUnavailableOpt,
        gpu_pod_timeout: float = GpuPodTimeoutOpt,
        drain_timeout: int = DrainTimeoutOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512),
        ignore: list[str] = typer.Option([], "--ignore", help="Preflight check id that must not block a host."),
        test_pods: bool = typer.Option(True, "--test-pods/--no-test-pods"),
        skip_phases: list[str] = SkipPhasesOpt,
        only_phase: str | None = OnlyPhaseOpt,  # noqa: UP007
        bundle: Path | None = BundleOpt,  # noqa: UP007
        bundle_host: str | None = BundleHostOpt,  # noqa: UP007
        bundle_port: int = BundlePortOpt,
        bundle_key: Path | None = BundleKeyOpt,  # noqa: UP007
        keep_serving: bool = KeepServingOpt,
    ) -> None:
        """Upgrade Kubernetes one minor at a time: control planes, then workers drained one by one."""
        inv = load_inventory(inventory, output)
        served = load_bundle(bundle, bundle_host, bundle_port, output, bundle_key, keep_serving)
        if served is not None and to is None:
            to = served.manifest.minor  # a bundle holds one minor: the one to reach
        skip = phase_names(skip_phases)
        try:  # a wrong phase name is told before anything is asked or contacted
            flows.select_upgrade(skip, only_phase)
        except PhaseSelectionError as e:
            usage_error(e, output)
        sudo = passwords(inv)
        con = ui.console(stderr=True)
        confirm(dry_run, yes, "gpuk8s upgrade changes every node of the cluster",
                "Upgrade the cluster of this inventory?")
        try:
            rep = flows.upgrade(inv, to=to, concurrency=concurrency, ignore=ignored_checks(inv, ignore),
                                sudo_passwords=sudo, max_unavailable=max_unavailable,
                                gpu_pod_timeout=gpu_pod_timeout, drain_timeout=drain_timeout,
                                options=Options(test_pods=test_pods, bundle=served), emit=phase_printer(output),
                                dry_run=dry_run,
                                skip=skip, only=only_phase)
        except UpgradeRefused as e:
            if output == Output.json:
                ui.emit_json({"ok": False, "refused": e.message, "remedy": e.remedy,
                              "findings": [findings.failed("upgrade.refused", e.message, e.remedy).to_json()]})
            else:
                ui.say(con, f"upgrade refused: {e.message}; {e.remedy}")
            raise typer.Exit(ExitCode.USAGE) from None
        except GpuK8sError as e:
            failed(e, output)
        if not rep.steps:
            if output == Output.json:
                ui.emit_json({"ok": True, "changed": False, "from": rep.start_minor, "steps": []})
            else:
                ui.say(ui.console(), f"every node runs Kubernetes {rep.start_minor}: nothing to upgrade")
            raise typer.Exit(ExitCode.OK)

        finish(rep, output, lambda: report.render(rep, dry_run, inv.path))
