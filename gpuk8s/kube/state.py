"""Cluster state read from `kubectl get ... -o json`, and the verdict on each node: pure functions, no I/O.

`gpuk8s verify` (over SSH, kubectl on the control plane) and the kind smoke tests (local kubectl) feed
the same functions, so what they conclude about a node is decided in one place. Every cause has a
registered finding id (`NodeCheck.cause_id`, docs/findings.md) and `NodeCheck.finding()` gives the verdict
as a finding about node/NAME. Any input gives a
value or a StateError; never another exception.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpuk8s import findings
from gpuk8s.errors import GpuK8sError
from gpuk8s.facts.model import HostFacts
from gpuk8s.findings import Finding
from gpuk8s.gpuplan import GPU_PRESENT, QUARANTINE_KEY, GPUPlan
from gpuk8s.mig import layout as miglayout

GPU_RESOURCE = "nvidia.com/gpu"
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"
DEVICE_PLUGIN_POD_PREFIX = "nvidia-device-plugin"
MPS_DAEMON_POD_PREFIX = "nvidia-device-plugin-mps-control-daemon"
HAMI_PLUGIN_POD_PREFIX = "hami-device-plugin"


# Kubernetes' own name rules (apimachinery validation: IsDNS1123Label, IsDNS1123Subdomain); Node names are
# subdomains
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_node_name(name: str) -> bool:
    """Whether a Node can have this name (the whole text: no trailing newline either)."""
    return "\n" not in name and bool(DNS1123_SUBDOMAIN.match(name))

class StateError(GpuK8sError):
    """kubectl printed something that is not the object we asked for."""

    kind = "kube-state"


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
    return items_of(load(text))


def items_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of a List kubectl printed, already read (`load`); entries that are not objects are dropped."""
    raw = doc.get("items", [])
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
    allocatable: dict[str, str] = field(default_factory=dict)  # every resource, as the API spells the amounts
    annotations: dict[str, str] = field(default_factory=dict)

    def allocatable_of(self, resource: str) -> int:
        return _int(self.allocatable.get(resource))

    @property
    def quarantine(self) -> str:
        """The value of its quarantine taint (the finding its GPUs failed before it joined; docs/health.md), ''
        without one."""
        return next((v or "unknown" for k, v, _ in sorted(self.taints) if k == QUARANTINE_KEY), "")


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
        allocatable=_str_map(_sub(status, "allocatable")),
        annotations=_str_map(_sub(node, "metadata").get("annotations")),
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
    namespace: str = ""
    owners: tuple[tuple[str, str], ...] = ()  # (kind, name) of each metadata.ownerReferences entry


def owners_of(obj: Any) -> tuple[tuple[str, str], ...]:
    """(kind, name) of each of an object's ownerReferences that names both."""
    refs = _list(_sub(obj, "metadata").get("ownerReferences")) if isinstance(obj, dict) else []
    return tuple((r["kind"], r["name"]) for r in refs
                 if isinstance(r, dict) and isinstance(r.get("kind"), str) and isinstance(r.get("name"), str))


def pod_state(pod: Any) -> PodState:
    pod = _dict(pod, "a pod")
    status = _sub(pod, "status")
    waiting, restarts = "", 0
    # an init container that keeps failing (config-manager without its config) shows as Init:CrashLoopBackOff
    for cs in _list(status.get("initContainerStatuses")) + _list(status.get("containerStatuses")):
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
                    unsched, text["reason"], text["message"], str(_sub(pod, "metadata").get("namespace", "") or ""),
                    owners_of(pod))


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


@dataclass(frozen=True)
class Cause:
    """Why a node fails verification: a registered finding id (gpuk8s/findings.py), the message, the lines
    that show it and what to do."""

    id: str
    message: str
    evidence: tuple[str, ...] = ()
    remedy: str = ""


