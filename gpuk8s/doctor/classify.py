"""Evidence -> causes: why a GPU pod is Pending or failing, why a GPU node lacks its GPUs. Pure functions.

Each cause is a finding (gpuk8s/findings.py) about pod/NAMESPACE/NAME or node/NAME, with the lines that show it
and a remedy, most likely first. The texts matched are the real components' (quoted where they are matched; each
has real samples with their sources in tests/fixtures/real/, run through this module by
tests/unit/test_real_corpus_doctor.py): kube-scheduler's FitError in each minor's wording ("0/3 nodes are
available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector. preemption: ..."),
the kubelet's events and container statuses for a bound pod (FailedCreatePodSandBox with the runtime's missing
handler, RunContainerError/CreateContainerError/StartError with the NVIDIA container toolkit's nvidia-container-cli
errors, the device manager's admission errors), NVML's messages in the device plugin's and the pod's logs. A GPU pod
that is failing for a reason none of these explains gets pod.unknown, a GPU node short of its plan gpu.unknown:
doctor is never silent about them. A node's own causes are verify's (gpuk8s/kube/state.check_node): the same cause
gets the same id.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from gpuk8s import findings, gpuplan
from gpuk8s.doctor.evidence import (
    DEVICE_PLUGINS,
    ENVVAR_UNPRIVILEGED,
    PLUGIN_SOCKET_PREFIX,
    TOOLKIT_CONFIG,
    ClusterEvidence,
    HostEvidence,
)
from gpuk8s.driver import xid as xid_catalogue
from gpuk8s.facts.fabric import NcclFailure, classify_nccl
from gpuk8s.findings import Finding
from gpuk8s.kube import allocation as al
from gpuk8s.kube import dra, state
from gpuk8s.kube.state import StateError, restart_command
from gpuk8s.text import clean
from gpuk8s.versions import at_least, cuda_driver_floor, cuda_of_driver, release

# kube-scheduler pkg/scheduler/framework/types.go FitError.Error(): "0/%v nodes are available:" then the PreFilter
# message or the sorted "N reason" histogram joined with ", " and a ".", then " " and the PostFilter plugins'
# messages: " preemption: 0/%v nodes are available: ..." (since 1.24), and from the minors where the
# DynamicResources plugin runs (on by default since DRA went GA) "no new claims to deallocate, " before it:
# "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient cpu. no new claims to deallocate,
# preemption: 0/3 nodes are available: ..." (tests/fixtures/real/kubernetes/scheduler/).
# Only the head is a regular expression (literal, bounded digits: linear); the rest is split with str.find and
# str.partition: the old pattern's lazy group before an optional `\.?\s*preemption: ` was quadratic on runs of
# whitespace, and anyone who may create Events in a pod's namespace writes the message (160 KiB froze doctor).
FIT_HEAD = re.compile(r"0/(\d{1,9}) nodes are available: ")
PREEMPTION = "preemption: "
MAX_MESSAGE = 8192  # characters of a scheduler message kept (real ones: one "N reason" per distinct cause, ~300)
INSUFFICIENT = re.compile(r"^Insufficient (\S+)$")
# The TaintToleration plugin's reason, by Kubernetes minor: "node(s) had untolerated taint {KEY: VALUE}" (seen from
# 1.24 on), then "node(s) had untolerated taint(s)" from kubernetes PR 134740 ("remove taint values from
# unschedulable messages in pod status"; its cherry-pick PR 135023 brought it to the previous minor's later
# patches; docs/troubleshooting.md names the minors). The key is no longer named: every GPU node's untolerated
# taint is then a candidate. Older wordings, matched too: "node(s) had taint {KEY: VALUE}, that the pod didn't
# tolerate" and, before it (kubernetes PR 87250), "node(s) had taints that the pod didn't tolerate".
TAINT = re.compile(r"^node\(s\) had untolerated taint \{(.*)\}$")
TAINT_OLD = re.compile(r"^node\(s\) had taint \{(.*)\}, that the pod didn't tolerate$")
TAINT_UNNAMED = ("node(s) had untolerated taint(s)", "node(s) had taints that the pod didn't tolerate")
SELECTOR = "node(s) didn't match Pod's node affinity/selector"
# kube-scheduler's DynamicResources filter: no node can allocate the pod's ResourceClaims (kubernetes/kubernetes
# issue 133531, tests/fixtures/real/kubernetes/scheduler/dra-cannot-allocate-all-claims-*.txt)
DRA_UNALLOCATABLE = "cannot allocate all claims"
# The kubelet's admission error for the plugin's Allocate refusal (k8s-device-plugin internal/rm/rm.go)
SHARED_GT1 = "maximum request size for shared resources is 1"
# nvidia-container-cli (libnvidia-container): "requirement error: unsatisfied condition: cuda>=12.4, please update
# your driver to a newer version, or use an earlier cuda container"
CUDA_REQ = re.compile(r"unsatisfied condition: cuda\s*>=\s*([0-9]{1,3}(?:\.[0-9]{1,3})?)")
NVML_UNKNOWN = "Failed to initialize NVML: Unknown Error"
# The device plugin without NVML in its container: "could not load NVML library" (before v0.14),
# "Detected non-NVML platform: could not load NVML library: libnvidia-ml.so.1: cannot open shared object file"
# and "Incompatible strategy detected auto" (v0.14 on), "Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND" (v0.19)
# "No devices found. Waiting indefinitely." (every version: its FAIL_ON_INIT_ERROR=false path) is what a plugin that
# found no GPU says, with or without an NVML error before it (NVIDIA/k8s-device-plugin#414: alone, after a reboot).
PLUGIN_NVML = ("could not load NVML library", "Incompatible strategy detected", "Incompatible platform detected",
               "ERROR_LIBRARY_NOT_FOUND", "libnvidia-ml.so.1: cannot open shared object file",
               "No devices found. Waiting indefinitely")
# A container that did not get the GPU through the nvidia runtime: no nvidia-smi, no driver library in it
NO_RUNTIME = ('exec: "nvidia-smi": executable file not found', "nvidia-smi: not found",
              "nvidia-smi: command not found", "libnvidia-ml.so.1: cannot open shared object file",
              "Found no NVIDIA driver on your system", "libcuda.so.1: cannot open shared object file")
# CUDA's out-of-memory errors (cudaErrorMemoryAllocation's text, PyTorch's)
GPU_OOM = ("CUDA out of memory", "CUDA error: out of memory", "cudaErrorMemoryAllocation")
# CUDA error 802 (cudaErrorSystemNotReady / CUDA_ERROR_SYSTEM_NOT_READY): on an NVSwitch system the fabric manager
# has not configured the switches (NVIDIA's Fabric Manager user guide); PyTorch prints "cuda runtime error (802) :
# system not yet initialized" or "Error 802: system not yet initialized", CUDA's samples "returned 802 -> system not
# yet initialized" (pytorch/pytorch#35710, microsoft/lisa#2823)
FABRIC_NOT_READY = ("system not yet initialized", "cudaErrorSystemNotReady", "CUDA_ERROR_SYSTEM_NOT_READY")
# NVML in the container finds the loaded module of another version than its library (the driver's packages upgraded
# without a reboot): "Failed to initialize NVML: Driver/library version mismatch"; nvidia-container-cli's form is
# "nvml error: driver/library version mismatch"
DRIVER_MISMATCH = ("Driver/library version mismatch", "driver/library version mismatch")
# The device plugin's health checker taking a GPU off the node (internal/rm/health.go, plugin/server.go):
# "XidCriticalError: Xid=79 on Device=GPU-...; marking device as unhealthy.", "'nvidia.com/gpu' device marked
# unhealthy: GPU-..."
PLUGIN_UNHEALTHY = ("marking device as unhealthy", "device marked unhealthy")
XID = re.compile(r"Xid=([0-9]{1,4})")
HAMI_SCHEDULER = "hami-scheduler"
# An image reference as a pod spec names it (registry/path:tag@digest); anything else is not put in a remedy
IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}(?::[A-Za-z0-9._-]{1,128})?(?:@sha256:[0-9a-f]{64})?")
STANDARD = ("cpu", "memory", "ephemeral-storage", "pods")

# -- a bound pod whose sandbox or containers do not start (the kubelet's events and container statuses) ----------
# The runtime handler a RuntimeClass names is not in the runtime's config. containerd's CRI plugin: "failed to get
# sandbox runtime: no runtime for "nvidia" is configured" (1.6/1.7), "unable to get OCI runtime for sandbox
# "<id>": no runtime for "nvidia" is configured" (2.x, and 1.7's sandboxed CRI); CRI-O: "failed to find runtime
# handler nvidia from runtime list map[crun:0xc00047e300 runc:0xc00047ef00]". In the kubelet's
# FailedCreatePodSandBox event ("Failed to create pod sandbox: rpc error: code = Unknown desc = ..."); the pod
# stays Pending in ContainerCreating.
# dockershim (Kubernetes 1.23 and older, and cri-dockerd before its CRI runtime handlers): 'RuntimeHandler
# "nvidia" not supported' (NVIDIA/gpu-operator#250).
RUNTIME_HANDLER = re.compile(r'no runtime for "([^"\s]{1,64})" is configured'
                             r"|failed to find runtime handler (\S{1,64}) from runtime list"
                             r'|RuntimeHandler "([^"\s]{1,64})" not supported')
# The NVIDIA container runtime hook's CLI (libnvidia-container) failing: "nvidia-container-cli: <stage> error:
# <what>" (nvidia-container-cli.real under the GPU Operator's toolkit), inside the runtime's error
# ("... error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as
# 'legacy'\nnvidia-container-cli: initialization error: nvml error: driver not loaded: unknown"); the kubelet
# reports it as RunContainerError/CreateContainerError (waiting), StartError (terminated) or a Failed event.
HOOK_CLI = re.compile(r"nvidia-container-cli(?:\.real)?: ([a-z]{1,20}(?: [a-z]{1,20})? error): ([^\n]{0,400})")
# The driver's kernel module is not loaded (or its libraries are not installed): the CLI cannot initialize NVML
DRIVER_NOT_LOADED = ("nvml error: driver not loaded", "load library failed: libnvidia-ml.so.1",
                     "driver/library version mismatch")
# A device node the runtime (or a CDI spec) names does not exist on the host: lstat /dev/nvidia-uvm, stat failed:
# /dev/nvidia0, failed to stat CDI host device "/dev/dri/renderD129", under a driver root (/run/nvidia/driver/dev)
DEVICE_NODE = re.compile(r'(/(?:[A-Za-z0-9_.-]{1,64}/){0,6}dev/(?:nvidia[A-Za-z0-9-]{0,32}|dri/[A-Za-z0-9-]{1,32}))'
                         r'"?: no such file or directory')
# The toolkit failing outside nvidia-container-cli: CRI-O's OCI hook ("error executing hook
# `/usr/local/nvidia/toolkit/nvidia-container-runtime-hook` (exit code: 1)"), the runtime binary missing, CDI
TOOLKIT_OTHER = ("nvidia-container-runtime-hook` (exit code:", 'exec: "nvidia-container-runtime": executable file',
                 "unresolvable CDI devices", "nvidia-container-runtime did not terminate successfully")
# The kubelet's device manager refusing a pod at admission (UnexpectedAdmissionError): "Allocate failed due to
# requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected",
# "Pod Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: ...: nvml: GPU is lost"
ADMISSION = ("Allocate failed due to", "UnexpectedAdmissionError")
# The kubelet's events that say why a bound pod's sandbox or containers do not start
KUBELET_WARNINGS = ("FailedCreatePodSandBox", "Failed", "BackOff", "FailedMount", "UnexpectedAdmissionError",
                    "FailedPostStartHook", "FailedPreStopHook", "InspectFailed", "ErrImageNeverPull")


@dataclass(frozen=True)
class FitError:
    total: int
    reasons: dict[str, int]  # reason -> how many nodes
    preemption: str
    # every PostFilter message, as the scheduler joined them ("no new claims to deallocate, preemption: ...");
    # not compared: what the reasons and the preemption say is the parse
    post_filter: str = field(default="", compare=False)


def parse_fit_error(message: str) -> FitError | None:
    """kube-scheduler's FailedScheduling message, or None when it is not one. Linear time; only the first
    MAX_MESSAGE characters are read."""
    text = message[:MAX_MESSAGE].strip()
    m = FIT_HEAD.search(text)
    if not m:
        return None
    body, found, preemption = text[m.end():].partition(PREEMPTION)
    if found:  # the whitespace and the one "." before "preemption: " end the reasons, as in FitError.Error()
        body = body.rstrip()
        body = body[:-1] if body.endswith(".") else body
    cut = _post_filter_start(body)  # other PostFilter messages before it: "... cpu. no new claims to deallocate,"
    post = body[cut + 2:].strip() if cut >= 0 else ""
    body = body[:cut] if cut >= 0 else body
    reasons: dict[str, int] = {}
    for part in _reason_parts(body.strip().rstrip(".")):
        count, _, reason = part.strip().partition(" ")
        if count.isascii() and count.isdigit() and len(count) <= 9 and reason and "\n" not in reason:
            reason = reason.strip().rstrip(".")
            reasons[reason] = reasons.get(reason, 0) + int(count)
    post = " ".join(x for x in (post, PREEMPTION + preemption.strip() if found else "") if x)
    return FitError(int(m.group(1)), reasons, preemption.strip(), post)


def _post_filter_start(body: str) -> int:
    """Where the reasons end and a PostFilter message begins: the first ". " not followed by a count (a reason
    never holds ". "; the next reason of the histogram starts with its count); -1 when none does."""
    i = body.find(". ")
    while i >= 0:
        nxt = body[i + 2:i + 3]
        if not (nxt.isascii() and nxt.isdigit()):
            return i
        i = body.find(". ", i + 1)
    return -1


def _reason_parts(text: str) -> list[str]:
    """`text` split at each comma followed by whitespace and then a count ("N "): a reason may hold commas
    ("node(s) had untolerated taint {a: b, c: d}"), a new reason starts with its count."""
    parts: list[list[str]] = []  # each reason's pieces, joined once at the end (no repeated concatenation)
    for i, piece in enumerate(text.split(",")):
        rest = piece.lstrip()
        count, sp, _ = rest.partition(" ")
        starts = rest != piece and sp and count.isascii() and count.isdigit()
        if i == 0 or starts:
            parts.append([piece])
        else:
            parts[-1].append(piece)
    return [",".join(p) for p in parts]


def _l(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _dd(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _md(o: dict[str, Any]) -> dict[str, Any]:
    md = o.get("metadata")
    return md if isinstance(md, dict) else {}


def _spec(o: dict[str, Any]) -> dict[str, Any]:
    s = o.get("spec")
    return s if isinstance(s, dict) else {}


def _status(o: dict[str, Any]) -> dict[str, Any]:
    s = o.get("status")
    return s if isinstance(s, dict) else {}


def pod_key(pod: dict[str, Any]) -> tuple[str, str]:
    return str(_md(pod).get("namespace", "default") or "default"), str(_md(pod).get("name", "") or "")


def extended_requests(pod: dict[str, Any]) -> dict[str, int]:
    """Every extended resource the pod asks for (GPU or not): name -> amount."""
    out: dict[str, int] = {}
    for c in _l(_spec(pod).get("containers")):
        res = c.get("resources") if isinstance(c, dict) else None
        if not isinstance(res, dict):
            continue
        seen: dict[str, int] = {}
        for part in ("limits", "requests"):
            for k, v in (res.get(part) or {}).items() if isinstance(res.get(part), dict) else ():
                k = str(k)
                if k in STANDARD or k.startswith("hugepages-") or "/" not in k or k.startswith("kubernetes.io/"):
                    continue
                s = str(v).strip()
                seen[k] = max(seen.get(k, 0), int(s) if s.isdigit() and len(s) < 10 else 1)
        for k, v in seen.items():
            out[k] = out.get(k, 0) + v
    return out


def is_gpu_pod(pod: dict[str, Any]) -> bool:
    if _l(_spec(pod).get("resourceClaims")):  # DRA: its GPUs come through claims (docs/dra.md)
        return True
    req = extended_requests(pod)
    return bool(req) and any(al.is_gpu_resource(k) or k in al.HAMI_PER_POD or "gpu" in k for k in req) \
        or _spec(pod).get("schedulerName") == HAMI_SCHEDULER


def scheduler_message(pod: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """The scheduler's latest word on a pod: its last FailedScheduling event, else the PodScheduled condition."""
    ns, name = pod_key(pod)
    last: object = None  # the raw message of the last such event: only that one is converted and cleaned
    for e in events:
        io = e.get("involvedObject") if isinstance(e.get("involvedObject"), dict) else {}
        assert isinstance(io, dict)
        if io.get("kind") == "Pod" and io.get("name") == name and io.get("namespace", ns) == ns \
                and e.get("reason") == "FailedScheduling":
            last = e.get("message", "")
    text = _capped(last) if last is not None else ""
    if text:
        return text
    for c in _l(_status(pod).get("conditions")):
        if isinstance(c, dict) and c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
            return _capped(c.get("message", ""))
    return ""


