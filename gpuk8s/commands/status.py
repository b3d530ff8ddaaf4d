"""`gpuk8s status [NODE...]`: where every GPU went. Per node and per GPU resource (whole GPU, shared slice, MIG
device): capacity, allocatable, requested by which pods, free; the sharing strategy and MIG layout; on HAMi
nodes, memory and cores per physical GPU and the pods holding them; utilisation and memory from the DCGM exporter
where monitoring is enabled; the cluster footer. Fetches here, computes in
gpuk8s/kube/allocation.py, renders a table (plain when piped) or JSON (docs/status.schema.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpuk8s import gpuplan, ui
from gpuk8s.commands.common import connect, passwords
from gpuk8s.exitcodes import ExitCode
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube import allocation as al
from gpuk8s.kube import monitoring as mon
from gpuk8s.kube import state
from gpuk8s.kube.client import NOT_DONE, KubeClient, KubeError, is_node_name, on_node
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.phases.monitoring_verify import metrics_path

SCHEMA_VERSION = 1


def read_metrics(kube: KubeClient, inv: Inventory, pods: list[dict[str, Any]],
                 alloc: al.ClusterAllocation) -> None:
    """Fill each GPU node's DCGM metrics (read through the API server's pod proxy) where monitoring is on."""
    if not inv.monitoring.enabled:
        return
    ns = inv.monitoring.namespace
    exporters: dict[str, str] = {}
    for p in pods:
        md, spec = p.get("metadata") or {}, p.get("spec") or {}
        if md.get("namespace") == ns and (md.get("labels") or {}).get(mon.NAME_LABEL) == mon.EXPORTER \
                and spec.get("nodeName"):
            exporters[str(spec["nodeName"])] = str(md.get("name", ""))
    for n in alloc.nodes:
        if not n.gpu_node:
            continue
        pod = exporters.get(n.node)
        if pod is None:
            n.metrics_note = f"no DCGM exporter pod on {n.node} (gpuk8s verify says why)"
            continue
        try:
            n.metrics = al.gpu_metrics(kube.raw_get(metrics_path(ns, pod), cap=al.METRICS_MAX_BYTES))
        except (KubeError, al.MetricsError) as e:
            n.metrics_note = f"metrics of {ns}/{pod} unreadable: {e}"


def gather(kube: KubeClient, inv: Inventory, only: list[str] | None = None) -> al.ClusterAllocation:
    """Reads only what the answer needs: pods that are done hold nothing and are left out by the API server; with
    NODE names, only those nodes and the pods bound to them (a cluster of 5,000 pods is tens of MB of JSON)."""
    if only:
        names = [n for n in dict.fromkeys(only) if is_node_name(n)]  # another cannot be a node: none to read
        nodes = [n for name in names for n in kube.get("nodes", name)]
        pods = [p for name in names for p in kube.get("pods", namespace="*", field_selector=on_node(name))]
    else:
        nodes = kube.get("nodes")
        pods = kube.get("pods", namespace="*", field_selector=NOT_DONE)
    alloc = al.allocation(nodes, pods, gpuplan.plans(inv), only)
    read_metrics(kube, inv, pods, alloc)
    return alloc


def to_json(alloc: al.ClusterAllocation) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, **alloc.to_json()}


def _num(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:g}{unit}"


def _share(s: al.HamiShare) -> str:
    return f"{s.namespace}/{s.name} {s.memory_mib}MiB " + (f"{s.cores}%" if s.cores else "no core limit")


def render_hami(alloc: al.ClusterAllocation) -> None:
    """Per physical GPU of each HAMi node: memory and cores HAMi's scheduler placed, and on behalf of which pods."""
    rows: list[list[object]] = []
    for n in alloc.nodes:
        for g in n.hami_gpus:
            total = "?" if g.memory_total_mib is None else g.memory_total_mib
            gpu = f"{'?' if g.index is None else g.index} {g.uuid}" + (
                " (not registered)" if g.index is None else "" if g.healthy else " (unhealthy)")
            rows.append([n.node, gpu, f"{g.memory_mib}/{total} MiB", f"{g.cores}/{g.cores_total}%",
                         ", ".join(_share(s) for s in g.pods)])
    if rows:
        ui.table("HAMi GPUs", ["NODE", "GPU", "MEMORY", "CORES", "PODS"], rows)