# What to do for each cause id when the verdict itself named nothing more specific ({node}: the node,
# {pod}: its test pod).
REMEDIES: dict[str, str] = {
    "node.not-joined": "join it: gpuk8s join {node}",
    "node.unreadable": "check the API server (kubectl get node {node} -o json), then run gpuk8s verify again",
    "node.not-ready": "see kubectl describe node {node} and the kubelet's log on the host (journalctl -u kubelet)",
    "node.unreachable": "bring the host back over SSH (gpuk8s preflight names the cause), then run gpuk8s verify",
    "node.failed": "fix the named cause, then run gpuk8s verify again",
    "gpu.test-pod-rejected": "the node advertises GPUs it cannot give: restart the device plugin pod on {node} "
                             "(kubectl -n kube-system delete pod -l name=nvidia-device-plugin-ds "
                             "--field-selector spec.nodeName={node}) and check nvidia-smi on the host",
    "gpu.test-pod-failed": "see kubectl logs {pod}: nvidia-smi failed in the container (driver or runtime)",
    "gpu.test-pod-unschedulable": "see kubectl describe pod {pod}: the node's GPUs may be in use, or its taints "
                                  "not tolerated",
    "gpu.test-pod-timeout": "see kubectl describe pod {pod} (an image pull can take long: run gpuk8s verify again)",
}


@dataclass
class NodeCheck:
    """The verdict on one node. `cause_id` is the registered id of `cause` ('' when ok); `finding()` gives
    the verdict as a Finding about node/NAME (id node.verified when ok)."""

    node: str
    ok: bool
    ready: bool
    expected_gpus: int
    allocatable_gpus: int
    cause: str = ""
    pod: str = ""
    cause_id: str = ""
    evidence: list[str] = field(default_factory=list)
    remedy: str = ""
    resource: str = GPU_RESOURCE  # what expected_gpus and allocatable_gpus count (nvidia.com/gpu.shared, ...)
    proof: str = ""  # on a shared node: what the sharing proof showed
    quarantine: str = ""  # the node's gpuk8s.io/quarantine taint's value (the finding it failed): not verified
    # a GPU count's verdict: what the cause is about ("2 of 8 GPU(s) schedulable"), `cause` being head: said; doctor
    # builds its own message on it (structured, never cut out of the message's words)
    head: str = ""

    @property
    def said(self) -> str:
        """The cause without its head: why, in words."""
        return self.cause[len(self.head) + 2:] if self.head and self.cause.startswith(self.head + ": ") else self.cause

    def __post_init__(self) -> None:
        if not self.ok and not self.cause_id:
            self.cause_id = "node.failed"  # a verdict made elsewhere without an id: still a registered one

    def to_json(self) -> dict[str, Any]:
        out = self.__dict__.copy()
        out.pop("head")  # in `cause` already
        out["evidence"] = list(self.evidence)
        return out

    def finding(self) -> Finding:
        subject = findings.node(self.node)
        if self.quarantine:
            return findings.failed(
                "node.quarantined", f"quarantined ({self.quarantine}): no test pod; "
                f"{self.allocatable_gpus} of {self.expected_gpus} GPU(s) allocatable"
                + (f" ({self.cause})" if not self.ok and self.cause else ""),
                ("gpuk8s verify --fabric names the fault; once it is fixed: gpuk8s verify --fabric --quarantine "
                 "(it releases the node when the test that put it there passes)" if self.quarantine.startswith(
                     "fabric.") else
                 f"gpuk8s health {self.node} names the fault; once it is fixed: gpuk8s health --release {self.node}"),
                subject=subject, evidence=[*self.evidence, *self._facts()])
        if self.ok:
            msg = "Ready, " + (f"{self.allocatable_gpus} of {self.expected_gpus} GPU(s) schedulable"
                               if self.expected_gpus else "no GPU expected")
            if self.pod:
                msg += f", test pod {self.pod} succeeded"
            if self.resource != GPU_RESOURCE or self.proof:
                msg = msg.replace("GPU(s) schedulable", f"{self.resource} schedulable")
            if self.proof:
                msg += f"; {self.proof}"
            return findings.passed("node.verified", msg, subject=subject, evidence=self._facts())
        cid = self.cause_id or "node.failed"
        remedy = self.remedy or REMEDIES.get(cid, "").format(node=self.node, pod=self.pod or "-")
        return findings.failed(cid, self.cause or cid, remedy, subject=subject,
                               evidence=[*self.evidence, *self._facts()])

    def _facts(self) -> list[str]:
        if self.cause_id in ("node.not-joined", "node.unreadable", "node.unreachable"):
            return []
        out = [f"Ready: {'yes' if self.ready else 'no'}"]
        if self.expected_gpus or self.allocatable_gpus:
            out.append(f"{self.resource} allocatable: {self.allocatable_gpus}, expected: {self.expected_gpus}")
        if self.pod:
            out.append(f"test pod: {self.pod}")
        return out


