"""Dynamic Resource Allocation as the API server returns it (pure): the GPUs and MIG devices NVIDIA's DRA driver
publishes per node (ResourceSlices) and which pods hold them (ResourceClaims). docs/dra.md.

Read from the objects' JSON only, typed and bounded: a field of the wrong type is left out, never trusted, and a
slice or claim of another driver is ignored. The shapes are resource.k8s.io/v1's, as the real driver publishes
them (tests/fixtures/real/dra/: charts 25.3.2 and 25.12.0, two Kubernetes minors): a slice per node and
driver (`spec.nodeName`, `spec.pool.name` the node's name, `spec.devices[]` with `name`, typed `attributes` such
as `type: {string: gpu}` and `productName`, `capacity.memory.value`), a claim's `status.allocation.devices
.results[]` (driver, pool, device, request) and `status.reservedFor[]` (the pods using it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpuk8s.gpuplan import ALLOCATOR_LABEL, DRA, LEGACY_ALLOCATOR_LABEL, GPUPlan
from gpuk8s.kube import state

DRA_DRIVER = "gpu.nvidia.com"  # the NVIDIA DRA driver's name in ResourceSlices, claims' results and DeviceClasses
DRA_CLASSES = {"gpu": "gpu.nvidia.com", "mig": "mig.nvidia.com"}  # device type -> the DeviceClass selecting it
DRA_NAMESPACE = "nvidia-dra-driver-gpu"  # the namespace NVIDIA's install guide gives the chart's release
DRA_NAME = "dra-driver-nvidia-gpu"  # the chart's name: its objects' names and the kubelet plugin's labels
DRA_PLUGIN = f"{DRA_NAME}-kubelet-plugin"  # the kubelet plugin's DaemonSet (its pods: DRA_PLUGIN-<node>...)
MAX_DEVICES = 1024  # per slice (the API allows 128 per slice in v1; a hostile object is cut here)
MAX_ITEMS = 100_000  # slices or claims read at all
# per node: a node's kubelet may publish any number of slices naming itself (hostile data); a real node publishes
# one slice per pool generation with at most a few hundred devices (8 GPUs x 7 MIG devices and their parents)
MAX_NODE_SLICES = 64
MAX_NODE_DEVICES = 4096


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice: gpu-0 (type gpu) or a MIG device (type mig, its profile)."""

    name: str
    type: str  # "gpu" | "mig" | another the driver publishes (vfio, ...)
    product: str = ""
    memory: str = ""  # capacity.memory.value as published ("81559Mi")
    profile: str = ""  # a MIG device's profile ("1g.10gb")
    uuid: str = ""


@dataclass(frozen=True)
class Allocation:
    """One device a claim holds: where and for which pods."""

    claim: str  # namespace/name
    node: str  # the pool (the node's name, as the NVIDIA driver names its pools)
    device: str
    pods: tuple[str, ...] = ()  # namespace/name of the pods the claim is reserved for


@dataclass
class NodeDevices:
    """What DRA publishes on one node and what of it is allocated."""

    devices: list[Device] = field(default_factory=list)
    allocated: list[Allocation] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for d in self.devices if d.type == kind)

    @property
    def in_use(self) -> int:
        return len({a.device for a in self.allocated})


def labelled(node: Any, planned: str | None = None) -> bool:
    """Whether a node object (hostile data) carries gpuk8s's label of a dra node (gpuplan.ALLOCATOR_LABEL=dra, which
    no kubelet can set). The label gpuk8s wrote up to main 3c20938 (LEGACY_ALLOCATOR_LABEL), which any kubelet can
    set on its own node, counts only where the inventory says the same (`planned`): a host cannot put itself on
    DRA."""
    md = node.get("metadata") if isinstance(node, dict) else None
    labels = md.get("labels") if isinstance(md, dict) else None
    if not isinstance(labels, dict):
        return False
    if ALLOCATOR_LABEL in labels:
        return labels.get(ALLOCATOR_LABEL) == DRA
    return planned == DRA and labels.get(LEGACY_ALLOCATOR_LABEL) == DRA


def allocator_of(node: Any, planned: str | None = None) -> str:
    """The allocator a node object is on now, as its label says: dra, else the device plugin (`planned`: the
    inventory's, as `labelled`). The one place that reads it (status, the gpu phase's manifests, the move)."""
    return DRA if labelled(node, planned) else "device-plugin"


