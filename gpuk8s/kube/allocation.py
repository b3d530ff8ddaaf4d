"""Where every GPU went: per node and per GPU resource, capacity, allocatable, what pods request and what is
free, from the API's JSON (`kubectl get nodes/pods -o json`). Pure functions, no I/O: `gpuk8s status` fetches,
this computes, the report renders.

GPU resources are the NVIDIA device plugin's (`nvidia.com/gpu`, a renamed shared slice `nvidia.com/gpu.shared`,
MIG devices `nvidia.com/mig-<profile>` under the mixed strategy) and whatever else a node's GPU plan
(gpuk8s/gpuplan.py) says it must expose; HAMi's GPU memory and cores (`nvidia.com/gpumem`, `gpucores`) are not
node resources, only pod requests, counted against the GPUs HAMi registered on the node, else the plan's GPUs x
memory (or x 100 %). The sharing strategy and MIG layout come from the plan, else from the node's labels; this
module never decides them.

Where HAMi shares a node, its per-GPU view comes from HAMi's own annotations: the device plugin's register of the
node's GPUs (`hami.io/node-nvidia-register`) and the scheduler's placement of each pod's containers
(`hami.io/vgpu-devices-allocated`). Anyone who may write a node or pod sets those, so they are parsed as
hostile text: bounded sizes, and an odd shape gives fewer devices, never an exception.

Utilisation and memory come from the DCGM exporter's /metrics (read through the API server's pod proxy, as
monitoring verify does), parsed by prometheus-client's parser after `dcgm_text` has cut the body down to the
series gpuk8s reads (the parser is quadratic on hostile lines; the exporter's pod runs on a node that may be
compromised).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuk8s import gpuplan
from gpuk8s.errors import MetricsError
from gpuk8s.gpuplan import GPUPlan
from gpuk8s.kube import dra, state
from gpuk8s.kube.state import StateError
from gpuk8s.text import ascii_int, clean, one_line

MIG_PREFIX = "nvidia.com/mig-"
HAMI_PER_POD = (gpuplan.HAMI_MEMORY, gpuplan.HAMI_CORES)
# a dra node's devices, by type, as status names them: gpu.nvidia.com/gpu (counted with the GPUs), .../mig
DRA_PREFIX = dra.DRA_DRIVER + "/"
DRA_GPU = DRA_PREFIX + "gpu"
DONE_PHASES = ("Succeeded", "Failed")


def is_gpu_resource(name: str) -> bool:
    """An extended resource that stands for a GPU, a slice of one, or a MIG device."""
    return name == gpuplan.GPU_RESOURCE or name.startswith(gpuplan.GPU_RESOURCE + ".") or name.startswith(MIG_PREFIX)


def _qty(value: Any) -> int:
    """An extended resource's quantity: a whole number (the API forbids fractions for them); else 0."""
    s = str(value).strip()
    if s.isdigit() and len(s) <= 9:
        return int(s)
    return 0


