"""`gpuk8s preflight`: readiness of every host and of the cluster, one probe run per host."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpuk8s import ui
from gpuk8s.commands.common import HostProgress, finish, ignored_checks, passwords
from gpuk8s.logs import log_path
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.preflight.runner import HostReport, run_preflight
from gpuk8s.report import preflight as render


def register(app: typer.Typer, load_inventory: Callable[..., Any]) -> None:
    @app.command()
    def preflight(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512,
                                        help="Hosts contacted at once."),
        ignore: list[str] = typer.Option([], "--ignore", help="Check id to downgrade from error to warning "
                                         "(repeatable; 'all' for every check)."),
        network: bool = typer.Option(True, "--network/--no-network", help="Measure RTT and bandwidth."),
        network_seconds: float | None = typer.Option(  # noqa: UP007
            None, "--network-seconds", min=0, max=60, help="iperf3 duration per worker (0: RTT only)."),
    ) -> None:
        """Check that every host, and the cluster as a whole, is ready for install."""
        inv = load_inventory(inventory, output)
        ignored = ignored_checks(inv, ignore)
        sudo = passwords(inv)

        progress = HostProgress(len(inv.hosts), output)

        def done(rep: HostReport) -> None:
            fails = sum(1 for c in rep.checks if c.status == "fail")
            progress.host(rep.host.name, not fails, "ready" if not fails else f"{fails} failed", rep.seconds)

        progress.say(f"checking {len(inv.hosts)} host(s), {concurrency} at a time ...")
        rep = run_preflight(inv, concurrency=concurrency, ignore=ignored, sudo_passwords=sudo,
                            network_seconds=network_seconds, measure_network=network, on_host=done)

        def tables() -> None:
            render.render(rep, inv.preflight.min_bandwidth_gbit, inv.preflight.max_rtt_ms)
            if not rep.ok and log_path():
                ui.say(progress.con, f"full detail in {log_path()}")

        finish(rep, output, tables)
