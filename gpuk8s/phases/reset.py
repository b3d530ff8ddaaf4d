"""Phase reset: take nodes out of the cluster and return their hosts to the state before gpuk8s install.

Which hosts, in which order, and what is refused is decided by the pure functions `order` and `refusal`
(the etcd quorum of the stacked control planes); the phase then works on one node at a time, in that order:

1. `kubectl drain` (it cordons first; PodDisruptionBudgets respected, DaemonSets' pods ignored, emptyDir
   data deleted, bounded by --drain-timeout). A drain that cannot finish stops here: that node stays
   cordoned and nothing else is done to it (`kubectl uncordon NODE` undoes it).
2. on the host, playbooks/cluster/reset-node.sh: `kubeadm reset -f` (on a stacked control plane it removes
   the local etcd member first: kubeadm's remove-etcd-member phase; when etcd refuses, kubeadm only warns,
   and the reset stops there: Node and etcd data kept, `reset.etcd-member-kept`), then what kubeadm leaves
   behind (Calico's and Flannel's CNI files, state and interfaces, kube-proxy's and the CNI's iptables rules,
   /var/lib/kubelet with its volumes unmounted first, /etc/kubernetes, a control plane's etcd data, the
   kubeconfigs whose only cluster is this one), the kubelet stopped and disabled.
3. the Node object deleted. After the host's reset, not before: a kubelet that still runs would register
   the node again.
4. with --purge, playbooks/cluster/reset-purge.sh: the packages and repositories gpuk8s added, and every
   file gpuk8s changed restored from /var/lib/gpuk8s/backup.

A worker that is not reachable over SSH is drained and its Node deleted (a dead node leaves the cluster);
its host is reported as not reset. A control plane that is not reachable is left alone: only kubeadm reset on
it removes its etcd member.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuk8s.errors import GpuK8sError
from gpuk8s.facts.model import CRI_SOCKETS
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube import render
from gpuk8s.kube.client import KubeError, drain_args
from gpuk8s.phases import shell
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult
from gpuk8s.phases.hostfiles import tail
from gpuk8s.text import clean

RESET_TIMEOUT = 900.0  # kubeadm reset waits for the kubelet and containers to stop


@dataclass(frozen=True)
class Refusal:
    """Why a reset is refused before anything is done: a registered finding id, the reason and the remedy."""

    id: str
    message: str
    remedy: str


def order(inv: Inventory, targets: Iterable[Host]) -> list[Host]:
    """The safe order: workers first, then the other control planes (last listed first), the first control
    plane (the one gpuk8s initialised and talks to) last."""
    chosen = {h.name for h in targets}
    first = inv.control_planes[0].name
    workers = [h for h in inv.hosts if h.name in chosen and not h.is_control_plane]
    cps = [h for h in reversed(inv.control_planes) if h.name in chosen and h.name != first]
    return workers + cps + [h for h in inv.hosts if h.name == first and h.name in chosen]


def refusal(inv: Inventory, targets: Iterable[Host], all_hosts: bool,
            control_plane_nodes: Iterable[str], ready: Iterable[str] | None = None) -> Refusal | None:
    """Whether resetting `targets` would leave the cluster without a control plane or break etcd's quorum.

    `control_plane_nodes`: the control planes that are nodes of the cluster now (each runs an etcd member,
    kubeadm's stacked topology); `ready`: those of them that are Ready (None: all). A member that is down still
    counts in the quorum but cannot vote: the Ready ones that stay must be a quorum of the members that stay.
    With --all the whole cluster goes and nothing is refused."""
    if all_hosts:
        return None
    names = {h.name for h in targets}
    members = [n for n in control_plane_nodes]
    first = inv.control_planes[0].name
    if first in names and first in members:
        leaving = sorted(n for n in names if n in members)
        if len(leaving) == len(members):
            return Refusal("reset.last-control-plane",
                           f"{first} is the last control plane of the cluster: resetting it ends the cluster",
                           "to tear the whole cluster down, run gpuk8s reset --all")
        return Refusal("reset.first-control-plane",
                       f"{first} is the first control plane of the inventory, the one gpuk8s initialised the "
                       "cluster on and runs kubectl and kubeadm token on",
                       "reset the other hosts, or tear the whole cluster down with gpuk8s reset --all")
    leaving = sorted(n for n in names if n in members)
    if not leaving:
        return None
    n, k = len(members), len(leaving)
    quorum = n // 2 + 1
    if n - k < quorum:
        return Refusal("reset.etcd-quorum",
                       f"removing {k} of the {n} control planes ({', '.join(leaving)}) leaves {n - k} etcd "
                       f"member(s) while the removal needs a quorum of {quorum}: etcd would lose its quorum "
                       f"and the cluster its API (an etcd of {n} tolerates {(n - 1) // 2} failure(s))",
                       "add a control plane first (gpuk8s join), or remove fewer at once; --all tears the whole "
                       "cluster down")
    up = set(members if ready is None else ready)
    staying = [m for m in members if m not in leaving]
    healthy = [m for m in staying if m in up]
    need = len(staying) // 2 + 1
    if len(healthy) < need:
        down = sorted(m for m in members if m not in up)
        return Refusal("reset.etcd-quorum",
                       f"removing {', '.join(leaving)} leaves {len(staying)} etcd member(s), of which only "
                       f"{len(healthy)} run on a Ready control plane ({', '.join(down)} not Ready): the quorum of "
                       f"{len(staying)} is {need}, so etcd would lose its quorum and the cluster its API",
                       f"bring {', '.join(down)} back (Ready) first, or remove the member that is down instead")
    return None


@dataclass
class NodeOutcome:
    """One node's reset: what happened, how long it took, and the finding id of its result."""

    name: str
    status: str = "pending"  # reset | failed | skipped
    message: str = ""
    remedy: str = ""
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)
    id: str = "reset.node-reset"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "id": self.id, "message": self.message,
                "remedy": self.remedy, "seconds": round(self.seconds, 2), "steps": self.steps}