def _capped(message: object) -> str:
    """An event's or condition's message as text to parse and show: at most MAX_MESSAGE characters (anyone
    who may create Events in the namespace writes it), control characters removed."""
    if not isinstance(message, (str, int, float)):
        return ""  # a list or mapping is no message (and its str() would walk all of it)
    text = str(message)
    return clean(text[:MAX_MESSAGE] + ("..." if len(text) > MAX_MESSAGE else ""))


def container_messages(pod: dict[str, Any]) -> list[str]:
    """The waiting/terminated reasons and messages of the pod's containers, and the pod's own."""
    out = []
    st = _status(pod)
    if st.get("reason") or st.get("message"):
        out.append(f"pod {st.get('phase', '')}: {st.get('reason', '')}: {st.get('message', '')}".strip())
    for cs in _l(st.get("initContainerStatuses")) + _l(st.get("containerStatuses")):
        if not isinstance(cs, dict):
            continue
        for key in ("state", "lastState"):
            s = cs.get(key) if isinstance(cs.get(key), dict) else {}
            assert isinstance(s, dict)
            for kind in ("waiting", "terminated"):
                d = s.get(kind)
                if isinstance(d, dict) and (d.get("reason") or d.get("message")):
                    out.append(f"container {cs.get('name', '')} {kind}: {d.get('reason', '')}"
                               + (f": {d.get('message')}" if d.get("message") else ""))
    return [clean(x) for x in out]


def _gpu_nodes(ev: ClusterEvidence) -> list[str]:
    """The nodes that are (or must be) GPU nodes: by plan, by label, or by an allocatable GPU resource."""
    out = []
    for name, n in ev.nodes.items():
        plan = ev.plans.get(name)
        labels = _dd(_md(n).get("labels"))
        alloc = _status(n).get("allocatable") or {}
        if (plan is not None and plan.gpu_node) or labels.get(gpuplan.GPU_PRESENT) == "true" \
                or any(al.is_gpu_resource(str(k)) for k in alloc):
            out.append(name)
    return sorted(out)