def _str(v: Any, limit: int = 253) -> str:
    return v[:limit] if isinstance(v, str) else ""


def _dict(o: dict[str, Any], key: str) -> dict[str, Any]:
    v = o.get(key)
    return v if isinstance(v, dict) else {}


def _list(o: dict[str, Any], key: str) -> list[Any]:
    v = o.get(key)
    return v if isinstance(v, list) else []


def _items(doc: Any) -> list[dict[str, Any]]:
    """The objects of a List document (`kubectl get -o json`) or of a list of objects (KubeClient.get)."""
    items = doc.get("items") if isinstance(doc, dict) else doc
    return [i for i in items[:MAX_ITEMS] if isinstance(i, dict)] if isinstance(items, list) else []


def _attr(attrs: dict[str, Any], key: str) -> str:
    """A typed attribute's value as text ({string: ...}, {version: ...}, {int: ...}); '' when absent."""
    v = attrs.get(key)
    if not isinstance(v, dict):
        return ""
    for kind in ("string", "version"):
        if isinstance(v.get(kind), str):
            return _str(v[kind])
    if isinstance(v.get("int"), int) and not isinstance(v.get("int"), bool):
        return str(v["int"])
    return ""


def _device(d: Any) -> Device | None:
    if not isinstance(d, dict) or not _str(d.get("name")):
        return None
    attrs = _dict(d, "attributes")
    cap = _dict(d, "capacity")
    mem = _dict(cap, "memory")
    return Device(_str(d["name"]), _attr(attrs, "type"), _attr(attrs, "productName"), _str(mem.get("value"), 32),
                  _attr(attrs, "profile"), _attr(attrs, "uuid"))


def published(slices: Any, driver: str = DRA_DRIVER) -> dict[str, NodeDevices]:
    """The driver's devices per node, from ResourceSlices (a List, or the list KubeClient.get returns): of each
    pool only the slices of its newest generation (an older one is being replaced), each device name once."""
    mine = []
    newest: dict[tuple[str, str], int] = {}
    for s in _items(slices):
        spec = _dict(s, "spec")
        node = _str(spec.get("nodeName"))
        if spec.get("driver") != driver or not node:
            continue
        pool = _dict(spec, "pool")
        gen = pool.get("generation")
        key = (node, _str(pool.get("name")))
        gen = gen if isinstance(gen, int) and not isinstance(gen, bool) else 0
        newest[key] = max(newest.get(key, gen), gen)
        mine.append((node, key, gen, _list(spec, "devices")))
    out: dict[str, NodeDevices] = {}
    # one set of device names per node, kept across its slices (rebuilding it per slice was quadratic: 1,500 slices
    # of one node took status 16 s), and a cap on a node's slices and devices
    seen: dict[str, set[str]] = {}
    slices_of: dict[str, int] = {}
    for node, key, gen, devices in mine:
        if gen < newest[key] or slices_of.get(node, 0) >= MAX_NODE_SLICES:
            continue
        slices_of[node] = slices_of.get(node, 0) + 1
        nd = out.setdefault(node, NodeDevices())
        names = seen.setdefault(node, set())
        for d in map(_device, devices[:MAX_DEVICES]):
            if len(nd.devices) >= MAX_NODE_DEVICES:
                break
            if d is not None and d.name not in names:
                names.add(d.name)
                nd.devices.append(d)
    return out


def allocations(claims: Any, driver: str = DRA_DRIVER) -> list[Allocation]:
    """Every device of `driver` that a claim holds, from a List of ResourceClaims."""
    out: list[Allocation] = []
    for c in _items(claims):
        md = _dict(c, "metadata")
        status = _dict(c, "status")
        alloc = _dict(status, "allocation")
        devices = _dict(alloc, "devices")
        results = _list(devices, "results")
        reserved = _list(status, "reservedFor")
        ns = _str(md.get("namespace")) or "default"
        pods = tuple(f"{ns}/{_str(r.get('name'))}" for r in reserved[:MAX_DEVICES]
                     if isinstance(r, dict) and r.get("resource") == "pods" and _str(r.get("name")))
        name = f"{ns}/{_str(md.get('name'))}"
        for r in results[:MAX_DEVICES]:
            if isinstance(r, dict) and r.get("driver") == driver and _str(r.get("pool")) and _str(r.get("device")):
                out.append(Allocation(name, _str(r["pool"]), _str(r["device"]), pods))
    return out