ETCD_KEPT = "/var/lib/gpuk8s/etcd-member-kept"  # reset-node.sh: this control plane's etcd member is still in etcd
# reset-node.sh: the etcd manifest's --data-dir is not below /var/lib, so it was named and not removed
ETCD_DIR_REFUSED = "@@gpuk8s-etcd-dir-refused"


def _node_values(inv: Inventory, h: Host) -> dict[str, str]:
    return {"user": h.ssh.user, "endpoint": render.endpoint(inv),
            "cri_socket": CRI_SOCKETS[inv.cluster.container_runtime],
            "control_plane": "yes" if h.is_control_plane else "no"}


def node_script(inv: Inventory, h: Host) -> str:
    return shell.command("reset-node", **_node_values(inv, h))


def purge_script(inv: Inventory) -> str:
    return shell.command("reset-purge", lock_timeout=inv.install.package_lock_timeout)


class Reset(Phase):
    name = "reset"
    title = "drain, reset and remove nodes"

    def __init__(self, targets: list[Host], *, purge: bool, drain_timeout: int, all_hosts: bool) -> None:
        self.targets = targets  # in the order of `order`
        self.purge = purge
        self.drain_timeout = drain_timeout
        self.all_hosts = all_hosts
        self.outcomes: list[NodeOutcome] = []

    def _present(self, ctx: Context) -> set[str]:
        if not ctx.initialized():
            return set()
        return {n["metadata"]["name"] for n in ctx.kube.get("nodes")}

    def _last(self, ctx: Context, h: Host) -> bool:
        """The first control plane in --all: the cluster goes with it, there is no API left to ask."""
        return self.all_hosts and h.name == ctx.cp.name

    def plan(self, ctx: Context) -> PhasePlan:
        present = self._present(ctx)
        changes: list[Change] = []
        for h in self.targets:
            if h.name in present and not self._last(ctx, h):
                changes.append(Change(f"drain {h.name} (cordon; PodDisruptionBudgets respected; at most "
                                      f"{self.drain_timeout} s)", ctx.cp.name,
                                      "kubectl --kubeconfig /etc/kubernetes/admin.conf "
                                      + " ".join(drain_args(h.name, self.drain_timeout))))
            changes.append(Change(f"kubeadm reset -f on {h.name}, then its CNI, iptables, kubelet and kubeconfig "
                                  "leftovers" + (" (removes its etcd member)" if h.is_control_plane else ""),
                                  h.name, node_script(ctx.inv, h)))
            if h.name in present and not self._last(ctx, h):
                changes.append(Change(f"delete the Node object {h.name}", ctx.cp.name,
                                      f"kubectl --kubeconfig /etc/kubernetes/admin.conf delete node {h.name} "
                                      "--ignore-not-found"))
            if self.purge:
                changes.append(Change(f"purge {h.name}: packages and repositories gpuk8s added, files restored "
                                      "from /var/lib/gpuk8s/backup", h.name, purge_script(ctx.inv)))
        if not changes:
            return self.planned("unchanged", "no host to reset")
        gone = [h.name for h in self.targets if h.name not in present]
        reason = f"{len(self.targets)} host(s), in this order: {', '.join(h.name for h in self.targets)}"
        if gone:
            reason += f" ({', '.join(gone)} not a node of the cluster: host reset only)"
        return self.planned("would-change", reason, changes)

    def run(self, ctx: Context) -> PhaseResult:
        r = self.result("pending")
        present = self._present(ctx)
        for i, h in enumerate(self.targets):
            out = NodeOutcome(h.name)
            self.outcomes.append(out)
            t0 = time.monotonic()
            try:
                self._one(ctx, h, h.name in present, out)
            except GpuK8sError as e:
                out.status, out.message, out.remedy = "failed", e.message, e.remedy
                if out.id == "reset.node-reset":
                    out.id = "reset.node-failed"
            out.seconds = time.monotonic() - t0
            r.hosts[h.name] = (f"reset in {out.seconds:.1f} s" if out.status == "reset"
                               else f"{out.status}: {out.message}")
            ctx.emit(f"{h.name}: {r.hosts[h.name]}")
            if out.status == "failed":
                for later in self.targets[i + 1:]:
                    self.outcomes.append(NodeOutcome(later.name, "skipped", f"not reset: {h.name} failed first",
                                                     "fix that, then run gpuk8s reset again", id="reset.skipped"))
                    r.hosts[later.name] = f"skipped: {h.name} failed first"
                r.status, r.message, r.remedy = "failed", f"{h.name}: {out.message}", out.remedy
                return r
        r.status = "changed" if self.targets else "unchanged"
        r.message = f"reset {len(self.targets)} host(s)"
        return r

    def _one(self, ctx: Context, h: Host, in_cluster: bool, out: NodeOutcome) -> None:
        last = self._last(ctx, h)
        if h.is_control_plane and in_cluster and not last and h.name not in ctx.sessions:
            # only kubeadm reset on the host removes its etcd member: deleting the Node would leave a member
            # that etcd still counts in its quorum and nothing would show it
            out.id = "reset.host-unreachable"
            raise PhaseError(f"control plane {h.name} is not reachable over SSH: nothing was done (its Node and its "
                             "etcd member stay; only kubeadm reset on the host removes the member)",
                             f"bring {h.name} back, then run gpuk8s reset {h.name} again; if it is gone for good, "
                             "remove its member with etcdctl member remove on a healthy control plane, then "
                             f"kubectl delete node {h.name}")
        if in_cluster and not last:
            try:
                ctx.kube.drain(h.name, self.drain_timeout)
            except KubeError as e:
                if "disruption budget" in e.message:
                    out.id = "reset.drain-blocked"
                    raise PhaseError(f"drain of {h.name} did not finish within {self.drain_timeout} s: a "
                                     f"PodDisruptionBudget allows no eviction: {e.message}",
                                     f"{h.name} stays cordoned and untouched: let the budget allow it (scale the "
                                     "workload up so that its replicas run elsewhere), or raise --drain-timeout; "
                                     f"'kubectl uncordon {h.name}' undoes the cordon") from None
                out.id = "reset.drain-failed"
                raise PhaseError(f"drain of {h.name} failed: {e.message}",
                                 f"{h.name} stays cordoned and untouched: move or delete what kubectl names, "
                                 f"then run gpuk8s reset {h.name} again; 'kubectl uncordon {h.name}' undoes the "
                                 "cordon") from None
            out.steps.append("drained")
        s = ctx.sessions.get(h.name)
        if s is None:
            if in_cluster and not last:
                ctx.kube.delete_node(h.name)
                out.steps.append("Node deleted")
            out.id = "reset.host-unreachable"
            raise PhaseError(f"{h.name} is not reachable over SSH: "
                             + ("its Node was deleted, its host not reset" if in_cluster else "not reset"),
                             f"bring {h.name} back, then run gpuk8s reset {h.name} again to clean the host")
        res = s.run(shell.script("reset-node", **_node_values(ctx.inv, h)), sudo=True,
                    timeout=RESET_TIMEOUT, display=f"kubeadm reset -f and cleanup on {h.name}")
        if h.is_control_plane and ("@@gpuk8s-etcd-member-kept" in res.stdout
                                   or "failed to remove etcd member" in res.stdout.lower()):
            out.id = "reset.etcd-member-kept"
            said = next((ln.strip()[-400:] for ln in res.stdout.splitlines()
                         if "failed to remove etcd member" in ln.lower()),
                        f"an earlier reset could not, {ETCD_KEPT} says so")
            raise PhaseError(f"kubeadm reset could not remove the etcd member of {h.name} ({said}); its Node, "
                             "its etcd data and the rest of the host were kept",
                             "remove the member on a healthy control plane (kubectl -n kube-system exec "
                             "etcd-NODE -- etcdctl --endpoints https://127.0.0.1:2379 --cacert "
                             "/etc/kubernetes/pki/etcd/ca.crt --cert /etc/kubernetes/pki/etcd/server.crt --key "
                             "/etc/kubernetes/pki/etcd/server.key member list, then member remove ID), then on "
                             f"{h.name} remove {ETCD_KEPT} and run gpuk8s reset {h.name} again")
        if not res.ok or "@@gpuk8s-reset-done" not in res.stdout:
            out.id = "reset.host-failed"
            raise PhaseError(f"the reset of {h.name} failed (exit status {res.exit_status}): {tail(res)}",
                             f"fix the cause on {h.name}, then run gpuk8s reset {h.name} again")
        if "@@gpuk8s-kubeadm-reset-failed" in res.stdout:
            out.steps.append("kubeadm reset failed; its files were removed anyway")
        else:
            out.steps.append("kubeadm reset")
        out.steps.append("leftovers removed, kubelet stopped and disabled")
        refused = next((ln.split(" ", 1)[1] for ln in res.stdout.splitlines()
                        if ln.startswith(f"{ETCD_DIR_REFUSED} ")), None)
        if refused is not None:  # host text: shown cleaned and cut, never acted on
            shown = clean(refused)[:200]
            out.steps.append(f"etcd's --data-dir {shown} kept: not below /var/lib, not removed")
            out.remedy = (f"check {shown} on {h.name}: the etcd manifest named it as etcd's data directory; remove "
                          "it by hand if it is")
        if in_cluster and not last:
            ctx.kube.delete_node(h.name)
            out.steps.append("Node deleted")
        if self.purge:
            res = s.run(shell.script("reset-purge", lock_timeout=ctx.inv.install.package_lock_timeout), sudo=True,
                        timeout=RESET_TIMEOUT, display=f"purge {h.name}")
            if not res.ok or "@@gpuk8s-purge-done" not in res.stdout:
                out.id = "reset.host-failed"
                raise PhaseError(f"the purge of {h.name} failed (exit status {res.exit_status}): {tail(res)}",
                                 f"fix the cause on {h.name}, then run gpuk8s reset --purge {h.name} again")
            out.steps.append("purged: " + "; ".join(
                ln for ln in res.stdout.splitlines() if ln.startswith(("removed", "restored", "kept"))
            )[:2000])
        out.status = "reset"
        out.message = ", ".join(out.steps[:4])
        if h.is_control_plane and in_cluster and not last:
            out.message += "; its etcd member was removed by kubeadm reset"
