"""The cluster-state parsers and node verdicts (gpuk8s.kube.state): examples, then properties over any JSON."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.findings import FINDINGS
from gpuk8s.kube import state as s


def node(name: str = "gpu-1", ready: str = "True", gpus: Any = "4", labels: dict | None = None,
         taints: list | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels or {"kubernetes.io/hostname": name}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {"cpu": "16", "memory": "65536Mi", **({"nvidia.com/gpu": gpus} if gpus is not None else {})},
            "conditions": [{"type": "MemoryPressure", "status": "False"},
                           {"type": "Ready", "status": ready, "message": "kubelet is posting ready status"
                            if ready == "True" else "container runtime network not ready: cni plugin not initialized"}],
        },
    }


def pod(name: str, node_name: str, phase: str = "Running", waiting: str | None = None,
        restarts: int = 0) -> s.PodState:
    cs: dict[str, Any] = {"name": "c", "restartCount": restarts,
                          "state": {"waiting": {"reason": waiting}} if waiting else {"running": {}}}
    # owned by the plugin's DaemonSet, as its pods are (the one ownership check: s.is_device_plugin_pod)
    return s.pod_state({"metadata": {"name": name, "ownerReferences": [{"kind": "DaemonSet", "name": s.DEVICE_PLUGIN}]},
                        "spec": {"nodeName": node_name},
                        "status": {"phase": phase, "containerStatuses": [cs]}})


PLUGIN = s.daemonset_state({"metadata": {"name": s.DEVICE_PLUGIN, "annotations": {"gpuk8s.io/manifest-hash": "ab"}},
                            "status": {"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberReady": 1}})


def test_items_and_node_state() -> None:
    text = json.dumps({"kind": "List", "items": [node(), node("cp-1", gpus=None, taints=[
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]), "junk"]})
    nodes = s.by_name(s.items(text))
    assert set(nodes) == {"gpu-1", "cp-1"}
    g = s.node_state(nodes["gpu-1"])
    assert (g.ready, g.allocatable_gpus, g.labels["kubernetes.io/hostname"]) == (True, 4, "gpu-1")
    cp = s.node_state(nodes["cp-1"])
    assert cp.allocatable_gpus == 0
    assert cp.taints == {("node-role.kubernetes.io/control-plane", "", "NoSchedule")}
    assert PLUGIN.annotations["gpuk8s.io/manifest-hash"] == "ab" and (PLUGIN.desired, PLUGIN.ready) == (2, 1)


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"items": 3}', "null"])
def test_unreadable_output_is_a_state_error(text: str) -> None:
    with pytest.raises(s.StateError):
        s.items(text)


def test_check_node_all_good() -> None:
    c = s.check_node("gpu-1", 4, node(), [pod("nvidia-device-plugin-daemonset-x", "gpu-1")], PLUGIN,
                     runtime_default="nvidia")
    assert c.ok and c.allocatable_gpus == 4 and c.cause == "" and c.cause_id == ""
    f = c.finding()
    assert (f.id, f.status, f.severity, str(f.subject)) == ("node.verified", "pass", "error", "node/gpu-1")
    assert f.message == "Ready, 4 of 4 GPU(s) schedulable" and f.remedy == ""


PLUGIN_POD = "nvidia-device-plugin-daemonset-x"


def test_the_device_plugin_pod_is_the_one_its_daemonset_owns() -> None:
    # issue 28 item 9: one ownership check for the diagnosis and for what doctor --fix deletes
    mine = pod(PLUGIN_POD, "gpu-1")
    assert s.device_plugin_pod([mine], "gpu-1") is mine and s.is_device_plugin_pod(mine, "gpu-1")
    for owners in ([], [{"kind": "DaemonSet", "name": "other"}], [{"kind": "ReplicaSet", "name": s.DEVICE_PLUGIN}],
                   "junk", [{"kind": "DaemonSet"}]):
        look_alike = s.pod_state({"metadata": {"name": PLUGIN_POD, "namespace": "kube-system",
                                               "ownerReferences": owners}, "spec": {"nodeName": "gpu-1"}})
        assert s.device_plugin_pod([look_alike], "gpu-1") is None, owners
    elsewhere = s.pod_state({"metadata": {"name": PLUGIN_POD, "namespace": "team-a", "ownerReferences": [
        {"kind": "DaemonSet", "name": s.DEVICE_PLUGIN}]}, "spec": {"nodeName": "gpu-1"}})
    assert s.device_plugin_pod([elsewhere], "gpu-1") is None


@pytest.mark.parametrize(("kwargs", "expected", "cause_id", "evidence"), [
    ({"node": None}, "not a node of the cluster", "node.not-joined", "kubectl get nodes lists no node gpu-1"),
    ({"node": node(ready="False")}, "NotReady: container runtime network not ready", "node.not-ready",
     "condition Ready: container runtime network not ready: cni plugin not initialized"),
    ({"node": {"metadata": {}}}, "node object is unreadable", "node.unreadable", None),
    ({"driver_problem": "NVML: Driver/library version mismatch"}, "driver is missing or failing", "gpu.driver",
     "nvidia-smi on the host: NVML: Driver/library version mismatch"),
    ({"plugin": None}, "device plugin is not deployed", "gpu.plugin-missing",
     "kubectl -n kube-system get daemonset nvidia-device-plugin-daemonset: not found"),
    ({"pods": []}, "no device plugin pod on this node: it needs the label nvidia.com/gpu.present=true",
     "gpu.plugin-not-scheduled", "node label nvidia.com/gpu.present: missing"),
    ({"pods": [], "node": node(gpus="0", labels={"nvidia.com/gpu.present": "true"},
                               taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                                       {"key": "soft", "effect": "PreferNoSchedule"}])},
     "no device plugin pod on this node", "gpu.plugin-not-scheduled", "node taints: dedicated=ml:NoSchedule"),
    ({"pods": [pod(PLUGIN_POD, "gpu-1", waiting="CrashLoopBackOff", restarts=7)]},
     "is CrashLoopBackOff (7 restart(s))", "gpu.plugin-crashing",
     f"pod kube-system/{PLUGIN_POD}: waiting (CrashLoopBackOff), 7 restart(s)"),
    ({"pods": [pod(PLUGIN_POD, "gpu-1", waiting="ImagePullBackOff")]}, "is ImagePullBackOff", "gpu.plugin-crashing",
     None),
    ({"pods": [pod(PLUGIN_POD, "gpu-1", phase="Pending")]}, "is Pending, not Running", "gpu.plugin-not-running",
     f"pod kube-system/{PLUGIN_POD}: phase Pending"),
    ({"runtime_default": ""}, "default is runc, not nvidia", "gpu.runtime-not-nvidia",
     "container runtime default on the host: runc"),
    ({"runtime_default": "runc"}, "default is runc, not nvidia", "gpu.runtime-not-nvidia", None),
    ({}, "registered no GPU: it cannot load NVML", "gpu.plugin-no-nvml", f"pod kube-system/{PLUGIN_POD}: Running"),
    ({"node": node(gpus="2")}, "2 of 4 GPU(s) schedulable: the device plugin registered fewer GPUs",
     "gpu.fewer-registered", "nvidia.com/gpu allocatable: 2, expected: 4"),
])
def test_check_node_causes(kwargs: dict[str, Any], expected: str, cause_id: str, evidence: str | None) -> None:
    args: dict[str, Any] = {"node": node(gpus="0"), "pods": [pod(PLUGIN_POD, "gpu-1")],
                            "plugin": PLUGIN, "driver_problem": "", "runtime_default": None}
    args.update(kwargs)
    c = s.check_node("gpu-1", 4, args["node"], args["pods"], args["plugin"], driver_problem=args["driver_problem"],
                     runtime_default=args["runtime_default"])
    assert not c.ok
    assert expected in c.cause
    if "schedulable" in c.cause:
        assert c.cause.startswith(f"{c.allocatable_gpus} of 4 GPU(s) schedulable: ")
    assert c.cause_id == cause_id and c.to_json()["cause_id"] == cause_id
    f = c.finding()
    assert (f.id, f.status, f.severity, f.message) == (cause_id, "fail", "error", c.cause)
    assert f.subject is not None and str(f.subject) == "node/gpu-1" and f.remedy
    assert evidence is None or any(evidence in e for e in f.evidence), f.evidence
    assert cause_id in FINDINGS and "verify" in FINDINGS[cause_id].sources


def test_node_check_keeps_its_json_keys_and_adds_the_cause_id() -> None:
    c = s.check_node("gpu-1", 4, None, [], None)
    j = c.to_json()
    assert list(j)[:7] == ["node", "ok", "ready", "expected_gpus", "allocatable_gpus", "cause", "pod"]
    assert j["cause_id"] == "node.not-joined" and j["evidence"] == ["kubectl get nodes lists no node gpu-1"]
    assert j["remedy"] == ""  # the finding fills in the id's remedy
    assert c.finding().remedy == "join it: gpuk8s join gpu-1"
    json.dumps(j)


def test_a_failed_node_check_made_without_an_id_still_has_a_registered_one() -> None:
    c = s.NodeCheck("gpu-1", False, False, 4, 0, "host not reachable over SSH")
    assert c.cause_id == "node.failed"
    f = c.finding()
    assert (f.id, f.status, f.message) == ("node.failed", "fail", "host not reachable over SSH")
    assert s.NodeCheck("gpu-1", True, True, 4, 4).cause_id == ""


def test_summary_counts() -> None:
    checks = [s.NodeCheck("a", True, True, 4, 4), s.NodeCheck("b", False, True, 4, 0, "0 of 4 GPU(s) schedulable: x")]
    assert s.summary(checks) == "1/2 nodes ok, 4 GPU(s) schedulable: b: 0 of 4 GPU(s) schedulable: x"


def test_label_and_taint_changes() -> None:
    n = s.node_state(node(labels={"a": "1", "b": "2"}, taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]))
    assert s.label_changes({"a": "1", "b": "3", "c": "4"}, n) == {"b": "3", "c": "4"}
    assert s.missing_taints([("k", "v", "NoSchedule"), ("k", "v", "NoExecute")], n) == [("k", "v", "NoExecute")]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["metadata", "name", "status", "spec", "items", "conditions", "type", "Ready", "True",
                         "allocatable", "nvidia.com/gpu", "labels", "taints", "key", "value", "effect", "phase",
                         "nodeName", "containerStatuses", "state", "waiting", "reason", "restartCount",
                         "annotations", "desiredNumberScheduled", "message"]) | st.text(max_size=8),
        children, max_size=6),
    max_leaves=40)


@settings(max_examples=400)
@given(json_values)
def test_any_json_gives_a_value_or_state_error(value: Any) -> None:
    for fn in (s.node_state, s.pod_state, s.daemonset_state):
        with contextlib.suppress(s.StateError):
            fn(value)
    try:
        objs = s.items(json.dumps(value))
    except s.StateError:
        objs = []
    for o in objs:
        s.by_name([o])
    c = s.check_node("n", 2, value, [], None)
    assert isinstance(c.cause, str) and c.ok == (c.cause == "") == (c.cause_id == "")
    f = c.finding()
    assert f.id in FINDINGS and f.ok == c.ok and str(f.subject) == "node/n"


@settings(max_examples=300)
@given(st.text(max_size=300))
def test_any_text_gives_items_or_state_error(text: str) -> None:
    with contextlib.suppress(s.StateError):
        s.items(text)


def raw_pod(phase: str, **status: Any) -> s.PodState:
    return s.pod_state({"metadata": {"name": "gpuk8s-verify-gpu-1"}, "status": {"phase": phase, **status}})


@pytest.mark.parametrize(("p", "verdict", "cause_id"), [
    (None, None, None),
    (raw_pod("Pending"), None, None),
    (raw_pod("Running"), None, None),
    (raw_pod("Succeeded"), (True, ""), ""),
    (raw_pod("Failed", reason="OutOfnvidia.com/gpu", message="Pod was rejected: Node didn't have enough resource: "
             "nvidia.com/gpu, requested: 1, used: 0, capacity: 0"),
     (False, "the kubelet rejected the test pod gpuk8s-verify-gpu-1 (OutOfnvidia.com/gpu): Pod was rejected: Node "
             "didn't have enough resource: nvidia.com/gpu, requested: 1, used: 0, capacity: 0"),
     "gpu.test-pod-rejected"),
    (raw_pod("Failed"), (False, "the test pod gpuk8s-verify-gpu-1 failed: see kubectl logs gpuk8s-verify-gpu-1"),
     "gpu.test-pod-failed"),
    (raw_pod("Failed", reason="Error"),
     (False, "the test pod gpuk8s-verify-gpu-1 failed (Error): see kubectl logs gpuk8s-verify-gpu-1"),
     "gpu.test-pod-failed"),
    (raw_pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/3 nodes are available: 1 Insufficient nvidia.com/gpu."}]),
     (False, "the test pod gpuk8s-verify-gpu-1 cannot be scheduled: 0/3 nodes are available: 1 Insufficient "
             "nvidia.com/gpu."), "gpu.test-pod-unschedulable"),
])
def test_test_pod_verdict(p: s.PodState | None, verdict: tuple[bool, str] | None, cause_id: str | None) -> None:
    v = s.test_pod_verdict(p)
    assert v == verdict  # still unpacks and compares as (ok, cause)
    if v is not None:
        ok, cause = v
        assert (v.ok, v.cause, v.cause_id) == (ok, cause, cause_id)
        assert cause_id == "" or cause_id in FINDINGS
