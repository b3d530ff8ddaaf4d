"""The reports of install, join, verify and upgrade: the host table, the phase table, the node table, the plans."""

from __future__ import annotations

from collections.abc import Callable

from gpuk8s import ui
from gpuk8s.flows import ClusterReport
from gpuk8s.install.prepare import PrepareReport
from gpuk8s.lines import lines_that_matter
from gpuk8s.logs import log_path
from gpuk8s.options import Output
from gpuk8s.report import findings
from gpuk8s.report.live import STYLE

PHASE_STYLE = {"changed": "green", "unchanged": "green", "passed": "green", "failed": "red", "skipped": "yellow",
               "would-change": "yellow", "unknown": "yellow"}


def prepare_table(rep: PrepareReport) -> None:
    rows, styles = [], []
    for h in rep.hosts:
        if rep.dry_run:
            steps = f"{h.count('would-change')} would change, {h.count('unchanged')} done"
        else:
            steps = f"{h.count('changed')} changed, {h.count('unchanged')} unchanged"
        rows.append([h.host.name, h.status, steps if h.steps else "-", h.message or h.lock_note or "",
                     f"{h.seconds:.1f}"])
        styles.append(STYLE.get(h.status, ""))
    title = "install (dry run: nothing was changed)" if rep.dry_run else "install: prepare nodes"
    ui.table(title, ["host", "result", "steps", "detail", "seconds"], rows, styles)
    con = ui.console(stderr=True)
    for h in rep.hosts:
        if h.status != "done":
            fs = h.failed_step
            ui.say(con, f"{h.host.name}: {h.status}: {h.message}")
            if fs is not None:
                for ln in lines_that_matter(fs.outcome.output, 12):
                    ui.say(con, f"    {ln}")
            if h.remedy:
                ui.say(con, f"    fix: {h.remedy}")


def prepare_dry_run(rep: PrepareReport) -> None:
    out = ui.console()
    for h in rep.hosts:
        todo = [s for s in h.steps if s.outcome.status == "would-change"]
        if h.status != "done":
            continue
        ui.say(out, f"== {h.host.name} ({h.host.address}): {len(todo)} of {len(h.steps)} steps would run, as root")
        for s in todo:
            ui.say(out, f"--- {s.step.playbook}/{s.step.name}: {s.step.title}")
            if s.step.file_path:
                ui.say(out, f"# write {s.step.file_path} atomically with this content:")
                for ln in s.step.file_content.splitlines():
                    ui.say(out, f"#   {ln}")
            ui.say(out, s.step.run)


def phase_printer(output: Output) -> Callable[[str], None]:
    con = ui.console(stderr=True)

    def say(line: str) -> None:
        if output == Output.table:
            ui.say(con, line)

    return say


def render_cluster(rep: ClusterReport, title: str) -> None:
    if rep.prepare is not None:
        prepare_table(rep.prepare)
    rows = [[p.name, p.status, p.message] for p in rep.phases]
    ui.table(title, ["phase", "result", "detail"], rows, [PHASE_STYLE.get(p.status, "") for p in rep.phases])
    bad = [f for f in rep.findings if f.status != "pass"]
    if bad:  # per host, what a phase found (the health phase's failures, with their evidence)
        findings.table("findings", bad, subject="host")
    if rep.nodes:
        findings.table("nodes", [n.finding() for n in rep.nodes], subject="node")
    con = ui.console(stderr=True)
    for p in rep.phases:
        # a failure's remedy; and the health phase's where it quarantined nodes (it passed: the policy was followed)
        if p.remedy and (p.status == "failed" or p.name == "health"):
            ui.say(con, f"{p.name}: {p.message}\n    fix: {p.remedy}")
    if rep.kubeconfig:
        ui.say(con, f"admin kubeconfig: {rep.kubeconfig} (mode 0600): kubectl --kubeconfig {rep.kubeconfig} get nodes")
    if rep.ok and not rep.changed and rep.prepare is not None:
        ui.say(con, "nothing to change: the cluster is as the inventory describes")
    if not rep.ok and log_path():
        ui.say(con, f"full detail in {log_path()}")


PLANS_NOTE = "# the cluster phases' commands use gk_secret_file and gk_to_the_end from playbooks/cluster/_lib.sh"


def plan_commands(rep: ClusterReport, note: str = PLANS_NOTE) -> None:
    """--dry-run: `note` (the first line, a shell comment), then every phase's plan with the exact remote commands,
    what they read on stdin and the manifests. install, join, upgrade and reset print their plans through this one
    function; each flow's `note` says what its commands rely on."""
    out = ui.console()
    ui.say(out, note)
    for p in rep.plans:
        ui.say(out, f"== phase {p.name}: {p.title}: {p.status}" + (f" ({p.reason})" if p.reason else ""))
        if p.name == "prepare" and rep.prepare is not None:
            prepare_dry_run(rep.prepare)
            continue
        for c in p.changes:
            ui.say(out, f"--- {c.what}" + (f" (on {c.host}, as root)" if c.host else " (through the API)"))
            if c.stdin:
                ui.say(out, "# on stdin (secrets as placeholders):")
                for ln in c.stdin.splitlines():
                    ui.say(out, f"#   {ln}")
            if c.commands:
                ui.say(out, c.commands.rstrip())
            if c.manifest:
                ui.say(out, c.manifest.rstrip())


def plans(rep: ClusterReport, command: str = "install") -> None:
    """--dry-run: every phase's plan, with the exact remote commands and manifests, then the table of plans."""
    plan_commands(rep)
    rows = [[p.name, p.status, p.reason] for p in rep.plans]
    ui.table(f"{command} (dry run: nothing was changed)", ["phase", "plan", "why"], rows,
             [PHASE_STYLE.get(p.status, "") for p in rep.plans])
    if rep.prepare is not None:
        prepare_table(rep.prepare)
