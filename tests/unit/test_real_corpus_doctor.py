"""gpuk8s doctor's classifier over the real corpus: every real text of tests/fixtures/real/doctor,
tests/fixtures/real/kubernetes and tests/fixtures/doctor, each through gpuk8s/doctor/classify.py in the place the
component puts it (the scheduler's FailedScheduling event, the kubelet's events and container statuses, the
device plugin's log, the workload's log, the node's conditions), with the cause written by hand from the text in
CASES below: a text classified as anything else fails.

Each file of tests/fixtures/real/ has a header (source, date, component, version, form, excerpt) above a line
`---`; the text below it is the source's, byte for byte. `form` says how the text reaches doctor:
- describe-events / get-events: kubectl's event tables; each line's reason and message become an Event of the pod
- scheduler-log: kube-scheduler's log; its err="..." is the FailedScheduling message
- yaml-status: a pod's status (or a container's state) as YAML
- message / describe-field: a pod's status message (`where`: pod-status:REASON, terminated:REASON)
- runtime-error / event-messages / journal: a container runtime's error text (Docker's, podman's, containerd's
  journal, or the kubelet's event messages without the table): it stands where the kubelet puts the runtime's
  error, the message of a Failed event; the NVIDIA toolkit's part of it is the same under every runtime
- plugin-log: the device plugin pod's log on the node; container-log: the workload's log
- node-condition / describe-conditions: the kubelet's node conditions
The texts of tests/fixtures/doctor (README there) have no header; their form is in CASES.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import findings, gpuplan
from gpuk8s.doctor import classify
from gpuk8s.doctor.evidence import ClusterEvidence, HostEvidence
from gpuk8s.facts import fabric
from gpuk8s.facts.parse import parse_probe
from gpuk8s.kube.state import DaemonSetState

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real"
OLD = ROOT / "tests" / "fixtures" / "doctor"
H200 = parse_probe((ROOT / "tests" / "fixtures" / "h200" / "probe.txt").read_text())
PLUGIN = DaemonSetState("nvidia-device-plugin-daemonset", 2, 2, 2)
FORMS = {"describe-events", "get-events", "scheduler-log", "yaml-status", "message", "describe-field",
         "runtime-error", "event-messages", "journal", "plugin-log", "container-log", "node-condition",
         "describe-conditions", "scheduler-message"}


def load(name: str) -> tuple[dict[str, str], str]:
    """(header, text) of a corpus file; `old:NAME` is tests/fixtures/doctor/NAME (no header)."""
    if name.startswith("old:"):
        return {}, (OLD / name[4:]).read_text(encoding="utf-8")
    raw = (REAL / name).read_text(encoding="utf-8")
    head, sep, text = raw.partition("\n---\n")
    assert sep, f"{name}: no --- line under the header"
    meta = dict(line.split(": ", 1) for line in head.splitlines())
    assert text.endswith("\n")
    return meta, text[:-1]


# -- the forms --------------------------------------------------------------------------------------------------

DESCRIBE = re.compile(r"^\s*(Normal|Warning)\s+(\S+)\s+(\S+(?: \S+)*)\s{2,}(\S+(?:, \S+)?)\s{2,}(\S.*)$")
GET = re.compile(r"^(\S+)\s+(Normal|Warning)\s+(\S+)\s+(\S+/\S+)\s+(\S.*)$")
KLOG_ERR = re.compile(r'err="((?:[^"\\]|\\.)*)"')
CONDITION = re.compile(r"^\s*(\w+)\s+(True|False|Unknown)\s+(.+?\+\d{4})\s+(.+?\+\d{4})\s+(\S+)\s+(\S.*)$")


def events_of(form: str, text: str) -> list[tuple[str, str]]:
    """(reason, message) of each event line of a kubectl table."""
    rx, reason, message = (DESCRIBE, 2, 5) if form == "describe-events" else (GET, 3, 5)
    out = [(m.group(reason), m.group(message)) for m in map(rx.match, text.splitlines()) if m]
    assert out, f"no event line in a {form} text"
    return out


def event(pod: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Event", "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"],
                                                "namespace": pod["metadata"]["namespace"]},
            "reason": reason, "type": "Warning", "message": message}


def node(name: str, gpus: int = 0, labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None, conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    alloc = {"cpu": "16", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": alloc, "capacity": dict(alloc),
                       "conditions": conditions or [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                     "message": "kubelet is posting ready status"}]}}


CP_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def gpu_pod(name: str = "train", on: str = "", phase: str = "Pending", gpus: int = 1, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"},
            "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu22.04",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                     **({"nodeName": on} if on else {}), **spec},
            "status": {"phase": phase}}


def plugin_pod(node_name: str) -> dict[str, Any]:
    image = "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"
    return {"metadata": {"name": f"nvidia-device-plugin-daemonset-{node_name}", "namespace": "kube-system",
                         "ownerReferences": [{"kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset"}]},
            "spec": {"nodeName": node_name, "containers": [{"name": "nvidia-device-plugin-ctr", "image": image}]},
            "status": {"phase": "Running"}}


def host(default_runtime: str = "nvidia") -> HostEvidence:
    facts = dataclasses.replace(
        H200, containerd_config=dataclasses.replace(H200.containerd_config, default_runtime=default_runtime),
        gpu=dataclasses.replace(H200.gpu, driver="535.104.05", cuda_version="12.2"))
    return HostEvidence(facts, "containerd", ("kubelet.sock",), 0)


def plan(name: str, gpus: int, **kw: Any) -> gpuplan.GPUPlan:
    p = kw.pop("plugin", gpuplan.PluginSettings())
    return gpuplan.GPUPlan(name, True, gpus, {p.resource: gpus * p.replicas}, plugin=p, **kw)


# -- the scenarios: the cluster a text is read in ---------------------------------------------------------------
# Pending (the scheduler's texts): a control plane cp-1 (its own taint, no GPU) and a GPU node gpu-1 with 2 GPUs,
# changed as the scenario says. Bound (the kubelet's and the toolkit's texts): the pod on gpu-1, whose host runs
# driver 535.104.05 (CUDA 12.2) with nvidia as containerd's default. Node (the plugin's and the kubelet's node
# texts): gpu-1 planned with 2 GPUs (8 for xid), its device plugin pod Running.

TAINTS = {"tainted": {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
          "spray": {"key": "spray", "value": "mortein", "effect": "NoSchedule"},
          "gpu-taint": {"key": "gpu", "effect": "NoSchedule"}}


def pending(scenario: str, message: str) -> tuple[dict[str, Any], ClusterEvidence]:
    taints = [TAINTS[scenario]] if scenario in TAINTS else []
    nodes = {"cp-1": node("cp-1", taints=[CP_TAINT]),
             "gpu-1": node("gpu-1", 1 if scenario == "full" else 2, {gpuplan.GPU_PRESENT: "true"}, taints)}
    spec: dict[str, Any] = {}
    if scenario == "selector":
        spec["nodeSelector"] = {"gpu-type": "h100"}
    if scenario == "hami":
        spec["schedulerName"] = "hami-scheduler"
    p = gpu_pod(**spec)
    pods = [p]
    if scenario == "full":
        pods.append(gpu_pod("holder", on="gpu-1", phase="Running"))
    return p, ClusterEvidence(nodes, pods, [event(p, "FailedScheduling", message)] if message else [],
                              hami_scheduler=scenario == "hami")


def bound(scenario: str, *, events: list[tuple[str, str]] | None = None, status: dict[str, Any] | None = None,
          log: str = "") -> tuple[dict[str, Any], ClusterEvidence]:
    p = gpu_pod(on="gpu-1", phase="Pending")
    p["status"] = status or {"phase": "Pending", "containerStatuses": [
        {"name": "main", "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    plans = {}
    if scenario == "time-sliced":
        plans["gpu-1"] = plan("gpu-1", 1, sharing="time-slicing", replicas=4,
                              plugin=gpuplan.PluginSettings("time-slicing", 4), gpu_memory_mib=15360)
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 4 if scenario == "time-sliced" else 2,
                                        {gpuplan.GPU_PRESENT: "true"})}, [p],
                         [event(p, r, m) for r, m in events or []], plans=plans,
                         logs={("ml", "train"): log} if log else {},
                         hosts={"gpu-1": host("runc" if scenario == "runc" else "nvidia")})
    return p, ev


def terminated(reason: str, message: str = "", exit_code: int = 128) -> dict[str, Any]:
    return {"phase": "Failed", "containerStatuses": [{"name": "main", "restartCount": 0, "state": {
        "terminated": {"reason": reason, "exitCode": exit_code, **({"message": message} if message else {})}}}]}


def node_case(scenario: str, *, log: str = "", conditions: list[dict[str, str]] | None = None,
              extra_events: list[dict[str, Any]] | None = None) -> ClusterEvidence:
    want, have = {"xid": (8, 7), "healthy": (2, 2)}.get(scenario, (2, 0))
    pp = plugin_pod("gpu-1")
    pods = [pp]
    if scenario == "image-pull":
        pp["status"] = {"phase": "Pending", "containerStatuses": [
            {"name": "nvidia-device-plugin-ctr", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}
    return ClusterEvidence({"gpu-1": node("gpu-1", have, {gpuplan.GPU_PRESENT: "true"}, conditions=conditions)},
                           pods, extra_events or [], plans={"gpu-1": plan("gpu-1", want)}, plugin=PLUGIN,
                           logs={("kube-system", "nvidia-device-plugin-daemonset-gpu-1"): log} if log else {},
                           hosts={"gpu-1": host()})


def diagnose(name: str, scenario: str, form: str = "") -> tuple[list[findings.Finding], str]:
    """The causes doctor names for the corpus file `name` read in `scenario`, and the text."""
    meta, text = load(name)
    form = form or meta["form"]
    assert form in FORMS, form
    where = meta.get("where", "")
    if form in ("describe-events", "get-events"):
        evs = events_of(form, text)
        if scenario == "image-pull":  # the device plugin pod's own events: the node's cause
            ev = node_case(scenario, extra_events=[{
                "kind": "Event", "involvedObject": {"kind": "Pod", "namespace": "kube-system",
                                                    "name": "nvidia-device-plugin-daemonset-gpu-1"},
                "reason": r, "type": "Warning", "message": m} for r, m in evs])
            return classify.node_causes("gpu-1", ev), text
        sched = [m for r, m in evs if r == "FailedScheduling"]
        if sched:
            p, ev = pending(scenario, sched[-1])
            return classify.pod_causes(p, ev), text
        p, ev = bound(scenario, events=[(r, m) for r, m in evs if r != "FailedScheduling"])
        return classify.pod_causes(p, ev), text
    if form == "scheduler-log":
        errs = [m.group(1).replace('\\"', '"') for m in KLOG_ERR.finditer(text)]
        assert errs, name
        p, ev = pending(scenario, errs[-1])
        return classify.pod_causes(p, ev), text
    if form == "scheduler-message":
        p, ev = pending(scenario, text.strip())
        return classify.pod_causes(p, ev), text
    if form == "yaml-status":
        doc = yaml.safe_load(textwrap.dedent(text))
        if "status" in doc:
            msg = next(c["message"] for c in doc["status"]["conditions"] if c["type"] == "PodScheduled")
            p, ev = pending(scenario, "")
            p["status"] = {"phase": doc["status"].get("phase", "Pending"), "conditions": doc["status"]["conditions"]}
            assert classify.scheduler_message(p, ev.events) == msg.strip()
            return classify.pod_causes(p, ev), text
        p, ev = bound(scenario, status=terminated(doc["reason"], doc["message"], doc.get("exitCode", 128)))
        return classify.pod_causes(p, ev), text
    if form in ("message", "describe-field"):
        msg = text.split(":", 1)[1].strip() if form == "describe-field" else text.strip()
        kind, _, reason = where.partition(":")
        status = ({"phase": "Failed", "reason": reason, "message": msg} if kind == "pod-status"
                  else terminated(reason, msg))
        p, ev = bound(scenario, status=status)
        return classify.pod_causes(p, ev), text
    if form in ("runtime-error", "event-messages", "journal"):
        p, ev = bound(scenario, events=[("Failed", text)])
        return classify.pod_causes(p, ev), text
    if form == "container-log":
        p, ev = bound(scenario, status=terminated("Error", exit_code=1), log=text)
        return classify.pod_causes(p, ev), text
    if form == "plugin-log":
        events = []
        if scenario == "image-pull":
            events = [{"kind": "Event", "involvedObject": {"kind": "Pod", "namespace": "kube-system",
                                                          "name": "nvidia-device-plugin-daemonset-gpu-1"},
                       "reason": "Failed", "type": "Warning", "message": text.strip()}]
        ev = node_case(scenario, log="" if scenario == "image-pull" else text, extra_events=events)
        return classify.node_causes("gpu-1", ev), text
    if form in ("node-condition", "describe-conditions"):
        if form == "node-condition":
            conds = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": text.strip()}]
        else:
            conds = [{"type": m.group(1), "status": m.group(2), "reason": m.group(5), "message": m.group(6)}
                     for m in map(CONDITION.match, text.splitlines()) if m]
            assert conds, name
        ev = node_case("healthy" if scenario == "healthy" else "none", conditions=conds)
        return classify.node_causes("gpu-1", ev), text
    raise AssertionError(form)


# -- the table: every real text, its scenario, the causes written by hand from the text, what must be said --------
# (file, scenario, form for the old fixtures, expected ids, a substring the finding's message, remedy or evidence
# must hold)
CASES: list[tuple[str, str, str, list[str], str]] = [
    # kube-scheduler, by wording: 1.35+ "untolerated taint(s)" (no key), 1.24-1.34 "{KEY: VALUE}"
    ("kubernetes/scheduler/taints-unnamed-dra-kind.txt", "tainted", "", ["pod.untolerated-taint"],
     "gpu-1: taint dedicated=ml:NoSchedule not tolerated by the pod"),
    ("kubernetes/scheduler/taints-unnamed-dra-kind.txt", "plain", "", ["pod.unschedulable"],
     "2 node(s) had untolerated taint(s)"),
    # DRA (1.34): a claim no node can satisfy; the DynamicResources PostFilter's "still not schedulable"
    ("kubernetes/scheduler/dra-cannot-allocate-all-claims-1.34.txt", "plain", "", ["pod.dra-unallocatable"],
     "no node publishes devices of gpu.nvidia.com"),
    ("kubernetes/scheduler/taint-control-plane-only-k8s126.txt", "plain", "", ["pod.unschedulable"],
     "1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"),
    ("kubernetes/scheduler/taints-control-plane-and-user-k8s124.txt", "spray", "", ["pod.untolerated-taint"],
     "gpu-1: taint spray=mortein:NoSchedule not tolerated by the pod"),
    ("kubernetes/scheduler/antiaffinity-taint-selector-harvester.yaml.txt", "selector", "",
     ["pod.selector-mismatch"], "gpu-1: nodeSelector gpu-type=h100 (node has no such label)"),
    ("kubernetes/scheduler/hami-unregistered-selector.log", "selector", "", ["pod.selector-mismatch"],
     "nodeSelector gpu-type=h100"),
    ("kubernetes/scheduler/preemption-only-hami-kind.log", "plain", "", ["pod.unknown"],
     "scheduler: 0/1 nodes are available: preemption:"),
    ("old:scheduler-insufficient.txt", "full", "scheduler-message", ["pod.insufficient-gpu"],
     "held by ml/holder"),
    ("old:scheduler-taint.txt", "gpu-taint", "scheduler-message", ["pod.untolerated-taint"],
     "tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]"),
    ("old:scheduler-mixed.txt", "plain", "scheduler-message", ["pod.unschedulable"],
     "2 node(s) didn't match pod topology spread constraints"),
    ("old:scheduler-hami.txt", "hami", "scheduler-message", ["pod.unschedulable"], "1 NodeUnfitPod"),
    # the pre-1.25 wording "had taint {KEY: VALUE}, that the pod didn't tolerate" (TAINT_OLD), a control plane's key
    ("kubernetes/scheduler/taint-old-wording-control-plane-kubeedge.txt", "plain", "", ["pod.unschedulable"],
     "1 node(s) had taint {node-role.kubernetes.io/control-plane: }, that the pod didn't tolerate"),
    ("kubernetes/scheduler/taint-old-wording-master-adaptdl.txt", "plain", "", ["pod.unschedulable"],
     "1 node(s) had taint {node-role.kubernetes.io/master: }, that the pod didn't tolerate"),
    ("kubernetes/scheduler/taint-unreachable-get-events-optscale.txt", "plain", "", ["pod.unschedulable"],
     "1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }"),
    ("kubernetes/scheduler/insufficient-gpu-cordoned-node-2019.txt", "full", "", ["pod.insufficient-gpu"],
     "held by ml/holder"),
    # HAMi's own resource, which the table's pod does not ask for and no node offers: the scheduler's reason is kept,
    # pod.unschedulable quoting it (before, it was dropped as "said above" and doctor fell back on pod.unknown)
    ("kubernetes/scheduler/hami-insufficient-gpu-memory.log", "plain", "", ["pod.unschedulable"],
     "4 Insufficient nvidia.com/gpu.memory"),
    # OpenShift 3.11 (Kubernetes 1.11): the older "didn't match node selector" beside the GPU shortage
    ("kubernetes/scheduler/insufficient-gpu-old-selector-openshift311.txt", "full", "", ["pod.insufficient-gpu"],
     "held by ml/holder"),
    # the kubelet: the sandbox's runtime handler (containerd 1.x, 2.x, CRI-O)
    ("kubernetes/kubelet/sandbox-no-runtime-nvidia-kops.txt", "nvidia", "", ["pod.runtime-handler-missing"],
     "runtime handler 'nvidia'"),
    ("kubernetes/kubelet/sandbox-refused-then-no-runtime-nvidia.txt", "nvidia", "",
     ["pod.runtime-handler-missing"], "nvidia-ctk runtime configure --runtime=containerd"),
    ("kubernetes/kubelet/sandbox-no-runtime-nvidia-kind.txt", "nvidia", "", ["pod.runtime-handler-missing"],
     "failed to get sandbox runtime: no runtime for \"nvidia\" is configured"),
    ("kubernetes/kubelet/sandbox-no-runtime-nvidia-containerd2.txt", "nvidia", "",
     ["pod.runtime-handler-missing"], "unable to get OCI runtime for sandbox"),
    ("kubernetes/kubelet/sandbox-no-runtime-nvidia-gpu-operator-docs.txt", "nvidia", "",
     ["pod.runtime-handler-missing"], "ContainerCreating"),
    ("kubernetes/kubelet/sandbox-no-runtime-nvidia-nouveau-docs.txt", "nvidia", "",
     ["pod.runtime-handler-missing"], "containerd config defines the nvidia runtime"),
    ("kubernetes/kubelet/sandbox-crio-no-runtime-handler.txt", "nvidia", "", ["pod.runtime-handler-missing"],
     "failed to find runtime handler nvidia from runtime list"),
    # dockershim's wording (Kubernetes <= 1.23)
    ("kubernetes/kubelet/sandbox-dockershim-runtime-handler-not-supported.txt", "nvidia", "",
     ["pod.runtime-handler-missing"], "runtime handler 'nvidia'"),
    # the kubelet's admission (device manager)
    ("kubernetes/kubelet/admission-devices-unavailable-e2e.txt", "nvidia", "", ["pod.admission-rejected"],
     "Requested: 1, Available: 0"),
    ("kubernetes/kubelet/admission-gpu-lost.txt", "nvidia", "", ["pod.admission-rejected"], "GPU lost"),
    ("kubernetes/kubelet/admission-plugin-eof-hami.txt", "nvidia", "", ["pod.admission-rejected"],
     "error reading from server: EOF"),
    ("kubernetes/kubelet/admission-requested-unavailable-k8s-130145.txt", "nvidia", "", ["pod.admission-rejected"],
     "Requested:1, Available: 0"),
    ("kubernetes/kubelet/admission-gpu-lost-device-3.txt", "nvidia", "", ["pod.admission-rejected"],
     "the driver reports a GPU lost"),
    ("old:shared-gt1.txt", "nvidia", "message", ["pod.shared-request-gt1"], "failRequestsGreaterThanOne"),
    # the NVIDIA container toolkit's hook (nvidia-container-cli) and the device nodes
    ("doctor/toolkit/cli-driver-not-loaded-docker.txt", "nvidia", "", ["pod.driver-not-loaded"],
     "nvml error: driver not loaded"),
    ("doctor/toolkit/cli-driver-not-loaded-garden-linux.yaml.txt", "nvidia", "", ["pod.driver-not-loaded"],
     "initialization error: nvml error: driver not loaded"),
    ("doctor/toolkit/cli-driver-not-loaded-stderr.txt", "nvidia", "", ["pod.driver-not-loaded"], "modprobe nvidia"),
    ("doctor/toolkit/cli-driver-not-loaded-info-1.17.8.txt", "nvidia", "", ["pod.driver-not-loaded"],
     "initialization error: nvml error: driver not loaded"),
    ("doctor/toolkit/cli-driver-not-loaded-docker-runc-1.0.txt", "nvidia", "", ["pod.driver-not-loaded"],
     "sudo modprobe nvidia"),
    ("doctor/toolkit/cli-mount-error-devices-allow-containerd.txt", "nvidia", "", ["pod.toolkit-error"],
     "mount error: open failed: /sys/fs/cgroup/devices/"),
    ("doctor/toolkit/cli-load-library-failed-compose.txt", "nvidia", "", ["pod.driver-not-loaded"],
     "load library failed: libnvidia-ml.so.1"),
    ("doctor/toolkit/cli-ldcache-ldconfig-real-missing.txt", "nvidia", "", ["pod.toolkit-error"],
     "@/sbin/ldconfig.real"),
    ("doctor/toolkit/cli-ldcache-error-code-1.txt", "nvidia", "", ["pod.toolkit-error"],
     "ldcache error: process /sbin/ldconfig.real failed with error code: 1"),
    ("doctor/toolkit/cli-ldcache-kubelet-dockershim.txt", "nvidia", "", ["pod.toolkit-error"],
     "ldcache error: process /sbin/ldconfig failed with error code: 127"),
    ("doctor/toolkit/cli-mount-error-file-exists.txt", "nvidia", "", ["pod.toolkit-error"],
     "use an image without driver libraries"),
    ("doctor/toolkit/cli-detection-error-nvml-unknown.txt", "nvidia", "", ["pod.toolkit-error"],
     "detection error: nvml error: unknown error"),
    ("doctor/toolkit/cli-change-root-failed.txt", "nvidia", "", ["pod.toolkit-error"], "driver root"),
    ("doctor/toolkit/cli-unknown-device-kubelet.txt", "nvidia", "", ["pod.toolkit-error"],
     "NVIDIA_VISIBLE_DEVICES"),
    ("doctor/toolkit/cli-driver-error-failed-to-process.txt", "nvidia", "", ["pod.toolkit-error"],
     "driver error: failed to process request"),
    ("doctor/toolkit/cli-driver-error-with-cuda-require.txt", "nvidia", "", ["pod.toolkit-error"],
     "the driver did not answer the hook"),
    ("doctor/toolkit/cli-driver-rpc-timeout-gpu-operator-docs.txt", "nvidia", "", ["pod.toolkit-error"], "Xid 79"),
    ("doctor/toolkit/cli-cuda-requirement-12.8-runpod.txt", "nvidia", "", ["pod.cuda-too-new"],
     "upgrade the driver on gpu-1 to at least 570.26"),
    ("old:cuda-requirement.txt", "nvidia", "runtime-error", ["pod.cuda-too-new"],
     "CUDA 12.8's driver floor (NVIDIA's CUDA release notes, table 3): 570.26"),
    ("doctor/toolkit/crio-hook-exit-code-openshift.txt", "nvidia", "", ["pod.toolkit-error"],
     "nvidia-container-runtime-hook` (exit code: 1)"),
    ("doctor/toolkit/device-node-lstat-driver-root-kubelet.txt", "nvidia", "", ["pod.device-nodes-missing"],
     "/run/nvidia/driver/dev/nvidiactl"),
    ("doctor/toolkit/device-node-lstat-driver-root-containerd.log", "nvidia", "", ["pod.device-nodes-missing"],
     "/run/nvidia/driver/dev/nvidiactl"),
    ("doctor/toolkit/device-node-uvm-docker.txt", "nvidia", "", ["pod.device-nodes-missing"],
     "the device node /dev/nvidia-uvm"),
    ("doctor/toolkit/device-node-uvm-tools-docker.txt", "nvidia", "", ["pod.device-nodes-missing"],
     "the device node /dev/nvidia-uvm-tools"),
    ("doctor/toolkit/device-node-cdi-podman.txt", "nvidia", "", ["pod.device-nodes-missing"],
     "nvidia-ctk cdi generate"),
    ("doctor/toolkit/cli-mount-error-proc-bus-id.txt", "nvidia", "", ["pod.toolkit-error"],
     "stat failed: /proc/driver/nvidia/gpus/cfdd:00:00.0"),
    # the third harvest: the CLI by hand (Rocky 9), k3s's kubelet (.real), Docker 2024, minikube 2020, a docker build,
    # nvidia-docker 2.0 (2017, 'cuda >= 9.0' with spaces), a MIG node's plugin (2021), LXD with an R450-style MIG UUID
    ("doctor/toolkit/cli-load-library-failed-list-rocky9.txt", "nvidia", "", ["pod.driver-not-loaded"],
     "load library failed: libnvidia-ml.so.1: cannot open shared object file"),
    ("doctor/toolkit/cli-driver-error-real-k3s-kubelet.txt", "nvidia", "", ["pod.toolkit-error"],
     "initialization error: driver error: failed to process request"),
    ("doctor/toolkit/cli-driver-rpc-timeout-docker-2024.txt", "nvidia", "", ["pod.toolkit-error"],
     "initialization error: driver rpc error: timed out"),
    ("doctor/toolkit/cli-cuda-error-no-device-minikube-kubelet.txt", "nvidia", "", ["pod.toolkit-error"],
     "initialization error: cuda error: no cuda-capable device is detected"),
    ("doctor/toolkit/cli-cuda-requirement-10.2-docker-build.txt", "nvidia", "", ["pod.cuda-too-new"],
     "already meets CUDA 10.2's floor 440.33"),
    ("doctor/toolkit/cli-cuda-requirement-9.0-spaced-2017.txt", "nvidia", "", ["pod.cuda-too-new"],
     "already meets CUDA 9.0's floor 384.81"),
    ("doctor/toolkit/cli-cuda-requirement-12.8-docker-wsl-551.txt", "nvidia", "", ["pod.cuda-too-new"],
     "upgrade the driver on gpu-1 to at least 570.26"),
    ("doctor/toolkit/cli-detection-error-invalid-ordinal-mig-kubelet.txt", "nvidia", "", ["pod.toolkit-error"],
     "detection error: cuda error: invalid device ordinal"),
    ("doctor/toolkit/cli-unknown-device-mig-gpu-uuid-lxd.txt", "nvidia", "", ["pod.toolkit-error"],
     "device error: MIG-GPU-932bfb2c-849a-2a22-1e84-9eff6bc02b39/1/0: unknown device"),
    # the workload's log
    ("doctor/workload/cuda-oom-time-slicing-t4.log", "time-sliced", "", ["pod.gpu-oom"],
     "time-slicing node, where 4 pods share"),
    ("doctor/workload/cuda-oom-pytorch-2.x.log", "nvidia", "", ["pod.gpu-oom"], "more GPU memory"),
    ("doctor/workload/no-nvidia-driver-pytorch.log", "runc", "", ["pod.no-nvidia-runtime"],
     "node default runtime: runc"),
    ("doctor/workload/nvml-unknown-cpu-manager-static.log", "nvidia", "", ["pod.nvml-unknown-error"],
     "create-dev-char-symlinks"),
    # NVML's version mismatch in the workload's own log: the node's driver upgraded without a reboot
    ("doctor/workload/nvml-version-mismatch-kubeflow-notebook.log", "nvidia", "", ["pod.driver-mismatch"],
     "Failed to initialize NVML: Driver/library version mismatch"),
    # CUDA error 802 on NVSwitch systems without a working fabric manager
    ("doctor/workload/cuda-802-system-not-yet-initialized-pytorch.log", "nvidia", "", ["pod.fabric-manager"],
     "cuda runtime error (802) : system not yet initialized"),
    ("doctor/workload/cuda-802-bandwidthtest-pytorch.log", "nvidia", "", ["pod.fabric-manager"],
     "-> system not yet initialized"),
    ("doctor/workload/cuda-802-torch-warning-azure-nd96asr.log", "nvidia", "", ["pod.fabric-manager"],
     "Error 802: system not yet initialized"),
    ("old:nvml-unknown.log", "nvidia", "container-log", ["pod.nvml-unknown-error"],
     "create-dev-char-symlinks"),
    # the device plugin's log on a node short of its GPUs (v0.17, v0.19; before v0.14)
    ("doctor/device-plugin/v0.17.1-incompatible-strategy.log", "none", "", ["gpu.plugin-no-nvml"],
     "Incompatible strategy detected auto"),
    ("doctor/device-plugin/v0.17.3-nvml-not-detected.log", "none", "", ["gpu.plugin-no-nvml"],
     "NVML not detected: could not load NVML library"),
    ("doctor/device-plugin/v0.19.3-library-not-found.log", "none", "", ["gpu.plugin-no-nvml"],
     "Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"),
    ("doctor/device-plugin/v1.8-failed-to-start-nvml.log", "none", "", ["gpu.plugin-no-nvml"],
     "Failed to start nvml with error:  could not load NVML library"),
    ("doctor/device-plugin/v1.9-registration-unimplemented.log", "none", "", ["gpu.plugin-socket-missing"],
     "not registered with the kubelet"),
    ("doctor/device-plugin/v1.8-register-deadline-exceeded.log", "none", "", ["gpu.plugin-socket-missing"],
     "not registered with the kubelet"),
    ("doctor/device-plugin/image-not-found-v0.7.2-event.txt", "image-pull", "", ["gpu.plugin-image-pull"],
     "docker.io/nvidia/k8s-device-plugin:v0.7.2: not found"),
    ("doctor/device-plugin/registered-journal-bottlerocket.log", "healthy", "", [], ""),
    ("doctor/device-plugin/xid-79-unhealthy-gpu-operator-docs.log", "xid", "", ["gpu.fewer-registered"],
     "marked a GPU unhealthy (Xid 79)"),
    ("doctor/device-plugin/legacy-could-not-load-nvml-microk8s.log", "none", "", ["gpu.plugin-no-nvml"],
     "Failed to initialize NVML: could not load NVML library."),
    ("doctor/device-plugin/legacy-could-not-load-nvml-minikube-addon.log", "none", "", ["gpu.plugin-no-nvml"],
     "Failed to initialize NVML: could not load NVML library."),
    # the plugin's own "found no GPU" line with no NVML error before it
    ("doctor/device-plugin/legacy-no-devices-found-after-reboot.log", "none", "", ["gpu.plugin-no-nvml"],
     "No devices found. Waiting indefinitely."),
    ("old:plugin-nvml-v017.log", "none", "plugin-log", ["gpu.plugin-no-nvml"], "Incompatible strategy detected"),
    ("old:plugin-nvml-legacy.log", "none", "plugin-log", ["gpu.plugin-no-nvml"], "could not load NVML library"),
    ("old:plugin-registered.log", "healthy", "plugin-log", [], ""),
    ("old:image-pull-failed.txt", "image-pull", "plugin-log", ["gpu.plugin-image-pull"],
     "nvcr.io/nvidia/driver:460.73.01-ubuntu21.04: not found"),
    # the kubelet's node conditions
    ("kubernetes/node/not-ready-cni-bottlerocket.txt", "none", "", ["node.not-ready"],
     "cni plugin not initialized"),
    ("kubernetes/node/conditions-ready-gpu-operator-docs.txt", "healthy", "", [], ""),
]


def _said(f: findings.Finding) -> str:
    return "\n".join([f.message, f.remedy, *f.evidence])


def _case(c: tuple[str, str, str, list[str], str]) -> Any:
    return pytest.param(*c, id=f"{c[0]}[{c[1]}]")


@pytest.mark.parametrize(("name", "scenario", "form", "want", "says"), [_case(c) for c in CASES])
def test_every_real_text_gets_its_cause(name: str, scenario: str, form: str, want: list[str], says: str) -> None:
    found, _ = diagnose(name, scenario, form)
    assert [f.id for f in found] == want, [(f.id, f.message) for f in found]
    assert all(f.status == "fail" and f.remedy for f in found)
    if says:
        assert any(says in _said(f) for f in found), [_said(f) for f in found]


def test_every_corpus_file_is_in_the_table_and_has_its_header() -> None:
    files = {p.relative_to(REAL).as_posix() for top in ("doctor", "kubernetes")
             for p in (REAL / top).rglob("*") if p.is_file()}
    tabled = {c[0] for c in CASES} | set(NOT_CLASSIFIED)
    assert files == {n for n in tabled if not n.startswith("old:")}, files ^ tabled
    for name in files:
        meta, text = load(name)
        assert {"source", "date", "component", "version", "form", "excerpt", "verbatim"} <= set(meta), name
        assert meta["source"].startswith("https://github.com/"), name
        assert meta["form"] in FORMS and text.strip(), name
    olds = {p.name for p in OLD.iterdir() if p.suffix in (".txt", ".log")}
    # every real text of tests/fixtures/doctor is here too, but dcgm-metrics.txt (the monitoring's parser reads it)
    assert olds - {"dcgm-metrics.txt"} == {c[0][4:] for c in CASES if c[0].startswith("old:")}


# The kubelet's and kubeadm's errors gpuk8s names elsewhere (preflight's k8s.cgroup-v2): not doctor's causes; the
# words gpuk8s quotes must be the real ones.
NOT_CLASSIFIED = {
    "kubernetes/kubelet/kubelet-refuses-cgroup-v1.log": "kubelet is configured to not run on a host using cgroup v1",
    "kubernetes/kubeadm/preflight-cgroup-v1-warning.txt": "'FailCgroupV1' to 'false'",
}


@pytest.mark.parametrize("name", sorted(NOT_CLASSIFIED))
def test_the_kubelet_and_kubeadm_words_gpuk8s_quotes_are_real(name: str) -> None:
    _, text = load(name)
    assert NOT_CLASSIFIED[name] in text
    checks = (ROOT / "gpuk8s" / "preflight" / "host_checks.py").read_text()
    assert "kubelet is configured to not run on a host using cgroup v1" in checks and "failCgroupV1" in checks


# -- the named defects, each on real text -------------------------------------------------------------------------

def test_a_pod_in_container_creating_for_a_missing_runtime_handler_is_not_an_all_clear() -> None:
    """Before: FailedCreatePodSandBox was not read at all: "doctor: nothing wrong found", exit 0."""
    found, text = diagnose("kubernetes/kubelet/sandbox-no-runtime-nvidia-kops.txt", "nvidia")
    [f] = found
    assert f.id == "pod.runtime-handler-missing" and f.subject == findings.pod("ml/train")
    # --fix re-runs node preparation only where the host's own facts show containerd without the nvidia runtime:
    # the pod's words (events, its log) are a tenant's to write
    message = next(m for r, m in events_of("describe-events", text) if r == "FailedCreatePodSandBox")
    p, ev = bound("nvidia", events=[("FailedCreatePodSandBox", message)])
    [f] = classify.pod_causes(p, ev)
    h = ev.hosts["gpu-1"]
    assert h.facts is not None

    def with_runtime(defined: bool) -> HostEvidence:
        assert h.facts is not None
        return dataclasses.replace(h, facts=dataclasses.replace(h.facts, containerd_config=dataclasses.replace(
            h.facts.containerd_config, nvidia_runtime=defined)))

    ev.hosts["gpu-1"] = with_runtime(True)
    assert classify.fixable(f, ev) == ""  # the host has the runtime: nothing for preparation to fix
    ev.hosts["gpu-1"] = with_runtime(False)
    assert classify.fixable(f, ev) == "prepare"
    assert classify.fixable(f, ClusterEvidence({}, [p])) == ""  # no facts read: not fixable


def test_a_tenants_log_never_makes_a_cause_that_fix_acts_on() -> None:
    """The pod's log is its owner's text: 'no runtime for "nvidia"' there names no runtime handler cause."""
    p, ev = bound("nvidia", status=terminated("Error", exit_code=1),
                  log='failed to get sandbox runtime: no runtime for "nvidia" is configured')
    found = classify.pod_causes(p, ev)
    assert found and not [f for f in found if f.id == "pod.runtime-handler-missing"]


def test_a_cuda_minor_requirement_is_compared_with_the_minors_driver_floor() -> None:
    """Before: cuda>=12.6 got the 12.x floor 525.60.13, below the host's 535: "upgrade to at least 525.60.13"."""
    p, ev = bound("nvidia", events=[("Failed", "nvidia-container-cli: requirement error: unsatisfied condition: "
                                               "cuda>=12.6, please update your driver to a newer version, or use an "
                                               "earlier cuda container: unknown")])
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.cuda-too-new" and "to at least 560.28.03" in f.remedy and "525.60.13" not in f.remedy
    assert "(CUDA 12.2)" in f.message
    # a host whose driver meets the minor's floor is not told to upgrade to it
    ev.hosts["gpu-1"] = dataclasses.replace(ev.hosts["gpu-1"], facts=dataclasses.replace(
        ev.hosts["gpu-1"].facts, gpu=dataclasses.replace(H200.gpu, driver="570.86.10", cuda_version="12.8")))
    [f] = classify.pod_causes(p, ev)
    assert "already meets CUDA 12.6's floor 560.28.03" in f.remedy and "upgrade" not in f.remedy
    # a minor newer than the matrix knows: the newest known one's floor, said to be a lower bound
    p, ev = bound("nvidia", events=[("Failed", "nvidia-container-cli: requirement error: unsatisfied condition: "
                                               "cuda>=13.9, please update your driver")])
    [f] = classify.pod_causes(p, ev)
    assert "a lower bound" in " ".join(f.evidence) and "CUDA 13.9 needs a newer one" in f.remedy


