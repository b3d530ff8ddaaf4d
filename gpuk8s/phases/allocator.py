"""Phase allocator: move running nodes between the NVIDIA device plugin and NVIDIA's DRA driver (docs/dra.md),
one node at a time, as `gpuk8s allocator NODE... --to dra|device-plugin` asks.

Per node: cordon it (marked, as upgrade does: a resumed run knows the cordon is gpuk8s's), wait for its GPU pods
(those asking nvidia.com/ resources or holding claims) to finish and drain it; apply the GPU manifests of the
inventory (which already says the node's new allocator: the DRA driver where a node uses it, the device plugin kept
off dra nodes) and give the node its new labels; wait until the new allocator offers every GPU of the node's plan
(its ResourceSlice, or the node's allocatable); run verify's test pod on it; uncordon it. If the GPUs do not come or
the test pod fails, the node gets its former labels back, and is uncordoned (when the cordon was gpuk8s's) once the
former allocator offers its GPUs again: the node is as it was, and the finding says why. A node already on its
target allocator, offering its GPUs, is left as it is (an interrupted run's cordon is undone): a re-run resumes.
What is measured: the seconds each node's GPUs could take no new pod (from the cordon to the uncordon)."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuk8s import findings
from gpuk8s.errors import GpuK8sError
from gpuk8s.gpuplan import ALLOCATOR_LABEL, DRA, LEGACY_ALLOCATOR_LABEL, MANAGED_LABELS, MANAGED_PREFIXES, GPUPlan
from gpuk8s.inventory.model import Host
from gpuk8s.kube import dra, manifests, moves, state
from gpuk8s.kube.client import drain_args
from gpuk8s.kube.state import NodeCheck
from gpuk8s.phases import nodeops
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.phases.gpu import as_they_are, gpu_manifests, move_allocator_labels, node_changes
from gpuk8s.phases.nodeops import CORDONED_BY, NodeFailure, NodeOptions, NodeOutcome
from gpuk8s.phases.poll import until
from gpuk8s.phases.verify import Verify, offered, wait_offered
from gpuk8s.preflight.dra_checks import not_ready_now

# the manifests a move applies (or removes): the device plugin (kept off dra nodes), its configs (the config a node
# moved to it selects), the DRA driver
MOVED = (manifests.PLUGIN_MANIFEST, manifests.PLUGIN_CONFIGS_MANIFEST, manifests.DRA_MANIFEST)
MARK = "allocator"  # the value of the cordon mark a move sets: only its own cordon is a move's to undo


class AllocatorMove(Phase):
    name = "allocator"
    title = "move nodes between the device plugin and the DRA driver"
    resume = "gpuk8s allocator"

    def __init__(self, nodes: list[str], opts: NodeOptions,
                 on_node: Callable[[str, float], None] | None = None) -> None:
        self.opts = opts
        self.on_node = on_node or (lambda name, seconds: None)
        self.nodes = nodes
        self.unavailable: dict[str, float] = {}  # node -> seconds its GPUs took no new pod

    def _hosts(self, ctx: Context) -> list[Host]:
        by = {h.name: h for h in ctx.inv.hosts}
        return [by[n] for n in self.nodes]

    def _node_obj(self, ctx: Context, name: str) -> dict[str, object]:
        found = ctx.kube.get("nodes", name)
        if not found:
            raise NodeFailure("allocator.failed", f"{name} is not a node of the cluster", f"gpuk8s join {name}")
        return found[0]

    @staticmethod
    def _test_pod(ctx: Context, plan: GPUPlan) -> NodeCheck:
        """verify's test pod(s) on the node: through a claim on a dra node (and nvidia.com/gpu where the DeviceClass
        names it), else nvidia.com/gpu from the device plugin."""
        n = sum(plan.dra_devices.values()) if plan.dra else plan.expected_gpus
        c = NodeCheck(plan.node, True, True, n, n)
        Verify().test_pods(ctx, [c])
        return c

    def _move(self, ctx: Context, h: Host) -> NodeOutcome:
        plan = ctx.plans[h.name]
        target = plan.allocator
        node = self._node_obj(ctx, h.name)
        marked = state.node_state(node).labels.get(CORDONED_BY) == MARK  # an earlier move's cordon
        if dra.allocator_of(node, target) == target and offered(ctx, plan)[0]:
            if not marked:
                moves.forget(ctx.kube, h.name)  # a move that ended without this command (install moved it)
                return NodeOutcome("already", f"already on {target}")
            again = self._test_pod(ctx, plan)  # an earlier run stopped between its switch and its uncordon
            if not again.ok:
                raise NodeFailure("allocator.failed", f"{h.name}: on {target} since an earlier run, but {again.cause}; "
                                  "left cordoned", f"gpuk8s doctor node/{h.name}; then re-run {self.resume}")
            moves.forget(ctx.kube, h.name)
            return NodeOutcome("resumed", f"already on {target}; test pod passed; "
                               f"{nodeops.give_back(ctx.kube, h.name)} (an earlier run stopped)")
        facts = ctx.facts.get(h.name)
        why = not_ready_now(facts, ctx.inv.cluster) if target == DRA and facts is not None and not marked else ""
        if why:  # before anything changes (a move an earlier run began goes on, to its end or its put-back): it
            # would end in a failed proof and a put-back, the node drained for nothing (issue 41)
            raise NodeFailure("allocator.failed", f"{h.name}: not moved to {target}: {why}",
                              f"gpuk8s install -i INVENTORY brings a DRA node its containerd and moves it where no GPU "
                              f"pod holds it (gpuk8s driver upgrade for the driver); then re-run {self.resume}")
        before = {k: v for k, v in state.node_state(node).labels.items()
                  if k in MANAGED_LABELS or k.startswith(MANAGED_PREFIXES)}
        # where it is: the old label counts here as well (a node gpuk8s put on DRA before the protected label, moved
        # off it before any install moved its label: its DRA driver is what serves it, and what a failure gives back)
        was = dra.allocator_of(node, DRA)
        if was == DRA:  # as the protected label says it (one of gpuk8s up to main 3c20938 moves to it)
            before = {k: v for k, v in before.items() if k != LEGACY_ALLOCATOR_LABEL} | {ALLOCATOR_LABEL: DRA}
        # the node as it was before this move, kept in kube-system (no node can write there) until the move ends:
        # a move stopped after the relabel and failing on the re-run puts the node back where it really was, not
        # onto the target its labels already name
        was, before = moves.record(ctx.kube, h.name, was, before, target)
        t0 = time.monotonic()
        mine, waited = nodeops.vacate(ctx.kube, h.name, MARK, self.opts, ctx.emit, self.resume,
                                      "allocator.drain-failed")
        try:
            # the allocators' manifests with this node on its new allocator and every other node on the one it is on
            # now (a node of the same group not moved yet keeps its allocator: nothing serves its GPUs twice)
            nodes = state.by_name(ctx.kube.get("nodes"))
            if move_allocator_labels(ctx, nodes):  # before the DRA driver's manifest selects by the new label
                nodes = state.by_name(ctx.kube.get("nodes"))
            plans = as_they_are(ctx, nodes, {h.name})
            manifests.apply(ctx.kube, [m for m in gpu_manifests(ctx, plans) if m.name in MOVED])
            labels = node_changes(plan, state.node_state(self._node_obj(ctx, h.name)))[0]  # as the gpu phase does
            if labels:
                ctx.kube.label(h.name, labels)
            ok, what = wait_offered(ctx, plan, self.opts.drain_timeout, self.opts.poll)
            check = self._test_pod(ctx, plan) if ok else None
            cause = "" if ok and check is not None and check.ok else (
                f"its GPUs were not offered within {self.opts.drain_timeout} s ({what})" if not ok else
                check.cause if check is not None else "")
        except GpuK8sError as e:  # the API refused something midway: put it back all the same
            cause = f"{e.message} ({e.remedy})" if e.remedy else e.message
        if cause:
            back = self._put_back(ctx, h, before, mine)
            moves.forget(ctx.kube, h.name)
            raise NodeFailure("allocator.failed", f"{h.name}: {target} failed: {cause}; put back on {was} ({back})",
                              f"gpuk8s doctor node/{h.name} names the cause; fix it, then re-run {self.resume} "
                              f"{h.name} --to {target} (the inventory already says {target})")
        back = nodeops.left_as_it_was(ctx.kube, h.name, mine)
        moves.forget(ctx.kube, h.name)
        seconds = time.monotonic() - t0
        # no node on DRA any more: the driver's objects go (those gpuk8s applied)
        after = as_they_are(ctx, state.by_name(ctx.kube.get("nodes")), set())
        manifests.remove(ctx.kube, [m for m in manifests.unwanted(ctx.inv, after) if m.name in MOVED])
        self.unavailable[h.name] = seconds
        self.on_node(h.name, seconds)
        ctx.emit(f"{h.name}: {was} -> {target}; GPUs unavailable {seconds:.1f} s")
        self.opts.findings.append(findings.passed("allocator.moved", f"{h.name}: {was} -> {target} ({what})",
                                                  subject=findings.node(h.name)))
        return NodeOutcome("done", "; ".join([
            *([f"waited for GPU pods {', '.join(waited)}"] if waited else []), "drained", f"{was} -> {target} ({what})",
            f"test pod {check.pod if check else ''} passed", back, f"GPUs unavailable {seconds:.1f} s"]))

    def _put_back(self, ctx: Context, h: Host, before: dict[str, str], mine: bool) -> str:
        """The node's former labels back (its former allocator takes it again), then its cordon undone once that
        allocator offers its GPUs (else it stays cordoned: nothing would run on it anyway)."""
        node = self._node_obj(ctx, h.name)
        ns = state.node_state(node)
        owned = tuple(k for k in ns.labels if k in MANAGED_LABELS or k.startswith(MANAGED_PREFIXES))
        changes = state.label_changes(before, ns, owned)
        if changes:
            ctx.kube.label(h.name, changes)
        # the manifests as the nodes are again (the device plugin kept off this node if it is back on DRA)
        plans = as_they_are(ctx, state.by_name(ctx.kube.get("nodes")), set())
        manifests.apply(ctx.kube, [m for m in gpu_manifests(ctx, plans) if m.name in MOVED])
        ok, what = self._wait_former(ctx, h.name, before.get(ALLOCATOR_LABEL) == DRA)
        if not ok:
            return f"left cordoned: its former allocator offers {what}"
        return nodeops.left_as_it_was(ctx.kube, h.name, mine) + f", {what}"

    def _wait_former(self, ctx: Context, name: str, was_dra: bool) -> tuple[bool, str]:
        """Until the former allocator offers GPUs on the node again (its sharing or MIG settings, which the former
        labels carry, decide how many: any is enough to say it serves the node)."""
        def serves() -> tuple[bool, str]:
            if was_dra:
                nd = dra.published(ctx.kube.get("resourceslices")).get(name)
                have, what = (len(nd.devices) if nd else 0), "device(s) in its ResourceSlice"
            else:
                ns = state.node_state(self._node_obj(ctx, name))
                have = sum(ns.allocatable_of(k) for k in ns.allocatable if k.startswith("nvidia.com/"))
                what = "nvidia.com/ resource(s) allocatable"
            return bool(have), f"{have} {what}"

        return until(serves, self.opts.drain_timeout, self.opts.poll)

    def plan(self, ctx: Context) -> PhasePlan:
        changes: list[Change] = []
        todo = []
        nodes = state.by_name(ctx.kube.get("nodes"))
        seen: set[str] = set()  # the nodes moved before this one, in this run
        applied: dict[str, str] = {}  # manifest -> the sha256 a change above applies
        for h in self._hosts(ctx):
            plan = ctx.plans[h.name]
            try:
                node = self._node_obj(ctx, h.name)
            except NodeFailure as e:
                changes.append(Change(f"{h.name}: not moved: {e.message}"))
                continue
            if dra.allocator_of(node, plan.allocator) == plan.allocator and offered(ctx, plan)[0]:
                continue
            todo.append(h.name)
            pods = nodeops.gpu_pods(ctx.kube, h.name)
            changes.append(Change(f"cordon {h.name}; wait (at most {self.opts.gpu_pod_timeout:g} s) for its GPU pods"
                                  + (f": {', '.join(pods)}" if pods else "") + "; drain it", "",
                                  "kubectl " + " ".join(drain_args(h.name, self.opts.drain_timeout))))
            done = seen | {h.name}
            plans = as_they_are(ctx, nodes, done)  # the manifests as they will be when this node moves
            for m in manifests.out_of_date(ctx.kube, [m for m in gpu_manifests(ctx, plans) if m.name in MOVED]):
                if applied.get(m.name) != m.sha256:  # each text once
                    applied[m.name] = m.sha256
                    changes.append(Change(f"apply {m.name} (sha256 {m.sha256[:12]})", manifest=m.applied_text()))
            now = dra.allocator_of(node, plan.allocator)
            changes.append(Change(f"{h.name}: {now} -> {plan.allocator}: label {ALLOCATOR_LABEL}"
                                  + ("=dra" if plan.dra else " removed") + "; wait for its GPUs; a test pod; "
                                  "uncordon (or put back as it was if they fail)"))
            seen = done
        if not todo:
            return self.planned("unchanged", "every node named is on the allocator its inventory says")
        # once the last node left DRA: its driver's objects (those gpuk8s applied)
        after = as_they_are(ctx, nodes, seen)
        changes += [Change(f"delete {kind.lower()}/{name} of {m.name} (no node uses it any more)",
                           commands=manifests.delete_command((kind, name, ns)))
                    for m, gone in manifests.removable(ctx.kube, [m for m in manifests.unwanted(ctx.inv, after)
                                                                  if m.name in MOVED])
                    for kind, name, ns in gone]
        return self.planned("would-change", f"{len(todo)} node(s) to move, one at a time ({', '.join(todo)})",
                            changes)

    def run(self, ctx: Context) -> PhaseResult:
        out = nodeops.each_node(self._hosts(ctx), lambda h: self._move(ctx, h), self.opts, "allocator.failed",
                                self.resume, at_once=1)  # one at a time: each is drained
        return nodeops.node_result(
            self, out, remedy=f"fix the cause, then re-run {self.resume}: moved nodes are skipped",
            unchanged="every node named is on the allocator its inventory says",
            changed=lambda done, resumed: "; ".join(
                [*(["moved " + ", ".join(f"{n} (GPUs unavailable {self.unavailable[n]:.1f} s)" for n in done)]
                   if done else []),
                 *([f"finished {', '.join(resumed)} (an earlier run stopped before its uncordon)"]
                   if resumed else [])]))
