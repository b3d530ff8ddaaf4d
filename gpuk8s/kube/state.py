"""Cluster state read from `kubectl get ... -o json`, and the verdict on each node: pure functions, no I/O.

`gpuk8s verify` (over SSH, kubectl on the control plane) and the kind smoke tests (local kubectl) feed
the same functions, so what they conclude about a node is decided in one place. Any input gives a
value or a StateError; never another exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"
DEVICE_PLUGIN_POD_PREFIX = "nvidia-device-plugin"


class StateError(Exception):
    """kubectl printed something that is not the object we asked for."""


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StateError(f"{what} is not an object")
    return value


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _sub(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value):
        return int(value)
    return default


def load(text: str) -> dict[str, Any]:
    """One object printed by `kubectl get KIND NAME -o json` (or a List)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise StateError("kubectl printed no JSON") from None
    return _dict(data, "kubectl's output")


def items(text: str) -> list[dict[str, Any]]:
    """The objects of `kubectl get KIND -o json`; entries that are not objects are dropped."""
    raw = load(text).get("items", [])
    if not isinstance(raw, list):
        raise StateError("kubectl's output has no list of items")
    return [i for i in raw if isinstance(i, dict)]


def name_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise StateError("an object without metadata.name")
    return name


def by_name(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for o in objs:
        try:
            out[name_of(o)] = o
        except StateError:
            continue
    return out


@dataclass
class NodeState:
    name: str
    ready: bool
    ready_message: str
    allocatable_gpus: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: set[tuple[str, str, str]] = field(default_factory=set)


def node_state(node: Any) -> NodeState:
    node = _dict(node, "a node")
    name = name_of(node)
    status = _sub(node, "status")
    ready = next((c for c in _list(status.get("conditions")) if isinstance(c, dict) and c.get("type") == "Ready"),
                 None)
    taints = set()
    for t in _list(_sub(node, "spec").get("taints")):
        if isinstance(t, dict) and isinstance(t.get("key"), str) and isinstance(t.get("effect"), str):
            taints.add((t["key"], str(t.get("value", "") or ""), t["effect"]))
    return NodeState(
        name=name,
        ready=ready is not None and ready.get("status") == "True",
        ready_message=str(ready.get("message", "")) if ready else "no Ready condition",
        allocatable_gpus=_int(_sub(status, "allocatable").get(GPU_RESOURCE)),
        labels=_str_map(_sub(node, "metadata").get("labels")),
        taints=taints,
    )


@dataclass
class PodState:
    name: str
    node: str
    phase: str
    waiting: str  # a container's waiting reason (CrashLoopBackOff, ImagePullBackOff, ...), else ''
    restarts: int
    unschedulable: str  # the scheduler's message when it cannot place the pod
    reason: str = ""  # status.reason: e.g. OutOfnvidia.com/gpu when the kubelet rejected the pod
    message: str = ""


def pod_state(pod: Any) -> PodState:
    pod = _dict(pod, "a pod")
    status = _sub(pod, "status")
    waiting, restarts = "", 0
    for cs in _list(status.get("containerStatuses")):
        if not isinstance(cs, dict):
            continue
        restarts += _int(cs.get("restartCount"))
        w = _sub(cs, "state").get("waiting")
        if isinstance(w, dict) and not waiting:
            waiting = str(w.get("reason", "") or "Waiting")
    unsched = next((str(c.get("message", "") or "Unschedulable") for c in _list(status.get("conditions"))
                    if isinstance(c, dict) and c.get("reason") == "Unschedulable"), "")
    text = {k: str(status.get(k, "") or "") for k in ("phase", "reason", "message")}
    return PodState(name_of(pod), str(_sub(pod, "spec").get("nodeName", "") or ""), text["phase"], waiting, restarts,
                    unsched, text["reason"], text["message"])


def pod_states(pods: list[dict[str, Any]]) -> list[PodState]:
    """The readable pods of a list; a pod without a name is left out."""
    out = []
    for p in pods:
        try:
            out.append(pod_state(p))
        except StateError:
            continue
    return out


@dataclass
class DaemonSetState:
    name: str
    desired: int
    scheduled: int
    ready: int
    annotations: dict[str, str] = field(default_factory=dict)


def daemonset_state(ds: Any) -> DaemonSetState:
    ds = _dict(ds, "a DaemonSet")
    status = _sub(ds, "status")
    return DaemonSetState(name_of(ds), _int(status.get("desiredNumberScheduled")),
                          _int(status.get("currentNumberScheduled")), _int(status.get("numberReady")),
                          _str_map(_sub(ds, "metadata").get("annotations")))


@dataclass
class NodeCheck:
    node: str
    ok: bool
    ready: bool
    expected_gpus: int
    allocatable_gpus: int
    cause: str = ""
    pod: str = ""

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def device_plugin_pod(pods: list[PodState], node: str) -> PodState | None:
    return next((p for p in pods if p.node == node and p.name.startswith(DEVICE_PLUGIN_POD_PREFIX)), None)


def check_node(name: str, want: int, node: Any, pods: list[PodState], plugin: DaemonSetState | None, *,
               driver_problem: str = "", runtime_default: str | None = None) -> NodeCheck:
    """The verdict on one inventory host: in the cluster, Ready, and `want` GPUs allocatable; else why not.

    `driver_problem` and `runtime_default` come from the host's facts when gpuk8s could read them
    (over SSH); without them the cause is told from the cluster's side alone.
    """
    if node is None:
        return NodeCheck(name, False, False, want, 0, "not a node of the cluster (not joined)")
    try:
        ns = node_state(node)
    except StateError as e:
        return NodeCheck(name, False, False, want, 0, f"the API server's node object is unreadable: {e}")
    if not ns.ready:
        return NodeCheck(name, False, False, want, ns.allocatable_gpus, f"NotReady: {ns.ready_message}")
    cause = ""
    if want and ns.allocatable_gpus != want:
        cause = gpu_cause(name, want, ns.allocatable_gpus, pods, plugin, driver_problem=driver_problem,
                          runtime_default=runtime_default)
    return NodeCheck(name, not cause, True, want, ns.allocatable_gpus, cause)


def gpu_cause(name: str, want: int, alloc: int, pods: list[PodState], plugin: DaemonSetState | None, *,
              driver_problem: str = "", runtime_default: str | None = None) -> str:
    head = f"{alloc} of {want} GPU(s) schedulable: "
    if driver_problem:
        return head + f"the driver is missing or failing on the host ({driver_problem})"
    if plugin is None:
        return head + "the NVIDIA device plugin is not deployed (gpuk8s install deploys it)"
    mine = device_plugin_pod(pods, name)
    if mine is None:
        return head + ("no device plugin pod on this node: it needs the label nvidia.com/gpu.present=true "
                       "and must tolerate the node's taints")
    if mine.waiting:
        return head + (f"the device plugin pod {mine.name} is {mine.waiting} ({mine.restarts} restart(s)); "
                       f"see kubectl -n kube-system logs {mine.name}")
    if mine.phase != "Running":
        return head + f"the device plugin pod {mine.name} is {mine.phase or 'not started'}, not Running"
    if runtime_default is not None and runtime_default != "nvidia":
        return head + (f"the container runtime's default is {runtime_default or 'runc'}, not nvidia: the plugin "
                       "cannot load NVML (re-run gpuk8s install to configure it)")
    if alloc == 0:
        return head + (f"the device plugin runs but registered no GPU: it cannot load NVML in its container "
                       f"(no driver on the node, or the runtime's default is not nvidia); see kubectl -n "
                       f"kube-system logs {mine.name}")
    return head + ("the device plugin registered fewer GPUs than the host has "
                   f"(see kubectl -n kube-system logs {mine.name})")


def test_pod_verdict(pod: PodState | None) -> tuple[bool, str] | None:
    """A GPU test pod's outcome: (True, '') when it succeeded, (False, cause) when it cannot, None while pending."""
    if pod is None:
        return None
    if pod.phase == "Succeeded":
        return True, ""
    if pod.phase == "Failed":
        if pod.reason.startswith("OutOf"):
            return False, f"the kubelet rejected the test pod {pod.name} ({pod.reason}): {pod.message}"
        return False, (f"the test pod {pod.name} failed{f' ({pod.reason})' if pod.reason else ''}: "
                       f"see kubectl logs {pod.name}")
    if pod.unschedulable:
        return False, f"the test pod {pod.name} cannot be scheduled: {pod.unschedulable}"
    return None


def pod_progress(pod: PodState | None) -> str:
    """Where a pod stands, in a few words, for a timeout message."""
    if pod is None:
        return "not created"
    return pod.waiting or pod.phase or "no status"


def summary(checks: list[NodeCheck]) -> str:
    bad = [c for c in checks if not c.ok]
    gpus = sum(c.allocatable_gpus for c in checks)
    return (f"{len(checks) - len(bad)}/{len(checks)} nodes ok, {gpus} GPU(s) schedulable"
            + (": " + "; ".join(f"{c.node}: {c.cause}" for c in bad) if bad else ""))


def label_changes(want: dict[str, str], node: NodeState) -> dict[str, str]:
    return {k: v for k, v in want.items() if node.labels.get(k) != v}


def missing_taints(want: list[tuple[str, str, str]], node: NodeState) -> list[tuple[str, str, str]]:
    return [t for t in want if t not in node.taints]