def restart_command(pod: str) -> str:
    """How a device plugin pod is restarted (its DaemonSet makes a new one at once)."""
    return "kubectl " + shlex.join(["-n", "kube-system", "delete", "pod", pod])


def is_device_plugin_pod(pod: PodState, node: str) -> bool:
    """Whether the pod is gpuk8s's device plugin on the node: in kube-system and owned by the DaemonSet gpuk8s
    deploys. The one ownership check of the diagnosis (verify, doctor) and of the restart that deletes the pod
    (doctor --fix, the gpu phase): a look-alike name (any user's pod, or another tool's in kube-system) is not
    it, and its name goes into remedies and into what is deleted."""
    return (pod.node == node and pod.name.startswith(DEVICE_PLUGIN_POD_PREFIX)
            and not pod.name.startswith(MPS_DAEMON_POD_PREFIX) and pod.namespace in ("kube-system", "")
            and ("DaemonSet", DEVICE_PLUGIN) in pod.owners)


def device_plugin_pod(pods: list[PodState], node: str) -> PodState | None:
    """The device plugin's pod on the node (`is_device_plugin_pod`), or None."""
    return next((p for p in pods if is_device_plugin_pod(p, node)), None)


def check_node(name: str, want: int, node: Any, pods: list[PodState], plugin: DaemonSetState | None, *,
               driver_problem: str = "", runtime_default: str | None = None, resource: str = GPU_RESOURCE,
               sharing: Sharing | None = None) -> NodeCheck:
    """The verdict on one inventory host: in the cluster, Ready, and `want` GPUs allocatable; else why not.

    `driver_problem` and `runtime_default` come from the host's facts when gpuk8s could read them
    (over SSH); without them the cause is told from the cluster's side alone.
    """
    if node is None:
        return NodeCheck(name, False, False, want, 0, "not a node of the cluster (not joined)",
                         cause_id="node.not-joined", evidence=[f"kubectl get nodes lists no node {name}"])
    try:
        ns = node_state(node)
    except StateError as e:
        return NodeCheck(name, False, False, want, 0, f"the API server's node object is unreadable: {e}",
                         cause_id="node.unreadable")
    if not ns.ready:
        return NodeCheck(name, False, False, want, ns.allocatable_gpus, f"NotReady: {ns.ready_message}",
                         cause_id="node.not-ready", evidence=[f"condition Ready: {ns.ready_message}"])
    alloc = ns.allocatable_of(resource)
    if want and alloc != want:
        c = None
        if sharing is not None and sharing.strategy != "none" and not driver_problem:
            c = diagnose_sharing(name, want, alloc, resource, sharing, pods, plugin, ns)
            head = f"{alloc} of {want} {resource} schedulable"
        if c is None:
            c = diagnose_gpus(name, want, alloc, pods, plugin, driver_problem=driver_problem,
                              runtime_default=runtime_default, node=ns)
            head = f"{alloc} of {want} GPU(s) schedulable"
        return NodeCheck(name, False, True, want, alloc, c.message, cause_id=c.id,
                         evidence=list(c.evidence), remedy=c.remedy, resource=resource, head=head)
    return NodeCheck(name, True, True, want, alloc, resource=resource)


def mig_devices(f: HostFacts | None) -> Counter[str] | None:
    """The MIG devices (profile -> count) the host's facts list, or None without facts."""
    if f is None or f.mig.state != "ok":
        return None
    return Counter(p for g in f.mig.gpus if g.current == "Enabled" for p in miglayout.state_of(g).instances)


