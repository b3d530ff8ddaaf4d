"""The flows: install, join and verify, each a list of phases (gpuk8s/phases/) over one Context.

A new capability is a new phase module and a line in one of these lists. A flow builds the context, runs
(or, for --dry-run, plans) its phases, always releases what it holds and closes its connections, and
returns one report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuk8s import findings, gpuplan, versions
from gpuk8s.install.prepare import Event, PrepareReport
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube import state
from gpuk8s.kube.client import KubeClient, KubeError
from gpuk8s.kube.state import NodeCheck
from gpuk8s.phases import upgrade as up
from gpuk8s.phases.allocator import AllocatorMove
from gpuk8s.phases.base import (
    Context,
    Options,
    Phase,
    PhaseError,
    PhasePlan,
    PhaseResult,
    Skipped,
    plan_phases,
    run_phases,
    select,
)
from gpuk8s.phases.bundle import Bundle
from gpuk8s.phases.cni import CNI
from gpuk8s.phases.driver import Driver
from gpuk8s.phases.driver_upgrade import DriverUpgrade
from gpuk8s.phases.fabric_verify import FabricVerify
from gpuk8s.phases.gather import gather
from gpuk8s.phases.gpu import GPUNodes
from gpuk8s.phases.health import Health
from gpuk8s.phases.init import Init
from gpuk8s.phases.join import Join
from gpuk8s.phases.kubeconfig import Kubeconfig
from gpuk8s.phases.lock import Lock
from gpuk8s.phases.mig import Mig
from gpuk8s.phases.monitoring import Monitoring
from gpuk8s.phases.monitoring_verify import MonitoringVerify
from gpuk8s.phases.nodeops import NodeOptions
from gpuk8s.phases.prepare import Prepare
from gpuk8s.phases.reset import Reset
from gpuk8s.phases.verify import Verify
from gpuk8s.remote import RemoteError, Session


@dataclass
class ClusterReport:
    prepare: PrepareReport | None
    phases: list[PhaseResult] = field(default_factory=list)
    nodes: list[NodeCheck] = field(default_factory=list)
    kubeconfig: str = ""
    plans: list[PhasePlan] = field(default_factory=list)  # --dry-run: what each phase would do
    findings: list[findings.Finding] = field(default_factory=list)  # per node, where a flow gives them (driver)

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
        if self.findings:
            out["findings"] = [f.to_json() for f in self.findings]
        return out


def install_phases(inv: Inventory, on_event: Callable[[Event], None] | None = None,
                   measure_network: bool = False) -> list[Phase]:
    # driver and mig right after prepare: the module loaded and the MIG layout (and any reboot they need) before
    # kubelet and the device plugin start
    # health after the driver (a bare host is judged with its driver loaded) and before the GPUs are reset for MIG
    monitoring = [Monitoring()] if inv.monitoring.enabled else []
    return health_selected([Lock(), Prepare(on_event, measure_network), Driver(), Health(), Mig(), Init(),
                            Kubeconfig(), CNI(inv.cluster.cni), Join(), GPUNodes(), *monitoring, Verify()])


def join_phases(on_event: Callable[[Event], None] | None = None) -> list[Phase]:
    return health_selected([Lock(), Prepare(on_event), Driver(), Health(), Mig(), Join(), GPUNodes(), Verify()])


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
    report.findings = list(ctx.findings)
    report.kubeconfig = ctx.kubeconfig
    return report


def monitoring(ctx: Context, remove: bool, dry_run: bool) -> ClusterReport:
    """`gpuk8s monitoring`: the monitoring phase alone on a running cluster (or its --remove). Over SSH the
    cluster lock is taken first, as install, reset and upgrade do, so that it never runs beside them; with a
    local kubeconfig (ctx.kube_client) no host is contacted over SSH and there is no lock to take."""
    phases: list[Phase] = [Monitoring(remove=remove)]
    if ctx.kube_client is None:
        phases.insert(0, Lock())
    return _run(ctx, phases, dry_run)


def allocator(ctx: Context, nodes: list[str], opts: NodeOptions, dry_run: bool) -> ClusterReport:
    """`gpuk8s allocator NODE... --to ...`: the lock, then each node moved to the allocator its inventory says
    (gpuk8s/phases/allocator.py), one at a time; its findings in the report. The nodes' facts are read first (their
    GPUs, MIG devices: what each allocator must offer there); a node that cannot be read is planned from the
    inventory alone."""
    gather(ctx, [h for h in ctx.inv.hosts if h.name in nodes])
    report = _run(ctx, [Lock(), AllocatorMove(nodes, opts)], dry_run)
    report.findings = opts.findings
    return report


def select_install(inv: Inventory, skip: Sequence[str], only: str | None,
                   on_event: Callable[[Event], None] | None = None, measure_network: bool = False) -> list[Phase]:
    """install's phases with --skip-phases / --only-phase applied (phases.base.select); a left-out prepare still
    reads every host (facts, connections, GPU plans) and applies nothing."""
    return health_selected(select(install_phases(inv, on_event, measure_network), skip, only, "install",
                                  read_only={"prepare": Prepare(on_event, measure_network, apply=False)}))


def health_selected(phases: list[Phase]) -> list[Phase]:
    """Tell prepare whether the health phase runs after it (--skip-phases health or --only-phase another leave it
    out): only then does preflight read the health sections, and leave a GPU missing to the health phase."""
    judged = any(isinstance(p, Health) for p in phases)
    for p in phases:
        if isinstance(p, Prepare):
            p.health = judged
    return phases


def select_upgrade(skip: Sequence[str], only: str | None) -> dict[str, Phase]:
    """The phases --skip-phases / --only-phase leave out of every step of an upgrade, by name (Skipped)."""
    every = select([Lock(), *up.step_phases(up.UpgradeOptions("")), Verify()], skip, only, "upgrade")
    return {p.name: p for p in every if isinstance(p, Skipped)}


def with_bundle(phases: list[Phase], options: Options | None) -> list[Phase]:
    """With --bundle, the bundle phase right after the cluster lock: it serves the bundle and gives every later
    phase the served inventory (gpuk8s/phases/bundle.py)."""
    if options is None or options.bundle is None:
        return phases
    at = 1 if phases and isinstance(phases[0], Lock) else 0
    return [*phases[:at], Bundle(), *phases[at:]]


def install(inv: Inventory, *, concurrency: int, ignore: set[str], sudo_passwords: dict[str, str],
            options: Options | None = None, emit: Callable[[str], None] | None = None,
            on_event: Callable[[Event], None] | None = None, dry_run: bool = False,
            measure_network: bool = False, skip: Sequence[str] = (), only: str | None = None) -> ClusterReport:
    """Lock, prepare every host, kubeadm init, kubeconfig, CNI, join, GPU manifests and labels, verify; `skip` or
    `only` leave phases out (PhaseSelectionError, before any host is contacted, for a wrong name)."""
    phases = with_bundle(select_install(inv, skip, only, on_event, measure_network), options)
    ctx = Context(inv, options=options or Options(), concurrency=concurrency, emit=emit or (lambda line: None),
                  sudo_passwords=sudo_passwords, ignore=ignore)
    return _run(ctx, phases, dry_run)


def join(inv: Inventory, hosts: list[Host], *, concurrency: int, ignore: set[str], sudo_passwords: dict[str, str],
         options: Options | None = None, emit: Callable[[str], None] | None = None,
         dry_run: bool = False) -> ClusterReport:
    """Prepare the first control plane and `hosts`, then join them, label them and verify."""
    opts = options or Options()
    opts.only = hosts
    ctx = Context(inv, options=opts, concurrency=concurrency, emit=emit or (lambda line: None),
                  sudo_passwords=sudo_passwords, ignore=ignore)
    return _run(ctx, with_bundle(join_phases(), opts), dry_run)


def select_verify(inv: Inventory, options: Options, skip: Sequence[str] = ()) -> list[Phase]:
    """verify's phases: the nodes and GPUs (`verify`), the DCGM exporter and Prometheus where monitoring is enabled
    (`monitoring-verify`), the RDMA fabric with --fabric (`fabric`); `skip` leaves some out (PhaseSelectionError,
    before any host is contacted, for a name verify does not have)."""
    every = select([Verify(), MonitoringVerify(), FabricVerify()], skip, None, "verify")
    wanted = {"verify", *(["monitoring-verify"] if inv.monitoring.enabled else []),
              *(["fabric"] if options.fabric else [])}
    return [p for p in every if p.name in wanted]


def verify(inv: Inventory, *, concurrency: int, sudo_passwords: dict[str, str], options: Options | None = None,
           emit: Callable[[str], None] | None = None, kube: KubeClient | None = None,
           skip: Sequence[str] = ()) -> ClusterReport:
    """Every node and GPU checked. With `kube` (a local kubeconfig) no host is contacted over SSH: the
    expectations come from the inventory alone; else the facts are read on every host first. `skip`: phases left
    out (select_verify)."""
    ctx = Context(inv, options=options or Options(), concurrency=concurrency, emit=emit or (lambda line: None),
                  sudo_passwords=sudo_passwords, kube_client=kube)
    phases = select_verify(inv, ctx.options, skip)
    report = ClusterReport(None)
    try:
        if kube is None:
            gather(ctx, inv.hosts, drop_unread=True)
        else:
            ctx.set_facts({})  # the plans of the inventory alone
        run_phases(phases, ctx, report.phases)
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
    report.findings = list(ctx.findings)
    return report


def read_nodes(inv: Inventory, sudo_passwords: dict[str, str]) -> list[dict[str, Any]] | None:
    """The cluster's Node objects, asked with kubectl on the first control plane; None when it runs no control
    plane yet. What fails on the way (SSH, kubectl) is a PhaseError with its message and remedy."""
    cp = inv.control_planes[0]
    ctx = Context(inv, sudo_passwords=sudo_passwords)
    try:
        ctx.sessions[cp.name] = Session(cp, sudo_passwords.get(cp.name))
        if not ctx.initialized():
            return None
        return ctx.kube.get("nodes")
    except (RemoteError, KubeError) as e:
        raise PhaseError(e.message, e.remedy) from None
    finally:
        ctx.close()


def not_joined(inv: Inventory, sudo_passwords: dict[str, str]) -> tuple[list[Host], list[Host]]:
    """Hosts of the inventory that are not nodes of the running cluster (asked on the first control plane), and GPU
    hosts that are but whose join never ended: their Node lacks nvidia.com/gpu.present=true, which the gpu phase
    sets after kubeadm join (a join stopped in between, issue 41: its re-run said "nothing to join" and the node
    stayed without its GPU setup for good)."""
    nodes = read_nodes(inv, sudo_passwords)
    if nodes is None:
        cp = inv.control_planes[0]
        raise PhaseError(f"{cp.name} runs no control plane yet", "run gpuk8s install first")
    present = state.by_name(nodes)
    unfinished = []
    for h in inv.hosts:
        node = present.get(h.name)
        labels = node.get("metadata", {}).get("labels") if isinstance(node, dict) else None
        if node is not None and gpuplan.is_gpu_node(h) and \
                (labels.get(gpuplan.GPU_PRESENT) if isinstance(labels, dict) else None) != "true":
            unfinished.append(h)
    return [h for h in inv.hosts if h.name not in present], unfinished


def cluster_nodes(inv: Inventory, sudo_passwords: dict[str, str]) -> dict[str, bool]:
    """The cluster's nodes (name: whether it is Ready), asked on the first control plane; empty when it runs
    no cluster."""
    nodes = read_nodes(inv, sudo_passwords)
    if nodes is None:
        return {}
    # reset decides on each node's Ready condition: a node it cannot read is an error, where not_joined, which
    # needs only the names, passes over it
    try:
        return {n.name: n.ready for n in map(state.node_state, nodes)}
    except state.StateError as e:
        raise PhaseError(f"the cluster's nodes are unreadable: {e}", "check the control plane") from None


def reset_phases(targets: list[Host], *, purge: bool, drain_timeout: int, all_hosts: bool) -> list[Phase]:

    return [Lock(), Reset(targets, purge=purge, drain_timeout=drain_timeout, all_hosts=all_hosts)]



def reset(inv: Inventory, targets: list[Host], *, concurrency: int, sudo_passwords: dict[str, str],
          purge: bool = False, drain_timeout: int = 300, all_hosts: bool = False,
          emit: Callable[[str], None] | None = None, dry_run: bool = False) -> tuple[ClusterReport, list[Any]]:
    """Drain, kubeadm reset, clean up and delete `targets` (already in the safe order, gpuk8s/phases/reset.py);
    the report and each node's outcome (reset.NodeOutcome). Hosts that do not answer are left out of the
    SSH sessions (their Node is still drained and deleted)."""

    ctx = Context(inv, concurrency=concurrency, emit=emit or (lambda line: None), sudo_passwords=sudo_passwords)

    gather(ctx, [inv.control_planes[0], *[h for h in targets if h.name != inv.control_planes[0].name]], facts=False)
    phases = reset_phases(targets, purge=purge, drain_timeout=drain_timeout, all_hosts=all_hosts)
    report = _run(ctx, phases, dry_run)
    return report, phases[-1].outcomes  # type: ignore[attr-defined]


@dataclass
class UpgradeReport(ClusterReport):
    """An upgrade: the minors stepped through, and how long each node took."""

    steps: list[str] = field(default_factory=list)
    node_seconds: dict[str, float] = field(default_factory=dict)
    start_minor: str = ""
    findings: list[Any] = field(default_factory=list)  # gpuk8s.findings.Finding, one per node (upgrade.*)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "from": self.start_minor, "steps": self.steps,
                "node_seconds": {k: round(v, 2) for k, v in self.node_seconds.items()},
                "findings": [f.to_json() for f in self.findings]}


def driver_upgrade(inv: Inventory, *, concurrency: int, sudo_passwords: dict[str, str], max_unavailable: int = 1,
                   gpu_pod_timeout: float = 3600, drain_timeout: int = 600, options: Options | None = None,
                   emit: Callable[[str], None] | None = None, dry_run: bool = False) -> ClusterReport:
    """`gpuk8s driver upgrade`: lock, then every node with driver: {manage: true} brought to the driver its inventory
    asks for, `max_unavailable` at a time (gpuk8s/phases/driver_upgrade.py), then verify."""
    ctx = Context(inv, options=options or Options(), concurrency=concurrency, emit=emit or (lambda line: None),
                  sudo_passwords=sudo_passwords)
    gather(ctx, inv.hosts, need_cp=True)
    opts = NodeOptions(max_unavailable=max_unavailable, gpu_pod_timeout=gpu_pod_timeout, drain_timeout=drain_timeout)
    # --bundle: served right after the lock (NVIDIA's RHEL 8 repository as the bundle carries it)
    report = _run(ctx, with_bundle([Lock(), DriverUpgrade(opts), Verify()], ctx.options), dry_run)
    report.findings = opts.findings
    return report


def upgrade(inv: Inventory, *, to: str | None, concurrency: int, ignore: set[str], sudo_passwords: dict[str, str],
            max_unavailable: int = 1, gpu_pod_timeout: float = 3600, drain_timeout: int = 600,
            options: Options | None = None, emit: Callable[[str], None] | None = None,
            dry_run: bool = False, skip: Sequence[str] = (), only: str | None = None) -> UpgradeReport:
    """Lock, then for each minor from the oldest a node runs to `to` (default: the next), one at a time: prepare
    for it, control planes, workers, manifests; then verify (gpuk8s/phases/upgrade.py). Raises
    upgrade.UpgradeRefused (nothing done) when the path is not allowed; `skip` or `only` leave phases out of every
    step (PhaseSelectionError, before any host is contacted, for a wrong name)."""
    left_out = select_upgrade(skip, only)

    def selected(phases: list[Phase]) -> list[Phase]:
        return [left_out.get(p.name, p) for p in phases]

    ctx = Context(inv, options=options or Options(), concurrency=concurrency, emit=emit or (lambda line: None),
                  sudo_passwords=sudo_passwords, ignore=ignore)
    report = UpgradeReport(None)

    try:
        gather(ctx, inv.hosts, facts=False, need_cp=True)
        current = up.current_state(ctx).oldest()
        report.start_minor = f"1.{current}"
        report.steps = up.steps(current, to, versions.supported_minors())
        if not report.steps:
            return report
        # --bundle: one minor per bundle; it is served right after the lock, for every step's packages and images
        bundle: list[Phase] = [Bundle(upgrade_to=report.steps[-1])] if ctx.options.bundle is not None else []
        if bundle and len(report.steps) > 1:
            raise up.UpgradeRefused(f"the cluster runs 1.{current}; a bundle holds one minor, "
                                    f"{report.steps[-1]}, and the upgrade goes through {', '.join(report.steps)}",
                                    "upgrade one minor at a time, each from its own bundle (--to 1.N)")
        if dry_run:
            first = up.UpgradeOptions(report.steps[0], max_unavailable=max_unavailable,
                                      gpu_pod_timeout=gpu_pod_timeout, drain_timeout=drain_timeout)
            report.plans = plan_phases([*bundle, *selected(up.step_phases(first))], ctx)
            return report
        if not run_phases([Lock(), *bundle], ctx, report.phases):
            return report
        for to_minor in report.steps:
            ctx.emit(f"==> Upgrading to Kubernetes {to_minor}")
            opts = up.UpgradeOptions(to_minor, max_unavailable=max_unavailable, gpu_pod_timeout=gpu_pod_timeout,
                                     drain_timeout=drain_timeout, findings=report.findings)
            on_node = report.node_seconds.__setitem__
            phases = selected(up.step_phases(opts, on_node=on_node))
            step_results: list[PhaseResult] = []
            ok = run_phases(phases, ctx, step_results)
            for r in step_results:
                r.name = f"{r.name}@{to_minor}"
            report.phases += step_results
            if not ok or any(r.status == "failed" for r in step_results):
                return report
        ctx.inv = up.target_inventory(ctx.inv if bundle else inv, report.steps[-1])  # a bundle's: its served one
        run_phases(selected([Verify()]), ctx, report.phases)
    finally:
        ctx.close()
        report.nodes = ctx.nodes
    return report
