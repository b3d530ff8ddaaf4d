"""Phase gpu: what GPU nodes need from the API: RuntimeClass nvidia, the NVIDIA device plugin, and every
node's labels and taints as its GPU plan says (gpuk8s/gpuplan.py).

Manifests are applied only when the sha256 of their rendered text differs from what the cluster has
(gpuk8s/kube/manifests.py); labels and taints only where they differ.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpuk8s import fabricplan
from gpuk8s.gpuplan import (
    ALLOCATOR_LABEL,
    CONFIG_LABEL,
    DRA,
    FABRIC_LABELS,
    HAMI_NODE_LABEL,
    HAMI_NODE_VALUE,
    LEGACY_ALLOCATOR_LABEL,
    MANAGED_LABELS,
    MANAGED_PREFIXES,
    NCCL_CONFIG_PREFIX,
    NCCL_LABEL,
    REPLICAS_LABEL,
    STRATEGY_LABEL,
    GPUPlan,
    plan_on,
    quarantine_taint,
)
from gpuk8s.kube import dra, manifests, state
from gpuk8s.kube.client import label_args, taint_args
from gpuk8s.kube.state import StateError
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult

# The prepare steps that restart a node's container runtime with a new configuration (playbooks/containerd.yaml,
# docker.yaml). A device plugin that started before loaded NVML then or never: gpuk8s deploys it with
# FAIL_ON_INIT_ERROR=false, so one that found no NVML waits indefinitely ("No devices found. Waiting
# indefinitely."); its pod is restarted so that it starts under the runtime as it is now.
RUNTIME_RESTARTS = ("containerd-restarted", "docker-restarted")


def runtime_restarted(ctx: Context, planning: bool = False) -> list[str]:
    """The hosts whose container runtime prepare restarted; planning: those where it would (a dry run reports the
    steps that change the runtime's configuration as would-change, and the restart step itself as unchanged)."""
    rep = ctx.prepare_report
    if rep is None:
        return []
    if planning:
        return sorted(h.host.name for h in rep.hosts if any(
            s.outcome.status == "would-change"
            and (s.step.name in RUNTIME_RESTARTS or getattr(s.step, "restarts", "") in ("containerd", "docker"))
            for s in h.steps))
    return sorted(h.host.name for h in rep.hosts
                  if any(s.step.name in RUNTIME_RESTARTS and s.outcome.status == "changed" for s in h.steps))


def plugin_pods(ctx: Context, nodes: list[str]) -> dict[str, str]:
    """node -> the name of the device plugin's pod on it, for those of `nodes` that have one: the pod gpuk8s's
    DaemonSet owns (state.device_plugin_pod, the check the diagnosis makes), the only pod a restart deletes."""
    if not nodes:
        return {}
    pods = state.pod_states(ctx.kube.get("pods", namespace="kube-system"))
    found = {n: state.device_plugin_pod(pods, n) for n in nodes}
    return {n: p.name for n, p in found.items() if p is not None}


def owned_labels(node: state.NodeState) -> tuple[str, ...]:
    """The labels gpuk8s removes when the plan no longer has them: the sharing and GFD-named ones, and
    HAMi's gpu=on (only with that value: `gpu` may be a user's own label), and the MIG labels of a node's
    former layout (nvidia.com/mig-<profile>.*)."""
    return tuple(k for k in MANAGED_LABELS
                 if k != HAMI_NODE_LABEL or node.labels.get(k) == HAMI_NODE_VALUE) + tuple(
        k for k in sorted(node.labels) if k.startswith(MANAGED_PREFIXES))


def node_changes(plan: GPUPlan, node: state.NodeState, quarantine: str | None = None,
                 fabric: dict[str, str] | None = None) -> tuple[dict[str, str | None], list[str]]:
    """The labels to set (None: to remove) and the taints to add so that the node matches its plan, and the
    quarantine taint where the health phase put the node in quarantine (`quarantine`: the failing finding's id); a
    label the plan cannot decide (no facts for the host) is neither set nor removed. No taint is ever removed
    here: the quarantine's only by `gpuk8s health --release`. `fabric`: the node's fabric labels (fabricplan; {} for
    a node without a fabric), None where its facts were not read (its fabric labels are left as they are)."""
    want = [*plan.taints, *([quarantine_taint(quarantine)] if quarantine else [])]
    # a quarantined node keeps the finding it was quarantined for first: a second one does not overwrite it
    if quarantine and node.quarantine:
        want = list(plan.taints)
    missing = state.missing_taints([(t.key, t.value, t.effect) for t in want], node)
    owned = tuple(k for k in owned_labels(node) if plan.decides(k) and (fabric is not None or k not in FABRIC_LABELS))
    if fabric and RATE_LABEL not in fabric and RATE_LABEL in node.labels:
        fabric = {**fabric, RATE_LABEL: node.labels[RATE_LABEL]}  # every port down: the rate is as it was
    labels = {k: v for k, v in plan.labels.items() if plan.decides(k)} | (fabric or {})
    return (state.label_changes(labels, node, owned),
            [str(t) for t in want if (t.key, t.value, t.effect) in missing])


def fabric_labels(ctx: Context, name: str) -> dict[str, str] | None:
    """The node's fabric labels (gpuk8s/fabricplan.py); None where its facts were not read."""
    host = next((h for h in ctx.inv.hosts if h.name == name), None)
    if host is None or name not in ctx.facts:
        return None
    fp = fabricplan.plan(host, ctx.facts[name])
    return fp.labels() if fp is not None else {}


def as_they_are(ctx: Context, nodes: dict[str, Any], switching: set[str]) -> dict[str, GPUPlan]:
    """The plans the manifests must follow: each node of the cluster that this run does not switch (`switching`)
    counted on the allocator it is on now (its label), so that the device plugin keeps off a node still on DRA and
    the DRA driver stays while one is (both would hand out the same GPUs otherwise)."""
    by = {h.name: h for h in ctx.inv.hosts}
    out = dict(ctx.plans)
    for name, plan in ctx.plans.items():
        if name in switching or name not in nodes or not plan.gpu_node or name not in by:
            continue
        now = dra.allocator_of(nodes[name], plan.allocator)
        if now != plan.allocator:
            out[name] = plan_on(by[name], ctx.facts.get(name), now)
    return out


def legacy_allocator_label(node: Any) -> bool:
    """Whether the node carries only the allocator label of gpuk8s up to main 3c20938 (a DRA node that must get the
    protected one before any manifest that selects by it is applied: else the DRA kubelet plugin would leave it, and
    the device plugin keeps off it by the old label's exclusion: its GPUs served by neither)."""
    md = (node or {}).get("metadata") if isinstance(node, dict) else None
    labels = md.get("labels") if isinstance(md, dict) else None
    return isinstance(labels, dict) and labels.get(LEGACY_ALLOCATOR_LABEL) == DRA and ALLOCATOR_LABEL not in labels


def legacy_nodes(ctx: Context, nodes: dict[str, Any]) -> list[str]:
    """The nodes the inventory puts on DRA whose objects (`nodes`) carry only the former allocator label."""
    return [name for name, plan in ctx.plans.items() if plan.dra and legacy_allocator_label(nodes.get(name))]


def move_allocator_labels(ctx: Context, nodes: dict[str, Any]) -> list[str]:
    """The nodes the inventory puts on DRA that carry only the former allocator label (legacy_allocator_label): given
    the protected one now."""
    moved = legacy_nodes(ctx, nodes)
    for name in moved:
        ctx.kube.label(name, {ALLOCATOR_LABEL: DRA})
    return moved


def gpu_manifests(ctx: Context, plans: dict[str, GPUPlan]) -> list[manifests.Manifest]:
    """The GPU manifests for these plans; the ConfigMap keeps the config each node selects whose plan cannot
    decide it (no facts)."""
    keep: dict[str, str] = {}
    blind = [n for n, p in plans.items() if not p.decides(CONFIG_LABEL)]
    if blind and ctx.initialized():
        nodes = state.by_name(ctx.kube.get("nodes"))
        found = ctx.kube.get("configmap", manifests.PLUGIN_CONFIGS, "kube-system")
        data = found[0].get("data") if found else None
        for n in blind:
            labels = (nodes.get(n) or {}).get("metadata", {}).get("labels") or {}
            name = labels.get(CONFIG_LABEL) if isinstance(labels, dict) else None
            if isinstance(data, dict) and isinstance(name, str) and isinstance(data.get(name), str):
                keep[name] = data[name]
    nccl = nccl_manifest(ctx)
    return manifests.wanted(ctx.inv, plans, keep) + ([nccl] if nccl is not None else [])


NCCL_MANIFEST = "nccl-env.yaml"
RATE_LABEL = f"{FABRIC_LABELS[0]}-rate"
NCCL_NAMESPACE = "default"


def nccl_manifest(ctx: Context) -> manifests.Manifest | None:
    """NCCL's environment for the fabric nodes (docs/fabric.md): one ConfigMap per distinct environment, in the
    default namespace, named by the node label gpuk8s.io/fabric-nccl (a job's nodeSelector and envFrom)."""
    envs = {fp.nccl_config(): fp.nccl_env() for fp in fabricplan.plans(ctx.inv.hosts, ctx.facts).values()}
    if not envs:
        return None
    docs = [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": name, "namespace": NCCL_NAMESPACE, "labels": {manifests.MANAGED_BY: "gpuk8s"}},
             "data": env} for name, env in sorted(envs.items())]
    return manifests.Manifest(NCCL_MANIFEST, yaml.safe_dump_all(docs, sort_keys=False))