def mig_verdict(plan: GPUPlan, c: NodeCheck, node: Any, have: Counter[str] | None) -> None:
    """A MIG node's verdict (verify's and doctor's): every resource of its plan allocatable (mixed: each
    nvidia.com/mig-<profile>), and when it is not, the cause told from the host's MIG devices (`have`, mig_devices;
    None: not read) (docs/mig.md). `c` is check_node's verdict on the node, changed in place."""
    if plan.mig_strategy == "none" or not c.ready or not plan.resources:
        return
    try:
        alloc = node_state(node).allocatable if node is not None else {}
    except StateError:
        return
    short = {r: (n, int(alloc.get(r, 0) or 0)) for r, n in sorted(plan.resources.items())
             if int(alloc.get(r, 0) or 0) != n}
    if c.ok and not short:
        c.proof = (c.proof + "; " if c.proof else "") + "MIG " + plan.mig_strategy + ": " + ", ".join(
            f"{n} {r}" for r, n in sorted(plan.resources.items()))
        return
    # the plugin runs but registered another count (0 reads as "no NVML" without MIG): the MIG devices tell why;
    # a missing or crashing plugin, a driver or runtime problem keeps its own cause
    if not c.ok and c.cause_id not in ("gpu.fewer-registered", "gpu.plugin-no-nvml"):
        return
    layout = ", ".join(f"{n} {r}" for r, n in sorted(plan.resources.items()))
    got = ", ".join(f"{a} of {n} {r}" for r, (n, a) in short.items())
    seen = "its MIG devices unknown (no facts)"
    if have is not None:
        seen = ", ".join(miglayout.counted(list(have.elements()))) or "no MIG devices"
    c.ok, c.cause_id, c.head = False, "gpu.mig-resources", ""
    c.cause = f"{got} schedulable (MIG {plan.mig_strategy}; the plan: {layout}); the host has {seen}"
    c.evidence = [*c.evidence, f"nvidia-smi -L on {plan.node}: {seen}",
                  "node allocatable: " + ", ".join(f"{r}={a}" for r, (_n, a) in short.items())]
    c.remedy = ("re-run gpuk8s install (its mig phase re-creates the layout; --allow-reboot where a reset is "
                "refused); on the host: systemctl status gpuk8s-mig, nvidia-smi -L; docs/mig.md")


@dataclass(frozen=True)
class Sharing:
    """What verify needs of a node's sharing plan (gpuk8s/gpuplan.py), and what the cluster has for it."""

    strategy: str  # time-slicing | mps | hami
    replicas: int
    gpus: int
    config: str = ""  # the config name the node's nvidia.com/device-plugin.config must select
    configs: tuple[str, ...] | None = None  # the names in the plugin's ConfigMap; None: the ConfigMap is missing


CONFIG_LABEL = "nvidia.com/device-plugin.config"