def by_node(slices: Any, claims: Any) -> dict[str, NodeDevices]:
    """Per node: what the driver publishes and what of it claims hold."""
    out = published(slices)
    for a in allocations(claims):
        out.setdefault(a.node, NodeDevices()).allocated.append(a)
    return out


def verdict(node: str, want: dict[str, int], nd: NodeDevices | None) -> tuple[int, str, str, list[str]]:
    """Whether the driver publishes every device a dra node's plan expects (`want`: type -> count): (the wanted
    devices published, cause id, cause, evidence); the cause is '' when all are."""
    total = sum(want.values())
    if nd is None or not nd.devices:
        return 0, "dra.no-devices", (f"no ResourceSlice of {DRA_DRIVER} lists this node's devices: the DRA kubelet "
                                     f"plugin is not running or not registered there ({total} expected)"), [
            f"kubectl get resourceslices: no slice of driver {DRA_DRIVER} with nodeName {node}"]
    have = {k: nd.count(k) for k in want}
    short = [f"{have[k]} of {v} {k}" for k, v in sorted(want.items()) if have[k] < v]
    published = sum(min(have[k], v) for k, v in want.items())
    if short:
        names = ", ".join(f"{d.name} ({d.type or 'no type'})" for d in nd.devices[:16])
        return published, "dra.devices-missing", (f"the DRA driver publishes {', '.join(short)} device(s) on this "
                                                  "node"), [f"ResourceSlice devices: {names}"]
    return published, "", "", []


# A claim request's selector as doctor reads it: equality on one of the driver's string attributes (the form of the
# driver's own demo and test specs, tests/fixtures/real/dra/); any other CEL is not judged
_EQUALS = re.compile(r"""^\s*device\.attributes\[\s*['"]([\w.-]{1,63})['"]\s*\]\.(\w{1,63})\s*==\s*"""
                     r"""['"]([^'"]{0,253})['"]\s*$""")
_ATTRIBUTES = {"productName": "product", "profile": "profile", "type": "type", "uuid": "uuid"}


@dataclass(frozen=True)
class Request:
    """One request of a claim (template), as its pod asks it."""

    claim: str  # the pod's name for the claim
    name: str
    device_class: str
    count: int
    selectors: tuple[str, ...] = ()  # CEL expressions, as written (bounded)


def requests_of(pod: Any, templates: dict[tuple[str, str], Any]) -> list[Request]:
    """The device requests of a pod's claims made from templates (`templates`: (namespace, name) -> the
    ResourceClaimTemplate object); a claim by name, or a template not found, gives none."""
    spec = _dict(pod, "spec") if isinstance(pod, dict) else {}
    ns = _str(_dict(pod, "metadata").get("namespace")) if isinstance(pod, dict) else ""
    out: list[Request] = []
    for pc in _list(spec, "resourceClaims")[:MAX_DEVICES]:
        if not isinstance(pc, dict):
            continue
        tmpl = templates.get((ns or "default", _str(pc.get("resourceClaimTemplateName"))))
        body = _dict(_dict(tmpl, "spec"), "spec") if isinstance(tmpl, dict) else {}
        for r in _list(_dict(body, "devices"), "requests")[:MAX_DEVICES]:
            ex = _dict(r, "exactly") if isinstance(r, dict) else {}
            count = ex.get("count", 1)
            sels = tuple(_str(_dict(x, "cel").get("expression"), 1024) for x in _list(ex, "selectors")[:16]
                         if isinstance(x, dict))
            out.append(Request(_str(pc.get("name")), _str(r.get("name")) if isinstance(r, dict) else "",
                               _str(ex.get("deviceClassName")),
                               count if isinstance(count, int) and not isinstance(count, bool) else 1, sels))
    return out


