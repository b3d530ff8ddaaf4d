"""Smoke tests against a real API server (kind): what `gpuk8s render` produces, and verify's reading of the cluster.

The kind worker stands in for a GPU node that has no GPU: the manifests must be accepted, the device
plugin must get a pod there, and gpuk8s's verdict must be "0 of 1 GPU(s) schedulable" with the cause,
never success. The tests run in order on one cluster (see conftest.py for how it is found or made).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import gpuplan
from gpuk8s.inventory.loader import loads
from gpuk8s.kube import manifests, state
from gpuk8s.phases.gpu import node_changes

pytestmark = pytest.mark.kind

LABELS = {"gpuk8s.io/pool": "kind-smoke"}
TAINT = "nvidia.com/gpu=present:NoSchedule"


def wait_for(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(3)


@pytest.fixture(scope="module")
def rendered(kind, tmp_path_factory) -> tuple[Path, Any]:
    """The inventory of the kind cluster, and what `gpuk8s render` writes for it."""
    ver = json.loads(kind.kubectl("version", "-o", "json").stdout)["serverVersion"]
    minor = f"{ver['major']}.{ver['minor'].rstrip('+')}"
    text = yaml.safe_dump({
        "cluster": {"name": "kind-smoke", "kubernetes_version": minor},
        "hosts": [{"name": kind.control_plane, "address": "127.0.0.1", "role": "control-plane"},
                  {"name": kind.worker, "address": "127.0.0.2", "gpus": 1, "labels": LABELS, "taints": [TAINT],
                   # shared (docs/sharing.md): the ConfigMap and the config label reach a real API server
                   "gpu_sharing": {"strategy": "time-slicing", "replicas": 4}}],
    })
    d = tmp_path_factory.mktemp("render")
    (d / "inventory.yaml").write_text(text)
    out = d / "out"
    r = subprocess.run([sys.executable, "-m", "gpuk8s", "render", "-i", str(d / "inventory.yaml"), "--output-dir",
                        str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out, loads(text, str(d / "inventory.yaml"))


def api_objects(out: Path) -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for f in sorted(out.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d and not d["apiVersion"].startswith(("kubeadm.k8s.io", "kubelet.config.k8s.io")):
                docs.append((f.name, d))
    return docs


def plugin_pods(kind) -> list[state.PodState]:
    return state.pod_states(state.items(kind.kubectl("get", "pods", "-n", "kube-system", "-o", "json").stdout))


def test_every_rendered_object_is_accepted_by_the_api_server(kind, rendered):
    out, _ = rendered
    objs = api_objects(out)
    assert {d["kind"] for _, d in objs} >= {"DaemonSet", "RuntimeClass", "Pod", "ConfigMap", "ServiceAccount",
                                             "ClusterRole", "ClusterRoleBinding"}
    for name, d in objs:
        r = kind.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(d), check=False)
        assert r.returncode == 0, f"{name}: {r.stderr}"
    kind.kubectl("apply", "-f", str(out / "nvidia-device-plugin-configs.yaml"), "-f",
                 str(out / "nvidia-device-plugin.yaml"), "-f", str(out / "runtimeclass-nvidia.yaml"), "-f",
                 str(out / "nvidia-device-plugin-mps-control-daemon.yaml"))
    rc = json.loads(kind.kubectl("get", "runtimeclass", "nvidia", "-o", "json").stdout)
    assert rc["handler"] == "nvidia"
    ds = state.daemonset_state(state.load(kind.kubectl("get", "ds", "-n", "kube-system", state.DEVICE_PLUGIN, "-o",
                                                       "json").stdout))
    want = next(yaml.safe_load_all((out / "nvidia-device-plugin.yaml").read_text()))["metadata"]["annotations"]
    assert ds.annotations[manifests.ANNOTATION] == want[manifests.ANNOTATION]


def test_labels_and_taints_are_set_as_install_sets_them(kind, rendered):
    out, inv = rendered
    env = {**os.environ, "KUBECONFIG": str(kind.kubeconfig)}
    r = subprocess.run(["sh", str(out / "node-labels-taints.sh")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    nodes = state.by_name(state.items(kind.kubectl("get", "nodes", "-o", "json").stdout))
    worker = state.node_state(nodes[kind.worker])
    assert worker.labels["gpuk8s.io/pool"] == "kind-smoke" and worker.labels["nvidia.com/gpu.present"] == "true"
    assert ("nvidia.com/gpu", "present", "NoSchedule") in worker.taints
    # what install's gpu phase would still change on this node: nothing
    assert node_changes(gpuplan.plan_for(inv.host(kind.worker)), worker) == ({}, [])
    assert "nvidia.com/gpu.present" not in state.node_state(nodes[kind.control_plane]).labels


def test_the_sharing_configmap_and_labels_on_a_real_api_server(kind, rendered):
    """The worker's config label names a config the applied ConfigMap has, in the plugin's format."""
    out, inv = rendered
    kind.kubectl("apply", "-f", str(out / "nvidia-device-plugin-configs.yaml"))
    env = {**os.environ, "KUBECONFIG": str(kind.kubeconfig)}
    assert subprocess.run(["sh", str(out / "node-labels-taints.sh")], env=env).returncode == 0
    cm = json.loads(kind.kubectl("get", "configmap", "-n", "kube-system", manifests.PLUGIN_CONFIGS, "-o",
                                 "json").stdout)
    worker = state.node_state(state.by_name(state.items(kind.kubectl("get", "nodes", "-o", "json").stdout))[
        kind.worker])
    name = worker.labels["nvidia.com/device-plugin.config"]
    assert name == "time-slicing-4" and worker.labels["nvidia.com/gpu.replicas"] == "4"
    assert yaml.safe_load(cm["data"][name])["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}]
    assert worker.labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_the_device_plugin_gets_a_pod_on_the_gpu_node_only(kind):
    mine = wait_for(lambda: state.device_plugin_pod(plugin_pods(kind), kind.worker), 120,
                    "a device plugin pod on the worker")
    assert mine.node == kind.worker
    assert state.device_plugin_pod(plugin_pods(kind), kind.control_plane) is None
    ds = state.daemonset_state(state.load(kind.kubectl("get", "ds", "-n", "kube-system", state.DEVICE_PLUGIN, "-o",
                                                       "json").stdout))
    assert ds.desired == 1


def test_verify_reports_zero_gpus_schedulable_with_the_cause(kind):
    def running() -> state.PodState | None:
        p = state.device_plugin_pod(plugin_pods(kind), kind.worker)
        return p if p is not None and p.phase == "Running" and not p.waiting else None

    try:
        wait_for(running, 300, "the device plugin pod Running on the worker")
    except AssertionError:
        pytest.fail(f"device plugin pod: {state.device_plugin_pod(plugin_pods(kind), kind.worker)}")
    nodes = state.by_name(state.items(kind.kubectl("get", "nodes", "-o", "json").stdout))
    plugin = state.daemonset_state(state.load(kind.kubectl("get", "ds", "-n", "kube-system", state.DEVICE_PLUGIN,
                                                           "-o", "json").stdout))
    pods = plugin_pods(kind)
    gpu = state.check_node(kind.worker, 1, nodes[kind.worker], pods, plugin)
    assert gpu.ready and not gpu.ok and gpu.allocatable_gpus == 0
    assert gpu.cause.startswith("0 of 1 GPU(s) schedulable: the device plugin runs but registered no GPU"), gpu.cause
    cp = state.check_node(kind.control_plane, 0, nodes[kind.control_plane], pods, plugin)
    assert cp.ok
    summary = state.summary([cp, gpu])
    assert summary.startswith("1/2 nodes ok, 0 GPU(s) schedulable: ")


def test_the_verify_pod_is_reported_unschedulable(kind, rendered):
    out, _ = rendered
    pod = yaml.safe_load((out / "verify-pod.yaml").read_text())
    name = pod["metadata"]["name"]
    kind.kubectl("delete", "pod", name, "--ignore-not-found")
    kind.kubectl("apply", "-f", str(out / "verify-pod.yaml"))
    try:
        def verdict() -> tuple[bool, str] | None:
            pods = state.by_name(state.items(kind.kubectl("get", "pods", "-n", "default", "-o", "json").stdout))
            return state.test_pod_verdict(state.pod_state(pods[name]) if name in pods else None)

        ok, cause = wait_for(verdict, 120, "a verdict on the verify pod")
        assert not ok
        assert "cannot be scheduled" in cause and "Insufficient nvidia.com/gpu" in cause, cause
    finally:
        kind.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=false", check=False)


def test_gpuk8s_verify_with_a_local_kubeconfig(kind, rendered):
    """`gpuk8s verify --kubeconfig` asks the cluster with this machine's kubectl; no host is contacted."""
    out, _ = rendered
    wait_for(lambda: state.device_plugin_pod(plugin_pods(kind), kind.worker), 120, "a device plugin pod")
    r = subprocess.run([sys.executable, "-m", "gpuk8s", "verify", "-i", str(out.parent / "inventory.yaml"),
                        "--kubeconfig", str(kind.kubeconfig), "--no-test-pods", "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr  # the worker has no GPU
    nodes = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}
    assert nodes[kind.control_plane]["ok"] and nodes[kind.control_plane]["ready"]
    assert nodes[kind.worker]["ready"] and not nodes[kind.worker]["ok"]
    # the worker shares its GPU (time-slicing, 4 replicas): 4 slices expected
    assert nodes[kind.worker]["cause"].startswith("0 of 4 GPU(s) schedulable: "), nodes[kind.worker]["cause"]


def test_the_monitoring_manifests_are_accepted_by_the_api_server(kind, tmp_path):
    """Issue 20: every object `gpuk8s monitoring` applies (deploy, with Grafana and a storage class), applied to
    a real API server with a server-side dry run; the ServiceMonitor too where the Operator's CRD exists."""
    from gpuk8s.kube import monitoring

    ver = json.loads(kind.kubectl("version", "-o", "json").stdout)["serverVersion"]
    inv = loads(yaml.safe_dump({
        "cluster": {"name": "kind-smoke", "kubernetes_version": f"{ver['major']}.{ver['minor'].rstrip('+')}"},
        "hosts": [{"name": kind.control_plane, "address": "127.0.0.1", "role": "control-plane"},
                  {"name": kind.worker, "address": "127.0.0.2", "gpus": 1, "labels": LABELS, "taints": [TAINT]}],
        "monitoring": {"enabled": True, "namespace": "gpuk8s-kind-monitoring", "grafana": True,
                       "storage_class": "standard"}}), str(tmp_path / "inventory.yaml"))
    plans = gpuplan.plans(inv)
    ms = monitoring.wanted(inv, plans, "deploy")
    crd = kind.kubectl("get", "crd", monitoring.SERVICEMONITOR_CRD, check=False).returncode == 0
    if crd:
        ms.append(monitoring.service_monitor(inv))
    ns, rest = ms[0], ms[1:]
    assert ns.objects()[0]["kind"] == "Namespace"
    kind.kubectl("apply", "-f", "-", stdin=ns.applied_text())  # namespaced objects need it to exist
    try:
        checked = 0
        for m in rest:
            for d in m.objects():
                r = kind.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(d), check=False)
                assert r.returncode == 0, f"{m.name} {d['kind']}: {r.stderr}"
                checked += 1
        assert checked == 13 + (1 if crd else 0)  # DaemonSet, Service; 7 of Prometheus; 4 of Grafana
    finally:
        kind.kubectl("delete", "namespace", inv.monitoring.namespace, "--wait=false", check=False)