def diagnose_sharing(name: str, want: int, alloc: int, resource: str, sh: Sharing, pods: list[PodState],
                     plugin: DaemonSetState | None, node: NodeState) -> Cause | None:
    """Why a shared node does not advertise GPUs x replicas under `resource`; None: not a sharing cause."""
    head = f"{alloc} of {want} {resource} schedulable: "
    on_node = [p for p in pods if p.node == name]
    if sh.strategy == "hami":
        mine = next((p for p in on_node if p.name.startswith(HAMI_PLUGIN_POD_PREFIX)), None)
        if mine is None or mine.phase != "Running" or mine.waiting:
            return Cause("gpu.hami-missing", head + "HAMi's device plugin is not running on this node",
                         (f"pod {HAMI_PLUGIN_POD_PREFIX}-* on {name}: "
                          + (f"{mine.phase} {mine.waiting}".strip() if mine else "none"),
                          f"node label gpu: {node.labels.get('gpu', 'missing')}"),
                         "re-run gpuk8s install (it deploys HAMi and labels the node gpu=on); see "
                         f"kubectl -n kube-system get pods -o wide | grep {HAMI_PLUGIN_POD_PREFIX}")
        return None
    label = node.labels.get(CONFIG_LABEL, "")
    evidence = [f"node label {CONFIG_LABEL}: {label or 'missing'} (planned: {sh.config})",
                "allocatable: " + ", ".join(f"{k}={v}" for k, v in sorted(node.allocatable.items())
                                            if k.startswith("nvidia.com/")) or "allocatable: no nvidia.com/ resource"]
    if sh.configs is None:
        return Cause("gpu.sharing-config", head + "the device plugin's ConfigMap of sharing configs is missing",
                     (*evidence, "kubectl -n kube-system get configmap nvidia-device-plugin-configs: not found"),
                     "re-run gpuk8s install: it applies the ConfigMap")
    if label and label not in sh.configs:
        return Cause("gpu.sharing-config", head + (f"the node selects config {label!r}, which the plugin's ConfigMap "
                                                   f"does not have (config-manager: specified config {label} does not "
                                                   "exist)"),
                     (*evidence, "configs in the ConfigMap: " + ", ".join(sh.configs)),
                     f"re-run gpuk8s install (it labels the node {CONFIG_LABEL}={sh.config}), or add the config")
    if sh.strategy == "mps":
        daemon = next((p for p in on_node if p.name.startswith(MPS_DAEMON_POD_PREFIX)), None)
        if daemon is None or daemon.phase != "Running" or daemon.waiting:
            return Cause("gpu.mps-daemon-missing",
                         head + ("the MPS control daemon is not running on this node, so the device plugin cannot "
                                 "start MPS sharing (its log: error waiting for MPS daemon)"),
                         (f"pod {MPS_DAEMON_POD_PREFIX}-* on {name}: "
                          + (f"{daemon.phase} {daemon.waiting}".strip() if daemon else "none"),
                          f"node label nvidia.com/mps.capable: {node.labels.get('nvidia.com/mps.capable', 'missing')}",
                          *evidence),
                         "re-run gpuk8s install: it deploys the daemonset nvidia-device-plugin-mps-control-daemon and "
                         "labels MPS nodes nvidia.com/mps.capable=true; then see kubectl -n kube-system logs of the "
                         "daemon's pod on this node")
    if label != sh.config or alloc == 0 and any(node.allocatable_of(k) for k in node.allocatable
                                                if k.startswith("nvidia.com/gpu") and k != resource) \
            or alloc == sh.gpus:
        return Cause("gpu.sharing-not-applied",
                     head + (f"the node advertises {alloc} instead of {sh.gpus} GPU(s) x {sh.replicas} replicas: "
                             f"its {CONFIG_LABEL} label or the config it selects is not the plan's"),
                     tuple(evidence), f"re-run gpuk8s install; kubectl -n kube-system logs the plugin's "
                     f"config-manager sidecar on {name} says which config it applied")
    return None


def _logs(pod: str) -> str:
    return f"kubectl -n kube-system logs {pod} (and kubectl -n kube-system describe pod {pod})"


def _taint(t: tuple[str, str, str]) -> str:
    return f"{t[0]}={t[1]}:{t[2]}" if t[1] else f"{t[0]}:{t[2]}"