def stale_nccl_configs(ctx: Context, wanted: list[manifests.Manifest], nodes: dict[str, Any],
                       diffs: dict[str, tuple[dict[str, str | None], list[str]]]) -> list[str]:
    """The NCCL ConfigMaps gpuk8s applied (its annotation) that neither this run's manifest nor a node's label (as
    this run leaves it) names, and that no pod in their namespace takes its environment from (a job started
    before a node's fabric changed keeps its ConfigMap until it ends)."""
    names = {o["metadata"]["name"] for m in wanted if m.name == NCCL_MANIFEST for o in m.objects()}
    for name, n in nodes.items():
        labels = (n.get("metadata") or {}).get("labels") or {}
        value = diffs[name][0].get(NCCL_LABEL) if name in diffs and NCCL_LABEL in diffs[name][0] \
            else labels.get(NCCL_LABEL)
        if isinstance(value, str):
            names.add(value)
    mine = [o["metadata"]["name"] for o in ctx.kube.get("configmap", namespace=NCCL_NAMESPACE)
            if str(o.get("metadata", {}).get("name", "")).startswith(NCCL_CONFIG_PREFIX)
            and manifests.applied_by_gpuk8s(o) and o["metadata"]["name"] not in names]
    if not mine:
        return []
    used = {ref for p in ctx.kube.get("pods", namespace=NCCL_NAMESPACE) for ref in config_maps_of(p)}
    return sorted(n for n in mine if n not in used)


