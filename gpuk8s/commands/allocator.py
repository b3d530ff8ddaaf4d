"""`gpuk8s allocator NODE... --to dra|device-plugin`: move running nodes between the NVIDIA device plugin and NVIDIA's
DRA driver, one at a time, drained with their GPU pods waited for, verified with a test pod, put back as they were
when the new allocator does not serve them; resumable (gpuk8s/phases/allocator.py, docs/dra.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpuk8s import flows, gpuplan, ui
from gpuk8s.commands.common import confirm, finish, passwords, usage_error
from gpuk8s.errors import GpuK8sError
from gpuk8s.exitcodes import ExitCode
from gpuk8s.inventory.model import ALLOCATORS, Inventory
from gpuk8s.options import DrainTimeoutOpt, GpuPodTimeoutOpt, InventoryOpt, Output, OutputOpt
from gpuk8s.phases.base import Context, Options, PhaseError
from gpuk8s.phases.nodeops import NodeOptions
from gpuk8s.remote import Session
from gpuk8s.report import cluster as report


def check_nodes(inv: Inventory, nodes: list[str], to: str) -> None:
    """Every node named is a GPU host of the inventory whose `allocator:` already says `to` (the inventory stays
    the truth: else the next install would move the node back, and without a drain). GpuK8sError otherwise."""
    if to not in ALLOCATORS:
        raise GpuK8sError(f"--to {to!r} is not one of {', '.join(ALLOCATORS)}", "write --to dra or --to device-plugin")
    by = {h.name: h for h in inv.hosts}
    for n in dict.fromkeys(nodes):
        h = by.get(n)
        if h is None:
            raise GpuK8sError(f"{n} is not a host of the inventory", f"name one of: {', '.join(by)}")
        if not gpuplan.is_gpu_node(h):
            raise GpuK8sError(f"{n} is not a GPU node", "name GPU nodes only")
        if h.gpu.allocator.kind != to:
            where = f"{inv.path}:{h.line}" if h.line else str(inv.path)
            raise GpuK8sError(f"the inventory says allocator: {h.gpu.allocator.kind} for {n} ({where})",
                              f"write allocator: {to} on {n} (or its gpu_group) first, then run this again: the "
                              "inventory stays the truth, so that the next install keeps the node where it is")


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command()
    def allocator(
        nodes: list[str] = typer.Argument(..., metavar="NODE...", help="The nodes to move, one at a time."),
        to: str = typer.Option(..., "--to", help="dra (NVIDIA's DRA driver) or device-plugin."),
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        dry_run: bool = typer.Option(False, "--dry-run", help="Show what each node's move would do, with the "
                                     "exact commands; change nothing."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
        gpu_pod_timeout: float = GpuPodTimeoutOpt,
        drain_timeout: int = DrainTimeoutOpt,
    ) -> None:
        """Move nodes between the device plugin and the DRA driver (docs/dra.md): cordon, wait for the GPU pods,
        drain, switch, wait for the GPUs, a test pod, uncordon; a node whose GPUs do not come back on the new
        allocator is put back as it was. Write the node's new allocator: in the inventory first."""
        inv = load_inventory(inventory, output)
        try:
            check_nodes(inv, nodes, to)
        except GpuK8sError as e:
            usage_error(e, output)
        confirm(dry_run, yes, "gpuk8s allocator drains nodes", f"Move {', '.join(nodes)} to {to}?")
        sudo = passwords(inv)
        ctx = Context(inv, options=Options(), emit=report.phase_printer(output), sudo_passwords=sudo)
        ctx.set_facts({})  # the inventory's plans until flows.allocator reads the named nodes' facts
        try:
            cp = inv.control_planes[0]
            ctx.sessions[cp.name] = Session(cp, sudo.get(cp.name))
            if not ctx.initialized():
                raise PhaseError(f"{cp.name} runs no control plane yet", "run gpuk8s install first")
        except GpuK8sError as e:
            ctx.close()
            ui.say(ui.console(stderr=True), f"cannot reach the cluster: {e.message}; {e.remedy}")
            raise typer.Exit(ExitCode.FAILED) from None
        opts = NodeOptions(max_unavailable=1, gpu_pod_timeout=gpu_pod_timeout, drain_timeout=drain_timeout)
        rep = flows.allocator(ctx, list(dict.fromkeys(nodes)), opts, dry_run)
        finish(rep, output, lambda: report.plans(rep, "allocator") if dry_run
               else report.render_cluster(rep, "allocator"))