def _l(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def pod_requests(pod: dict[str, Any]) -> dict[str, int]:
    """The GPU (and HAMi) resources a pod holds: per container the request (an extended resource's request
    equals its limit; a limit alone implies the request), summed; an init container's counts when larger."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    assert isinstance(spec, dict)

    def one(c: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        res = c.get("resources") if isinstance(c, dict) else None
        if not isinstance(res, dict):
            return out
        for part in ("limits", "requests"):
            values = res.get(part)
            if isinstance(values, dict):
                for k, v in values.items():
                    if is_gpu_resource(str(k)) or k in HAMI_PER_POD:
                        out[str(k)] = max(out.get(str(k), 0), _qty(v))
        return out

    total: dict[str, int] = {}
    for c in _l(spec.get("containers")):
        for k, v in one(c).items():
            total[k] = total.get(k, 0) + v
    for c in _l(spec.get("initContainers")):
        for k, v in one(c).items():
            total[k] = max(total.get(k, 0), v)
    return {k: v for k, v in total.items() if v > 0}


@dataclass(frozen=True)
class PodUse:
    namespace: str
    name: str
    count: int
    phase: str

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "count": self.count, "phase": self.phase}


@dataclass
class ResourceUse:
    """One GPU resource on one node."""

    resource: str
    capacity: int
    allocatable: int
    planned: int | None = None  # what the node's GPU plan says it must expose; None: no plan for it
    pods: list[PodUse] = field(default_factory=list)
    plugin_down: bool = False  # the node's device plugin pod is not running: the kubelet offers none of its devices

    @property
    def requested(self) -> int:
        return sum(p.count for p in self.pods)

    @property
    def free(self) -> int:
        return max(self.allocatable - self.requested, 0)

    @property
    def unhealthy(self) -> int:
        """Devices the node has but does not offer: the device plugin marks a GPU unhealthy (an Xid, a GPU off the
        bus) and the kubelet's allocatable drops below its capacity (HAMi's per-pod amounts are not devices). 0 while
        the node's plugin pod is not running (restarted, upgraded): the kubelet then drops every device of it for a
        while, and that is no GPU's fault."""
        return 0 if self.kind == "hami" or self.plugin_down else max(self.capacity - self.allocatable, 0)

    @property
    def kind(self) -> str:
        if self.resource.startswith(DRA_PREFIX):
            return "dra"
        if self.resource.startswith(MIG_PREFIX):
            return "mig"
        if self.resource in HAMI_PER_POD:
            return "hami"
        if self.resource != gpuplan.GPU_RESOURCE:
            return "shared"
        return "gpu"

    def to_json(self) -> dict[str, Any]:
        return {"resource": self.resource, "kind": self.kind, "capacity": self.capacity,
                "allocatable": self.allocatable, "unhealthy": self.unhealthy, "requested": self.requested,
                "free": self.free, "planned": self.planned, "pods": [p.to_json() for p in self.pods]}


@dataclass(frozen=True)
class GPUMetric:
    """One device as the DCGM exporter sees it: a GPU, or a MIG instance of one (`instance`)."""

    gpu: str
    instance: str
    model: str
    util: float | None
    memory_used_mib: float | None
    memory_free_mib: float | None
    pods: tuple[str, ...] = ()  # namespace/name of the pods the exporter attributes it to
    driver: str = ""  # the driver the exporter reads (its DCGM_FI_DRIVER_VERSION label, where it has one)

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "instance": self.instance, "model": self.model, "util_percent": self.util,
                "memory_used_mib": self.memory_used_mib, "memory_free_mib": self.memory_free_mib,
                "pods": list(self.pods), "driver": self.driver}


HAMI_REGISTER = "hami.io/node-nvidia-register"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_MAX_TEXT = 64 * 1024  # an annotation longer than this is not HAMi's: ignored
HAMI_MAX_DEVICES = 64  # GPUs of one node
HAMI_MAX_GRANTS = 256  # devices of one pod, all containers
HAMI_MAX_ID = 128  # characters of a UUID or type


@dataclass(frozen=True)
class HamiDevice:
    """One GPU as HAMi's device plugin registers it on the node."""

    index: int
    uuid: str
    count: int  # how many pods may share it (deviceSplitCount)
    memory_mib: int  # 0: not said
    cores: int
    type: str
    numa: int
    healthy: bool


@dataclass(frozen=True)
class HamiGrant:
    """One device HAMi's scheduler gave one container: memory in MiB, cores in percent (0: no limit)."""

    uuid: str
    type: str
    memory_mib: int
    cores: int


def _text_id(v: Any) -> str:
    """An id or type as text; one longer than HAMI_MAX_ID is dropped (cut, two ids could become one)."""
    t = one_line(v).strip() if isinstance(v, str) else ""
    return t if len(t) <= HAMI_MAX_ID else ""


def _base_uuid(uuid: str) -> tuple[str, str]:
    """(GPU uuid, MIG slot): HAMi's MIG mode names a grant GPU-xxx[template-position]."""
    if uuid.endswith("]") and "[" in uuid:
        base, _, slot = uuid[:-1].partition("[")
        return base, slot
    return uuid, ""