def diagnose_gpus(name: str, want: int, alloc: int, pods: list[PodState], plugin: DaemonSetState | None, *,
                  driver_problem: str = "", runtime_default: str | None = None,
                  node: NodeState | None = None) -> Cause:
    """Why only `alloc` of `want` GPUs of node `name` are schedulable: the first cause that holds, in the
    order a GPU reaches the scheduler (driver, device plugin deployed, scheduled, running, runtime, NVML)."""
    head = f"{alloc} of {want} GPU(s) schedulable: "
    if driver_problem:
        return Cause("gpu.driver", head + f"the driver is missing or failing on the host ({driver_problem})",
                     (f"nvidia-smi on the host: {driver_problem}",),
                     "install or repair the NVIDIA driver on the host (gpuk8s preflight shows gpu.driver with the "
                     "cause), then run gpuk8s verify again")
    if plugin is None:
        return Cause("gpu.plugin-missing",
                     head + "the NVIDIA device plugin is not deployed (gpuk8s install deploys it)",
                     (f"kubectl -n kube-system get daemonset {DEVICE_PLUGIN}: not found",),
                     "run gpuk8s install: it deploys the device plugin")
    mine = device_plugin_pod(pods, name)
    ds = (f"daemonset {plugin.name}: {plugin.desired} desired, {plugin.scheduled} scheduled, "
          f"{plugin.ready} ready")
    if mine is None:
        evidence = [f"no pod {DEVICE_PLUGIN_POD_PREFIX}-* on node {name}", ds]
        if node is not None:
            evidence.append(f"node label {GPU_PRESENT}: {node.labels.get(GPU_PRESENT, 'missing')}")
            blocking = sorted(_taint(t) for t in node.taints if t[2] in ("NoSchedule", "NoExecute"))
            evidence.append("node taints: " + (", ".join(blocking) if blocking else "none"))
        return Cause("gpu.plugin-not-scheduled",
                     head + ("no device plugin pod on this node: it needs the label nvidia.com/gpu.present=true "
                             "and must tolerate the node's taints"), tuple(evidence),
                     f"re-run gpuk8s install (it labels the node), or kubectl label node {name} "
                     f"{GPU_PRESENT}=true; a taint of your own needs a toleration in the plugin")
    if mine.waiting:
        return Cause("gpu.plugin-crashing",
                     head + (f"the device plugin pod {mine.name} is {mine.waiting} ({mine.restarts} restart(s)); "
                             f"see kubectl -n kube-system logs {mine.name}"),
                     (f"pod kube-system/{mine.name}: waiting ({mine.waiting}), {mine.restarts} restart(s)",),
                     f"read {_logs(mine.name)}; add --previous to see the last crash")
    if mine.phase != "Running":
        evidence = [f"pod kube-system/{mine.name}: phase {mine.phase or 'none'}"]
        if mine.unschedulable:
            evidence.append(f"scheduler: {mine.unschedulable}")
        return Cause("gpu.plugin-not-running",
                     head + f"the device plugin pod {mine.name} is {mine.phase or 'not started'}, not Running",
                     tuple(evidence), f"see kubectl -n kube-system describe pod {mine.name}")
    if runtime_default is not None and runtime_default != "nvidia":
        return Cause("gpu.runtime-not-nvidia",
                     head + (f"the container runtime's default is {runtime_default or 'runc'}, not nvidia: the "
                             "plugin cannot load NVML (re-run gpuk8s install to configure it)"),
                     (f"container runtime default on the host: {runtime_default or 'runc'}",),
                     "re-run gpuk8s install: it makes nvidia the runtime's default")
    if alloc == 0:
        return Cause("gpu.plugin-no-nvml",
                     head + (f"the device plugin runs but registered no GPU: it cannot load NVML in its container "
                             f"(no driver on the node, or the runtime's default is not nvidia); see kubectl -n "
                             f"kube-system logs {mine.name}"),
                     (f"pod kube-system/{mine.name}: Running, {mine.restarts} restart(s)",),
                     f"read {_logs(mine.name)}; check nvidia-smi on the host and that nvidia is "
                     "the container runtime's default")
    return Cause("gpu.fewer-registered",
                 head + ("the device plugin registered fewer GPUs than the host has "
                         f"(see kubectl -n kube-system logs {mine.name})"),
                 (f"pod kube-system/{mine.name}: Running, {mine.restarts} restart(s)",),
                 f"read {_logs(mine.name)}; compare with nvidia-smi -L on the host (a GPU may "
                 "have fallen off the bus, or be in MIG mode)")


class PodVerdict(tuple[bool, str]):
    """A test pod's outcome: unpacks as (ok, cause), as it always has; `cause_id` is the registered id
    of the cause ('' when the pod succeeded)."""

    cause_id: str

    def __new__(cls, ok: bool, cause: str, cause_id: str = "") -> PodVerdict:
        self = super().__new__(cls, (ok, cause))
        self.cause_id = cause_id
        return self

    @property
    def ok(self) -> bool:
        return self[0]

    @property
    def cause(self) -> str:
        return self[1]