def config_maps_of(pod: Any) -> set[str]:
    """The ConfigMaps a pod takes environment from (envFrom, env valueFrom) or mounts (volumes, projected)."""
    out: set[str] = set()
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return out
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if not isinstance(c, dict):
            continue
        for e in c.get("envFrom") or []:
            ref = e.get("configMapRef") if isinstance(e, dict) else None
            if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                out.add(ref["name"])
        for e in c.get("env") or []:
            ref = ((e.get("valueFrom") or {}).get("configMapKeyRef") if isinstance(e, dict) else None)
            if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                out.add(ref["name"])
    for v in spec.get("volumes") or []:  # mounted, whole or projected
        if not isinstance(v, dict):
            continue
        refs = [v.get("configMap")] + [x.get("configMap") for x in (v.get("projected") or {}).get("sources") or []
                                       if isinstance(x, dict)]
        out |= {r["name"] for r in refs if isinstance(r, dict) and isinstance(r.get("name"), str)}
    return out


@dataclass
class GPUDecision:
    """What the gpu phase decided, once, from the cluster and the plans: --dry-run renders it (`changes`), a run
    applies it (GPUNodes.apply); the two cannot differ."""

    initialized: bool
    # node -> (labels to set, None: to remove; taints to add), for the nodes whose labels or taints differ
    diffs: dict[str, tuple[dict[str, str | None], list[str]]] = field(default_factory=dict)
    # node -> why its allocator is not switched (GPU pods hold its GPUs: gpuk8s allocator moves it, drained first)
    held: dict[str, str] = field(default_factory=dict)
    was_shared: dict[str, bool] = field(default_factory=dict)  # node -> whether its labels said it shared its GPUs
    legacy: list[str] = field(default_factory=list)  # DRA nodes that get the protected allocator label first
    out_of_date: list[manifests.Manifest] = field(default_factory=list)  # the manifests that differ (applied)
    taken: dict[str, list[str]] = field(default_factory=dict)  # objects of those wanted that another tool made
    removable: list[tuple[manifests.Manifest, list[manifests.Ref]]] = field(default_factory=list)
    stale_configs: list[str] = field(default_factory=list)  # NCCL ConfigMaps no node names any more
    stale_plugins: dict[str, str] = field(default_factory=dict)  # node -> its plugin pod, under a restarted runtime

    def changes(self) -> list[Change]:
        """The decision in words and exact commands, in the order GPUNodes.apply makes them."""
        out = [Change(f"label {n} {ALLOCATOR_LABEL}={DRA} (the allocator label of gpuk8s up to main 3c20938 moved)",
                      commands="kubectl " + shlex.join(label_args(n, {ALLOCATOR_LABEL: DRA}))) for n in self.legacy]
        out += [Change(f"apply {m.name} (sha256 {m.sha256[:12]})", manifest=m.applied_text()) for m in self.out_of_date]
        if self.taken:
            out.append(Change(manifests.taken_message(self.taken)))
        # one change per object gpuk8s applied: a namesake another tool made is neither named nor deleted
        out += [Change(f"delete {kind.lower()}/{name} of {m.name} (no node asks for it)",
                       commands=manifests.delete_command((kind, name, ns)))
                for m, gone in self.removable for kind, name, ns in gone]
        for name, (labels, taints) in self.diffs.items():
            if labels:
                out.append(Change(f"label {name}", commands="kubectl " + shlex.join(label_args(name, labels))))
            if taints:
                out.append(Change(f"taint {name}", commands="kubectl " + shlex.join(taint_args(name, taints))))
        out += [Change(f"delete configmap/{n} in {NCCL_NAMESPACE} (no node's fabric names it)",
                       commands=manifests.delete_command(("ConfigMap", n, NCCL_NAMESPACE))) for n in self.stale_configs]
        out += [Change(f"restart the device plugin on {node} (its container runtime is reconfigured)",
                       commands=state.restart_command(pod)) for node, pod in self.stale_plugins.items()]
        out += [Change(f"{name}: {why}") for name, why in self.held.items()]  # not changed: said
        return out


