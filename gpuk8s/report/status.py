"""`gpuk8s status` as people read it: the GPU allocation table per node and GPU resource, HAMi's memory and cores
per physical GPU, the DCGM exporter's utilisation, the notes on unreadable metrics and the cluster footer. The
numbers come computed from gpuk8s/kube/allocation.py; `-o json` is the command's (docs/status.schema.json)."""

from __future__ import annotations

from gpuk8s import ui
from gpuk8s.gpuplan import FABRIC_LABEL, NCCL_LABEL
from gpuk8s.kube import allocation as al


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


def render_fabric(alloc: al.ClusterAllocation) -> None:
    """The fabric per node (its labels) and the RDMA device plugin's shared slots in use (docs/fabric.md)."""
    rows: list[list[object]] = []
    for n in alloc.nodes:
        if not n.fabric and n.rdma is None:
            continue
        f = n.fabric
        rows.append([n.node, f.get(FABRIC_LABEL, "-"), f.get(f"{FABRIC_LABEL}-ports", "-"),
                     f.get(f"{FABRIC_LABEL}-rate", "-"), f.get(NCCL_LABEL, "-"),
                     "-" if n.rdma is None else f"{n.rdma[0]}/{n.rdma[1]}"])
    if rows:
        ui.table("RDMA fabric", ["NODE", "FABRIC", "PORTS", "RATE (Gb/s)", "NCCL CONFIGMAP", "RDMA PODS/SLOTS"], rows)


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
        if n.allocator == "dra":  # the DRA driver serves its GPUs, through claims (docs/dra.md)
            how = ("dra " + how).strip()
        node = f"{n.node}{'' if n.ready else ' (NotReady)'}"
        if n.quarantine:  # gpuk8s health NODE says why; gpuk8s health --release NODE once it is fixed
            node += f" (quarantined: {n.quarantine})"
        if not n.resources:
            rows.append([node, how, "-", 0, 0, 0, 0, ""])
        for i, r in enumerate(n.resources):
            planned = "" if r.planned is None or r.planned == r.allocatable else f" (plan {r.planned})"
            sick = f" ({r.unhealthy} unhealthy)" if r.unhealthy else ""  # gpuk8s health NODE says which and why
            rows.append([node if i == 0 else "", how if i == 0 else "", r.resource, r.capacity,
                         f"{r.allocatable}{sick}{planned}", r.requested, r.free,
                         ", ".join(f"{p.namespace}/{p.name}" + (f" x{p.count}" if p.count > 1 else "")
                                   for p in r.pods)])
    ui.table("GPU allocation", ["NODE", "SHARING", "RESOURCE", "CAPACITY", "ALLOCATABLE", "REQUESTED", "FREE",
                                "PODS"], rows)
    render_hami(alloc)
    render_fabric(alloc)
    mrows: list[list[object]] = []
    notes = []
    for n in alloc.nodes:
        for m in n.metrics:
            mem = "-" if m.memory_used_mib is None else (
                f"{m.memory_used_mib:g}/{(m.memory_used_mib + (m.memory_free_mib or 0)):g} MiB")
            mrows.append([n.node, m.gpu + (f"/{m.instance}" if m.instance else ""), m.model, m.driver or "-",
                          _num(m.util, "%"), mem, ", ".join(m.pods)])
        if n.metrics_note:
            notes.append(n.metrics_note)
    if mrows:
        ui.table("GPU utilisation (DCGM exporter)", ["NODE", "GPU", "MODEL", "DRIVER", "UTIL", "MEMORY", "PODS"],
                 mrows)
    con = ui.console()
    for line in notes:
        ui.say(con, line)
    for line in alloc.footer() or ["Allocated/Total GPUs in cluster: 0/0 (0%)"]:
        ui.say(con, line)