def test_pod_verdict(pod: PodState | None) -> PodVerdict | None:
    """A GPU test pod's outcome: (True, '') when it succeeded, (False, cause) when it cannot, None while pending."""
    if pod is None:
        return None
    if pod.phase == "Succeeded":
        return PodVerdict(True, "")
    if pod.phase == "Failed":
        if pod.reason.startswith("OutOf"):
            return PodVerdict(False, f"the kubelet rejected the test pod {pod.name} ({pod.reason}): {pod.message}",
                              "gpu.test-pod-rejected")
        return PodVerdict(False, f"the test pod {pod.name} failed{f' ({pod.reason})' if pod.reason else ''}: "
                                 f"see kubectl logs {pod.name}", "gpu.test-pod-failed")
    if pod.unschedulable:
        return PodVerdict(False, f"the test pod {pod.name} cannot be scheduled: {pod.unschedulable}",
                          "gpu.test-pod-unschedulable")
    return None


def pod_progress(pod: PodState | None) -> str:
    """Where a pod stands, in a few words, for a timeout message."""
    if pod is None:
        return "not created"
    return pod.waiting or pod.phase or "no status"


def summary(checks: list[NodeCheck]) -> str:
    """One line: nodes ok, GPUs schedulable (a quarantined node's are not: it takes no new pods), the failures."""
    held = [c for c in checks if c.quarantine]
    bad = [c for c in checks if not c.ok and not c.quarantine]
    gpus = sum(c.allocatable_gpus for c in checks if not c.quarantine)
    return (f"{len(checks) - len(bad) - len(held)}/{len(checks)} nodes ok, {gpus} GPU(s) schedulable"
            + (f", {len(held)} quarantined ({', '.join(c.node for c in held)})" if held else "")
            + (": " + "; ".join(f"{c.node}: {c.cause}" for c in bad) if bad else ""))


def label_changes(want: dict[str, str], node: NodeState,
                  owned: tuple[str, ...] = ()) -> dict[str, str | None]:
    """The labels to set, and (value None) those of `owned` the node has but `want` no longer names."""
    out: dict[str, str | None] = {k: v for k, v in want.items() if node.labels.get(k) != v}
    for k in owned:
        if k in node.labels and k not in want:
            out[k] = None
    return out


def quarantined(node: Any) -> str:
    """The value of a node object's quarantine taint (the finding its GPUs failed before it joined; docs/health.md),
    '' without one, without a node or for an unreadable one."""
    if node is None:
        return ""
    try:
        return node_state(node).quarantine
    except StateError:
        return ""


def missing_taints(want: list[tuple[str, str, str]], node: NodeState) -> list[tuple[str, str, str]]:
    return [t for t in want if t not in node.taints]


def gpu_pods(pods: list[Any], node: str) -> list[str]:
    """Of a list of pod objects, those bound to `node` that hold GPUs (an nvidia.com/ resource, or a claim: a dra
    node's GPUs, docs/dra.md) and have not finished, DaemonSets' left out: their namespace/name, sorted."""
    out = []
    for p in pods:
        spec = p.get("spec") if isinstance(p, dict) else None
        md = p.get("metadata") if isinstance(p, dict) else None
        status = p.get("status") if isinstance(p, dict) else None
        if not isinstance(spec, dict) or not isinstance(md, dict) or spec.get("nodeName") != node:
            continue
        if isinstance(status, dict) and status.get("phase") in ("Succeeded", "Failed"):
            continue
        owners = md.get("ownerReferences")
        if isinstance(owners, list) and any(isinstance(r, dict) and r.get("kind") == "DaemonSet" for r in owners):
            continue
        containers = spec.get("containers")
        wants = sum(_gpus(c) for c in containers if isinstance(c, dict)) if isinstance(containers, list) else 0
        if wants or spec.get("resourceClaims"):
            out.append(f"{md.get('namespace', 'default')}/{md.get('name', '')}")
    return sorted(out)


def _gpus(container: dict[str, Any]) -> int:
    res = container.get("resources")
    total = 0
    for section in ("limits", "requests"):
        amounts = res.get(section) if isinstance(res, dict) else None
        for k, v in (amounts.items() if isinstance(amounts, dict) else ()):
            if str(k).startswith("nvidia.com/"):
                try:
                    total = max(total, int(str(v)))
                except ValueError:
                    total = max(total, 1)
    return total
