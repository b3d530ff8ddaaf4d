"""The GPU plan of a node: what Kubernetes must see on it. The one place that decides it.

A pure function of the host's inventory entry, its facts (when gpuk8s could read them) and the inventory:
whether the node is a GPU node, how many GPUs it has, which extended resources and how many of each it
must expose, and the labels, taints and runtime handler gpuk8s keeps on it. The playbooks (is this a GPU
node?), the manifests, the label phase, `gpuk8s render` and verify all read it; nothing else decides.
Sharing and MIG will change `resources` (GPUs x replicas, `nvidia.com/mig-*`), here and only here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuk8s.facts.model import HostFacts
from gpuk8s.inventory.model import Host, Inventory, Taint

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRESENT = "nvidia.com/gpu.present"
RUNTIME_HANDLER = "nvidia"


@dataclass(frozen=True)
class GPUPlan:
    node: str
    gpu_node: bool  # the device plugin runs here and GPU pods may land here
    gpus: int | None  # physical GPUs: from the facts, else the inventory; None when neither says
    resources: dict[str, int] = field(default_factory=dict)  # extended resource -> allocatable count wanted
    labels: dict[str, str] = field(default_factory=dict)  # the labels gpuk8s keeps on the node
    taints: tuple[Taint, ...] = ()
    runtime_handler: str = ""  # the CRI runtime handler GPU pods use ("nvidia"), "" on CPU nodes

    @property
    def expected_gpus(self) -> int:
        """How many `nvidia.com/gpu` must be allocatable (0: none expected, or not known)."""
        return self.resources.get(GPU_RESOURCE, 0)


def is_gpu_node(host: Host) -> bool:
    """Workers carry GPUs unless the inventory says gpus: 0; a control plane only if it says gpus: N > 0."""
    if host.gpus is not None:
        return host.gpus > 0
    return not host.is_control_plane


def plan_for(host: Host, facts: HostFacts | None = None) -> GPUPlan:
    gpu_node = is_gpu_node(host)
    found = len(facts.gpu.gpus) if facts is not None and facts.gpu.gpus else None
    gpus = found if found is not None else host.gpus
    labels = dict(host.labels)
    resources: dict[str, int] = {}
    if gpu_node:
        labels[GPU_PRESENT] = "true"
        if gpus:
            resources[GPU_RESOURCE] = gpus
    return GPUPlan(host.name, gpu_node, gpus, resources, labels, tuple(host.taints),
                   RUNTIME_HANDLER if gpu_node else "")


def plans(inv: Inventory, facts: dict[str, HostFacts] | None = None) -> dict[str, GPUPlan]:
    """Every host's plan, by host name."""
    f = facts or {}
    return {h.name: plan_for(h, f.get(h.name)) for h in inv.hosts}


