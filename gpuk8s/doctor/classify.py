"""Evidence -> causes: why a GPU pod is Pending or failing, why a GPU node lacks its GPUs. Pure functions.

Each cause is a finding (gpuk8s/findings.py) about pod/NAMESPACE/NAME or node/NAME, with the lines that show it
and a remedy, most likely first. The texts matched are the real components' (quoted where they are matched):
kube-scheduler's FitError ("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's
node affinity/selector. preemption: ..."), the kubelet's admission error wrapping the device plugin's Allocate
refusal, nvidia-container-cli's requirement error, NVML's messages in the device plugin's and the pod's logs.
A node's own causes are verify's (gpuk8s/kube/state.check_node): the same cause gets the same id.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from gpuk8s import findings, gpuplan
from gpuk8s.doctor.evidence import (
    DEVICE_PLUGINS,
    ENVVAR_UNPRIVILEGED,
    PLUGIN_SOCKET_PREFIX,
    TOOLKIT_CONFIG,
    ClusterEvidence,
)
from gpuk8s.findings import Finding
from gpuk8s.kube import allocation as al
from gpuk8s.kube import state
from gpuk8s.kube.state import StateError, restart_command
from gpuk8s.text import clean
from gpuk8s.versions import CUDA_DRIVER_FLOORS, cuda_versions_supported, fmt, release

# kube-scheduler pkg/scheduler/framework/types.go FitError.Error(): "0/%v nodes are available: %v." with the
# reasons "N reason" sorted, then (since 1.24) " preemption: 0/%v nodes are available: ..."
# Only the head is a regular expression (literal, bounded digits: linear); the rest is split with str.partition:
# the old pattern's lazy group before an optional `\.?\s*preemption: ` was quadratic on runs of whitespace, and
# anyone who may create Events in a pod's namespace writes the message (160 KiB froze doctor for a minute).
FIT_HEAD = re.compile(r"0/(\d{1,9}) nodes are available: ")
PREEMPTION = "preemption: "
MAX_MESSAGE = 8192  # characters of a scheduler message kept (real ones: one "N reason" per distinct cause, ~300)
INSUFFICIENT = re.compile(r"^Insufficient (\S+)$")
TAINT = re.compile(r"^node\(s\) had untolerated taint \{(.*)\}$")
SELECTOR = "node(s) didn't match Pod's node affinity/selector"
# The kubelet's admission error for the plugin's Allocate refusal (k8s-device-plugin internal/rm/rm.go)
SHARED_GT1 = "maximum request size for shared resources is 1"
# nvidia-container-cli (libnvidia-container): "requirement error: unsatisfied condition: cuda>=12.4, please update
# your driver to a newer version, or use an earlier cuda container"
CUDA_REQ = re.compile(r"unsatisfied condition: cuda\s*>=\s*([0-9]+(?:\.[0-9]+)?)")
NVML_UNKNOWN = "Failed to initialize NVML: Unknown Error"
# The device plugin without NVML in its container: "could not load NVML library" (before v0.14),
# "Detected non-NVML platform: could not load NVML library: libnvidia-ml.so.1: cannot open shared object file"
# and "Incompatible strategy detected auto" (v0.14 on), "ERROR_LIBRARY_NOT_FOUND"
PLUGIN_NVML = ("could not load NVML library", "Incompatible strategy detected", "Incompatible platform detected",
               "ERROR_LIBRARY_NOT_FOUND", "libnvidia-ml.so.1: cannot open shared object file")
# A container that did not get the GPU through the nvidia runtime: no nvidia-smi, no driver library in it
NO_RUNTIME = ('exec: "nvidia-smi": executable file not found', "nvidia-smi: not found",
              "nvidia-smi: command not found", "libnvidia-ml.so.1: cannot open shared object file",
              "Found no NVIDIA driver on your system", "libcuda.so.1: cannot open shared object file")
# CUDA's out-of-memory errors (cudaErrorMemoryAllocation's text, PyTorch's)
GPU_OOM = ("CUDA out of memory", "CUDA error: out of memory", "cudaErrorMemoryAllocation")
HAMI_SCHEDULER = "hami-scheduler"
# An image reference as a pod spec names it (registry/path:tag@digest); anything else is not put in a remedy
IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}(?::[A-Za-z0-9._-]{1,128})?(?:@sha256:[0-9a-f]{64})?")
STANDARD = ("cpu", "memory", "ephemeral-storage", "pods")


@dataclass(frozen=True)
class FitError:
    total: int
    reasons: dict[str, int]  # reason -> how many nodes
    preemption: str


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
    reasons: dict[str, int] = {}
    for part in _reason_parts(body.strip().rstrip(".")):
        count, _, reason = part.strip().partition(" ")
        if count.isascii() and count.isdigit() and len(count) <= 9 and reason and "\n" not in reason:
            reason = reason.strip().rstrip(".")
            reasons[reason] = reasons.get(reason, 0) + int(count)
    return FitError(int(m.group(1)), reasons, preemption.strip())


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
    return findings.failed(
        "pod.untolerated-taint", f"the GPU nodes carry a taint the pod does not tolerate ({shown})",
        (f"add to the pod's spec: tolerations: [{need}]" if need else "add a toleration for the taint to the pod")
        + " (or remove the taint: kubectl taint node NODE KEY:EFFECT-)",
        subject=_subject(pod), evidence=lines)


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
    other: list[str] = []
    for reason, count in fit.reasons.items():
        m = INSUFFICIENT.match(reason)
        t = TAINT.match(reason)
        if m:
            if m.group(1) not in offered:
                continue  # said above: no node offers it at all
            if al.is_gpu_resource(m.group(1)) or m.group(1) in wants:
                ranked.append((count, _insufficient(pod, ev, m.group(1), msg)))
            else:
                other.append(f"{count} {reason}")
        elif t:
            f = _taint(pod, ev, msg, "{" + t.group(1) + "}")
            if any(e.endswith("not tolerated by the pod") for e in f.evidence):  # a GPU node's, not the CP's
                ranked.append((count, f))
        elif reason == SELECTOR:
            f = _selector(pod, ev, msg)
            if len(f.evidence) > 1:  # some GPU node does not match
                ranked.append((count, f))
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


def _failing(pod: dict[str, Any], ev: ClusterEvidence) -> list[Finding]:
    msgs = container_messages(pod)
    ns, name = pod_key(pod)
    log = clean(ev.logs.get((ns, name), ""))
    text = "\n".join(msgs) + "\n" + log
    node = _node_of(pod) or str(_status(pod).get("hostIP", "") or "")
    host = ev.hosts.get(node)
    plan = ev.plans.get(node)
    host_lines = host.lines() if host is not None else []
    log_lines = [ln for ln in log.splitlines() if ln.strip()][-3:]
    out: list[Finding] = []
    if SHARED_GT1 in text:
        n = max((v for k, v in extended_requests(pod).items() if al.is_gpu_resource(k)), default=2)
        out.append(findings.failed(
            "pod.shared-request-gt1",
            f"the pod asks for {n} shared GPUs on {node or 'its node'}, whose sharing config refuses more than one "
            "(failRequestsGreaterThanOne)",
            "ask for 1 (a slice of a time-shared GPU gives no more compute than one), or set gpu_sharing: "
            "{fail_requests_greater_than_one: false} in the inventory and re-run gpuk8s install",
            subject=_subject(pod), evidence=msgs))
    m = CUDA_REQ.search(text)
    if m:
        need = m.group(1)
        f = host.facts if host is not None else None
        driver = f.gpu.driver if f is not None else None
        rel = release(driver) if driver else None
        ok = cuda_versions_supported(rel) if rel else []
        floors = dict(CUDA_DRIVER_FLOORS)
        floor = floors.get(need) or floors.get(need.split(".", 1)[0])
        lines = [x for x in msgs if "cuda" in x.lower()] + [f"images: {', '.join(_image_cuda(pod))}"] + host_lines
        out.append(findings.failed(
            "pod.cuda-too-new",
            f"the image needs CUDA {need}, newer than the driver {driver or '?'} on {node or 'its node'} supports"
            + (f" (CUDA {f.gpu.cuda_version})" if f is not None and f.gpu.cuda_version else ""),
            f"use an image built for the driver's CUDA ({', '.join(ok[:2]) or 'older'}; e.g. nvidia/cuda:"
            f"{(f.gpu.cuda_version if f is not None and f.gpu.cuda_version else '12.2')}.0-base-ubuntu22.04), or "
            f"upgrade the driver on {node or 'the node'}" + (f" to at least {fmt(floor)}" if floor else ""),
            subject=_subject(pod), evidence=lines))
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
    return out


def pod_causes(pod: dict[str, Any], ev: ClusterEvidence) -> list[Finding]:
    """Why a GPU pod is Pending or failing (most likely first); [] when nothing is wrong with it."""
    st = _status(pod)
    phase = str(st.get("phase", "") or "")
    bound = bool(_node_of(pod))
    if phase == "Pending" and not bound:
        return _pending(pod, ev)
    return _failing(pod, ev)


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


def node_causes(name: str, ev: ClusterEvidence) -> list[Finding]:
    """Why a node does not expose what its GPU plan says; [] when it does (or there is no plan for it)."""
    plan = ev.plans.get(name)
    if plan is None or not plan.gpu_node:
        return []
    node = ev.nodes.get(name)
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
    check = state.check_node(name, want, node, state.pod_states(ev.pods), ev.plugin, driver_problem=problem,
                             runtime_default=default, resource=plan.resource_name, sharing=sharing)
    if check.ok:
        return []
    f = check.finding()
    extra: list[str] = []
    plugin = plugin_pod(ev, name)
    log = ""
    pname = str(_md(plugin or {}).get("name", "") or f"{state.DEVICE_PLUGIN_POD_PREFIX}-...")
    if plugin is not None:
        ns, pname = pod_key(plugin)
        log = clean(ev.logs.get((ns, pname), ""))
        extra += [f"{pname} log: {ln.strip()}" for ln in log.splitlines() if any(k in ln for k in PLUGIN_NVML)][:3]
    if host is not None:
        said = " ".join(f.evidence)
        extra += [ln for ln in host.lines()  # what verify's evidence said already is not repeated
                  if not (ln.startswith("nvidia-smi: ") and "nvidia-smi on the host:" in said)
                  and not (" default runtime: " in ln and "container runtime default on the host:" in said)]
    remedy = f.remedy
    fid = f.id
    message = f.message
    if fid == "gpu.plugin-crashing" and plugin is not None:
        waiting = " ".join(container_messages(plugin))
        if "ImagePull" in waiting or "ErrImagePull" in waiting:
            ns, pname = pod_key(plugin)
            pulls = pull_failures(ev.events, ns, pname)
            image = _failing_image(plugin)
            fid = "gpu.plugin-image-pull"
            message = (f"{f.message.split(': ', 1)[0]}: the node cannot pull the device plugin's image "
                       f"{image or '(not named)'}" + (f" ({_pull_reason(pulls[-1])})" if pulls else ""))
            remedy = (f"make {image or 'the image'} pullable from {name}: check that the node reaches its registry "
                      + (f"(on the node: sudo crictl pull {shlex.quote(image)}), " if image else "")
                      + "or serve it from a mirror (registry.mirror in the inventory; gpuk8s images lists what to "
                      "copy there) and re-run gpuk8s install")
            extra = [waiting[:300], *(f"event: {m[:400]}" for m in pulls[-1:]), *extra]
    if fid in ("gpu.plugin-no-nvml", "gpu.fewer-registered") and host is not None and not problem \
            and not any(k in log for k in PLUGIN_NVML) and host.sockets is not None \
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
        message = (f"{f.message.split(': ', 1)[0]}: the device plugin got no driver in its container: the toolkit on "
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


# Causes --fix can remedy by re-running install's phases on the node (prepare: the runtime default and the toolkit;
# gpu: the device plugin's manifests, its config, the node's labels; plugin: a restart of the node's plugin pod),
# with what it re-runs.
FIXES: dict[str, str] = {
    "gpu.runtime-not-nvidia": "prepare",
    "pod.no-nvidia-runtime": "prepare",
    "gpu.plugin-missing": "gpu",
    "gpu.plugin-not-scheduled": "gpu",
    "gpu.sharing-config": "gpu",
    "gpu.sharing-not-applied": "gpu",
    "gpu.mps-daemon-missing": "gpu",
    "gpu.hami-missing": "gpu",
    "gpu.plugin-socket-missing": "plugin",
    "gpu.plugin-no-nvml": "plugin",
}


def fixable(f: Finding, ev: ClusterEvidence) -> str:
    """The phase that remedies `f` ('' when gpuk8s cannot fix it safely). A plugin not scheduled because of a
    taint of the user's own is not fixable: only the missing label is."""
    phase = FIXES.get(f.id, "")
    if f.id == "gpu.plugin-not-scheduled" and not any(
            e.startswith(f"node label {gpuplan.GPU_PRESENT}: missing") for e in f.evidence):
        return ""
    if f.id == "gpu.plugin-no-nvml" and (  # a restart does not help where the toolkit refuses it the driver
            any(ENVVAR_UNPRIVILEGED in e for e in f.evidence)
            or not any(e.endswith(" default runtime: nvidia") for e in f.evidence)):
        return ""
    return phase