def _num(v: Any) -> int | None:
    """A count from JSON or text: a non-negative integer below 10**9, else None."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v if 0 <= v < 10 ** 9 else None
    return ascii_int(v.strip()) if isinstance(v, str) else None


def _device(index: int, d: dict[str, Any]) -> HamiDevice | None:
    uuid = _text_id(d.get("id"))
    if not uuid:
        return None
    idx = _num(d.get("index")) if d.get("index") is not None else (0 if d.get("_indexed") else None)
    health = d.get("health")
    return HamiDevice(index if idx is None else idx, uuid, _num(d.get("count")) or 0, _num(d.get("devmem")) or 0,
                      _num(d.get("devcore")) or 0, _text_id(d.get("type")), _num(d.get("numa")) or 0,
                      health is True or (isinstance(health, str) and health.strip().lower() == "true"))


def hami_devices(text: Any) -> list[HamiDevice]:
    """The node's GPUs from `hami.io/node-nvidia-register`: a JSON list of {id, index, count, devmem, devcore,
    type, numa, mode, health}, each omitted when zero or false (newer HAMi), or
    `UUID,COUNT,MEMORY,CORES,TYPE,NUMA,HEALTHY[,INDEX,MODE]:...:` (older)."""
    if not isinstance(text, str) or len(text) > HAMI_MAX_TEXT or not text.strip():
        return []
    raw: list[dict[str, Any]] = []
    if text.lstrip().startswith("["):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            return []
        raw = [d for d in _l(doc) if isinstance(d, dict)]
        # Go's omitempty leaves out index 0 (and numa 0, health false): where any entry has an index, a missing
        # one is 0, not the entry's position
        if any(d.get("index") is not None for d in raw):
            raw = [{**d, "_indexed": True} for d in raw]
    else:
        # ID,COUNT,MEM,CORE,TYPE,NUMA,HEALTH (older) or with ,INDEX,MODE (newer); HAMi skips any other shape
        keys = ("id", "count", "devmem", "devcore", "type", "numa", "health", "index", "mode")
        parts = [part.split(",") for part in text.split(":")[:HAMI_MAX_DEVICES * 2] if part.strip()]
        raw = [dict(zip(keys, f, strict=False)) for f in parts if len(f) in (7, 9)]
    out: list[HamiDevice] = []
    for i, d in enumerate(raw):
        dev = _device(i, d)
        if dev is not None and dev.uuid not in {o.uuid for o in out}:
            out.append(dev)
        if len(out) >= HAMI_MAX_DEVICES:
            break
    return out


def hami_allocations(text: Any) -> list[list[HamiGrant]]:
    """Per container, the devices HAMi's scheduler placed it on, from a pod's `hami.io/vgpu-devices-allocated`:
    containers separated by ';', their devices by ':', each `UUID,TYPE,MEMORY_MIB,CORES_PERCENT`."""
    if not isinstance(text, str) or len(text) > HAMI_MAX_TEXT:
        return []
    containers = text.split(";")
    if containers and not containers[-1].strip():
        containers.pop()  # the trailing ';' ends the last container
    out: list[list[HamiGrant]] = []
    left = HAMI_MAX_GRANTS
    for c in containers[:HAMI_MAX_GRANTS]:
        grants = []
        for dev in c.split(":"):
            f = dev.split(",")
            uuid = _text_id(f[0])
            if len(f) < 4 or not uuid or left <= 0:
                continue
            grants.append(HamiGrant(uuid, _text_id(f[1]), _num(f[2]) or 0, _num(f[3]) or 0))
            left -= 1
        out.append(grants)
    return out


@dataclass(frozen=True)
class HamiShare:
    """What one pod holds of one GPU (all its containers)."""

    namespace: str
    name: str
    memory_mib: int
    cores: int

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "memory_mib": self.memory_mib,
                "cores_percent": self.cores}


@dataclass
class HamiGPU:
    """One physical GPU of a HAMi node: its size and what HAMi's scheduler placed on it."""

    index: int | None  # None: a GPU a pod names that the node's register does not list
    uuid: str
    type: str
    memory_total_mib: int | None  # the register's, else the plan's; None: unknown
    pods: list[HamiShare] = field(default_factory=list)
    healthy: bool = True  # as the register says
    cores_total: int = 100  # the register's devcore (HAMi scales it with deviceCoreScaling), else 100 %

    @property
    def memory_mib(self) -> int:
        return sum(p.memory_mib for p in self.pods)

    @property
    def cores(self) -> int:
        return sum(p.cores for p in self.pods)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "type": self.type, "healthy": self.healthy,
                "memory_total_mib": self.memory_total_mib, "memory_mib": self.memory_mib,
                "cores_percent": self.cores, "cores_total_percent": self.cores_total,
                "pods": [p.to_json() for p in self.pods]}


