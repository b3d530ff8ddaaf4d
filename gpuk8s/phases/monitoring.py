"""Phase monitoring: the DCGM exporter on every GPU node, and Prometheus (and Grafana) as the inventory's
`monitoring:` section asks (gpuk8s/kube/monitoring.py). Install runs it when monitoring is enabled;
`gpuk8s monitoring` runs it alone, or removes what it created (`--remove`).

Manifests are applied only when the sha256 of their rendered text differs from what the cluster has. An object
of the user's with the name of one of them is never taken over: nothing is applied (monitoring.name-taken). The
removal deletes only objects that carry gpuk8s's manifest annotation, and the namespace only when gpuk8s
created it and nothing of the user's is in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuk8s.kube import manifests
from gpuk8s.kube import monitoring as mon
from gpuk8s.kube.client import KubeError
from gpuk8s.kube.manifests import Manifest
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult
from gpuk8s.text import first_of

EMPTYDIR_WARNING = ("Prometheus keeps its data in an emptyDir: it is lost when the pod restarts "
                    "(set monitoring.storage_class to keep it)")


def _warnings(ctx: Context, mode: str) -> str:
    return f"; {EMPTYDIR_WARNING}" if mode == "deploy" and ctx.inv.monitoring.storage_class is None else ""


# The namespaced kinds a user's software is made of, looked at before gpuk8s deletes the namespace it created
# (singular: what kubectl accepts as a resource name); the Prometheus Operator's kinds when their CRD exists.
RESIDENT_KINDS = ("deployment", "statefulset", "daemonset", "replicaset", "job", "cronjob", "pod", "service",
                  "configmap", "secret", "persistentvolumeclaim", "serviceaccount", "role", "rolebinding",
                  "ingress")
OPERATOR_GROUP = "monitoring.coreos.com"
# what Kubernetes itself puts in every namespace: kube-root-ca.crt (pkg/controller/certificates/
# rootcacertpublisher: RootCACertConfigMapName, "make sure certificate configmap exists in each namespace"),
# and the ServiceAccount default (the service account controller)
_BUILTIN = {("configmap", "kube-root-ca.crt"), ("serviceaccount", "default")}


def name_taken(ctx: Context, todo: list[Manifest]) -> list[str]:
    """The objects of `todo` that exist already and are not gpuk8s's (KIND/NAME): applying would take them
    over (and --remove would then delete them)."""
    out = []
    for kind, name, ns in mon.objects(todo):
        try:
            found = ctx.kube.get(kind.lower(), name, ns)
        except KubeError:
            continue  # a kind the cluster does not serve: nothing of that name exists
        if found and not manifests.created_by_gpuk8s(found[0]):
            out.append(f"{kind}/{name}")
    return out


def _refuse_taken(ctx: Context, todo: list[Manifest]) -> None:
    taken = name_taken(ctx, todo)
    if taken:
        ns = ctx.inv.monitoring.namespace
        raise PhaseError(
            f"monitoring.name-taken: {', '.join(taken)} in namespace {ns} exist(s) and gpuk8s did not create "
            "them: nothing applied (they would be overwritten, and deleted by --remove)",
            f"set monitoring.namespace to a namespace of gpuk8s's own (e.g. gpu-monitoring), or remove or rename "
            f"those objects in {ns}")


def foreign_objects(ctx: Context, ns: str) -> list[str]:
    """The objects in namespace `ns` gpuk8s did not create (kind/name): neither carrying its annotation or
    label nor owned (through ownerReferences) by one that does, nor what Kubernetes adds to every namespace.
    Stops at the first kind that has some. A kind that cannot be listed counts as one unknown object."""
    kinds = list(RESIDENT_KINDS)
    try:
        for crd in ctx.kube.get("customresourcedefinition"):
            spec = crd.get("spec") or {}
            if spec.get("group") == OPERATOR_GROUP and spec.get("scope") == "Namespaced":
                kinds.append(str((spec.get("names") or {}).get("plural", "")) + "." + OPERATOR_GROUP)
    except KubeError as e:
        return [f"(the custom resource definitions cannot be listed: {e.message})"]
    listed: list[tuple[str, dict[str, Any]]] = []
    for kind in kinds:
        try:
            items = ctx.kube.get(kind, namespace=ns)
        except KubeError as e:
            return [f"(the {kind}s cannot be listed: {e.message})"]
        listed += [(kind, o) for o in items]
    ours: set[tuple[str, str]] = set()
    changed = True
    while changed:  # owners before the owned, whatever the listing order: until nothing is added
        changed = False
        for kind, o in listed:
            md = o.get("metadata") or {}
            key = (str(o.get("kind") or kind).lower(), str(md.get("name", "")))
            if key in ours:
                continue
            owners = [(str(r.get("kind", "")).lower(), str(r.get("name", ""))) for r in md.get("ownerReferences") or []]
            if manifests.created_by_gpuk8s(o) or (owners and all(w in ours for w in owners)):
                ours.add(key)
                changed = True
    out = []
    for kind, o in listed:
        md = o.get("metadata") or {}
        k, name = kind.split(".")[0], str(md.get("name", ""))
        if (str(o.get("kind") or kind).lower(), name) in ours or (k, name) in _BUILTIN:
            continue
        sa = (md.get("annotations") or {}).get("kubernetes.io/service-account.name")
        token = o.get("type") == "kubernetes.io/service-account-token"
        if token and (sa == "default" or ("serviceaccount", sa) in ours):
            continue
        out.append(f"{k}/{name}")
    return out


def out_of_date(ctx: Context, wanted: list[Manifest]) -> list[Manifest]:
    """The manifests whose applied hash differs, or one of whose objects is gone (a Service deleted by hand:
    the hash is read from the first object only)."""
    stale = manifests.out_of_date(ctx.kube, wanted)
    rest = [(m, ref) for m in wanted if m not in stale for ref in mon.objects([m])[1:]]
    found = ctx.kube.get_refs([ref for _, ref in rest])  # one read for all (a kind not served: missing)
    stale += [m for m, ref in rest if ref not in found]
    return [m for m in wanted if m in stale]


@dataclass(frozen=True)
class MonitoringDecision:
    """What the monitoring phase decided, once: the manifests to apply (or, with --remove, the objects to delete and
    why the namespace is kept), and the Prometheus mode they follow. --dry-run renders it, a run applies it."""

    mode: str = ""
    todo: tuple[Manifest, ...] = ()
    initialized: bool = True
    gone: tuple[tuple[str, str, str], ...] = ()  # --remove: (kind, name, namespace), in deletion order
    kept: str = ""  # --remove: why the namespace stays ('' where it goes, or is not there)


class Monitoring(Phase):
    name = "monitoring"
    title = "DCGM exporter and Prometheus"
    fatal = False

    def __init__(self, remove: bool = False) -> None:
        self.remove = remove

    def decide(self, ctx: Context) -> MonitoringDecision:
        """The one decision of the plan and the run (an object of another tool in the way: PhaseError, before
        anything is applied)."""
        if self.remove:
            present, kept = self._removal(ctx)
            return MonitoringDecision(gone=tuple(present), kept=kept)
        if not ctx.initialized():
            mode = mon.resolve_mode(ctx.inv, None)
            return MonitoringDecision(mode, tuple(mon.wanted(ctx.inv, ctx.plans, mode)), initialized=False)
        mode = mon.resolve_mode(ctx.inv, ctx.kube)
        wanted = mon.wanted(ctx.inv, ctx.plans, mode, own_namespace=mon.owns_namespace(ctx.inv, ctx.kube))
        todo = out_of_date(ctx, wanted)
        _refuse_taken(ctx, todo)
        return MonitoringDecision(mode, tuple(todo))

    def plan(self, ctx: Context) -> PhasePlan:
        d = self.decide(ctx)
        if self.remove:
            if not d.gone:
                return self.planned("unchanged", "nothing of gpuk8s's monitoring is in the cluster" + d.kept)
            return self.planned("would-change", "delete what gpuk8s's monitoring created" + d.kept,
                                [Change(f"delete {k}/{n}") for k, n, _ns in d.gone])
        changes = [Change(f"apply {m.name} (sha256 {m.sha256[:12]})", manifest=m.applied_text()) for m in d.todo]
        if d.mode == "none":
            changes.append(Change("add this scrape job to your Prometheus", manifest=mon.scrape_config(ctx.inv)))
        if not d.todo:
            return self.planned("unchanged", f"manifests as wanted (prometheus: {d.mode}){_warnings(ctx, d.mode)}",
                                changes)
        reason = (f"what differs from the cluster (prometheus: {d.mode})" if d.initialized
                  else f"no cluster yet: every manifest (prometheus: {d.mode})")
        return self.planned("would-change", reason + _warnings(ctx, d.mode), changes)

    def run(self, ctx: Context) -> PhaseResult:
        d = self.decide(ctx)
        if self.remove:
            for kind, name, ns in d.gone:
                ctx.kube.delete(kind.lower(), [name], ns)
            if not d.gone:
                return self.result("unchanged", "nothing of gpuk8s's monitoring was in the cluster" + d.kept)
            return self.result("changed", "deleted " + ", ".join(f"{k.lower()}/{n}" for k, n, _ in d.gone) + d.kept)
        for m in d.todo:
            ctx.kube.apply(m.applied_text())
        applied = [m.name for m in d.todo]
        r = self.result("changed" if applied else "unchanged",
                        ("applied " + ", ".join(applied) if applied else "manifests as wanted")
                        + f" (prometheus: {d.mode}){_warnings(ctx, d.mode)}")
        if d.mode == "none":
            r.remedy = "add the scrape job of `gpuk8s monitoring --dry-run` to your own Prometheus"
        return r

    def _present(self, ctx: Context) -> list[tuple[str, str, str]]:
        """The objects gpuk8s's monitoring created that are in the cluster now, in deletion order: those carrying
        its annotation, each checked on its own (manifests.owned, as the gpu phase's removal of HAMi), and the
        namespace last. A kind the cluster does not know (ServiceMonitor without the Operator) has none."""
        ns = ctx.inv.monitoring.namespace
        return manifests.owned(ctx.kube, [
            *((kind, name, ns) for kind, name, _ in reversed(mon.objects(mon.every_manifest(ctx.inv, ctx.plans)))),
            ("Namespace", ns, ns)])

    def _removal(self, ctx: Context) -> tuple[list[tuple[str, str, str]], str]:
        """What --remove deletes, and (a sentence) why the namespace is kept when it holds an object gpuk8s did
        not create: decided before anything is deleted (the pods of a deleted DaemonSet linger a while)."""
        present = self._present(ctx)
        ns = ctx.inv.monitoring.namespace
        if ("Namespace", ns, ns) not in present:
            return present, ""
        foreign = foreign_objects(ctx, ns)
        if not foreign:
            return present, ""
        return ([p for p in present if p[0] != "Namespace"],
                f"; kept namespace {ns}: it holds objects gpuk8s did not create ({first_of(foreign, 5)})")
