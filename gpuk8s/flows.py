"""The flows: install, join and verify, each a list of phases (gpuk8s/phases/) over one Context.

A new capability is a new phase module and a line in one of these lists. A flow builds the context, runs
(or, for --dry-run, plans) its phases, always releases what it holds and closes its connections, and
returns one report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuk8s import gpuplan
from gpuk8s.install.prepare import Event, PrepareReport
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube import state
from gpuk8s.kube.client import KubeClient, KubeError
from gpuk8s.kube.state import NodeCheck
from gpuk8s.phases.base import Context, Options, Phase, PhaseError, PhasePlan, PhaseResult, plan_phases, run_phases
from gpuk8s.phases.cni import CNI
from gpuk8s.phases.gpu import GPUNodes
from gpuk8s.phases.init import Init
from gpuk8s.phases.join import Join
from gpuk8s.phases.kubeconfig import Kubeconfig
from gpuk8s.phases.lock import Lock
from gpuk8s.phases.prepare import Prepare, refresh_facts
from gpuk8s.phases.verify import Verify
from gpuk8s.remote import RemoteError, Session


@dataclass
class ClusterReport:
    prepare: PrepareReport | None
    phases: list[PhaseResult] = field(default_factory=list)
    nodes: list[NodeCheck] = field(default_factory=list)
    kubeconfig: str = ""
    plans: list[PhasePlan] = field(default_factory=list)  # --dry-run: what each phase would do

    @property
    def dry_run(self) -> bool:
        return bool(self.plans)

    @property
    def ok(self) -> bool:
        if self.dry_run:
            return self.prepare is None or self.prepare.ok
        return all(p.status != "failed" for p in self.phases) and bool(self.phases)

    @property
    def changed(self) -> bool:
        return any(p.status == "changed" for p in self.phases if p.name not in ("kubeconfig", "lock"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok, "changed": self.changed, "prepare": self.prepare.to_json() if self.prepare else None,
            "phases": [p.to_json() for p in self.phases], "nodes": [n.to_json() for n in self.nodes],
            "kubeconfig": self.kubeconfig}
        if self.dry_run:
            out["dry_run"] = True
            out["plans"] = [p.to_json() for p in self.plans]
        return out


def install_phases(inv: Inventory, on_event: Callable[[Event], None] | None = None,
                   measure_network: bool = False) -> list[Phase]:
    return [Lock(), Prepare(on_event, measure_network), Init(), Kubeconfig(), CNI(inv.cluster.cni), Join(),
            GPUNodes(), Verify()]


def join_phases(on_event: Callable[[Event], None] | None = None) -> list[Phase]:
    return [Lock(), Prepare(on_event), Join(), GPUNodes(), Verify()]


def _run(ctx: Context, phases: list[Phase], dry_run: bool) -> ClusterReport:
    report = ClusterReport(None)
    try:
        if dry_run:
            # the lock is not taken: a dry run changes nothing, and it reads what is there now
            report.plans = plan_phases([p for p in phases if not isinstance(p, Lock)], ctx)
        else:
            run_phases(phases, ctx, report.phases)
    finally:
        ctx.close()
    report.prepare = ctx.prepare_report
    report.nodes = ctx.nodes
    report.kubeconfig = ctx.kubeconfig
    return report


def install(inv: Inventory, *, concurrency: int, ignore: set[str], sudo_passwords: dict[str, str],
            options: Options | None = None, emit: Callable[[str], None] | None = None,
            on_event: Callable[[Event], None] | None = None, dry_run: bool = False,
            measure_network: bool = False) -> ClusterReport:
    """Lock, prepare every host, kubeadm init, kubeconfig, CNI, join, GPU manifests and labels, verify."""
    ctx = Context(inv, options=options or Options(), concurrency=concurrency, emit=emit or (lambda line: None),
                  sudo_passwords=sudo_passwords, ignore=ignore)
    return _run(ctx, install_phases(inv, on_event, measure_network), dry_run)


def join(inv: Inventory, hosts: list[Host], *, concurrency: int, ignore: set[str], sudo_passwords: dict[str, str],
         options: Options | None = None, emit: Callable[[str], None] | None = None,
         dry_run: bool = False) -> ClusterReport:
    """Prepare the first control plane and `hosts`, then join them, label them and verify."""
    opts = options or Options()
    opts.only = hosts
    ctx = Context(inv, options=opts, concurrency=concurrency, emit=emit or (lambda line: None),
                  sudo_passwords=sudo_passwords, ignore=ignore)
    return _run(ctx, join_phases(), dry_run)


def verify(inv: Inventory, *, concurrency: int, sudo_passwords: dict[str, str], options: Options | None = None,
           emit: Callable[[str], None] | None = None, kube: KubeClient | None = None) -> ClusterReport:
    """Every node and GPU checked. With `kube` (a local kubeconfig) no host is contacted over SSH: the
    expectations come from the inventory alone; else the facts are read on every host first."""
    ctx = Context(inv, options=options or Options(), concurrency=concurrency, emit=emit or (lambda line: None),
                  sudo_passwords=sudo_passwords, kube_client=kube)
    report = ClusterReport(None)
    try:
        if kube is None:
            sessions = {h.name: Session(h, sudo_passwords.get(h.name)) for h in inv.hosts}
            ctx.facts = refresh_facts(sessions, concurrency)
            for name in [n for n in sessions if n not in ctx.facts]:
                sessions.pop(name).close()
            ctx.sessions = sessions
        ctx.plans = gpuplan.plans(inv, ctx.facts)
        run_phases([Verify()], ctx, report.phases)
        if kube is None:
            for h in inv.hosts:
                if h.name not in ctx.facts:
                    ctx.nodes = [n for n in ctx.nodes if n.node != h.name] + [
                        NodeCheck(h.name, False, False, h.gpus or 0, 0, "host not reachable over SSH",
                                  cause_id="node.unreachable",
                                  remedy="bring the host back (see gpuk8s preflight), then verify again")]
    finally:
        ctx.close()
    report.nodes = ctx.nodes
    return report


def not_joined(inv: Inventory, sudo_passwords: dict[str, str]) -> list[Host]:
    """Hosts of the inventory that are not nodes of the running cluster (asked on the first control plane)."""
    cp = inv.control_planes[0]
    ctx = Context(inv, sudo_passwords=sudo_passwords)
    try:
        ctx.sessions[cp.name] = Session(cp, sudo_passwords.get(cp.name))
        if not ctx.initialized():
            raise PhaseError(f"{cp.name} runs no control plane yet", "run gpuk8s install first")
        present = set(state.by_name(ctx.kube.get("nodes")))
    except (RemoteError, KubeError) as e:
        raise PhaseError(e.message, e.remedy) from None
    finally:
        ctx.close()
    return [h for h in inv.hosts if h.name not in present]