def unmatched(selector: str, devices: list[Device]) -> str:
    """'' where the selector may match (or is not judged); else what it asks that no device has, with what they
    have: "productName == 'X' (the devices have: NVIDIA A100-SXM4-80GB)"."""
    m = _EQUALS.match(selector)
    if not m or m.group(1) != DRA_DRIVER or m.group(2) not in _ATTRIBUTES:
        return ""
    field_ = _ATTRIBUTES[m.group(2)]
    have = sorted({str(getattr(d, field_)) for d in devices if getattr(d, field_)})
    if m.group(3) in have:
        return ""
    return f"{m.group(2)} == {m.group(3)!r} (the devices have: {', '.join(have[:8]) or 'none published'})"


def offers(plan: GPUPlan, node: Any, nd: NodeDevices | None) -> tuple[bool, str]:
    """Whether the node's allocator (per its plan) offers its GPUs, and the other allocator none of them, with what
    it offers: on a dra node every device of the plan in its ResourceSlice (`nd`) and no nvidia.com/ resource
    allocatable; on a device-plugin node every resource of the plan allocatable (at least one GPU where the plan
    cannot count them) and no device in a ResourceSlice. Both at once would hand out the same GPUs twice. The one
    place that decides it: verify, the allocator's move and driver upgrade's wait ask here."""
    try:
        ns = state.node_state(node)
    except state.StateError as e:
        return False, f"its node object is unreadable: {e}"
    plugin = {k: ns.allocatable_of(k) for k in ns.allocatable if k.startswith("nvidia.com/")}
    if plan.dra:
        n, _id, cause, _ev = verdict(plan.node, plan.dra_devices or {"gpu": 1}, nd)
        what = f"{n} of {sum(plan.dra_devices.values()) or 'its'} device(s) in its ResourceSlice"
        stale = {k: v for k, v in plugin.items() if v}
        if stale:
            what += ", and still " + ", ".join(f"{v} {k}" for k, v in sorted(stale.items())) + " allocatable"
        return not cause and not stale, what
    want = dict(plan.resources) or {plan.resource_name: 1}
    short = {k: v for k, v in want.items() if plugin.get(k, 0) < v}
    what = ", ".join(f"{plugin.get(k, 0)} of {v} {k}" for k, v in sorted(want.items())) + " allocatable"
    if nd is not None and nd.devices:
        what += f", and still {len(nd.devices)} device(s) in a ResourceSlice of {DRA_DRIVER}"
    return not short and not (nd is not None and nd.devices), what


def served_twice(plan: GPUPlan, node: Any, nd: NodeDevices | None) -> bool:
    """Whether the other allocator than the node's plan says also offers its GPUs (`offers` fails for it): nvidia.com/
    resources allocatable on a dra node, devices in a ResourceSlice of a device-plugin node."""
    try:
        ns = state.node_state(node)
    except state.StateError:
        return False
    if plan.dra:
        return any(ns.allocatable_of(k) for k in ns.allocatable if k.startswith("nvidia.com/"))
    return nd is not None and bool(nd.devices)


@dataclass(frozen=True)
class AllocatorCause:
    """A node's allocator verdict beyond its GPU count (verify's and doctor's): a registered finding id, the cause,
    the lines that show it, the remedy."""

    id: str
    cause: str
    evidence: tuple[str, ...]
    remedy: str


def allocator_differs(plan: GPUPlan, node: Any) -> AllocatorCause | None:
    """node.allocator-differs: a GPU node on another allocator than its inventory says (install held it: GPU pods
    on it), named as such rather than as a broken allocator; None where it is on its own."""
    if not plan.gpu_node or labelled(node, plan.allocator) == plan.dra:
        return None
    now = allocator_of(node, plan.allocator)
    return AllocatorCause("node.allocator-differs", f"on {now}, where the inventory says allocator: {plan.allocator}",
                          (f"label {ALLOCATOR_LABEL}: {now if now == 'dra' else '(none)'}",),
                          f"gpuk8s allocator {plan.node} --to {plan.allocator} (drained, its GPU pods waited for)")


def double_served(plan: GPUPlan, node: Any, nd: NodeDevices | None) -> AllocatorCause | None:
    """dra.double-served: both allocators offer the node's GPUs (each would hand them out); None where not."""
    if not plan.gpu_node or not served_twice(plan, node, nd):
        return None
    return AllocatorCause("dra.double-served", f"both allocators serve this node's GPUs: {offers(plan, node, nd)[1]}",
                          (), f"gpuk8s allocator {plan.node} --to {plan.allocator} (it waits for the other allocator "
                          "to stop), or gpuk8s install")