def _annotation(obj: dict[str, Any], key: str) -> Any:
    md = obj.get("metadata")
    ann = md.get("annotations") if isinstance(md, dict) else None
    return ann.get(key) if isinstance(ann, dict) else None


def hami_gpus(node: dict[str, Any], held: list[tuple[dict[str, Any], dict[str, int]]],
              plan_memory_mib: int | None = None) -> list[HamiGPU]:
    """A HAMi node's GPUs (the register's, and any other one a holding pod names), each with the pods on it."""
    gpus = {d.uuid: HamiGPU(d.index, d.uuid, d.type, d.memory_mib or plan_memory_mib, healthy=d.healthy,
                            cores_total=d.cores or 100)
            for d in hami_devices(_annotation(node, HAMI_REGISTER))}
    registered = bool(gpus)
    for p, _ in held:
        shares: dict[str, tuple[str, int, int]] = {}
        for container in hami_allocations(_annotation(p, HAMI_ALLOCATED)):
            for grant in container:
                uuid = _base_uuid(grant.uuid)[0]  # a MIG slot of HAMi's MIG mode counts on its GPU
                _, mem, cores = shares.get(uuid, ("", 0, 0))
                shares[uuid] = (grant.type, mem + grant.memory_mib, cores + grant.cores)
        pns, pname = _pod_id(p)
        for uuid, (typ, mem, cores) in shares.items():
            if uuid not in gpus:
                if len(gpus) >= HAMI_MAX_DEVICES:
                    continue
                # a GPU the register does not list: its size is not known (the plan's, only without a register)
                gpus[uuid] = HamiGPU(None, uuid, typ, None if registered else plan_memory_mib)
            gpus[uuid].pods.append(HamiShare(pns, pname, mem, cores))
    for g in gpus.values():
        g.pods.sort(key=lambda s: (s.namespace, s.name))
    return sorted(gpus.values(), key=lambda g: (g.index is None, g.index or 0, g.uuid))


@dataclass
class NodeAllocation:
    node: str
    ready: bool
    gpu_node: bool
    sharing: str  # none | time-slicing | mps | hami (plan, else the node's label)
    replicas: int
    gpus: int | None  # physical GPUs (plan, else the nvidia.com/gpu.count label)
    resources: list[ResourceUse] = field(default_factory=list)
    mig: dict[str, int] = field(default_factory=dict)  # MIG profile -> devices allocatable
    mig_strategy: str = "none"  # none | single | mixed (plan, else the nvidia.com/mig.strategy label)
    metrics: list[GPUMetric] = field(default_factory=list)
    metrics_note: str = ""  # why there are no metrics ("" when read, or monitoring is off)
    hami_gpus: list[HamiGPU] = field(default_factory=list)  # HAMi's per-GPU view; empty: no HAMi here
    quarantine: str = ""  # the gpuk8s.io/quarantine taint's value (the health finding it failed); '' without one
    allocator: str = "device-plugin"  # device-plugin | dra (the plan, else kube/dra.allocator_of)
    fabric: dict[str, str] = field(default_factory=dict)  # the node's gpuk8s.io/fabric* labels (docs/fabric.md)
    rdma: tuple[int, int] | None = None  # the RDMA device plugin's resource: (requested, allocatable); None: none

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "ready": self.ready, "gpu_node": self.gpu_node, "allocator": self.allocator,
                "sharing": self.sharing,
                "replicas": self.replicas, "gpus": self.gpus, "mig": dict(self.mig),
                "mig_strategy": self.mig_strategy,
                "resources": [r.to_json() for r in self.resources],
                "metrics": [m.to_json() for m in self.metrics], "metrics_note": self.metrics_note,
                "hami_gpus": [g.to_json() for g in self.hami_gpus], "quarantine": self.quarantine,
                "fabric": dict(self.fabric),
                "rdma": None if self.rdma is None else {"requested": self.rdma[0], "allocatable": self.rdma[1]}}


