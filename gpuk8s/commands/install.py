"""`gpuk8s install`: preflight, then every node prepared from the playbooks (live progress, final table)."""

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpuk8s import ui
from gpuk8s.commands.common import finish, ignored_checks, passwords
from gpuk8s.install.prepare import Event, PrepareReport, playbooks_for, prepare
from gpuk8s.kube.run import ClusterReport, install_cluster
from gpuk8s.logs import log_path
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.playbook.script import lines_that_matter

_PHASE_STYLE = {"changed": "green", "unchanged": "green", "passed": "green", "failed": "red", "skipped": "yellow"}
_STYLE = {"done": "green", "failed": "red", "blocked": "red", "unreachable": "red", "busy": "yellow"}


class _LiveView:
    """Per-host progress on a terminal: hosts in flight with their current step, and the tally.

    Step names and statuses come from hosts: cells are `ui.safe` text, never markup.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.current: dict[str, str] = {}
        self.finished: dict[str, str] = {}
        self.lock = threading.Lock()
        self.live = Live(self.render(), console=ui.console(stderr=True), refresh_per_second=8, transient=True)

    def render(self) -> Table:
        t = Table(box=None, show_header=False)
        t.add_column("host")
        t.add_column("progress")
        for name, text in list(self.current.items())[:20]:
            t.add_row(ui.safe(name, single_line=True), ui.safe(text, single_line=True))
        n_failed = sum(1 for s in self.finished.values() if s != "done")
        t.add_row(Text(""), Text(f"{len(self.finished)}/{self.total} hosts finished, {n_failed} not done",
                                 style="bold"))
        return t

    def event(self, e: Event) -> None:
        with self.lock:
            if e.kind == "preflight":
                if e.status == "ok":
                    self.current[e.host] = "preflight passed"
                else:
                    self.finished[e.host] = e.status
                    ui.say(self.live.console, f"{e.host}: blocked by preflight", "red")
            elif e.kind == "step":
                self.current[e.host] = f"step {e.index}/{e.total} {e.step}: {e.status}"
            else:
                self.current.pop(e.host, None)
                self.finished[e.host] = e.status
                ui.say(self.live.console, f"{e.host}: {e.status}", _STYLE.get(e.status))
            self.live.update(self.render())


def _render(rep: PrepareReport) -> None:
    rows, styles = [], []
    for h in rep.hosts:
        if rep.dry_run:
            steps = f"{h.count('would-change')} would change, {h.count('unchanged')} done"
        else:
            steps = f"{h.count('changed')} changed, {h.count('unchanged')} unchanged"
        rows.append([h.host.name, h.status, steps if h.steps else "-", h.message or h.lock_note or "",
                     f"{h.seconds:.1f}"])
        styles.append(_STYLE.get(h.status, ""))
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


def _render_dry_run(rep: PrepareReport) -> None:
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
        _render(rep.prepare)
    rows = [[p.name, p.status, p.message] for p in rep.phases]
    ui.table(title, ["phase", "result", "detail"], rows, [_PHASE_STYLE.get(p.status, "") for p in rep.phases])
    if rep.nodes:
        ui.table("nodes", ["node", "ready", "GPUs expected", "GPUs schedulable", "result"],
                 [[n.node, "yes" if n.ready else "no", str(n.expected_gpus), str(n.allocatable_gpus),
                   "ok" if n.ok else n.cause] for n in rep.nodes],
                 ["green" if n.ok else "red" for n in rep.nodes])
    con = ui.console(stderr=True)
    for p in rep.phases:
        if p.status == "failed" and p.remedy:
            ui.say(con, f"{p.name}: {p.message}\n    fix: {p.remedy}")
    if rep.kubeconfig:
        ui.say(con, f"admin kubeconfig: {rep.kubeconfig} (mode 0600): kubectl --kubeconfig {rep.kubeconfig} get nodes")
    if rep.ok and not rep.changed and rep.prepare is not None:
        ui.say(con, "nothing to change: the cluster is as the inventory describes")
    if not rep.ok and log_path():
        ui.say(con, f"full detail in {log_path()}")


def _full_install(inv: Any, output: Output, concurrency: int, ignored: set[str], sudo: dict[str, str],
                  kubeconfig_out: Path | None, test_pods: bool, view: "_LiveView | None",
                  force: bool = False, merge: bool = False) -> None:
    dest = kubeconfig_out or (Path.home() / ".kube" / "config" if merge else
                              Path.cwd() / f"{inv.cluster.name}.kubeconfig")
    # on a terminal, phase lines go through the live view's console so they do not tear its display
    say = (lambda line: ui.say(view.live.console, line)) if view else phase_printer(output)
    try:
        rep = install_cluster(inv, concurrency=concurrency, ignore=ignored, sudo_passwords=sudo,
                              kubeconfig_out=dest, kubeconfig_force=force, kubeconfig_merge=merge,
                              emit=say, test_pods=test_pods,
                              on_event=view.event if view else None)
    finally:
        if view:
            view.live.stop()
    finish(rep, output, lambda: render_cluster(rep, "install: cluster phases"))


def register(app: typer.Typer, load_inventory: Callable[..., Any]) -> None:
    @app.command()
    def install(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        concurrency: int = typer.Option(16, "--concurrency", "-c", min=1, max=512, help="Hosts worked on at once."),
        ignore: list[str] = typer.Option([], "--ignore", help="Preflight check id that must not block a host "
                                         "(repeatable; 'all' for every check)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Run only the read-only checks and print, per host, "
                                     "the exact commands that would run. Changes nothing."),
        network: bool = typer.Option(False, "--network/--no-network",
                                     help="Also measure RTT and bandwidth during preflight."),
        prepare_only: bool = typer.Option(False, "--prepare-only", help="Stop after preparing the nodes."),
        kubeconfig_out: Path | None = typer.Option(  # noqa: UP007
            None, "--kubeconfig-out", help="Where to write the admin kubeconfig (mode 0600; default "
            "./CLUSTER.kubeconfig; with --kubeconfig-merge ~/.kube/config)."),
        force: bool = typer.Option(False, "--force", help="Replace an existing kubeconfig file that holds "
                                   "something else (never a symbolic link)."),
        kubeconfig_merge: bool = typer.Option(False, "--kubeconfig-merge", help="Add the cluster to an existing "
                                              "kubeconfig as context ADMIN@CLUSTER, keeping every other entry."),
        test_pods: bool = typer.Option(True, "--test-pods/--no-test-pods",
                                       help="Run one GPU test pod per GPU node during verification."),
    ) -> None:
        """Preflight, prepare every host (toolkit, runtime, Kubernetes packages), then kubeadm init, CNI, join,
        the NVIDIA device plugin, and verification that every GPU is schedulable."""
        inv = load_inventory(inventory, output)
        ignored = ignored_checks(inv, ignore)
        sudo = passwords(inv)
        live = output == Output.table and ui.is_terminal()
        view = _LiveView(len(inv.hosts)) if live else None
        if view:
            con = ui.console(stderr=True)
            ui.say(con, f"==> preflight, then playbooks {', '.join(playbooks_for(inv))} on {len(inv.hosts)} host(s), "
                   f"{concurrency} at a time{' (dry run)' if dry_run else ''}")
            view.live.start()
        if not (dry_run or prepare_only):
            _full_install(inv, output, concurrency, ignored, sudo, kubeconfig_out, test_pods, view,
                          force=force, merge=kubeconfig_merge)
        try:
            rep = prepare(inv, concurrency=concurrency, ignore=ignored, sudo_passwords=sudo, dry_run=dry_run,
                          measure_network=network, on_event=view.event if view else None)
        finally:
            if view:
                view.live.stop()
        def tables() -> None:
            if dry_run:
                _render_dry_run(rep)
                ui.say(ui.console(stderr=True), "dry run: the cluster phases (kubeadm, CNI, join, device plugin) are "
                       "not simulated; 'gpuk8s render' shows what they apply")
            _render(rep)
            if not rep.ok and log_path():
                ui.say(ui.console(stderr=True), f"full detail in {log_path()}")

        finish(rep, output, tables)