def _offered(ev: ClusterEvidence) -> dict[str, dict[str, int]]:
    """resource -> node -> allocatable, for every extended resource some node offers."""
    out: dict[str, dict[str, int]] = {}
    for name, n in ev.nodes.items():
        for k, v in _dd(_status(n).get("allocatable")).items():
            s = str(v)
            if "/" in str(k) and s.isdigit() and int(s) > 0:
                out.setdefault(str(k), {})[name] = int(s)
    return out


def _selector_ok(pod: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """What of the pod's nodeSelector / required node affinity the labels fail ([] when they match)."""
    spec = _spec(pod)
    bad = [f"nodeSelector {k}={v} (node has {labels.get(k, 'no such label')})"
           for k, v in _dd(spec.get("nodeSelector")).items() if labels.get(k) != str(v)]
    terms = _l(_dd(_dd(_dd(spec.get("affinity")).get("nodeAffinity"))
                   .get("requiredDuringSchedulingIgnoredDuringExecution")).get("nodeSelectorTerms"))

    def match(e: dict[str, Any]) -> bool:
        op, key, values = e.get("operator"), str(e.get("key")), [str(v) for v in _l(e.get("values"))]
        return {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}.get(str(op), False)

    exprs = [[e for e in _l(t.get("matchExpressions")) if isinstance(e, dict)] for t in terms if isinstance(t, dict)]
    if exprs and not any(all(match(e) for e in t) for t in exprs):
        bad.append("required node affinity: " + " or ".join(
            " and ".join(f"{e.get('key')} {e.get('operator')} {','.join(map(str, _l(e.get('values'))))}".strip()
                         for e in t) for t in exprs))
    return bad


def _tolerates(tolerations: list[Any], taint: dict[str, Any]) -> bool:
    for t in tolerations:
        if not isinstance(t, dict):
            continue
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and str(t.get("value", "") or "") == str(taint.get("value", "") or ""):
            return True
    return False


def _taint_text(t: dict[str, Any]) -> str:
    return f"{t.get('key')}={t.get('value')}:{t.get('effect')}" if t.get("value") else \
        f"{t.get('key')}:{t.get('effect')}"


def _subject(pod: dict[str, Any]) -> findings.Subject:
    ns, name = pod_key(pod)
    return findings.pod(f"{ns}/{name}")


def _holders(ev: ClusterEvidence, resource: str) -> dict[str, list[str]]:
    """node -> 'ns/name xN' of the pods holding `resource` there."""
    out: dict[str, list[str]] = {}
    for node, held in al.holding_pods(ev.pods).items():
        for p, req in held:
            if req.get(resource):
                ns, name = pod_key(p)
                out.setdefault(node, []).append(f"{ns}/{name}" + (f" x{req[resource]}" if req[resource] > 1 else ""))
    return out


def _insufficient(pod: dict[str, Any], ev: ClusterEvidence, resource: str, msg: str) -> Finding:
    want = extended_requests(pod).get(resource, 1)
    holders = _holders(ev, resource)
    offered = _offered(ev).get(resource, {})
    used = {n: sum(int(x.rsplit(" x", 1)[1]) if " x" in x else 1 for x in h) for n, h in holders.items()}
    lines = [f"scheduler: {msg}"]
    best = 0
    for n in sorted(offered):
        free = max(offered[n] - used.get(n, 0), 0)
        best = max(best, free)
        lines.append(f"{n}: {offered[n]} {resource} allocatable, {used.get(n, 0)} requested, {free} free"
                     + (f"; held by {', '.join(sorted(holders[n]))}" if holders.get(n) else ""))
    held = sorted(x for h in holders.values() for x in h)
    return findings.failed(
        "pod.insufficient-gpu",
        f"no node has {want} free {resource}: the pod asks for {want}, the most free on one node is {best}"
        + (f"; held by {', '.join(held[:8])}{' ...' if len(held) > 8 else ''}" if held else ""),
        "wait for a pod holding them to finish, delete one you do not need (kubectl delete pod -n NS NAME), ask "
        "for fewer, or add GPU nodes; gpuk8s status shows who holds what",
        subject=_subject(pod), evidence=lines)


def _unknown_resource(pod: dict[str, Any], ev: ClusterEvidence, resource: str, msg: str) -> Finding:
    offered = _offered(ev)
    gpu_offers = sorted(r for r in offered if al.is_gpu_resource(r))
    lines = ([f"scheduler: {msg}"] if msg else []) + [
        f"pod asks for {resource}: {extended_requests(pod).get(resource, 0)}",
        "GPU resources the nodes offer: " + (", ".join(
            f"{r} ({', '.join(f'{n}: {c}' for n, c in sorted(offered[r].items()))})" for r in gpu_offers)
            or "none")]
    mig = [r for r in gpu_offers if r.startswith(al.MIG_PREFIX)]
    if resource == gpuplan.GPU_RESOURCE and mig:
        remedy = (f"the GPUs are partitioned into MIG devices (mixed strategy): ask for one of {', '.join(mig)} "
                  "instead of nvidia.com/gpu (docs/mig.md)")
    elif resource.startswith("aliyun.com/"):
        remedy = (f"{resource} is Alibaba Cloud's gpushare scheduler extension, which this cluster does not run: ask "
                  "for nvidia.com/gpu, a shared slice (gpu_sharing in the inventory, docs/sharing.md), or HAMi's "
                  "nvidia.com/gpumem (gpu_sharing: {strategy: hami})")
    elif gpu_offers:
        remedy = f"ask for a resource a node offers ({', '.join(gpu_offers)}), or configure a node to offer {resource}"
    else:
        remedy = ("no node offers any GPU resource: see the node causes below (gpuk8s doctor node/NAME), or gpuk8s "
                  "verify")
    return findings.failed("pod.unknown-resource", f"the pod asks for {resource}, which no node offers", remedy,
                           subject=_subject(pod), evidence=lines)


def _selector(pod: dict[str, Any], ev: ClusterEvidence, msg: str) -> Finding:
    lines = [f"scheduler: {msg}"] if msg else []
    for n in _gpu_nodes(ev):
        labels = {str(k): str(v) for k, v in _dd(_md(ev.nodes[n]).get("labels")).items()}
        bad = _selector_ok(pod, labels)
        if bad:
            lines.append(f"{n}: " + "; ".join(bad))
    return findings.failed(
        "pod.selector-mismatch", "the pod's nodeSelector or node affinity matches no GPU node",
        "fix the pod's nodeSelector/affinity to labels the GPU nodes have (kubectl get nodes --show-labels; gpuk8s "
        "sets nvidia.com/gpu.present=true, nvidia.com/gpu.product, nvidia.com/gpu.count), or label a node "
        "(kubectl label node NODE KEY=VALUE, or labels: in the inventory)",
        subject=_subject(pod), evidence=lines)


def _taint(pod: dict[str, Any], ev: ClusterEvidence, msg: str, shown: str) -> Finding:
    tol = _l(_spec(pod).get("tolerations"))
    lines = [f"scheduler: {msg}"] if msg else []
    missing: list[dict[str, Any]] = []
    key = shown.strip("{}").split(": ", 1)[0]  # the scheduler's "{key: value}"; "" names every taint
    for n in _gpu_nodes(ev):
        for t in _l(_spec(ev.nodes[n]).get("taints")):
            if isinstance(t, dict) and t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tol, t) \
                    and (not key or t.get("key") == key):
                lines.append(f"{n}: taint {_taint_text(t)} not tolerated by the pod")
                if t not in missing:
                    missing.append(t)
    need = ", ".join(f"{{key: {t.get('key')}, operator: Exists, effect: {t.get('effect')}}}" for t in missing)
    named = f"({shown})" if shown else ("(newer schedulers do not name it, kubernetes PR 134740: the GPU nodes' "
                                        "taints the pod does not tolerate are below)")
    return findings.failed(
        "pod.untolerated-taint", f"the GPU nodes carry a taint the pod does not tolerate {named}",
        (f"add to the pod's spec: tolerations: [{need}]" if need else "add a toleration for the taint to the pod")
        + " (or remove the taint: kubectl taint node NODE KEY:EFFECT-)",
        subject=_subject(pod), evidence=lines)


def _dra_claims(pod: dict[str, Any], ev: ClusterEvidence, msg: str) -> Finding:
    """kube-scheduler's "cannot allocate all claims": a request whose selector no published device satisfies, else
    every matching device held (by whom)."""
    reqs = dra.requests_of(pod, ev.claim_templates)
    nodes = ev.dra or {}
    devices = [d for nd in nodes.values() for d in nd.devices]
    evidence = [f"claim {r.claim}, request {r.name}: {r.count} x {r.device_class}"
                + (f" where {'; '.join(s[:200] for s in r.selectors)}" if r.selectors else "") for r in reqs[:8]]
    for name, nd in sorted(nodes.items())[:16]:
        held = sorted({p for a in nd.allocated for p in a.pods})
        evidence.append(f"{name}: {len(nd.devices)} device(s) published, {nd.in_use} held"
                        + (f" by {', '.join(held[:5])}" if held else ""))
    evidence.append(f"scheduler: {msg}")
    missing = [f"request {r.name}: {why}" for r in reqs for s in r.selectors if (why := dra.unmatched(s, devices))]
    if missing:
        return findings.failed(
            "pod.dra-no-matching-device", "the pod's claim asks for a device no node publishes: " + "; ".join(missing),
            "change the claim's selector to a value the devices have (kubectl get resourceslices -o yaml lists "
            "their attributes), or add nodes with such GPUs (allocator: dra)", subject=_subject(pod),
            evidence=evidence)
    if not nodes:
        why = "no node publishes devices of gpu.nvidia.com (no dra node, or its kubelet plugin is not running)"
    else:
        why = "every device its claims could use is held by other pods, or on nodes it cannot go to"
    return findings.failed("pod.dra-unallocatable", f"the scheduler cannot allocate the pod's claims: {why}",
                           "wait for the holders to finish, lower the claim's count, or add dra nodes (gpuk8s status "
                           "shows who holds each node's devices); gpuk8s doctor node/NAME for a dra node whose "
                           "devices are not published", subject=_subject(pod), evidence=evidence)


