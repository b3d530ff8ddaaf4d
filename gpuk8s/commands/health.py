"""`gpuk8s health [HOST...]`: each GPU host's GPU health over SSH, before or after it joins (docs/health.md)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpuk8s.commands.common import HostProgress, finish, passwords, usage_error
from gpuk8s.errors import GpuK8sError
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.health.checks import LEVELS
from gpuk8s.health.release import release
from gpuk8s.health.run import run_health
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.report import health as render


def register(app: typer.Typer, load_inventory: Callable[..., Any]) -> None:
    @app.command()
    def health(
        hosts: list[str] = typer.Argument(None, help="Hosts to check (default: every GPU host of the inventory)."),
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512, help="Hosts contacted at once."),
        level: str = typer.Option("quick", "--level", help="quick: one round trip per host; standard / long: "
                                  "also DCGM's diagnostic (dcgmi diag -r 2 / -r 3: minutes / up to an hour) where "
                                  "DCGM is installed; fabric: also the RDMA fabric's ports and their error "
                                  "counters (hosts with fabric:)."),
        release_: bool = typer.Option(False, "--release", help="Remove the quarantine taint (gpuk8s.io/quarantine) "
                                      "from each named node whose GPUs pass the check now."),
    ) -> None:
        """Check every GPU host's GPUs (the quick level: one round trip per host): GPU count, Xid errors since
        boot, uncorrectable ECC errors, retired pages and row remapping, PCIe link width, NVLink, clock slowdown,
        NVSwitch fabric; --level standard or long adds DCGM's diagnostic, --level fabric the RDMA fabric's ports
        and their error counters. Exit status 1 when a host is unhealthy or
        unreachable (or, with --release, kept in quarantine)."""
        inv = load_inventory(inventory, output)
        if level not in LEVELS:
            usage_error(GpuK8sError(f"no level {level!r}", f"give one of: {', '.join(LEVELS)}"), output)
        if release_ and not hosts:
            usage_error(GpuK8sError("--release needs the nodes to release", "name them: gpuk8s health --release "
                                    "NODE..."), output)
        by_name = {h.name: h for h in inv.hosts}
        unknown = [n for n in hosts or [] if n not in by_name]
        if unknown:
            usage_error(GpuK8sError(f"no host {', '.join(unknown)} in the inventory",
                                    f"name hosts of the inventory: {', '.join(list(by_name)[:10])}"), output)
        chosen = [by_name[n] for n in dict.fromkeys(hosts)] if hosts else [h for h in inv.hosts if is_gpu_node(h)]
        progress = HostProgress(len(chosen), output)
        progress.say(f"checking the GPUs of {len(chosen)} host(s), {concurrency} at a time ...")
        rep = run_health(chosen, concurrency=concurrency, sudo_passwords=passwords(inv), level=level,
                         on_host=lambda r: progress.host(r.host.name, r.ok, "healthy" if r.ok else "UNHEALTHY",
                                                         r.seconds))
        if release_:
            release(inv, rep, passwords(inv))
        finish(rep, output, lambda: render.render(rep))