def render(alloc: al.ClusterAllocation) -> None:
    rows: list[list[object]] = []
    for n in alloc.nodes:
        how = n.sharing if n.sharing != "none" else ("" if n.mig_strategy != "none" else "whole")
        if n.sharing not in ("none", "hami"):
            how += f" x{n.replicas}"
        if n.mig_strategy != "none":
            how += f" mig {n.mig_strategy}" + (" " + ",".join(f"{k}:{v}" for k, v in sorted(n.mig.items()))
                                               if n.mig else "")
        how = how.strip()
        node = f"{n.node}{'' if n.ready else ' (NotReady)'}"
        if not n.resources:
            rows.append([node, how, "-", 0, 0, 0, 0, ""])
        for i, r in enumerate(n.resources):
            planned = "" if r.planned is None or r.planned == r.allocatable else f" (plan {r.planned})"
            rows.append([node if i == 0 else "", how if i == 0 else "", r.resource, r.capacity,
                         f"{r.allocatable}{planned}", r.requested, r.free,
                         ", ".join(f"{p.namespace}/{p.name}" + (f" x{p.count}" if p.count > 1 else "")
                                   for p in r.pods)])
    ui.table("GPU allocation", ["NODE", "SHARING", "RESOURCE", "CAPACITY", "ALLOCATABLE", "REQUESTED", "FREE",
                                "PODS"], rows)
    render_hami(alloc)
    mrows: list[list[object]] = []
    notes = []
    for n in alloc.nodes:
        for m in n.metrics:
            mem = "-" if m.memory_used_mib is None else (
                f"{m.memory_used_mib:g}/{(m.memory_used_mib + (m.memory_free_mib or 0)):g} MiB")
            mrows.append([n.node, m.gpu + (f"/{m.instance}" if m.instance else ""), m.model, _num(m.util, "%"), mem,
                          ", ".join(m.pods)])
        if n.metrics_note:
            notes.append(n.metrics_note)
    if mrows:
        ui.table("GPU utilisation (DCGM exporter)", ["NODE", "GPU", "MODEL", "UTIL", "MEMORY", "PODS"], mrows)
    con = ui.console()
    for line in notes:
        ui.say(con, line)
    for line in alloc.footer() or ["Allocated/Total GPUs in cluster: 0/0 (0%)"]:
        ui.say(con, line)


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command()
    def status(
        nodes: list[str] = typer.Argument(None, help="Only these nodes (default: every GPU node)."),  # noqa: B008
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        kubeconfig: Path | None = typer.Option(  # noqa: UP007
            None, "--kubeconfig", help="Use this machine's kubectl with this kubeconfig instead of kubectl on the "
            "first control plane."),
        context: str | None = typer.Option(None, "--context", help="The kubeconfig context (with --kubeconfig)."),  # noqa: UP007
    ) -> None:
        """Where every GPU went: per node and GPU resource, allocatable, requested by which pods, free
        (docs/troubleshooting.md)."""
        inv = load_inventory(inventory, output)
        cluster = connect(inv, kubeconfig, context, passwords(inv) if kubeconfig is None else {})
        try:
            alloc = gather(cluster.kube, inv, list(nodes or []) or None)
        except (KubeError, state.StateError) as e:
            ui.say(ui.console(stderr=True), f"cannot read the cluster: {e}")
            raise typer.Exit(ExitCode.FAILED) from None
        finally:
            cluster.close()
        missing = sorted(set(nodes or []) - {n.node for n in alloc.nodes})
        if missing:
            ui.say(ui.console(stderr=True), f"no GPU node named {', '.join(missing)} in the cluster")
        if output == Output.json:
            ui.emit_json(to_json(alloc))
        else:
            render(alloc)
        raise typer.Exit(ExitCode.FAILED if missing else ExitCode.OK)
