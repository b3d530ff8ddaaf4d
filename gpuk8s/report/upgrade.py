"""`gpuk8s upgrade` as people read it: the minors stepped through, the first step's plan on --dry-run, else the
phase and node tables with the upgrade time per node, and what to write in the inventory once the cluster runs the
new minor. `-o json` is the report's own (flows.UpgradeReport.to_json)."""

from __future__ import annotations

from pathlib import Path

from gpuk8s import ui
from gpuk8s.flows import UpgradeReport
from gpuk8s.report.cluster import plans, render_cluster


def node_times(rep: UpgradeReport) -> None:
    """How long each node's upgrade took, in seconds (flows.UpgradeReport.node_seconds)."""
    if rep.node_seconds:
        ui.table("upgrade time per node", ["node", "seconds"], [[n, f"{s:.1f}"] for n, s in rep.node_seconds.items()])


def render(rep: UpgradeReport, dry_run: bool, inventory: Path) -> None:
    ui.say(ui.console(), f"Kubernetes {rep.start_minor} -> {' -> '.join(rep.steps)}"
                         + (" (dry run: the first step)" if dry_run else ""))
    if dry_run:
        plans(rep)
        return
    render_cluster(rep, "upgrade")
    node_times(rep)
    if rep.ok and not dry_run:
        ui.say(ui.console(), f"now write cluster.kubernetes_version: \"{rep.steps[-1]}\" in {inventory}: "
                             "install and join use it")
