"""`gpuk8s status [NODE...]`: where every GPU went. Per node and per GPU resource (whole GPU, shared slice, MIG
device): capacity, allocatable, requested by which pods, free; the sharing strategy and MIG layout; on HAMi
nodes, memory and cores per physical GPU and the pods holding them; utilisation and memory from the DCGM exporter
where monitoring is enabled; the cluster footer. Fetches here, computes in
gpuk8s/kube/allocation.py, renders a table (gpuk8s/report/status.py; plain when piped) or JSON
(docs/status.schema.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpuk8s import gpuplan, ui
from gpuk8s.commands.common import connect, passwords
from gpuk8s.exitcodes import ExitCode
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube import allocation as al
from gpuk8s.kube import dra, state
from gpuk8s.kube import monitoring as mon
from gpuk8s.kube.client import NOT_DONE, KubeClient, KubeError, is_node_name, on_node
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.phases.monitoring_verify import metrics_path
from gpuk8s.report import status as report

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
    plans = gpuplan.plans(inv)
    devices = None
    if any(p.dra for p in plans.values()) or any(dra.labelled(n) for n in nodes):
        # DRA's devices and who holds them: two reads, only where a node's GPUs are DRA's
        devices = dra.by_node(kube.get("resourceslices"), kube.get("resourceclaims", namespace="*"))
    alloc = al.allocation(nodes, pods, plans, only, devices)
    read_metrics(kube, inv, pods, alloc)
    return alloc


def to_json(alloc: al.ClusterAllocation) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, **alloc.to_json()}


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
            report.render(alloc)
        raise typer.Exit(ExitCode.FAILED if missing else ExitCode.OK)