def _pending(pod: dict[str, Any], ev: ClusterEvidence) -> list[Finding]:
    spec = _spec(pod)
    msg = scheduler_message(pod, ev.events)
    out: list[Finding] = []
    offered = _offered(ev)
    wants = extended_requests(pod)
    sched = str(spec.get("schedulerName") or "default-scheduler")
    hami_wants = [r for r in wants if r in al.HAMI_PER_POD]
    if sched == HAMI_SCHEDULER and not ev.hami_scheduler:
        out.append(findings.failed(
            "pod.scheduler-missing", "the pod waits for hami-scheduler, which is not deployed: nobody binds it",
            "re-run gpuk8s install with gpu_sharing: {strategy: hami} on the GPU nodes (it deploys HAMi's scheduler "
            "and webhook); see kubectl -n kube-system get deploy hami-scheduler",
            subject=_subject(pod), evidence=[f"pod schedulerName: {sched}", "kubectl -n kube-system get deployment "
                                             "hami-scheduler: not found", f"scheduler events: {msg or 'none'}"]))
    elif hami_wants and sched != HAMI_SCHEDULER:
        out.append(findings.failed(
            "pod.scheduler-missing",
            f"the pod asks for HAMi's {', '.join(hami_wants)} but is left to {sched}: HAMi's webhook did not set "
            "schedulerName: hami-scheduler (it is not running, or the pod's namespace is excluded)",
            "check kubectl -n kube-system get pods | grep hami (scheduler and webhook Running); re-run gpuk8s install "
            "with gpu_sharing: {strategy: hami}; then re-create the pod",
            subject=_subject(pod), evidence=[f"pod schedulerName: {sched}", f"hami-scheduler deployed: "
                                             f"{'yes' if ev.hami_scheduler else 'no'}"] + ([f"scheduler: {msg}"] if msg
                                                                                           else [])))
        return out
    for r in sorted(wants):
        if r not in offered and r not in al.HAMI_PER_POD:
            out.append(_unknown_resource(pod, ev, r, msg))
    fit = parse_fit_error(msg) if msg else None
    if fit is None:
        if msg and not out:
            out.append(findings.failed("pod.unschedulable", f"the scheduler cannot place the pod: {msg}",
                                       "see kubectl describe pod; the message says which nodes and why",
                                       subject=_subject(pod), evidence=[f"scheduler: {msg}"]))
        return out
    ranked: list[tuple[int, Finding]] = []
    other: list[str] = []  # the reasons no GPU node explains: the scheduler's own words for pod.unschedulable
    for reason, count in fit.reasons.items():
        m = INSUFFICIENT.match(reason)
        t = TAINT.match(reason) or TAINT_OLD.match(reason)
        if m:
            if m.group(1) not in offered and m.group(1) in wants:
                continue  # said above: the pod asks for it and no node offers it at all
            if m.group(1) not in offered:
                # a resource the pod's spec as doctor read it does not ask for (HAMi's scheduler adds
                # nvidia.com/gpu.memory from the pod's annotations): the scheduler's own words, not dropped
                other.append(f"{count} {reason}")
                continue
            if al.is_gpu_resource(m.group(1)) or m.group(1) in wants:
                ranked.append((count, _insufficient(pod, ev, m.group(1), msg)))
            else:
                other.append(f"{count} {reason}")
        elif t or reason in TAINT_UNNAMED:
            f = _taint(pod, ev, msg, "{" + t.group(1) + "}" if t else "")
            if any(e.endswith("not tolerated by the pod") for e in f.evidence):  # a GPU node's, not the CP's
                ranked.append((count, f))
            else:
                other.append(f"{count} {reason}")
        elif reason == DRA_UNALLOCATABLE:
            ranked.append((count, _dra_claims(pod, ev, msg)))
        elif reason == SELECTOR:
            f = _selector(pod, ev, msg)
            if len(f.evidence) > 1:  # some GPU node does not match
                ranked.append((count, f))
            else:
                other.append(f"{count} {reason}")
        else:
            other.append(f"{count} {reason}")
    out += [f for _, f in sorted(ranked, key=lambda cf: -cf[0])]
    if other and not out:
        out.append(findings.failed("pod.unschedulable", "the scheduler cannot place the pod: " + ", ".join(other),
                                   "see kubectl describe pod and the nodes it names", subject=_subject(pod),
                                   evidence=[f"scheduler: {msg}"]))
    return out


def _node_of(pod: dict[str, Any]) -> str:
    return str(_spec(pod).get("nodeName", "") or "")


def _image_cuda(pod: dict[str, Any]) -> list[str]:
    return [str(c.get("image", "")) for c in _l(_spec(pod).get("containers")) if isinstance(c, dict)]


