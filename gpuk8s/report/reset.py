"""`gpuk8s reset` as people read it: the plan (hosts in the order they are reset, and each one's steps), the dry
run's exact commands, and each node's result with the failed phases' remedies. `-o json` is the command's."""

from __future__ import annotations

from gpuk8s import ui
from gpuk8s.flows import ClusterReport
from gpuk8s.inventory.model import Host
from gpuk8s.phases.reset import NodeOutcome
from gpuk8s.report import cluster

PLANS_NOTE = "# dry run: nothing was changed. The host commands run after playbooks/cluster/_lib.sh's helpers."


def plan_table(ordered: list[Host], present: dict[str, bool], purge: bool) -> None:
    rows = []
    for i, h in enumerate(ordered, 1):
        steps = (["drain", "kubeadm reset -f + leftovers", "delete Node"] if h.name in present
                 else ["kubeadm reset -f + leftovers (not a node of the cluster)"])
        if purge:
            steps.append("purge")
        rows.append([str(i), h.name, h.role, ", ".join(steps)])
    ui.table("gpuk8s reset: the plan, in this order", ["#", "host", "role", "steps"], rows)


def plans(rep: ClusterReport) -> None:
    """--dry-run: every phase's plan with its exact commands (report/cluster.py's, under reset's own first line;
    reset has no table of plans: plan_table came first)."""
    cluster.plan_commands(rep, PLANS_NOTE)


def result_table(rep: ClusterReport, outcomes: list[NodeOutcome]) -> None:
    ui.table("gpuk8s reset", ["node", "result", "seconds", "detail"],
             [[o.name, o.status, f"{o.seconds:.1f}", o.message] for o in outcomes],
             ["" if o.status == "reset" else "red" for o in outcomes])
    con = ui.console(stderr=True)
    for p in rep.phases:
        if p.status == "failed":
            ui.say(con, f"{p.name}: {p.message}\n    fix: {p.remedy}", "red")