def test_the_unnamed_taint_of_kubernetes_135_is_matched_with_the_old_wording() -> None:
    new = classify.parse_fit_error(load("kubernetes/scheduler/taints-unnamed-dra-kind.txt")[1].split(
        "pod/nginx-with-toleration-84559fbfc4-dl7tz    ")[1].splitlines()[0])
    assert new is not None and new.reasons == {"node(s) had untolerated taint(s)": 2}
    assert new.post_filter.startswith("no new claims to deallocate, preemption: ")
    assert new.preemption == "0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    old = classify.parse_fit_error(load("old:scheduler-taint.txt")[1])
    assert old is not None and old.reasons == {"node(s) had untolerated taint {gpu: }": 1}


def test_doctor_is_never_silent_about_a_failing_gpu_pod_or_node() -> None:
    # a bound pod in ContainerCreating with no event at all
    p, ev = bound("nvidia")
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.unknown" and "pod phase: Pending, node gpu-1" in f.evidence
    assert "container main waiting: ContainerCreating" in f.evidence
    assert any(e.startswith("node gpu-1 condition Ready=True") for e in f.evidence)
    assert "kubectl -n ml describe pod train" in f.remedy and "journalctl -u kubelet" in f.remedy
    # an application that exits 1 with a log doctor does not know
    p, ev = bound("nvidia", status=terminated("Error", exit_code=1), log="Traceback (most recent call last):\n"
                  "ValueError: bad input\n")
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.unknown" and "log: ValueError: bad input" in f.evidence
    # a Running pod with a container waiting after restarts
    p["status"] = {"phase": "Running", "containerStatuses": [{"name": "main", "restartCount": 4, "state": {
        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}}}]}
    assert [f.id for f in classify.pod_causes(p, ev)] == ["pod.unknown"]
    # healthy: nothing
    p["status"] = {"phase": "Running", "containerStatuses": [{"name": "main", "state": {"running": {}}}]}
    assert classify.pod_causes(p, ev) == []
    # a GPU node the inventory gives no count for and that shows no GPU: named, not skipped
    ev = node_case("none", log=load("doctor/device-plugin/v0.17.1-incompatible-strategy.log")[1])
    ev.plans["gpu-1"] = plan("gpu-1", 0)
    ev.hosts.clear()
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.plugin-no-nvml" and f.message.startswith("no GPU schedulable (how many is not in the")


def test_a_node_short_of_its_plan_with_no_recognised_cause_is_gpu_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s.kube import state

    ev = node_case("none")
    passing = state.NodeCheck("gpu-1", True, True, 2, 2)
    monkeypatch.setattr(state, "check_node", lambda *a, **k: passing)
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.unknown" and f.subject == findings.node("gpu-1")
    assert "allocatable: no extended resource" in f.evidence and "plugin pod kube-system/" in " ".join(f.evidence)
    assert "kubectl describe node gpu-1" in f.remedy


NCCL_TEXTS = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "fabric" / "nccl"


@pytest.mark.parametrize("name", sorted(p.stem for p in NCCL_TEXTS.glob("err-*.txt")))
def test_an_nccl_failure_in_a_pods_log_is_named(name: str) -> None:
    """A training pod that exited 1 with NCCL's real words in its log (tests/fixtures/real/fabric/nccl): doctor
    names the failure with its numbers and remedy (pod.nccl), not pod.unknown."""
    log = (NCCL_TEXTS / f"{name}.txt").read_text()
    p, ev = bound("nvidia", status=terminated("Error", exit_code=1), log=log)
    got = classify.pod_causes(p, ev)
    kinds = [f.kind for f in fabric.classify_nccl(log)]
    assert [f.id for f in got] == ["pod.nccl"] * min(3, len(kinds)), [f.message for f in got]
    assert got[0].message.startswith(f"NCCL on gpu-1 failed ({kinds[0]}): ") and "verify --fabric" in got[0].remedy
    assert got[0].evidence == (f"nccl: {kinds[0]}",)
