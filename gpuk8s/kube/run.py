"""Running the cluster phases after node preparation: what install, join and verify share."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuk8s import clusterlock
from gpuk8s.facts.model import HostFacts
from gpuk8s.install.prepare import Event, PrepareReport, owner, prepare
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube.cluster import ClusterOps, PhaseError, PhaseResult
from gpuk8s.kube.state import NodeCheck
from gpuk8s.preflight.runner import gather
from gpuk8s.remote import Held, RemoteError, Session, for_each_host

log = logging.getLogger("gpuk8s.kube")


@dataclass
class ClusterReport:
    prepare: PrepareReport | None
    phases: list[PhaseResult] = field(default_factory=list)
    nodes: list[NodeCheck] = field(default_factory=list)
    kubeconfig: str = ""

    @property
    def ok(self) -> bool:
        return (self.prepare is None or self.prepare.ok) and all(p.status != "failed" for p in self.phases) \
            and bool(self.phases)

    @property
    def changed(self) -> bool:
        return any(p.status == "changed" for p in self.phases if p.name != "kubeconfig") or (
            self.prepare is not None and any(h.count("changed") for h in self.prepare.hosts))

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "changed": self.changed,
                "prepare": self.prepare.to_json() if self.prepare else None,
                "phases": [p.to_json() for p in self.phases], "nodes": [n.to_json() for n in self.nodes],
                "kubeconfig": self.kubeconfig}


def _run_phase(report: ClusterReport, emit: Callable[[str], None], name: str, title: str,
               fn: Callable[[], PhaseResult]) -> PhaseResult:
    emit(f"==> Running phase: {title}")
    try:
        res = fn()
    except (PhaseError, RemoteError) as e:
        res = PhaseResult(name, title, "failed", e.message, e.remedy)
    log.info("phase %s: %s %s", name, res.status, res.message)
    report.phases.append(res)
    return res


def refresh_facts(sessions: dict[str, Session], concurrency: int) -> dict[str, HostFacts]:
    """Facts as they are now (after the playbooks changed the hosts): one probe run per host."""
    hosts = [s.host for s in sessions.values()]
    got = for_each_host(hosts, lambda h: gather(sessions[h.name])[0], concurrency)
    return {n: v for n, v in got.items() if isinstance(v, HostFacts)}


def install_cluster(inv: Inventory, *, concurrency: int, ignore: set[str], sudo_passwords: dict[str, str],
                    kubeconfig_out: Path, kubeconfig_force: bool = False, kubeconfig_merge: bool = False,
                    on_event: Callable[[Event], None] | None = None,
                    emit: Callable[[str], None] | None = None, test_pods: bool = True,
                    only_join: list[Host] | None = None) -> ClusterReport:
    """Prepare (every host, or the first control plane and `only_join`), then the cluster phases."""
    say = emit or (lambda line: None)
    sessions: dict[str, Session] = {}
    lock: Held | None = None
    target = inv
    if only_join is not None:
        names = {inv.control_planes[0].name} | {h.name for h in only_join}
        target = replace(inv, hosts=tuple(h for h in inv.hosts if h.name in names))
    try:
        # the cluster lock first, over the connection the rest of the run uses on the first control plane
        cp = inv.control_planes[0]
        cp_session = Session(cp, sudo_passwords.get(cp.name))
        try:
            lock = clusterlock.acquire(cp_session, owner())
            sessions[cp.name] = cp_session
        except clusterlock.ClusterBusy as e:
            cp_session.close()
            report = ClusterReport(None)
            report.phases.append(PhaseResult("lock", f"cluster lock on {cp.name}", "failed", e.message, e.remedy))
            return report
        except RemoteError as e:
            # an unreachable first control plane is reported by the preflight; nothing cluster-wide runs
            cp_session.close()
            log.warning("cluster lock not taken on %s: %s", cp.name, e.message)
        say("==> Running phase: preflight and node preparation")
        prep = prepare(target, concurrency=concurrency, ignore=ignore, sudo_passwords=sudo_passwords,
                       on_event=on_event, sessions=sessions)
        report = ClusterReport(prep)
        done = {h.host.name for h in prep.hosts if h.status == "done"}
        if cp.name not in done or lock is None:
            report.phases.append(PhaseResult("init", f"kubeadm init on {cp.name}", "skipped",
                                             f"the first control plane {cp.name} was not prepared",
                                             "fix it (see above) and re-run"))
            return report
        ready = {n: s for n, s in sessions.items() if n in done}
        # the preflight's facts still hold where the playbooks changed nothing; else read them again
        changed = {h.host.name for h in prep.hosts if h.count("changed")}
        facts = {r.host.name: r.facts for r in prep.preflight if r.facts is not None and r.host.name not in changed}
        facts.update(refresh_facts({n: s for n, s in ready.items() if n in changed}, concurrency))
        ops = ClusterOps(inv, ready, facts, concurrency, say)
        steps: list[tuple[str, str, Callable[[], PhaseResult]]] = []
        if only_join is None:
            steps += [("init", "kubeadm init", ops.init),
                      ("kubeconfig", "fetch the admin kubeconfig",
                       lambda: ops.fetch_kubeconfig(kubeconfig_out, force=kubeconfig_force, merge=kubeconfig_merge)),
                      ("cni", f"CNI ({inv.cluster.cni})", ops.cni)]
        joiners = [h for h in (only_join if only_join is not None else inv.hosts) if h.name in done]
        steps += [("join", "join control planes and workers", lambda: ops.join(joiners)),
                  ("gpu", "NVIDIA device plugin, labels, taints", ops.gpu_nodes)]
        for name, title, fn in steps:
            res = _run_phase(report, say, name, title, fn)
            # a failed join leaves the other hosts to verify; a kubeconfig not written locally leaves the cluster
            if res.status == "failed" and name not in ("join", "kubeconfig"):
                return report
            if name == "kubeconfig" and res.status != "failed":
                report.kubeconfig = str(kubeconfig_out)

        def verify() -> PhaseResult:
            res, report.nodes = ops.verify(test_pods=test_pods)
            return res

        _run_phase(report, say, "verify", "verify every node and GPU", verify)
        return report
    finally:
        if lock is not None:
            lock.release()
        for s in sessions.values():
            s.close()


def verify_cluster(inv: Inventory, *, concurrency: int, sudo_passwords: dict[str, str], test_pods: bool,
                   emit: Callable[[str], None] | None = None) -> ClusterReport:
    say = emit or (lambda line: None)
    sessions = {h.name: Session(h, sudo_passwords.get(h.name)) for h in inv.hosts}
    report = ClusterReport(None)
    try:
        facts = refresh_facts(sessions, concurrency)
        ops = ClusterOps(inv, {n: s for n, s in sessions.items() if n in facts}, facts, concurrency, say)

        def verify() -> PhaseResult:
            res, report.nodes = ops.verify(test_pods=test_pods)
            return res

        _run_phase(report, say, "verify", "verify every node and GPU", verify)
        for h in inv.hosts:
            if h.name not in facts:
                report.nodes = [n for n in report.nodes if n.node != h.name] + [
                    NodeCheck(h.name, False, False, h.gpus or 0, 0, "host not reachable over SSH")]
        return report
    finally:
        for s in sessions.values():
            s.close()


def not_joined(inv: Inventory, sudo_passwords: dict[str, str]) -> list[Host]:
    """Hosts of the inventory that are not nodes of the running cluster (asked on the first control plane)."""
    cp = inv.control_planes[0]
    with Session(cp, sudo_passwords.get(cp.name)) as s:
        ops = ClusterOps(inv, {cp.name: s}, {})
        if not ops.initialized():
            raise PhaseError(f"{cp.name} runs no control plane yet", "run gpuk8s install first")
        present = ops.node_names()
    return [h for h in inv.hosts if h.name not in present]