@dataclass
class ClusterAllocation:
    nodes: list[NodeAllocation]

    def totals(self) -> dict[str, tuple[int, int]]:
        """resource -> (requested, allocatable) over every node; HAMi's per-pod amounts left out."""
        out: dict[str, tuple[int, int]] = {}
        for n in self.nodes:
            for r in n.resources:
                if r.kind == "hami":
                    continue
                key = gpuplan.GPU_RESOURCE if r.resource == DRA_GPU else r.resource  # a GPU is a GPU, by either
                req, alloc = out.get(key, (0, 0))
                out[key] = (req + r.requested, alloc + r.allocatable)
        return dict(sorted(out.items(), key=lambda kv: (kv[0] != gpuplan.GPU_RESOURCE, kv[0])))

    def footer(self) -> list[str]:
        """'Allocated/Total GPUs in cluster: 9/30 (30%)', one line per GPU resource name."""
        lines = []
        for res, (req, alloc) in self.totals().items():
            what = "GPUs" if res == gpuplan.GPU_RESOURCE else res
            pct = req * 100 // alloc if alloc else 0
            lines.append(f"Allocated/Total {what} in cluster: {req}/{alloc} ({pct}%)")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [n.to_json() for n in self.nodes],
                "totals": [{"resource": k, "requested": v[0], "allocatable": v[1],
                            "percent": v[0] * 100 // v[1] if v[1] else 0} for k, v in self.totals().items()],
                "footer": self.footer()}


def _pod_id(pod: dict[str, Any]) -> tuple[str, str]:
    md = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    assert isinstance(md, dict)
    return str(md.get("namespace", "default") or "default"), str(md.get("name", "") or "")


def bound_pods(pods: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(node, pod, its spec) of each pod bound to a node and not finished."""
    for p in pods:
        if not isinstance(p, dict):
            continue
        spec = p.get("spec") if isinstance(p.get("spec"), dict) else {}
        status = p.get("status") if isinstance(p.get("status"), dict) else {}
        assert isinstance(spec, dict) and isinstance(status, dict)
        node = spec.get("nodeName")
        if isinstance(node, str) and node and status.get("phase") not in DONE_PHASES:
            yield node, p, spec


def holding_pods(pods: list[dict[str, Any]]) -> dict[str, list[tuple[dict[str, Any], dict[str, int]]]]:
    """node -> the pods bound to it that hold GPU resources (not finished), with what they hold."""
    out: dict[str, list[tuple[dict[str, Any], dict[str, int]]]] = {}
    for node, p, _ in bound_pods(pods):
        req = pod_requests(p)
        if req:
            out.setdefault(node, []).append((p, req))
    return out


def _granted(hami: list[HamiGPU], res: str) -> dict[tuple[str, str], int]:
    """(namespace, pod) -> the memory (MiB) or cores (%) HAMi's scheduler placed for it, over all GPUs."""
    out: dict[tuple[str, str], int] = {}
    for g in hami:
        for s in g.pods:
            out[(s.namespace, s.name)] = out.get((s.namespace, s.name), 0) + (
                s.memory_mib if res == gpuplan.HAMI_MEMORY else s.cores)
    return out


def _hami_total(res: str, hami: list[HamiGPU], gpus: int | None, plan: GPUPlan | None) -> int:
    """A HAMi node's memory (MiB) or cores (percent) in all: its register's GPUs (what HAMi's scheduler counts
    against) where it has one, else the plan's GPUs x memory (or x 100 %)."""
    registered = [g for g in hami if g.index is not None]
    if registered and (res != gpuplan.HAMI_MEMORY or all(g.memory_total_mib for g in registered)):
        return sum((g.memory_total_mib or 0) if res == gpuplan.HAMI_MEMORY else g.cores_total for g in registered)
    per = (plan.gpu_memory_mib or 0) if res == gpuplan.HAMI_MEMORY and plan is not None else 100
    return (gpus or 0) * per


def dra_resources(nd: dra.NodeDevices | None, plan: GPUPlan | None) -> list[ResourceUse]:
    """A dra node's devices as resources (gpu.nvidia.com/gpu, gpu.nvidia.com/mig): published, planned, and held
    by the pods the claims are reserved for (one count per device)."""
    out = []
    for kind in ("gpu", "mig"):
        have = nd.count(kind) if nd is not None else 0
        planned = plan.dra_devices.get(kind) if plan is not None and plan.dra else None
        if not have and not planned:
            continue
        use = ResourceUse(f"{DRA_PREFIX}{kind}", have, have, planned)
        types = {d.name: d.type for d in nd.devices} if nd is not None else {}
        held: dict[tuple[str, str], int] = {}
        counted: set[str] = set()
        for a in nd.allocated if nd is not None else []:
            if types.get(a.device) == kind and a.device not in counted:
                # a device once, for the first pod its claim is reserved for (a claim several pods share holds
                # its devices once)
                counted.add(a.device)
                pns, _, pname = sorted(a.pods or (a.claim + " (claim, no pod)",))[0].partition("/")
                held[(pns, pname)] = held.get((pns, pname), 0) + 1
        use.pods = [PodUse(pns, pname, n, "") for (pns, pname), n in sorted(held.items())]
        out.append(use)
    return out


def node_allocation(node: dict[str, Any], held: list[tuple[dict[str, Any], dict[str, int]]],
                    plan: GPUPlan | None = None, plugin_down: bool = False,
                    devices: dra.NodeDevices | None = None, rdma_requested: int = 0) -> NodeAllocation:
    """One node's GPU resources: those it has (capacity), those its plan wants, and those its pods hold; on a
    dra node the devices the DRA driver publishes there (`devices`) and the claims holding them."""
    ns = state.node_state(node)
    status = node.get("status") if isinstance(node.get("status"), dict) else {}
    assert isinstance(status, dict)
    capacity = status.get("capacity") if isinstance(status.get("capacity"), dict) else {}
    assert isinstance(capacity, dict)
    names = {k for k in (*capacity, *ns.allocatable) if is_gpu_resource(str(k))}
    planned = dict(plan.resources) if plan is not None else {}
    names |= set(planned)
    for _, req in held:
        names |= set(req)
    labels = ns.labels
    sharing = plan.sharing if plan is not None and plan.gpu_node else labels.get(gpuplan.STRATEGY_LABEL, "none")
    replicas = plan.replicas if plan is not None and plan.gpu_node else _qty(labels.get(gpuplan.REPLICAS_LABEL, 1))
    gpus = plan.gpus if plan is not None and plan.gpus is not None else (
        _qty(labels[gpuplan.COUNT_LABEL]) if gpuplan.COUNT_LABEL in labels else None)
    hami = hami_gpus(node, held, plan.gpu_memory_mib if plan is not None else None)
    # the node as it is (its label), not as the inventory wants it: a node not moved yet is its device plugin's (the
    # label of gpuk8s up to main 3c20938 counts where the inventory says the same, until install moves it)
    allocator = dra.allocator_of(node, plan.allocator if plan is not None else None)
    resources = []
    for res in sorted(names, key=lambda r: (r in HAMI_PER_POD, r != gpuplan.GPU_RESOURCE, r)):
        if allocator == gpuplan.DRA and not _qty(capacity.get(res, 0)) and not planned.get(res):
            continue  # a pod's nvidia.com/gpu that DRA serves here (its DeviceClass names it): counted below
        if res in HAMI_PER_POD:
            total = _hami_total(res, hami, gpus, plan)
            use = ResourceUse(res, total, total)
        else:
            use = ResourceUse(res, _qty(capacity.get(res, 0)), ns.allocatable_of(res), planned.get(res),
                              plugin_down=plugin_down)
        granted = _granted(hami, res) if res in HAMI_PER_POD else {}
        for p, req in held:
            pns, pname = _pod_id(p)
            # what HAMi's scheduler placed (per GPU, a pod without gpumem holding the whole memory) where it
            # recorded it, else what the pod asks for
            count = granted.get((pns, pname), req.get(res, 0))
            if count:
                st = p.get("status")
                phase = str(st.get("phase", "") or "") if isinstance(st, dict) else ""
                use.pods.append(PodUse(pns, pname, count, phase))
        use.pods.sort(key=lambda u: (u.namespace, u.name))
        resources.append(use)
    mig = {r.resource[len(MIG_PREFIX):]: r.allocatable for r in resources if r.kind == "mig"}
    strategy = str(getattr(plan, "mig_strategy", "none") or "none") if plan is not None else "none"
    if strategy == "none":
        strategy = labels.get("nvidia.com/mig.strategy", "mixed" if mig else "none")
    if allocator == gpuplan.DRA or devices is not None:
        resources += dra_resources(devices, plan)
    fabric = {k: v for k, v in labels.items() if k.startswith(gpuplan.FABRIC_LABEL)}
    rdma = (rdma_requested, ns.allocatable_of(gpuplan.RDMA_RESOURCE)) \
        if gpuplan.RDMA_RESOURCE in capacity or rdma_requested else None
    return NodeAllocation(ns.name, ns.ready, bool(plan.gpu_node) if plan is not None else bool(
        labels.get(gpuplan.GPU_PRESENT) == "true" or any(r.allocatable for r in resources)),
        sharing or "none", replicas or 1, gpus, resources, mig, strategy,
        hami_gpus=hami, quarantine=ns.quarantine, allocator=allocator, fabric=fabric, rdma=rdma)


def rdma_requests(pods: list[dict[str, Any]]) -> dict[str, int]:
    """node -> how many of the RDMA device plugin's shared slots its bound, unfinished pods hold."""
    out: dict[str, int] = {}
    for node, _, spec in bound_pods(pods):
        n = 0
        for c in _l(spec.get("containers")):
            res = c.get("resources") if isinstance(c, dict) else None
            got = [res.get(part) for part in ("limits", "requests")] if isinstance(res, dict) else []
            n += max((_qty(v.get(gpuplan.RDMA_RESOURCE, 0)) for v in got if isinstance(v, dict)), default=0)
        if n:
            out[node] = out.get(node, 0) + n
    return out


def allocation(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], plans: dict[str, GPUPlan] | None = None,
               only: list[str] | None = None,
               devices: dict[str, dra.NodeDevices] | None = None) -> ClusterAllocation:
    """The cluster's GPU allocation; `only`: these nodes (the footer then counts them alone); `devices`: what the
    DRA driver publishes per node, with its claims (kube/dra.by_node)."""
    held = holding_pods(pods)
    rdma = rdma_requests(pods)
    plugins = []  # gpuk8s's device plugin pods (is_device_plugin_pod: by owner, not by a look-alike name)
    for p in pods:
        md = p.get("metadata") if isinstance(p, dict) else None
        if isinstance(md, dict) and str(md.get("name", "")).startswith(state.DEVICE_PLUGIN_POD_PREFIX):
            with contextlib.suppress(StateError):
                plugins.append(state.pod_state(p))
    out = []
    for n in nodes:
        try:
            name = state.name_of(n)
            if only and name not in only:
                continue
            plugin = state.device_plugin_pod(plugins, name)
            down = plugin is not None and (plugin.phase != "Running" or bool(plugin.waiting))
            a = node_allocation(n, held.get(name, []), (plans or {}).get(name), plugin_down=down,
                                devices=(devices or {}).get(name), rdma_requested=rdma.get(name, 0))
        except StateError:
            continue
        if a.gpu_node or a.resources:
            out.append(a)
    return ClusterAllocation(sorted(out, key=lambda a: a.node))


UTIL, FB_USED, FB_FREE = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"

# The exporter's /metrics is text from a pod on a GPU node: a compromised node writes what it likes there, and
# prometheus-client's parser is quadratic in a line's labels and escaped quotes (1 MiB of them stalled `status`
# 12-16 s). So the body is bounded, and only the sample lines of the series gpuk8s reads reach the parser, each
# bounded too; every other line (HELP/TYPE comments included: the parser does not need them for gauges) is dropped.
METRICS_MAX_BYTES = 4 << 20  # a larger body is not read (an 8-GPU exporter serves about 100 KiB)
METRICS_MAX_LINE = 2048  # characters of one sample line (DCGM's longest, all names at their limits: ~1 KiB)
METRICS_MAX_LABELS = 24  # labels of one series (DCGM's: gpu, UUID, device, modelName, Hostname, pod... ~14)
METRICS_MAX_SERIES = 1024  # sample lines kept (8 GPUs x 7 MIG devices x 3 series is 168)
METRICS_MAX_MENTIONS = 2 * METRICS_MAX_SERIES  # lines naming these series at all (their HELP/TYPE lines too)


@functools.lru_cache(maxsize=8)
def _mentions(names: tuple[str, ...]) -> re.Pattern[str]:
    """From one of `names` (followed by its labels or its value) to the end of that line: the parser's lines
    end at newlines only. The rest of the line is taken, so a line matches at most once."""
    return re.compile("(?:" + "|".join(re.escape(n) for n in names) + ")[{ \t][^\n]*")


def dcgm_text(text: str, names: Iterable[str]) -> str:
    """The sample lines of the series `names` in an exporter's /metrics text, for prometheus-client's parser.

    Linear time, and a bounded number of Python steps: the lines are found by a regular expression (in C), and a
    body over METRICS_MAX_BYTES, with more than METRICS_MAX_MENTIONS lines naming these series or more than
    METRICS_MAX_SERIES sample lines of them is a MetricsError. A line longer than METRICS_MAX_LINE, with more
    labels than METRICS_MAX_LABELS, or with a backslash (an escape: no label of these series holds one; escaped
    quotes are what the parser is quadratic in) is dropped, as is every other line."""
    if len(text) > METRICS_MAX_BYTES:
        raise MetricsError(f"the body is larger than {METRICS_MAX_BYTES >> 20} MiB: not read")
    wanted = tuple(sorted(set(names)))
    kept: list[str] = []
    for n, found in enumerate(_mentions(wanted).finditer(text)):
        if n >= METRICS_MAX_MENTIONS:
            raise MetricsError(f"more than {METRICS_MAX_MENTIONS} lines name {', '.join(wanted)}: not read")
        start = found.start()
        begin = text.rfind("\n", 0, start) + 1  # back over this line's start only (one match a line): linear
        if begin < start and not text[begin:start].isspace():
            continue  # the name in the middle of a line: a comment, another metric's label
        line = found.group(0).rstrip()
        if len(line) > METRICS_MAX_LINE or "\\" in line or line.count("=") > METRICS_MAX_LABELS:
            continue
        if len(kept) >= METRICS_MAX_SERIES:
            raise MetricsError(f"more than {METRICS_MAX_SERIES} series of {', '.join(wanted)}: not read")
        kept.append(line)
    return "\n".join(kept) + "\n"


def gpu_metrics(text: str) -> list[GPUMetric]:
    """Utilisation and framebuffer memory per device (gpu, MIG instance GPU_I_ID) from the DCGM exporter's
    /metrics; the pods it names (pod/namespace labels, when it reads the kubelet's pod-resources)."""
    values: dict[tuple[str, str], dict[str, Any]] = {}
    text = dcgm_text(text, (UTIL, FB_USED, FB_FREE))
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name not in (UTIL, FB_USED, FB_FREE):
                    continue
                key = (s.labels.get("gpu", ""), s.labels.get("GPU_I_ID", ""))
                d = values.setdefault(key, {"model": s.labels.get("modelName", ""), "pods": set(), "driver": ""})
                drv = s.labels.get("DCGM_FI_DRIVER_VERSION", "")
                if _DRIVER.fullmatch(drv):
                    d["driver"] = drv
                d[s.name] = float(s.value)
                if s.labels.get("pod"):
                    d["pods"].add(f"{s.labels.get('namespace', '')}/{s.labels['pod']}")
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise MetricsError(f"not the Prometheus text format: {clean(str(e))[:200]}") from None

    def order(k: tuple[str, str]) -> tuple[int, str, str]:
        return (int(k[0]) if k[0].isdigit() else 1 << 30, k[0], k[1])

    return [GPUMetric(g, i, clean(d["model"]), d.get(UTIL), d.get(FB_USED), d.get(FB_FREE),
                      tuple(sorted(d["pods"])), d["driver"])
            for (g, i), d in sorted(values.items(), key=lambda kv: order(kv[0]))]


# A driver version as the exporter labels its series ("580.82.07"); anything else a node writes there is not shown
_DRIVER = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){1,3}")
