"""Phase gpu: what GPU nodes need from the API: RuntimeClass nvidia, the NVIDIA device plugin, and every
node's labels and taints as its GPU plan says (gpuk8s/gpuplan.py).

Manifests are applied only when the sha256 of their rendered text differs from what the cluster has
(gpuk8s/kube/manifests.py); labels and taints only where they differ.
"""

from __future__ import annotations

import shlex

from gpuk8s.gpuplan import GPUPlan
from gpuk8s.kube import manifests, state
from gpuk8s.kube.client import label_args, taint_args
from gpuk8s.kube.state import StateError
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult


def node_changes(plan: GPUPlan, node: state.NodeState) -> tuple[dict[str, str], list[str]]:
    """The labels to set and the taints to add so that the node matches its plan."""
    missing = state.missing_taints([(t.key, t.value, t.effect) for t in plan.taints], node)
    return (state.label_changes(plan.labels, node),
            [str(t) for t in plan.taints if (t.key, t.value, t.effect) in missing])


class GPUNodes(Phase):
    name = "gpu"
    title = "NVIDIA device plugin, labels, taints"

    def _node_diffs(self, ctx: Context) -> dict[str, tuple[dict[str, str], list[str]]]:
        nodes = state.by_name(ctx.kube.get("nodes"))
        out = {}
        for name, plan in ctx.plans.items():
            if name not in nodes:
                continue
            try:
                diff = node_changes(plan, state.node_state(nodes[name]))
            except StateError as e:
                raise PhaseError(f"the node object of {name} is unreadable: {e}", "see the log file") from None
            if diff[0] or diff[1]:
                out[name] = diff
        return out

    def plan(self, ctx: Context) -> PhasePlan:
        wanted = manifests.wanted(ctx.inv, ctx.plans)
        if not ctx.initialized():
            todo, diffs = wanted, {}
            reason = "no cluster yet: every manifest; labels and taints as each node joins"
        else:
            todo, diffs = manifests.out_of_date(ctx.kube, wanted), self._node_diffs(ctx)
            reason = "what differs from the cluster"
        changes = [Change(f"apply {m.name} (sha256 {m.sha256[:12]})", manifest=m.applied_text()) for m in todo]
        for name, (labels, taints) in diffs.items():
            if labels:
                changes.append(Change(f"label {name}", commands="kubectl " + shlex.join(label_args(name, labels))))
            if taints:
                changes.append(Change(f"taint {name}", commands="kubectl " + shlex.join(taint_args(name, taints))))
        if not changes:
            return self.planned("unchanged", "manifests, labels and taints as wanted")
        return self.planned("would-change", reason, changes)

    def run(self, ctx: Context) -> PhaseResult:
        r = self.result("unchanged", "manifests, labels and taints as wanted")
        done = [f"applied {name}" for name in manifests.apply(ctx.kube, manifests.wanted(ctx.inv, ctx.plans))]
        for name, (labels, taints) in self._node_diffs(ctx).items():
            if labels:
                ctx.kube.label(name, labels)
                r.hosts[name] = "labelled " + ", ".join(sorted(labels))
                done.append(f"labels on {name}")
            if taints:
                ctx.kube.taint(name, taints)
                r.hosts[name] = (r.hosts.get(name, "") + " tainted " + ", ".join(taints)).strip()
                done.append(f"taints on {name}")
        if done:
            r.status, r.message = "changed", "; ".join(done)
        return r
