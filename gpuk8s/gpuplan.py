"""The GPU plan of a node: what Kubernetes must see on it. The one place that decides it.

A pure function of the host's inventory entry, its facts (when gpuk8s could read them) and the inventory:
whether the node is a GPU node, how many GPUs it has, which extended resources and how many of each it
must expose, and the labels, taints and runtime handler gpuk8s keeps on it. The playbooks (is this a GPU
node?), the manifests, the label phase, `gpuk8s render` and verify all read it; nothing else decides.
Sharing changes `resources` here and only here: GPUs x replicas under `nvidia.com/gpu` (or
`nvidia.com/gpu.shared` when renamed), or HAMi's; `plugin` is the NVIDIA device plugin's per-node setting,
whose named config the ConfigMap holds and the `nvidia.com/device-plugin.config` label selects
(kube/manifests.plugin_config renders it). MIG (docs/mig.md) changes `resources` here too: with the host's
`mig:` layout and its facts (the GPU models), `gpuk8s.mig.layout.mig_resources` gives what the plugin will
advertise under the single or mixed strategy, and `PluginSettings.mig_strategy` the plugin's migStrategy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field

from gpuk8s.facts.model import HostFacts
from gpuk8s.inventory.model import AllocatorSetting, Host, Inventory, Taint
from gpuk8s.mig import layout as miglayout
from gpuk8s.mig.profiles import model_for

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"  # the plugin's name for a replicated GPU with renameByDefault
HAMI_MEMORY = "nvidia.com/gpumem"  # MiB, HAMi's (charts/hami/values.yaml resourceMem)
HAMI_CORES = "nvidia.com/gpucores"  # percent of one GPU (resourceCores)
GPU_PRESENT = "nvidia.com/gpu.present"
RUNTIME_HANDLER = "nvidia"
# The taint of a node whose GPUs failed the health check before it joined (docs/health.md): its value the failing
# finding's id; only `gpuk8s health --release` removes it
QUARANTINE_KEY = "gpuk8s.io/quarantine"


def quarantine_taint(finding_id: str) -> Taint:
    return Taint(QUARANTINE_KEY, finding_id, "NoSchedule")


# The label the device plugin's config-manager watches (deployments/helm/.../daemonset-device-plugin.yml NODE_LABEL)
CONFIG_LABEL = "nvidia.com/device-plugin.config"
# GPU Feature Discovery's label names (k8s-device-plugin internal/lm/resource.go baseLabeler), set by gpuk8s
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"  # the MPS control daemon's nodeSelector (daemonset-mps-control-daemon.yml)
# GFD's MIG labels (k8s-device-plugin internal/lm/mig-strategy.go migStrategyLabeler, newMigStrategy*Labeler;
# resource.go NewMIGResourceLabeler): the strategy, and per MIG resource <resource>.product/.count/.replicas/.memory
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_PREFIX = "nvidia.com/mig-"
# HAMi's device plugin runs where gpu=on (charts/hami/values.yaml devicePlugin.nvidianodeSelector)
HAMI_NODE_LABEL = "gpu"
HAMI_NODE_VALUE = "on"
# Who serves a node's GPUs (inventory `allocator:`, docs/dra.md): on a dra node this label is "dra"; the NVIDIA
# DRA driver's kubelet plugin runs only there, the device plugin everywhere else. Under the prefix the NodeRestriction
# admission plugin keeps for administrators: a kubelet can neither set nor remove it on its own node, so a host
# cannot put itself on DRA (and the DRA kubelet plugin's token on itself) or off it (docs/security.md)
ALLOCATOR_LABEL = "node-restriction.kubernetes.io/gpuk8s-gpu-allocator"
# where gpuk8s wrote it up to main 3c20938: any kubelet may set this one on its own node, so it is evidence only
# where the inventory says the same (kube/dra.labelled); install moves it to ALLOCATOR_LABEL and removes it
LEGACY_ALLOCATOR_LABEL = "gpuk8s.io/gpu-allocator"
DRA = "dra"
# Labels gpuk8s owns on GPU nodes: set from the plan, removed when the plan no longer has them.
# The RDMA fabric (docs/fabric.md, gpuk8s/fabricplan.py): the labels of a node whose inventory sets fabric:, and the
# extended resource NVIDIA's RDMA shared device plugin exposes its RDMA devices as (prefix rdma, the plugin's default)
FABRIC_LABEL = "gpuk8s.io/fabric"
NCCL_LABEL = f"{FABRIC_LABEL}-nccl"  # the name of the ConfigMap (namespace default) of NCCL's environment for the node
NCCL_CONFIG_PREFIX = "gpuk8s-nccl-"
FABRIC_LABELS = (FABRIC_LABEL, f"{FABRIC_LABEL}-ports", f"{FABRIC_LABEL}-rate", NCCL_LABEL)
RDMA_RESOURCE_PREFIX, RDMA_RESOURCE_NAME = "rdma", "fabric"
RDMA_RESOURCE = f"{RDMA_RESOURCE_PREFIX}/{RDMA_RESOURCE_NAME}"
MANAGED_LABELS = (CONFIG_LABEL, PRODUCT_LABEL, MEMORY_LABEL, COUNT_LABEL, REPLICAS_LABEL, STRATEGY_LABEL,
                  MPS_CAPABLE_LABEL, HAMI_NODE_LABEL, MIG_STRATEGY_LABEL, ALLOCATOR_LABEL, LEGACY_ALLOCATOR_LABEL,
                  *FABRIC_LABELS)
# ...and every label under nvidia.com/mig-<profile>. (mixed strategy): owned by prefix (gpu phase, owned_labels)
MANAGED_PREFIXES = (MIG_PREFIX,)


@dataclass(frozen=True)
class PluginSettings:
    """What the NVIDIA device plugin must do on one node: one named config of its ConfigMap per distinct value.

    `mig_strategy` is rendered as flags.migStrategy (and a name suffix); `mig_resources` are the MIG resources
    time-slicing replicates under the mixed strategy (the plugin names each resource it shares).
    """

    strategy: str = "none"  # none | time-slicing | mps
    replicas: int = 1
    rename: bool = False
    fail_requests_greater_than_one: bool = True
    mig_strategy: str = "none"  # none | single | mixed: the plugin's --mig-strategy
    mig_resources: tuple[str, ...] = ()  # mixed + time-slicing: the resources replicated (mig-* and whole GPUs)

    @property
    def config_name(self) -> str:
        """The config's key in the ConfigMap and the node's nvidia.com/device-plugin.config value."""
        mig = "" if self.mig_strategy == "none" else f"mig-{self.mig_strategy}"
        if self.strategy == "none":
            return mig or "none"
        name = f"{self.strategy}-{self.replicas}"
        if self.rename:
            name += "-renamed"
        if not self.fail_requests_greater_than_one:
            name += "-allow-multiple"
        if mig:
            name += "-" + mig + "".join("-" + r.removeprefix(MIG_PREFIX).removeprefix("nvidia.com/")
                                        for r in self.mig_resources)
        if len(name) > 63:  # a label value holds 63 characters: cut, and a stable hash keeps settings apart
            name = name[:54].rstrip("-_.") + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
        return name

    @property
    def resource(self) -> str:
        mig = [r for r in self.mig_resources if r.startswith(MIG_PREFIX)]
        if self.mig_strategy == "mixed" and mig:
            return mig[0]
        return SHARED_RESOURCE if self.rename and self.strategy != "none" else GPU_RESOURCE


@dataclass(frozen=True)
class GPUPlan:
    node: str
    gpu_node: bool  # the device plugin runs here and GPU pods may land here
    gpus: int | None  # physical GPUs: from the facts, else the inventory; None when neither says
    resources: dict[str, int] = field(default_factory=dict)  # extended resource -> allocatable count wanted
    labels: dict[str, str] = field(default_factory=dict)  # the labels gpuk8s keeps on the node
    taints: tuple[Taint, ...] = ()
    runtime_handler: str = ""  # the CRI runtime handler GPU pods use ("nvidia"), "" on CPU nodes
    sharing: str = "none"  # none | time-slicing | mps | hami
    replicas: int = 1  # pods per GPU (1: whole GPUs)
    plugin: PluginSettings | None = None  # the NVIDIA device plugin's setting; None: it does not run here
    gpu_memory_mib: int | None = None  # memory of one GPU, from the facts
    pod_memory_mib: int | None = None  # what the inventory says one shared pod needs
    mig_strategy: str = "none"  # none | single | mixed (inventory mig.strategy)
    mig_error: str = ""  # why the MIG resources could not be planned (the mig phase reports it too)
    # labels this plan cannot decide (no facts for the host: a failed, unreachable or not targeted host): a name,
    # or a prefix ending in '-'; the label phase neither sets nor removes them, the ConfigMap keeps their config
    undecided: tuple[str, ...] = ()
    allocator: str = "device-plugin"  # device-plugin | dra: who serves the GPUs to pods
    # dra: the devices the DRA driver must publish in the node's ResourceSlice, by type ("gpu", "mig"); the node
    # itself advertises no extended resource (`resources` is empty)
    dra_devices: dict[str, int] = field(default_factory=dict)

    @property
    def dra(self) -> bool:
        return self.gpu_node and self.allocator == DRA

    def decides(self, label: str) -> bool:
        """Whether the plan decides this label (else it is left as the node has it)."""
        return not any(label == u or (u.endswith("-") and label.startswith(u)) for u in self.undecided)

    @property
    def resource_name(self) -> str:
        """The extended resource a pod asks for one GPU (or one slice of one) with: under the mixed MIG strategy
        the first nvidia.com/mig-<profile> of the plan (the test pod asks for one of it)."""
        if self.mig_strategy == "mixed":
            mig = sorted(r for r in self.resources if r.startswith(MIG_PREFIX))
            if mig:
                return mig[0]
        return self.plugin.resource if self.plugin else GPU_RESOURCE

    @property
    def expected_gpus(self) -> int:
        """How many GPUs (or slices) must be allocatable under `resource_name` (0: none expected, or not known)."""
        return self.resources.get(self.resource_name, 0)


def is_gpu_node(host: Host) -> bool:
    """Workers carry GPUs unless the inventory says gpus: 0; a control plane only if it says gpus: N > 0."""
    if host.gpus is not None:
        return host.gpus > 0
    return not host.is_control_plane


def product_label(name: str, shared: bool) -> str:
    """GFD's nvidia.com/gpu.product: the name with spaces as '-', '-SHARED' when replicated and not renamed
    (k8s-device-plugin internal/lm/resource.go getProductName and sanitise)."""
    value = "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())
    if shared:
        value += "-SHARED"
    value = value[:63].rstrip("-_.")
    return value


def mig_plan(host: Host, facts: HostFacts | None) -> tuple[dict[str, int], dict[str, str], str]:
    """(resources, labels, error) of a MIG node: what the device plugin advertises once the layout is applied,
    from the layout and the GPU models of the facts (not the current instances: verify compares those)."""
    s = host.gpu.mig
    if facts is None or not facts.gpu.gpus:
        return {}, {}, ""
    first = facts.gpu.gpus[0]
    gpus = [(g.index, model_for(g.name, g.memory_mib)) for g in facts.gpu.gpus]
    try:
        resources = miglayout.mig_resources(s.layout, s.strategy, gpus, first.name)
    except miglayout.LayoutError as e:
        return {}, {}, e.message
    model = model_for(first.name, first.memory_mib)
    labels = {MIG_STRATEGY_LABEL: s.strategy}
    base = product_label(first.name, False)

    def describe(resource: str, profile: str, count: int) -> None:
        labels[f"{resource}.product"] = f"{base}-MIG-{profile}"[:63].rstrip("-_.")
        labels[f"{resource}.count"] = str(count)
        labels[f"{resource}.replicas"] = "1"
        prof = model.profile(profile) if model else None
        if prof is not None:  # the MIG device's memory in MiB, from the profile table (-lgip's GiB)
            labels[f"{resource}.memory"] = str(round(float(prof.memory_gib) * 1024))

    profiles = sorted({r.removeprefix(MIG_PREFIX) for r in resources if r.startswith(MIG_PREFIX)})
    if s.strategy == "single":
        want = miglayout.wanted(s.layout, first.index, model, first.name) if s.layout else None
        if want:
            describe(GPU_RESOURCE, want[0].replace("+", "."), resources.get(GPU_RESOURCE, 0))
    else:
        for p in profiles:
            describe(MIG_PREFIX + p, p, resources[MIG_PREFIX + p])
    return resources, labels, ""


def plan_for(host: Host, facts: HostFacts | None = None) -> GPUPlan:
    gpu_node = is_gpu_node(host)
    found = len(facts.gpu.gpus) if facts is not None and facts.gpu.gpus else None
    gpus = found if found is not None else host.gpus
    labels = dict(host.labels)
    resources: dict[str, int] = {}
    sharing = host.gpu.sharing if gpu_node else None
    strategy = sharing.strategy if sharing else "none"
    replicas = sharing.replicas if sharing and strategy != "none" else 1
    plugin: PluginSettings | None = None
    memory = None
    mig = host.gpu.mig if gpu_node and host.gpu.mig.enabled else None
    mig_error = ""
    undecided: list[str] = []
    if gpu_node:
        labels[GPU_PRESENT] = "true"
        first = facts.gpu.gpus[0] if facts is not None and facts.gpu.gpus else None
        memory = first.memory_mib if first else None
        if strategy == "hami":
            labels[HAMI_NODE_LABEL] = HAMI_NODE_VALUE
            if gpus:
                # HAMi's device plugin registers GPUs x deviceSplitCount as nvidia.com/gpu; memory and cores are
                # not node resources: its scheduler reads them from the node's hami.io/node-nvidia-register
                resources[GPU_RESOURCE] = gpus * replicas
        elif mig is not None:
            assert sharing is not None
            resources, mig_labels, mig_error = mig_plan(host, facts)
            # mixed + time-slicing: the config names every resource it replicates (the GPU Operator's
            # gpu-sharing example: migStrategy mixed, timeSlicing.resources nvidia.com/mig-1g.5gb ...)
            shared = tuple(sorted(resources)) if strategy == "time-slicing" and mig.strategy == "mixed" else ()
            if strategy == "time-slicing":  # the plugin replicates MIG devices as it does GPUs
                resources = {k: v * replicas if (k in shared or mig.strategy == "single") else v
                             for k, v in resources.items()}
                for k in list(mig_labels):  # GFD: replicas, and -SHARED on the product (resource.go productLabel)
                    res, _, what = k.rpartition(".")
                    if (res in shared or mig.strategy == "single") and what in ("replicas", "product"):
                        mig_labels[k] = str(replicas) if what == "replicas" else mig_labels[k] + "-SHARED"
            plugin = PluginSettings(strategy, replicas, False, sharing.fail_requests_greater_than_one,
                                    mig.strategy, shared)
            labels[CONFIG_LABEL] = plugin.config_name
            labels.update(mig_labels)
        else:
            assert sharing is not None
            plugin = PluginSettings(strategy, replicas, sharing.rename, sharing.fail_requests_greater_than_one)
            labels[CONFIG_LABEL] = plugin.config_name
            if strategy == "mps":
                labels[MPS_CAPABLE_LABEL] = "true"
            if gpus:
                resources[plugin.resource] = gpus * replicas
        single = mig is not None and mig.strategy == "single"
        if first is None:  # no facts: what they decide is left as the node has it
            undecided += [PRODUCT_LABEL, MEMORY_LABEL] + ([COUNT_LABEL] if not gpus or single else [])
            if mig is not None:
                undecided += [MIG_STRATEGY_LABEL, MIG_PREFIX]
                if strategy == "time-slicing" and mig.strategy == "mixed":  # its config names the MIG resources
                    plugin = None
                    labels.pop(CONFIG_LABEL, None)
                    undecided.append(CONFIG_LABEL)
        if gpus and not single:
            labels[COUNT_LABEL] = str(gpus)
        labels.setdefault(REPLICAS_LABEL, str(replicas))
        labels[STRATEGY_LABEL] = strategy
        if first and not single:  # under single, GFD's nvidia.com/gpu.* describe the MIG devices (mig_plan)
            product = product_label(first.name, strategy in ("time-slicing", "mps") and plugin is not None
                                    and not plugin.rename and mig is None)
            if product:
                labels[PRODUCT_LABEL] = product
            if memory:
                labels[MEMORY_LABEL] = str(memory)
    allocator = host.gpu.allocator.kind if gpu_node else "device-plugin"
    dra_devices: dict[str, int] = {}
    if allocator == DRA:
        # the DRA driver publishes each GPU (a MIG-enabled GPU: each of its MIG devices) as a device of the node's
        # ResourceSlice; the device plugin's settings and labels do not apply (the loader refuses sharing here)
        dra_devices = dra_plan(resources, mig.strategy if mig else "none")
        resources, plugin = {}, None
        labels.pop(CONFIG_LABEL, None)
        labels[ALLOCATOR_LABEL] = DRA
        undecided = [u for u in undecided if u != CONFIG_LABEL]
    return GPUPlan(host.name, gpu_node, gpus, resources, labels, tuple(host.taints),
                   RUNTIME_HANDLER if gpu_node else "", strategy, replicas, plugin, memory,
                   sharing.pod_memory_mib if sharing else None, mig.strategy if mig else "none", mig_error,
                   tuple(undecided), allocator, dra_devices)


def dra_plan(resources: dict[str, int], mig_strategy: str = "none") -> dict[str, int]:
    """The DRA devices of a node from what the device plugin would advertise there: whole GPUs as "gpu", MIG
    devices (nvidia.com/mig-<profile> under the mixed strategy, or nvidia.com/gpu under single with a MIG
    layout) as "mig"; the DRA driver publishes a MIG device whatever the strategy."""
    out: dict[str, int] = {}
    for name, count in resources.items():
        kind = "mig" if name.startswith(MIG_PREFIX) or mig_strategy == "single" else "gpu"
        out[kind] = out.get(kind, 0) + count
    return {k: v for k, v in out.items() if v}


def plan_on(host: Host, facts: HostFacts | None, allocator: str) -> GPUPlan:
    """The plan the host would have on `allocator` (a node not moved yet keeps the plan of the allocator it is on:
    its device plugin config, its labels)."""
    if host.gpu.allocator.kind == allocator:
        return plan_for(host, facts)
    setting = AllocatorSetting(allocator, host.gpu.allocator.line)  # type: ignore[arg-type]
    return plan_for(dataclasses.replace(host, gpu=dataclasses.replace(host.gpu, allocator=setting)), facts)


def plans(inv: Inventory, facts: dict[str, HostFacts] | None = None) -> dict[str, GPUPlan]:
    """Every host's plan, by host name."""
    f = facts or {}
    return {h.name: plan_for(h, f.get(h.name)) for h in inv.hosts}