def pod_events(pod: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """The kubelet's warnings about a pod ("REASON: message", in the order the API lists them; at most the last 8,
    each message capped): why its sandbox or containers do not start."""
    ns, name = pod_key(pod)
    out: list[str] = []
    for e in events:
        io = e.get("involvedObject") if isinstance(e.get("involvedObject"), dict) else {}
        assert isinstance(io, dict)
        if io.get("kind") == "Pod" and io.get("name") == name and io.get("namespace", ns) == ns \
                and e.get("reason") in KUBELET_WARNINGS:
            text = _capped(e.get("message", ""))
            if text:
                out.append(f"event {e.get('reason')}: {text}")
    return out[-8:]


def _cli_errors(text: str) -> list[tuple[str, str]]:
    """Each nvidia-container-cli error in the text as (stage, what): ("initialization error", "nvml error: driver
    not loaded"); the runtime's escaping of the hook's stderr and its trailing ": unknown" taken off."""
    out: list[tuple[str, str]] = []
    for m in HOOK_CLI.finditer(text):
        what = m.group(2).split("\\n", 1)[0].rstrip('\\"').strip()
        for tail in (": unknown.", ": unknown", "."):
            what = what.removesuffix(tail)
        if (m.group(1), what) not in out:
            out.append((m.group(1), what))
    return out


def _said(lines: list[str], *keys: str) -> list[str]:
    """The lines that say one of `keys`, each cut to 600 characters (at most 3)."""
    return [x[:600] for x in lines if any(k in x for k in keys)][:3]


def _node_lines(ev: ClusterEvidence, node: str) -> list[str]:
    """The node's Ready condition and any pressure condition that is True, as the kubelet reports them."""
    n = ev.nodes.get(node)
    if not node:
        return []
    if n is None:
        return [f"node {node}: not in the cluster"]
    out = []
    for c in _l(_status(n).get("conditions")):
        if not isinstance(c, dict):
            continue
        if c.get("type") == "Ready" or c.get("status") == "True" and c.get("type") != "Ready":
            out.append(clean(f"node {node} condition {c.get('type')}={c.get('status')}"
                             + (f" ({c.get('reason')})" if c.get("reason") else "")
                             + (f": {str(c.get('message'))[:300]}" if c.get("message") else "")))
    return out


def _toolkit_remedy(what: str, node: str) -> str:
    """What to do about an nvidia-container-cli error the other causes do not cover, by its text."""
    on = f"on {node or 'the node'}"
    if "ldcache error" in what or "ldconfig" in what:
        return (f"{on}: the hook's ldconfig is not where the toolkit's config says (ldconfig = "
                "\"@/sbin/ldconfig.real\" is Debian/Ubuntu's; \"@/sbin/ldconfig\" elsewhere): fix ldconfig in "
                "/etc/nvidia-container-runtime/config.toml to the host's ldconfig, then delete the pod")
    if "unknown device" in what:
        return ("the device the container was handed (NVIDIA_VISIBLE_DEVICES) is not a GPU of the node: a GPU was "
                "reset or re-partitioned (MIG) after the device plugin listed it, or the image sets "
                f"NVIDIA_VISIBLE_DEVICES itself: restart the device plugin pod {on}, check the pod's env, "
                "delete the pod")
    if "mount error" in what and "file exists" in what:
        return ("the image already holds the driver's files the hook mounts (an image built on another machine's "
                "driver, or with /usr/lib/.../libnvidia-* in it): use an image without driver libraries")
    if "change root failed" in what or "driver root" in what:
        return (f"{on}: the toolkit's driver root (root in /etc/nvidia-container-runtime/config.toml, /run/nvidia/"
                "driver for the GPU Operator's driver container) does not exist: point it at the host's driver (/)")
    if "driver rpc error" in what or "driver error" in what:
        return (f"{on}: the driver did not answer the hook (a GPU fallen off the bus, Xid 79; a hung driver): "
                "dmesg | grep -i -e xid -e NVRM and nvidia-smi on the node; a GPU in that state needs a reset or a "
                "reboot; then delete the pod")
    if "cgroup" in what or "device rules" in what or "bpf" in what:
        return (f"{on}: the hook cannot set the container's device cgroup (cgroup v2 with a runtime or toolkit too old "
                "for it): upgrade nvidia-container-toolkit (gpuk8s install pins it), or use CDI mode")
    return (f"{on}: run nvidia-container-cli -k -d /dev/tty info and read the toolkit's log "
            "(/var/log/nvidia-container-toolkit.log with debug set in /etc/nvidia-container-runtime/config.toml); "
            "reinstall or upgrade nvidia-container-toolkit (gpuk8s install pins it); then delete the pod")


def _failing(pod: dict[str, Any], ev: ClusterEvidence) -> list[Finding]:
    msgs = container_messages(pod)
    ns, name = pod_key(pod)
    log = clean(ev.logs.get((ns, name), ""))
    events = pod_events(pod, ev.events)
    said = msgs + events
    text = "\n".join(said) + "\n" + log
    node = _node_of(pod)  # spec.nodeName; status.hostIP is the node's address, not its name
    host = ev.hosts.get(node)
    plan = ev.plans.get(node)
    host_lines = host.lines() if host is not None else []
    log_lines = [ln for ln in log.splitlines() if ln.strip()][-3:]
    on = node or "its node"
    out: list[Finding] = []
    if SHARED_GT1 in text:
        n = max((v for k, v in extended_requests(pod).items() if al.is_gpu_resource(k)), default=2)
        out.append(findings.failed(
            "pod.shared-request-gt1",
            f"the pod asks for {n} shared GPUs on {on}, whose sharing config refuses more than one "
            "(failRequestsGreaterThanOne)",
            "ask for 1 (a slice of a time-shared GPU gives no more compute than one), or set gpu_sharing: "
            "{fail_requests_greater_than_one: false} in the inventory and re-run gpuk8s install",
            subject=_subject(pod), evidence=_said(said, SHARED_GT1) or msgs))
    elif any(k in text for k in ADMISSION):
        lines = _said(said, *ADMISSION)
        lost = "GPU is lost" in text
        out.append(findings.failed(
            "pod.admission-rejected",
            f"the kubelet on {on} refused the pod at admission: its device manager could not allocate the GPU "
            + ("(the driver reports a GPU lost: it fell off the bus)" if lost else
               "(the device plugin listed fewer healthy devices than the node advertised, or it restarted)"),
            (f"on {on}: nvidia-smi and dmesg | grep -i xid (a lost GPU needs a reset or a reboot); " if lost else
             f"check the device plugin pod on {on} (kubectl -n kube-system logs) and gpuk8s doctor node/{node}; ")
            + "then delete the pod so that it is scheduled again",
            subject=_subject(pod), evidence=lines + _node_lines(ev, node)))
    # the kubelet's words only (its events and the pod's status), never the pod's own log, which its owner writes
    hm = RUNTIME_HANDLER.search("\n".join(said))
    if hm:
        handler = hm.group(1) or hm.group(2) or hm.group(3)
        lines = _said(said, "no runtime for", "failed to find runtime handler", "RuntimeHandler \"")
        rc = str(_spec(pod).get("runtimeClassName") or "")
        lines.append(f"pod runtimeClassName: {rc or 'none'}")
        if host is not None and host.facts is not None and host.runtime == "containerd":
            cfg = host.facts.containerd_config
            lines.append(f"{on}: containerd config defines the nvidia runtime: {'yes' if cfg.nvidia_runtime else 'no'}"
                         + (f" (imports: {', '.join(cfg.imports)})" if cfg.imports else ""))
        lines += host_lines
        out.append(findings.failed(
            "pod.runtime-handler-missing",
            f"the pod's sandbox cannot be created on {on}: its RuntimeClass names the runtime handler "
            f"{handler!r}, which the node's container runtime does not have (the pod stays in ContainerCreating)",
            f"configure the {handler} runtime on {on}: gpuk8s doctor --fix (re-runs node preparation: nvidia-ctk "
            "runtime configure --runtime=containerd, then a containerd restart); by hand: sudo nvidia-ctk runtime "
            "configure --runtime=containerd && sudo systemctl restart containerd. A drop-in nvidia-ctk 1.18.0 wrote to "
            "/etc/containerd/config.d/ is not read (gpuk8s preflight: toolkit.dropin-path); k3s, RKE2 and k0s keep "
            "their own containerd config. Then delete the pod",
            subject=_subject(pod), evidence=lines))
    cli = _cli_errors(text)
    m = CUDA_REQ.search(text)
    if m:
        out.append(_cuda_too_new(pod, m.group(1), said, node, host, host_lines))
    dn = DEVICE_NODE.search(text)
    drv = next(((st, w) for st, w in cli if any(k in w for k in DRIVER_NOT_LOADED)), None)
    if drv is not None:
        lines = _said(said, "nvidia-container-cli") + host_lines
        modules = host.facts.modules if host is not None and host.facts is not None else None
        if modules is not None:
            lines.append(f"{on}: kernel modules nvidia: {'loaded' if 'nvidia' in modules else 'not loaded'}"
                         + (", nouveau: loaded" if "nouveau" in modules else ""))
        mismatch = "version mismatch" in drv[1]
        nouveau = modules is not None and "nouveau" in modules
        out.append(findings.failed(
            "pod.driver-not-loaded",
            f"the NVIDIA container toolkit on {on} cannot reach the driver ({drv[0]}: {drv[1]}): "
            + ("the driver's kernel module and its libraries differ (an upgrade without a reboot)" if mismatch else
               "the kernel module is not loaded" + (" (nouveau holds the GPU)" if nouveau else "")
               + " or the driver's libraries are not installed"),
            (f"reboot {on} (or unload and reload the nvidia modules) so that the kernel module matches the driver's "
             "libraries" if mismatch else
             (f"on {on}: blacklist nouveau (/etc/modprobe.d/blacklist-nouveau.conf: blacklist nouveau, options "
              "nouveau modeset=0), update-initramfs -u, reboot; " if nouveau else
              f"on {on}: sudo modprobe nvidia and nvidia-smi; if the module is missing for the running kernel "
              "(uname -r; after a kernel update, or Secure Boot refusing it), reinstall the driver for it and "
              "reboot; ")) + "gpuk8s doctor node/" + (node or "NAME") + " then shows the node's side; delete the pod",
            subject=_subject(pod), evidence=lines))
    elif dn is not None:
        path = dn.group(1)
        lines = _said(said, "no such file or directory") + host_lines
        if host is not None and host.dev_nodes:
            lines.append(f"{on}: /dev/nvidia*: {', '.join(host.dev_nodes)}")
        out.append(findings.failed(
            "pod.device-nodes-missing",
            f"the container needs the device node {path}, which does not exist on {on}: the driver is loaded "
            "without its device nodes (nvidia-uvm is created on first use, /dev/nvidiaN by nvidia-smi or "
            "nvidia-modprobe), or a driver root or CDI spec names nodes of another driver",
            f"on {on}: sudo nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules (or run "
            "nvidia-smi and nvidia-modprobe -u -c=0), make it run at boot; if a CDI spec names the node, regenerate "
            "it (sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml); then delete the pod",
            subject=_subject(pod), evidence=lines))
    other = [(st, w) for st, w in cli if st != "requirement error" and (st, w) != drv]
    if (other or any(k in text for k in TOOLKIT_OTHER)) and drv is None and dn is None:
        st, w = other[0] if other else ("", next(k for k in TOOLKIT_OTHER if k in text))
        what = f"{st}: {w}" if st else w
        out.append(findings.failed(
            "pod.toolkit-error",
            f"the NVIDIA container toolkit's hook on {on} failed to set up the container's GPU ({what[:300]})",
            _toolkit_remedy(what, node),
            subject=_subject(pod),
            evidence=_said(said, "nvidia-container-cli", *TOOLKIT_OTHER) + host_lines))
    if NVML_UNKNOWN in text:
        lines = [x for x in (msgs + log_lines) if "NVML" in x][:2] + host_lines
        if host is not None and host.systemd_cgroup is not None:
            lines.append(f"systemd cgroup driver: {'yes' if host.systemd_cgroup else 'no'}")
        if host is not None and host.dev_char_links is not None:
            lines.append(f"/dev/char links to NVIDIA devices: {host.dev_char_links}")
        out.append(findings.failed(
            "pod.nvml-unknown-error",
            f"the container lost access to its GPU ({NVML_UNKNOWN}): with the systemd cgroup driver, a systemctl "
            "daemon-reload drops the device permissions of NVIDIA devices that have no /dev/char link",
            f"on {node or 'the node'}: sudo nvidia-ctk system create-dev-char-symlinks --create-all, and make it run "
            "at boot (udev rule ACTION==\"add\", DEVPATH==\"/bus/pci/drivers/nvidia\", RUN+=\"/usr/bin/nvidia-ctk "
            "system create-dev-char-symlinks --create-all\" in /lib/udev/rules.d/71-nvidia-dev-char.rules); then "
            "delete the pod so that it is re-created", subject=_subject(pod), evidence=lines))
    if any(x in text for x in NO_RUNTIME) and not out:
        rc = str(_spec(pod).get("runtimeClassName") or "")
        default = host.runtime_default if host is not None else None
        if rc != "nvidia" and default != "nvidia":
            out.append(findings.failed(
                "pod.no-nvidia-runtime",
                f"the container got no GPU driver: the pod runs with runtime {rc or default or 'runc'}, not nvidia",
                "set runtimeClassName: nvidia in the pod spec (gpuk8s creates the RuntimeClass nvidia), or make nvidia "
                f"the default runtime on {node or 'the node'}: gpuk8s doctor --fix (re-runs node preparation)",
                subject=_subject(pod),
                evidence=[x for x in msgs + log_lines if any(k in x for k in NO_RUNTIME)][:2]
                + [f"pod runtimeClassName: {rc or 'none'}", f"node default runtime: {default or 'unknown'}"]))
    if any(x in text for x in DRIVER_MISMATCH) and not out:
        d = host.facts.driver if host is not None and host.facts is not None else None
        lines = [x for x in msgs + log_lines if any(k in x for k in DRIVER_MISMATCH)][:2] + host_lines
        if d is not None and d.module_version:
            lines.append(f"{on}: kernel module {d.module_version} loaded, driver libraries "
                         f"{', '.join(d.libraries) or 'unknown'}")
        out.append(findings.failed(
            "pod.driver-mismatch",
            f"the driver on {on} was upgraded without a reboot: its loaded kernel module and its libraries differ, so "
            "NVML (and every CUDA program) fails ('Driver/library version mismatch')",
            f"drain {node or 'the node'} and reboot it (gpuk8s install --allow-reboot does, where driver: manage), "
            "then hold the driver packages (apt-mark hold / dnf versionlock) so that unattended upgrades cannot do "
            "it again",
            subject=_subject(pod), evidence=lines))
    if any(x in text for x in FABRIC_NOT_READY):
        d = host.facts.driver if host is not None and host.facts is not None else None
        lines = [x for x in log_lines if any(k in x for k in FABRIC_NOT_READY)][:2] + host_lines
        if d is not None and d.read:
            lines.append(f"{on}: {len(d.nvswitches)} NVSwitch(es); nvidia-fabricmanager {d.fabric_manager}"
                         + (f" (package {v})" if (v := d.package_version("nvidia-fabricmanager")) else ""))
        out.append(findings.failed(
            "pod.fabric-manager",
            f"CUDA cannot start on {on} (error 802, 'system not yet initialized'): on an NVSwitch system the fabric "
            "manager has not configured the switches (not installed, stopped, or of another version than the driver)",
            f"on {node or 'the node'}: systemctl status nvidia-fabricmanager and journalctl -u nvidia-fabricmanager "
            "('driver interface version ... don't match' means its package and the driver differ: install the one "
            "of the driver's exact version); gpuk8s preflight's driver.fabric-manager says which; then delete the pod",
            subject=_subject(pod), evidence=lines))
    if any(x in text for x in GPU_OOM):
        sharing = plan.sharing if plan is not None else "none"
        shared = sharing in ("time-slicing", "mps")
        lines = [x for x in log_lines if any(k in x for k in GPU_OOM)][:2]
        if plan is not None:
            lines.append(f"node {node}: sharing {sharing}, {plan.replicas} replica(s) per GPU, GPU memory "
                         f"{plan.gpu_memory_mib or '?'} MiB")
        others = [f"{a}/{b}" for a, b in (pod_key(p) for p, _ in al.holding_pods(ev.pods).get(node, []))
                  if (a, b) != (ns, name)]
        if others:
            lines.append(f"other GPU pods on {node}: {', '.join(sorted(others)[:8])}")
        out.append(findings.failed(
            "pod.gpu-oom",
            "the pod ran out of GPU memory" + (f" on a {sharing} node, where {plan.replicas if plan else '?'} "
                                               "pods share each GPU's memory with no isolation" if shared else ""),
            ("lower gpu_sharing.replicas so that replicas x the memory one pod needs fits one GPU (gpu_sharing."
             "pod_memory_mib makes preflight check it), or use MIG for isolated memory; then re-run gpuk8s install"
             if shared else "the pod needs more GPU memory than one GPU has free: ask for a GPU with more memory, "
             "or make the job smaller"),
            subject=_subject(pod), evidence=lines))
    if not out:  # NCCL's own words in the pod's log (a training job over the fabric, docs/fabric.md)
        out += [_nccl(pod, f, on, node) for f in classify_nccl(log)[:3]]
    return out


def _nccl(pod: dict[str, Any], f: NcclFailure, on: str, node: str) -> Finding:
    """pod.nccl: an NCCL failure in the pod's log, named from NCCL's words (gpuk8s/facts/fabric.py classify_nccl)."""
    return findings.failed(
        "pod.nccl", f"NCCL on {on} failed ({f.kind}): {f.detail}",
        f"{f.remedy}; gpuk8s verify --fabric proves each node's GPUs and the links between nodes"
        + (f" (and gpuk8s preflight names {node}'s ports)" if node else ""),
        subject=_subject(pod), evidence=[f"nccl: {f.kind}"])


def _cuda_too_new(pod: dict[str, Any], need: str, said: list[str], node: str, host: HostEvidence | None,
                  host_lines: list[str]) -> Finding:
    """pod.cuda-too-new: nvidia-container-cli's requirement check refused an image needing CUDA `need` ("12.6"). The
    driver floor is the minor's (the release notes' table 3: 12.6 needs 560.28.03), not the major's (12.x runs on
    525.60.13 only through minor version compatibility, which the check does not consider)."""
    f = host.facts if host is not None else None
    driver = f.gpu.driver if f is not None else None
    rel = release(driver) if driver else None
    floor = cuda_driver_floor(need)
    has = (f.gpu.cuda_version if f is not None and f.gpu.cuda_version else None) or (cuda_of_driver(rel) if rel
                                                                                      else None)
    lines = _said(said, "cuda>=", "requirement error") + [f"images: {', '.join(_image_cuda(pod))}"] + host_lines
    if floor is not None:
        lines.append(f"CUDA {floor.known}'s driver floor (NVIDIA's CUDA release notes, table 3): {floor.text}"
                     + ("" if floor.exact else f" (CUDA {need} is newer than the version matrix knows: a lower bound)"))
    on = node or "its node"
    image = f"e.g. nvidia/cuda:{has}.0-base-ubuntu22.04" if has else "e.g. nvidia/cuda:12.2.0-base-ubuntu22.04"
    if floor is not None and rel is not None and floor.exact and at_least(rel, floor.driver):
        upgrade = (f"the driver {driver} already meets CUDA {need}'s floor {floor.text}: the container sees "
                   f"another driver than the host's nvidia-smi (a driver container, the toolkit's root), check "
                   f"nvidia-smi inside a GPU pod on {on}")
    elif floor is not None:
        upgrade = (f"upgrade the driver on {node or 'the node'} to at least {floor.text}"
                   + ("" if floor.exact else f" (CUDA {floor.known}'s; CUDA {need} needs a newer one: the release "
                      "notes' table 3 names it)"))
    else:
        upgrade = f"upgrade the driver on {node or 'the node'}"
    return findings.failed(
        "pod.cuda-too-new",
        f"the image needs CUDA {need}, newer than the driver {driver or '?'} on {on} supports"
        + (f" (CUDA {has})" if has else ""),
        f"use an image built for the driver's CUDA ({image}), or {upgrade}",
        subject=_subject(pod), evidence=lines)


def failing(pod: dict[str, Any]) -> bool:
    """A pod that is not where a healthy pod is: not Running or Succeeded, or Running with a container waiting
    (CrashLoopBackOff, RunContainerError, ...)."""
    st = _status(pod)
    if str(st.get("phase", "") or "") not in ("Running", "Succeeded"):
        return True
    return any(isinstance(_dd(cs.get("state")).get("waiting"), dict)
               for cs in _l(st.get("initContainerStatuses")) + _l(st.get("containerStatuses")) if isinstance(cs, dict))


def _unknown(pod: dict[str, Any], ev: ClusterEvidence) -> Finding:
    """pod.unknown: a failing GPU pod whose cause doctor does not recognise, with what it read and where to look."""
    ns, name = pod_key(pod)
    st = _status(pod)
    node = _node_of(pod)
    phase = str(st.get("phase", "") or "unknown")
    lines = [f"pod phase: {phase}" + (f", node {node}" if node else ", not bound to a node")]
    lines += container_messages(pod)[:4]
    if not node:
        msg = scheduler_message(pod, ev.events)
        lines.append(f"scheduler: {msg}" if msg else "scheduler: no FailedScheduling event, no PodScheduled reason")
    lines += pod_events(pod, ev.events)[-4:]
    log = clean(ev.logs.get((ns, name), ""))
    lines += [f"log: {ln[:300]}" for ln in [x for x in log.splitlines() if x.strip()][-3:]]
    lines += _node_lines(ev, node)
    host = ev.hosts.get(node)
    if host is not None:
        lines += host.lines()
    where = (f"kubectl -n {ns} describe pod {name} (its events), kubectl -n {ns} logs {name} --previous"
             + (f"; on {node}: journalctl -u kubelet -u containerd --since '-30min' | grep {name}" if node else
                "; kubectl -n kube-system logs -l component=kube-scheduler (is a scheduler running for it?)"))
    return findings.failed(
        "pod.unknown",
        f"the GPU pod is {phase if phase != 'unknown' else 'failing'}"
        + (" with a container waiting" if phase == "Running" else "")
        + " for a reason doctor does not recognise: the evidence it read is below",
        f"look at {where}; if it is a GPU cause doctor should name, report its text",
        subject=_subject(pod), evidence=lines)


def pod_causes(pod: dict[str, Any], ev: ClusterEvidence) -> list[Finding]:
    """Why a GPU pod is Pending or failing (most likely first); [] when nothing is wrong with it. A pod that is
    failing (`failing`) and whose cause is not recognised gets pod.unknown: doctor is never silent about it."""
    st = _status(pod)
    phase = str(st.get("phase", "") or "")
    bound = bool(_node_of(pod))
    out = _pending(pod, ev) if phase == "Pending" and not bound else _failing(pod, ev)
    if not out and failing(pod):
        out = [_unknown(pod, ev)]
    return out


def troubled(pod: dict[str, Any]) -> bool:
    """A GPU pod worth a diagnosis: Pending, Failed, or a container waiting after restarts or with an error."""
    if not is_gpu_pod(pod):
        return False
    st = _status(pod)
    phase = str(st.get("phase", "") or "")
    if phase in ("Pending", "Failed"):
        return True
    for cs in _l(st.get("containerStatuses")):
        if not isinstance(cs, dict):
            continue
        w = _dd(cs.get("state")).get("waiting")
        if isinstance(w, dict) or (isinstance(cs.get("restartCount"), int) and cs["restartCount"] > 0):
            return True
    return False


# -- nodes ----------------------------------------------------------------------------------------------------

def plugin_pod(ev: ClusterEvidence, node: str) -> dict[str, Any] | None:
    """The device plugin DaemonSet's pod on the node (state.is_device_plugin_pod, the one ownership check that
    --fix's restart makes too): any user may make a pod with a look-alike name; its name and image end up in
    remedies."""
    for p in ev.pods:
        try:
            if state.is_device_plugin_pod(state.pod_state(p), node):
                return p
        except StateError:
            continue
    return None


def _privileged(pod: dict[str, Any]) -> bool | None:
    """Whether the pod's containers run privileged or with CAP_SYS_ADMIN (what the toolkit counts as privileged,
    its internal/config/image/privileged.go); None when the pod's spec names no container."""
    cs = [c for c in _l(_spec(pod).get("containers")) if isinstance(c, dict)]
    if not cs:
        return None
    for c in cs:
        sc = _dd(c.get("securityContext"))
        if sc.get("privileged") is True or "SYS_ADMIN" in _l(_dd(sc.get("capabilities")).get("add")):
            return True
    return False


def _failing_image(pod: dict[str, Any]) -> str:
    """The image of the pod's container (init containers first) that waits on a pull, as its spec names it;
    '' when none is named or the name is not an image reference."""
    waiting = {str(cs.get("name", "")) for cs in _l(_status(pod).get("initContainerStatuses"))
               + _l(_status(pod).get("containerStatuses"))
               if isinstance(cs, dict) and "Pull" in str(_dd(_dd(cs.get("state")).get("waiting")).get("reason", ""))}
    for c in _l(_spec(pod).get("initContainers")) + _l(_spec(pod).get("containers")):
        if isinstance(c, dict) and str(c.get("name", "")) in waiting:
            image = str(c.get("image", ""))
            return image if IMAGE_REF.fullmatch(image) else ""
    return ""


def pull_failures(events: list[dict[str, Any]], namespace: str, pod: str) -> list[str]:
    """The kubelet's 'Failed to pull image' event messages for a pod, in the order the API lists them."""
    out = []
    for e in events:
        io = e.get("involvedObject") if isinstance(e.get("involvedObject"), dict) else {}
        assert isinstance(io, dict)
        msg = clean(str(e.get("message", "")))
        if io.get("kind") == "Pod" and io.get("name") == pod and io.get("namespace", namespace) == namespace \
                and e.get("reason") == "Failed" and msg.startswith("Failed to pull image"):
            out.append(msg)
    return out


def _pull_reason(message: str) -> str:
    """The end of containerd's error: what failed (no such host, not found, unauthorized, ...)."""
    tail = message.rsplit(": ", 2)
    return (": ".join(tail[-2:]) if len(tail) >= 3 else message)[:200]


def _dra_node(name: str, want: dict[str, int], ev: ClusterEvidence) -> list[Finding]:
    """A dra node: every device of its plan in its ResourceSlice (verify's verdict), with the kubelet plugin's pod
    on it as evidence."""
    n, cause_id, cause, evidence = dra.verdict(name, want, (ev.dra or {}).get(name))
    if not cause:
        return []
    pods = [p for p in ev.pods if isinstance(p, dict) and _spec(p).get("nodeName") == name
            and str(_md(p).get("name", "")).startswith(dra.DRA_PLUGIN)]
    for p in pods[:1]:
        try:
            st = state.pod_state(p)
        except StateError:
            continue
        evidence.append(f"{st.namespace}/{st.name}: {st.phase}{f' ({st.waiting})' if st.waiting else ''}")
    if not pods:
        evidence.append(f"no pod of the DRA kubelet plugin ({dra.DRA_PLUGIN}-*) on {name}")
    return [findings.failed(cause_id, cause, f"kubectl -n {dra.DRA_NAMESPACE} logs of the kubelet plugin's pod on "
                            f"{name}; its label {gpuplan.ALLOCATOR_LABEL}=dra and the driver's manifest come from "
                            "gpuk8s install", subject=findings.node(name), evidence=evidence)]


def node_causes(name: str, ev: ClusterEvidence) -> list[Finding]:
    """Why a node does not expose what its GPU plan says; [] when it does (or there is no plan for it)."""
    plan = ev.plans.get(name)
    if plan is None or not plan.gpu_node:
        return []
    node = ev.nodes.get(name)
    # on another allocator than the inventory says, or served by both: verify's verdicts (kube/dra.py), asked here
    differs = dra.allocator_differs(plan, node) if _ready(node) else None
    if differs is not None:
        return [findings.failed(differs.id, differs.cause, differs.remedy, subject=findings.node(name),
                                evidence=list(differs.evidence))]
    twice = dra.double_served(plan, node, ev.dra.get(name)) if ev.dra is not None and _ready(node) else None
    if plan.dra:
        return _dra_node(name, plan.dra_devices, ev) or ([findings.failed(
            twice.id, twice.cause, twice.remedy, subject=findings.node(name))] if twice is not None else [])
    host = ev.hosts.get(name)
    want = plan.expected_gpus
    if host is not None and host.facts is not None and host.facts.gpu.gpus and not want:
        want = len(host.facts.gpu.gpus) * max(plan.replicas, 1)
    sharing = None
    if plan.sharing != "none" and plan.gpus:
        sharing = state.Sharing(plan.sharing, plan.replicas, plan.gpus,
                                plan.plugin.config_name if plan.plugin else "", ev.configs)
    problem = host.driver_problem if host is not None else ""
    default = host.runtime_default if host is not None else None
    count_unknown = not want and node_problem(name, ev)  # neither the inventory nor the facts say how many
    check = state.check_node(name, want or (1 if count_unknown else 0), node, state.pod_states(ev.pods), ev.plugin,
                             driver_problem=problem, runtime_default=default, resource=plan.resource_name,
                             sharing=sharing)
    # a MIG node's resources, as verify judges them (one verdict for both)
    state.mig_verdict(plan, check, node, state.mig_devices(host.facts if host is not None else None))
    if check.ok and twice is not None:
        return [findings.failed(twice.id, twice.cause, twice.remedy, subject=findings.node(name))]
    if check.ok:
        return [_node_unknown(name, ev)] if node_problem(name, ev) else _stale_labels(name, plan, node)
    f = check.finding()
    head = check.head
    if count_unknown and check.allocatable_gpus == 0 and check.expected_gpus == 1 and head:  # asked for "at least 1"
        head = "no GPU schedulable (how many is not in the inventory, and the host's facts were not read)"
        f = dataclasses.replace(f, message=f"{head}: {check.said}")
    extra: list[str] = []
    plugin = plugin_pod(ev, name)
    log = ""
    pname = str(_md(plugin or {}).get("name", "") or f"{state.DEVICE_PLUGIN_POD_PREFIX}-...")
    if plugin is not None:
        ns, pname = pod_key(plugin)
        log = clean(ev.logs.get((ns, pname), ""))
        extra += [f"{pname} log: {ln.strip()}" for ln in log.splitlines() if any(k in ln for k in PLUGIN_NVML)][:3]
        extra += [f"{pname} log: {ln.strip()[:300]}" for ln in log.splitlines()
                  if any(k in ln for k in PLUGIN_UNHEALTHY)][:3]
    if host is not None:
        said = " ".join(f.evidence)
        extra += [ln for ln in host.lines()  # what verify's evidence said already is not repeated
                  if not (ln.startswith("nvidia-smi: ") and "nvidia-smi on the host:" in said)
                  and not (" default runtime: " in ln and "container runtime default on the host:" in said)]
    remedy = f.remedy
    fid = f.id
    message = f.message
    kernel = host.kernel if host is not None and host.kernel is not None else None
    kernel_fatal = [e for e, _ in kernel.firsts if xid_catalogue.is_fatal(e)] if kernel is not None else []
    plugin_said = any(k in log for k in PLUGIN_UNHEALTHY)
    if fid == "gpu.fewer-registered" and (plugin_said or kernel_fatal or (kernel is not None and kernel.fallen)):
        # the plugin's word (XidCriticalError ... marking device as unhealthy) and the kernel's (NVRM: Xid ...)
        m = XID.search(log)
        number = int(m.group(1)) if m else kernel_fatal[0].xid if kernel_fatal else 79 if kernel and kernel.fallen \
            else None
        row = xid_catalogue.lookup(number) if number is not None else None
        message = (f"{head}: " + ("the device plugin marked a GPU unhealthy" if plugin_said
                                                         else "the kernel reports a GPU fault")
                   + (f" (Xid {number})" if number is not None else "") + " and it is no longer advertised"
                   + (f": {row.meaning}" if row is not None else ""))
        remedy = (f"on {name}: {row.remedy if row is not None and row.fatal else 'reset the GPU or reboot'} "
                  "(nvidia-smi and gpuk8s health say which GPU: "
                  f"gpuk8s health {name}); the plugin advertises it again once it is healthy "
                  f"({restart_command(pname)})")
    if fid == "gpu.plugin-crashing" and plugin is not None:
        waiting = " ".join(container_messages(plugin))
        if "ImagePull" in waiting or "ErrImagePull" in waiting:
            ns, pname = pod_key(plugin)
            pulls = pull_failures(ev.events, ns, pname)
            image = _failing_image(plugin)
            fid = "gpu.plugin-image-pull"
            message = (f"{head}: the node cannot pull the device plugin's image "
                       f"{image or '(not named)'}" + (f" ({_pull_reason(pulls[-1])})" if pulls else ""))
            remedy = (f"make {image or 'the image'} pullable from {name}: check that the node reaches its registry "
                      + (f"(on the node: sudo crictl pull {shlex.quote(image)}), " if image else "")
                      + "or serve it from a mirror (registry.mirror in the inventory; gpuk8s images lists what to "
                      "copy there) and re-run gpuk8s install")
            extra = [waiting[:300], *(f"event: {m[:400]}" for m in pulls[-1:]), *extra]
    if fid in ("gpu.plugin-no-nvml", "gpu.fewer-registered") and host is not None and not problem \
            and not any(k in log for k in PLUGIN_NVML + PLUGIN_UNHEALTHY) and host.sockets is not None \
            and not any(s.startswith(PLUGIN_SOCKET_PREFIX) for s in host.sockets):
        fid, message = "gpu.plugin-socket-missing", (
            f"the device plugin runs on {name} but its socket is not in the kubelet's {DEVICE_PLUGINS}/: it is not "
            "registered with the kubelet (a kubelet restart it missed, or a plugin volume that is not the kubelet's "
            "directory)")
        remedy = (f"restart the plugin pod: {restart_command(pname)} (gpuk8s doctor --fix does it); if its socket "
                  f"still does not appear, compare the plugin's volume with the kubelet's root dir on {name} "
                  "(kubelet --root-dir)")
    if fid == "gpu.plugin-no-nvml" and default == "nvidia" and not problem and host is not None \
            and host.envvar_unprivileged is False and plugin is not None and _privileged(plugin) is False:
        message = (f"{head}: the device plugin got no driver in its container: the toolkit on "
                   f"{name} ignores NVIDIA_VISIBLE_DEVICES in containers without CAP_SYS_ADMIN "
                   f"({ENVVAR_UNPRIVILEGED} = false), and the plugin runs unprivileged")
        remedy = (f"on {name}: set {ENVVAR_UNPRIVILEGED} = true in {TOOLKIT_CONFIG} (or remove the line), then "
                  f"{restart_command(pname)}. The setting also keeps every unprivileged GPU pod from its GPUs, since "
                  "the plugin hands them out through that variable; keeping it needs the plugin's volume-mounts "
                  "device list strategy and CAP_SYS_ADMIN, which gpuk8s does not deploy (NVIDIA/k8s-device-plugin "
                  "issue 856)")
        extra.append(f"plugin pod {pname}: unprivileged (no CAP_SYS_ADMIN)")
    elif fid == "gpu.plugin-no-nvml" and default == "nvidia" and not problem and plugin is not None:
        remedy = (f"the runtime's default is nvidia, yet the plugin has no NVML: it loads NVML once, when it starts, "
                  f"so one started before the runtime or the driver was right waits indefinitely: "
                  f"{restart_command(pname)} (gpuk8s doctor --fix does it); if it still has none, check "
                  f"nvidia-container-toolkit on the host (nvidia-ctk --version, {TOOLKIT_CONFIG})")
    return [findings.failed(fid, message, remedy, subject=f.subject, evidence=[*f.evidence, *extra])]


def _ready(node: Any) -> bool:
    """Whether a node object (hostile data) is Ready; False where it cannot be read."""
    try:
        return node is not None and state.node_state(node).ready
    except state.StateError:
        return False


def _stale_labels(name: str, plan: gpuplan.GPUPlan, node: dict[str, Any] | None) -> list[Finding]:
    """gpu.labels-stale: the labels gpuk8s keeps on a node whose GPUs are offered as planned, where one has another
    value than the plan's (a label the plan cannot decide without the host's facts is not compared)."""
    labels = _md(node or {}).get("labels")
    if not isinstance(labels, dict):
        return []
    stale = [(k, v, labels.get(k)) for k, v in sorted(plan.labels.items())
             if plan.decides(k) and labels.get(k) != v]
    if not stale:
        return []

    def shown(v: object) -> str:  # a label value is at most 63 characters; a node's labels are anyone's to write
        t = clean(str(v)[:64]) if isinstance(v, (str, int, float)) else "(not a string)"
        return t[:63] + "..." if len(t) > 63 else t

    said = ", ".join(f"{k}={shown(have) if have is not None else '(none)'} (plan: {want})"
                     for k, want, have in stale[:6])
    return [findings.failed("gpu.labels-stale",
                            f"{len(stale)} label(s) gpuk8s keeps on {name} differ from its GPU plan: {said}",
                            "gpuk8s install relabels the node (nothing else changes on it), or gpuk8s doctor --fix",
                            subject=findings.Subject("node", name))]




def _node_unknown(name: str, ev: ClusterEvidence) -> Finding:
    """gpu.unknown: a GPU node short of its plan that verify's classifier finds nothing wrong with."""
    plan = ev.plans.get(name)
    n = ev.nodes.get(name) or {}
    alloc = {str(k): str(v) for k, v in _dd(_status(n).get("allocatable")).items() if "/" in str(k)}
    lines = _node_lines(ev, name)
    lines.append("allocatable: " + (", ".join(f"{k}={v}" for k, v in sorted(alloc.items())) or "no extended "
                                    "resource"))
    if plan is not None:
        lines.append(f"plan: {plan.expected_gpus or 'some'} {plan.resource_name}"
                     + (f", sharing {plan.sharing} x{plan.replicas}" if plan.sharing != "none" else ""))
    plugin = plugin_pod(ev, name)
    if plugin is not None:
        ns, pname = pod_key(plugin)
        lines.append(f"plugin pod {ns}/{pname}: {_status(plugin).get('phase', '?')}"
                     + "".join(f"; {m}" for m in container_messages(plugin)[:2]))
        log = clean(ev.logs.get((ns, pname), ""))
        lines += [f"{pname} log: {ln[:300]}" for ln in [x for x in log.splitlines() if x.strip()][-3:]]
    else:
        lines.append(f"no device plugin pod on {name}")
    host = ev.hosts.get(name)
    if host is not None:
        lines += host.lines()
    return findings.failed(
        "gpu.unknown",
        f"{name} does not show the GPUs of its plan and doctor does not recognise why: the evidence it read is below",
        f"look at kubectl describe node {name} (conditions, allocatable), the device plugin's log on it (kubectl -n "
        f"kube-system logs POD), nvidia-smi and journalctl -u kubelet on {name}; gpuk8s verify",
        subject=findings.node(name), evidence=lines)


def node_problem(name: str, ev: ClusterEvidence) -> bool:
    """A GPU node whose allocatable differs from its plan (cheap: the cluster's side only)."""
    plan = ev.plans.get(name)
    node = ev.nodes.get(name)
    if plan is None or not plan.gpu_node:
        return False
    if node is None:
        return True
    try:
        ns = state.node_state(node)
    except StateError:
        return True
    if plan.expected_gpus == 0:  # the inventory does not say how many (the facts will): a GPU node with no GPU at all
        return not ns.ready or not any(al.is_gpu_resource(k) and ns.allocatable_of(k) > 0 for k in ns.allocatable)
    return not ns.ready or ns.allocatable_of(plan.resource_name) != plan.expected_gpus


# Causes --fix can remedy by re-running install's phases on the node (prepare: the runtime default, the toolkit and
# the nvidia runtime handler in containerd's config;
# gpu: the device plugin's manifests, its config, the node's labels; plugin: a restart of the node's plugin pod),
# with what it re-runs.
FIXES: dict[str, str] = {
    "gpu.runtime-not-nvidia": "prepare",
    "pod.no-nvidia-runtime": "prepare",
    "pod.runtime-handler-missing": "prepare",
    "gpu.plugin-missing": "gpu",
    "gpu.plugin-not-scheduled": "gpu",
    "gpu.sharing-config": "gpu",
    "gpu.sharing-not-applied": "gpu",
    "gpu.mps-daemon-missing": "gpu",
    "gpu.hami-missing": "gpu",
    "gpu.labels-stale": "gpu",
    "gpu.plugin-socket-missing": "plugin",
    "gpu.plugin-no-nvml": "plugin",
}


def _host_of(f: Finding, ev: ClusterEvidence) -> HostEvidence | None:
    """The host evidence of the node a pod finding's pod is bound to (from the pod object, not from any text)."""
    if f.subject is None or f.subject.kind != "pod":
        return None
    ns, _, name = f.subject.name.partition("/")
    pod = ev.pod(ns, name)
    node = _node_of(pod) if pod is not None else ""
    return ev.hosts.get(node) if node else None


def fixable(f: Finding, ev: ClusterEvidence) -> str:
    """The phase that remedies `f` ('' when gpuk8s cannot fix it safely). A plugin not scheduled because of a
    taint of the user's own is not fixable: only the missing label is. A pod's cause that re-runs node preparation
    is fixable only where the host's own facts (read over SSH, not the pod's words, which a tenant can write)
    show what preparation fixes: containerd without the nvidia runtime, or a default runtime other than nvidia."""
    phase = FIXES.get(f.id, "")
    if f.id in ("pod.runtime-handler-missing", "pod.no-nvidia-runtime"):
        host = _host_of(f, ev)
        if host is None or host.facts is None:
            return ""
        if f.id == "pod.runtime-handler-missing" and not (
                host.runtime == "containerd" and not host.facts.containerd_config.nvidia_runtime):
            return ""
        if f.id == "pod.no-nvidia-runtime" and host.runtime_default in (None, "nvidia"):
            return ""
    # decided on the evidence read (the node's object, the host's facts), never on the finding's words
    if f.id == "gpu.plugin-not-scheduled":
        labels = _md(ev.nodes.get(_subject_node(f)) or {}).get("labels")
        if isinstance(labels, dict) and gpuplan.GPU_PRESENT in labels:
            return ""  # the label is there: what keeps the plugin off is not gpuk8s's to change (a taint, ...)
    if f.id == "gpu.plugin-no-nvml":
        host = ev.hosts.get(_subject_node(f))
        # a restart does not help where the toolkit refuses it the driver, or where the runtime's default is unknown
        # or another one (the host not read: not restarted blindly)
        if host is None or host.runtime_default != "nvidia" or host.envvar_unprivileged is False:
            return ""
    return phase


def _subject_node(f: Finding) -> str:
    """The node a node finding is about ('' for any other subject)."""
    return f.subject.name if f.subject is not None and f.subject.kind == "node" else ""