class GPUNodes(Phase):
    name = "gpu"
    title = "NVIDIA device plugin, labels, taints"

    @staticmethod
    def _node_diffs(ctx: Context, nodes: dict[str, Any], d: GPUDecision) -> dict[str, GPUPlan]:
        """The label and taint changes per node into `d`; a node whose allocator would change while pods hold its
        GPUs is left as it is (d.held: why), and counted on its current allocator in the plans the manifests follow
        (returned)."""
        pods: list[Any] | None = None  # read once, only where a node's allocator would change
        switching: set[str] = set()  # the nodes this run gives their plan's allocator
        # join labels only the nodes it joins: the others keep what the last install gave them
        only = None if ctx.options.only is None else {h.name for h in ctx.options.only}
        for name, plan in ctx.plans.items():
            if name not in nodes or (only is not None and name not in only):
                continue
            try:
                ns = state.node_state(nodes[name])
                diff = node_changes(plan, ns, ctx.quarantine.get(name), fabric_labels(ctx, name))
                d.was_shared[name] = ns.labels.get(STRATEGY_LABEL, "none") != "none"
            except StateError as e:
                raise PhaseError(f"the node object of {name} is unreadable: {e}", "see the log file") from None
            if ALLOCATOR_LABEL in diff[0] and dra.allocator_of(nodes[name], plan.allocator) != plan.allocator:
                # another allocator would serve GPUs that running pods hold (both would hand them out): only
                # gpuk8s allocator moves a node, drained first
                if pods is None:
                    pods = ctx.kube.get("pods", namespace="*")
                holding = state.gpu_pods(pods, name)
                if holding:
                    was = dra.allocator_of(nodes[name], plan.allocator)
                    d.held[name] = (f"left on {was}: GPU pods hold its GPUs ({', '.join(holding[:5])}"
                                    f"{', ...' if len(holding) > 5 else ''}); gpuk8s allocator {name} --to "
                                    f"{plan.allocator} drains it first")
                    continue
            switching.add(name)
            if diff[0] or diff[1]:
                d.diffs[name] = diff
        return as_they_are(ctx, nodes, switching)

    def decide(self, ctx: Context, planning: bool) -> GPUDecision:
        """Everything the phase will do, read from the cluster once. planning: a dry run, where prepare has not run
        (the device plugin pods restarted are those under a runtime prepare would restart)."""
        if not ctx.initialized():
            return GPUDecision(False, out_of_date=gpu_manifests(ctx, dict(ctx.plans)))
        d = GPUDecision(True)
        nodes = state.by_name(ctx.kube.get("nodes"))
        plans = self._node_diffs(ctx, nodes, d)  # first: a node held on its allocator decides the manifests too
        d.legacy = legacy_nodes(ctx, nodes)
        wanted = gpu_manifests(ctx, plans)  # rendered once: the NCCL ConfigMaps below are read off it too
        ready, d.taken = manifests.claimable(ctx.kube, wanted)
        d.out_of_date = manifests.out_of_date(ctx.kube, ready)
        d.removable = manifests.removable(ctx.kube, manifests.unwanted(ctx.inv, plans))
        d.stale_configs = stale_nccl_configs(ctx, wanted, nodes, d.diffs)
        if not any(m.name == manifests.PLUGIN_MANIFEST for m in d.out_of_date):  # else the DaemonSet replaces them
            d.stale_plugins = plugin_pods(ctx, [n for n in runtime_restarted(ctx, planning)
                                                if n in ctx.plans and ctx.plans[n].gpu_node])
        return d

    def plan(self, ctx: Context) -> PhasePlan:
        d = self.decide(ctx, planning=True)
        changes = d.changes()
        if not changes:
            return self.planned("unchanged", "manifests, labels and taints as wanted")
        return self.planned("would-change", "what differs from the cluster" if d.initialized else
                            "no cluster yet: every manifest; labels and taints as each node joins", changes)

    def run(self, ctx: Context) -> PhaseResult:
        return self.apply(ctx, self.decide(ctx, planning=False))

    def apply(self, ctx: Context, d: GPUDecision) -> PhaseResult:
        """Make the changes `d` decided, in the order of d.changes()."""
        r = self.result("unchanged", "manifests, labels and taints as wanted")
        for n in d.legacy:  # before the DRA driver's manifest selects by the new label
            ctx.kube.label(n, {ALLOCATOR_LABEL: DRA})
        taken = manifests.taken_message(d.taken) if d.taken else ""
        for m in d.out_of_date:
            ctx.kube.apply(m.applied_text())
        done = [f"applied {m.name}" for m in d.out_of_date]
        for m, gone in d.removable:
            for kind, name, namespace in gone:
                ctx.kube.delete(kind.lower(), [name], namespace)
            if gone:
                done.append(f"removed {m.name} ({len(gone)} object(s) gpuk8s applied)")
        for name, (labels, taints) in d.diffs.items():
            if labels:
                ctx.kube.label(name, labels)
                # a node whose sharing changes (to, from or between strategies): its plugin reflects the new
                # config a while later, and verify waits for it; first labels of a whole-GPU node need no wait
                if {CONFIG_LABEL, HAMI_NODE_LABEL, STRATEGY_LABEL, REPLICAS_LABEL} & set(labels) and (
                        ctx.plans[name].sharing != "none" or d.was_shared.get(name, False)):
                    ctx.relabelled.add(name)
                r.hosts[name] = "labelled " + ", ".join(sorted(labels))
                done.append(f"labels on {name}")
            if taints:
                ctx.kube.taint(name, taints)
                r.hosts[name] = (r.hosts.get(name, "") + " tainted " + ", ".join(taints)).strip()
                done.append(f"taints on {name}")
        if d.stale_configs:
            ctx.kube.delete("configmap", d.stale_configs, NCCL_NAMESPACE)
            done.append(f"removed {len(d.stale_configs)} NCCL ConfigMap(s) no node names")
        for node, pod in d.stale_plugins.items():
            ctx.kube.delete("pod", [pod], "kube-system")
            ctx.relabelled.add(node)  # verify waits for the new pod to register the node's GPUs
            ctx.plugin_restarted.add(node)
            r.hosts[node] = (r.hosts.get(node, "") + " device plugin restarted").strip()
            done.append(f"device plugin restarted on {node} (runtime reconfigured)")
        if done:
            r.status, r.message = "changed", "; ".join(done)
        if taken:
            r.status, r.message = "failed", "; ".join([*done, taken])
            r.remedy = manifests.TAKEN_REMEDY
        if d.held:
            r.hosts.update(d.held)
            r.status = "failed"
            r.message = "; ".join([*done, *([taken] if taken else []),
                                   *(f"{n}: {why}" for n, why in d.held.items())])
            r.remedy = "; ".join(f"gpuk8s allocator {n} --to {ctx.plans[n].allocator}" for n in d.held) + \
                " (each drained, its GPU pods waited for), then gpuk8s install again"
        return r


class RestartPlugin(Phase):
    """Restart the device plugin's pod on some nodes (doctor --fix): the DaemonSet makes a new one at once, which
    loads NVML and registers its socket with the kubelet afresh."""

    name = "plugin-restart"
    title = "restart the device plugin pods"

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = sorted(nodes)

    def plan(self, ctx: Context) -> PhasePlan:
        changes = [Change(f"restart the device plugin on {n}", commands=state.restart_command(pod))
                   for n, pod in plugin_pods(ctx, self.nodes).items()]
        return self.planned("would-change" if changes else "unchanged", "no device plugin pod on these nodes"
                            if not changes else "", changes)

    def run(self, ctx: Context) -> PhaseResult:
        pods = plugin_pods(ctx, self.nodes)
        if not pods:
            return self.result("unchanged", "no device plugin pod on " + ", ".join(self.nodes))
        ctx.kube.delete("pod", sorted(pods.values()), "kube-system")
        r = self.result("changed", "restarted " + ", ".join(pods.values()))
        r.hosts = {n: "device plugin restarted" for n in pods}
        return r
