"""gpuk8s's own device plugin on mock GPUs: NVIDIA/k8s-test-infra's nvml-mock (tests/kind/nvml_mock.py) lays out a
mock driver root on the cluster's second worker, and the plugin gpuk8s renders, pointed at that root, registers
its GPUs with a real kubelet. Then what gpuk8s says about the cluster, through --kubeconfig (no SSH):

- every mock GPU allocatable, and `gpuk8s verify --kubeconfig --no-test-pods` passing on the node;
- a GPU pod (gpuk8s's own verify pod, and one that holds a GPU) scheduled, and `gpuk8s status --kubeconfig`
  counting the holder against the node;
- `gpuk8s doctor --kubeconfig` naming a pod that asks for more GPUs than exist (pod.insufficient-gpu);
- time-slicing (gpu_sharing replicas): GPUs x replicas allocatable, verify and status saying so.

verify's test pods (nvidia-smi in a CUDA image) are left out: on a kind node no container toolkit puts
nvidia-smi and the driver's libraries into a container, so that pod cannot succeed here.

The tests run in order on one cluster, after test_kind.py, and leave the cluster as they found it (the second
worker without labels, taint or mock; the device plugin DaemonSet as gpuk8s renders it). Docker, kind, kubectl,
helm and git are needed; without them the tests are skipped with the reason (docs/kind.md).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s.kube import state
from tests.kind import nvml_mock
from tests.kind.conftest import Kind, unavailable

pytestmark = pytest.mark.kind

TAINT = "nvidia.com/gpu=present:NoSchedule"
LABELS = {"gpuk8s.io/pool": "kind-mock"}
REPLICAS = 4  # time-slicing
PAUSE = "registry.k8s.io/pause:3.10"  # a container that holds its GPU until deleted, and needs no GPU to run
HOLDER = "gpuk8s-kind-gpu-holder"
TOO_MANY = "gpuk8s-kind-too-many-gpus"


@dataclass
class Mock:
    kind: Kind
    node: str
    whole: Path  # inventory.yaml and out/ (gpuk8s render) with whole GPUs
    shared: Path  # the same node time-sliced: gpu_sharing {strategy: time-slicing, replicas: REPLICAS}
    gpus: int

    def gpuk8s(self, *args: str, inventory: Path | None = None) -> subprocess.CompletedProcess[str]:
        inv = (inventory or self.whole) / "inventory.yaml"
        return subprocess.run([sys.executable, "-m", "gpuk8s", *args, "-i", str(inv), "--kubeconfig",
                               str(self.kind.kubeconfig), "-o", "json"], capture_output=True, text=True, timeout=300)

    def node_json(self) -> dict[str, Any]:
        return state.load(self.kind.kubectl("get", "node", self.node, "-o", "json").stdout)

    def allocatable(self) -> int:
        return state.node_state(self.node_json()).allocatable_of("nvidia.com/gpu")


def wait_for(fn: Any, timeout: float, what: str, diag: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s" + (f"\n{diag()}" if diag else ""))
        time.sleep(3)


def render(kind: Kind, d: Path, node: str, gpus: int, sharing: dict[str, Any] | None) -> Path:
    """The inventory of the control plane and the mock GPU node, and what `gpuk8s render` writes for it."""
    ver = json.loads(kind.kubectl("version", "-o", "json").stdout)["serverVersion"]
    host: dict[str, Any] = {"name": node, "address": "127.0.0.3", "gpus": gpus, "labels": LABELS, "taints": [TAINT]}
    if sharing:
        host["gpu_sharing"] = sharing
    d.mkdir(parents=True)
    (d / "inventory.yaml").write_text(yaml.safe_dump({
        "cluster": {"name": "kind-mock", "kubernetes_version": f"{ver['major']}.{ver['minor'].rstrip('+')}"},
        "hosts": [{"name": kind.control_plane, "address": "127.0.0.1", "role": "control-plane"}, host]}))
    r = subprocess.run([sys.executable, "-m", "gpuk8s", "render", "-i", str(d / "inventory.yaml"), "--output-dir",
                        str(d / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return d


def label(kind: Kind, d: Path) -> None:
    """The node's labels and taint, as gpuk8s install sets them (render's node-labels-taints.sh)."""
    env = {**os.environ, "KUBECONFIG": str(kind.kubeconfig)}
    r = subprocess.run(["sh", str(d / "out" / "node-labels-taints.sh")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


def unlabel(kind: Kind, node: str, *dirs: Path) -> None:
    """Every label and taint the scripts of `dirs` set on `node`, removed."""
    keys: set[str] = set()
    taints: set[str] = set()
    for d in dirs:
        for line in (d / "out" / "node-labels-taints.sh").read_text().splitlines():
            words = shlex.split(line, comments=True)
            if words[:4] == ["kubectl", "label", "node", node]:
                keys |= {w.split("=", 1)[0] for w in words[4:] if "=" in w and not w.startswith("-")}
            elif words[:4] == ["kubectl", "taint", "node", node]:
                taints |= {w for w in words[4:] if not w.startswith("-")}
    if keys:
        kind.kubectl("label", "node", node, *(f"{k}-" for k in sorted(keys)), check=False)
    for t in sorted(taints):
        kind.kubectl("taint", "node", node, f"{t}-", check=False)


def plugin_docs(d: Path) -> list[dict[str, Any]]:
    return [x for x in yaml.safe_load_all((d / "out" / "nvidia-device-plugin.yaml").read_text()) if x]


def apply_plugin(kind: Kind, docs: list[dict[str, Any]]) -> None:
    """The device plugin's objects, the DaemonSet made anew (a patch of test_kind.py's would merge the two
    securityContexts)."""
    kind.kubectl("delete", "daemonset", "-n", "kube-system", state.DEVICE_PLUGIN, "--ignore-not-found",
                 "--wait=true")
    kind.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))


def gpu_pod(name: str, gpus: int, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "hold", "image": PAUSE, "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def pod(kind: Kind, name: str) -> dict[str, Any] | None:
    r = kind.kubectl("get", "pod", "-n", "default", name, "-o", "json", check=False)
    return state.load(r.stdout) if r.returncode == 0 else None


def scheduled(p: dict[str, Any] | None) -> str | None:
    """The node the pod is bound to, once the scheduler has bound it."""
    if not p:
        return None
    conds = {c.get("type"): c for c in p.get("status", {}).get("conditions", [])}
    node = p.get("spec", {}).get("nodeName")
    return node if node and conds.get("PodScheduled", {}).get("status") == "True" else None


def unschedulable(p: dict[str, Any] | None) -> str | None:
    """The scheduler's message on a pod it cannot place."""
    if not p:
        return None
    c = {c.get("type"): c for c in p.get("status", {}).get("conditions", [])}.get("PodScheduled", {})
    if c.get("status") == "False" and c.get("reason") == "Unschedulable":
        return str(c.get("message") or "") or None
    return None


def diagnostics(m: Mock) -> str:
    """What the plugin and the mock say, for a failure's message."""
    out = [f"node {m.node} allocatable: {state.node_state(m.node_json()).allocatable}"]
    pods = state.pod_states(state.items(m.kind.kubectl("get", "pods", "-n", "kube-system", "-o", "json").stdout))
    p = state.device_plugin_pod(pods, m.node)
    out.append(f"device plugin pod on {m.node}: {p}")
    if p is not None:
        out.append(m.kind.kubectl("logs", "-n", "kube-system", p.name, "-c", nvml_mock.PLUGIN_CONTAINER, "--tail",
                                  "40", check=False).stdout)
    out.append(m.kind.kubectl("get", "pods", "-n", nvml_mock.NAMESPACE, "-o", "wide", check=False).stdout)
    return "\n".join(out)


@pytest.fixture(scope="module")
def mock(kind: Kind, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mock]:
    reason = nvml_mock.tools_missing()
    if reason:
        unavailable(reason)
    node = kind.mock_gpu_node
    if node not in state.by_name(state.items(kind.kubectl("get", "nodes", "-o", "json").stdout)):
        unavailable(f"kind cluster {kind.name} has no node {node} (made before tests/kind/kind-config.yaml had a "
                    f"second worker): kind delete cluster --name {kind.name}, then run the tests again")
    d = tmp_path_factory.mktemp("mock")
    gpus = nvml_mock.GPUS
    whole = render(kind, d / "whole", node, gpus, None)
    shared = render(kind, d / "shared", node, gpus, {"strategy": "time-slicing", "replicas": REPLICAS})
    m = Mock(kind, node, whole, shared, gpus)
    try:
        src = nvml_mock.source()
        nvml_mock.build(src)
        nvml_mock.load(kind.name, node)
        nvml_mock.install(kind.kubeconfig, src, node, d)
        # gpuk8s's objects as install applies them: the plugin's named configs (the shared inventory's has both
        # the whole-GPU config and time-slicing-4, so that the later switch finds its config already mounted),
        # the node's labels and taint, then the plugin pointed at the mock driver root
        kind.kubectl("apply", "-f", str(shared / "out" / "nvidia-device-plugin-configs.yaml"))
        label(kind, whole)
        apply_plugin(kind, nvml_mock.point_at_mock(plugin_docs(whole)))
        yield m
    finally:
        for name in (HOLDER, TOO_MANY, f"gpuk8s-verify-{node}"):
            kind.kubectl("delete", "pod", "-n", "default", name, "--ignore-not-found", "--wait=false", check=False)
        apply_plugin(kind, plugin_docs(whole))  # as gpuk8s renders it, as test_kind.py leaves it
        nvml_mock.uninstall(kind.kubeconfig)
        unlabel(kind, node, whole, shared)


def test_every_mock_gpu_is_allocatable(mock: Mock):
    ds = state.load(mock.kind.kubectl("get", "daemonset", "-n", nvml_mock.NAMESPACE, nvml_mock.RELEASE, "-o",
                                      "json").stdout)
    [ctr] = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "nvml-mock"]
    env = {e["name"]: e.get("value") for e in ctr.get("env", [])}
    assert env.get("GPU_COUNT") == str(mock.gpus), env  # what the mock lays out on the node
    wait_for(lambda: mock.allocatable() == mock.gpus, 300,
             f"{mock.gpus} nvidia.com/gpu allocatable on {mock.node}", lambda: diagnostics(mock))
    node = mock.node_json()
    assert node["status"]["capacity"]["nvidia.com/gpu"] == str(mock.gpus)
    pods = state.pod_states(state.items(mock.kind.kubectl("get", "pods", "-n", "kube-system", "-o", "json").stdout))
    plugin = state.daemonset_state(state.load(mock.kind.kubectl("get", "ds", "-n", "kube-system",
                                                                state.DEVICE_PLUGIN, "-o", "json").stdout))
    check = state.check_node(mock.node, mock.gpus, node, pods, plugin)
    assert check.ok and check.ready and check.allocatable_gpus == mock.gpus, check


def test_gpuk8s_verify_with_a_local_kubeconfig_passes_on_the_mock_gpus(mock: Mock):
    r = mock.gpuk8s("verify", "--no-test-pods")
    assert r.returncode == 0, r.stdout + r.stderr
    nodes = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}
    n = nodes[mock.node]
    assert n["ok"] and n["ready"] and n["expected_gpus"] == n["allocatable_gpus"] == mock.gpus, n
    assert nodes[mock.kind.control_plane]["ok"]


def test_a_gpu_pod_is_scheduled_and_status_accounts_for_it(mock: Mock):
    kind = mock.kind
    # gpuk8s's own test pod (render's verify-pod.yaml) goes through the scheduler to the mock GPU node
    verify_pod = yaml.safe_load((mock.whole / "out" / "verify-pod.yaml").read_text())
    name = verify_pod["metadata"]["name"]
    kind.kubectl("delete", "pod", "-n", "default", name, "--ignore-not-found")
    kind.kubectl("apply", "-f", "-", stdin=json.dumps(verify_pod))
    try:
        assert wait_for(lambda: scheduled(pod(kind, name)), 120, f"{name} scheduled") == mock.node
    finally:
        kind.kubectl("delete", "pod", "-n", "default", name, "--ignore-not-found", "--wait=false", check=False)
    # a pod that holds one GPU until deleted (pause needs no GPU to run)
    kind.kubectl("apply", "-f", "-", stdin=json.dumps(gpu_pod(HOLDER, 1, mock.node)))
    assert wait_for(lambda: scheduled(pod(kind, HOLDER)), 120, f"{HOLDER} scheduled") == mock.node
    r = mock.gpuk8s("status", mock.node)
    assert r.returncode == 0, r.stdout + r.stderr
    [node] = [n for n in json.loads(r.stdout)["nodes"] if n["node"] == mock.node]
    assert node["gpu_node"] and node["ready"] and node["gpus"] == mock.gpus, node
    [gpu] = [x for x in node["resources"] if x["resource"] == "nvidia.com/gpu"]
    assert gpu["allocatable"] == gpu["planned"] == mock.gpus, gpu
    assert {"namespace": "default", "name": HOLDER, "count": 1} in [
        {k: p[k] for k in ("namespace", "name", "count")} for p in gpu["pods"]], gpu
    assert gpu["requested"] == sum(p["count"] for p in gpu["pods"]) >= 1
    assert gpu["free"] == mock.gpus - gpu["requested"]


def test_gpuk8s_doctor_names_a_pod_asking_for_more_gpus_than_exist(mock: Mock):
    kind = mock.kind
    want = mock.gpus + 1
    kind.kubectl("apply", "-f", "-", stdin=json.dumps(gpu_pod(TOO_MANY, want)))
    try:
        msg = wait_for(lambda: unschedulable(pod(kind, TOO_MANY)), 120, f"{TOO_MANY} reported unschedulable")
        assert "Insufficient nvidia.com/gpu" in msg, msg
        r = mock.gpuk8s("doctor")  # no target: every Pending GPU pod
        assert r.returncode == 1, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert not doc["ok"] and f"default/{TOO_MANY}" in doc["checked"]["pods"], doc["checked"]
        found = [f for f in doc["findings"] if f["subject"] == {"kind": "pod", "name": f"default/{TOO_MANY}"}]
        assert [f["id"] for f in found] == ["pod.insufficient-gpu"], doc["findings"]
        assert found[0]["status"] == "fail"
        assert f"the pod asks for {want}" in found[0]["message"], found[0]["message"]
        assert any(e.startswith(f"{mock.node}: {mock.gpus} nvidia.com/gpu allocatable") for e in found[0]["evidence"])
    finally:
        kind.kubectl("delete", "pod", "-n", "default", TOO_MANY, "--ignore-not-found", "--wait=false", check=False)


def test_time_slicing_replicas_on_the_mock_gpus(mock: Mock):
    """The node switched to gpu_sharing time-slicing (REPLICAS): the config-manager follows its label, the plugin
    offers GPUs x replicas, and verify and status say so."""
    want = mock.gpus * REPLICAS
    label(mock.kind, mock.shared)
    wait_for(lambda: mock.allocatable() == want, 300, f"{want} nvidia.com/gpu allocatable on {mock.node} "
             f"({mock.gpus} GPUs x {REPLICAS})", lambda: diagnostics(mock))
    r = mock.gpuk8s("verify", "--no-test-pods", inventory=mock.shared)
    assert r.returncode == 0, r.stdout + r.stderr
    [n] = [n for n in json.loads(r.stdout)["nodes"] if n["node"] == mock.node]
    assert n["ok"] and n["expected_gpus"] == n["allocatable_gpus"] == want, n
    r = mock.gpuk8s("status", mock.node, inventory=mock.shared)
    assert r.returncode == 0, r.stdout + r.stderr
    [node] = [x for x in json.loads(r.stdout)["nodes"] if x["node"] == mock.node]
    assert node["sharing"] == "time-slicing" and node["replicas"] == REPLICAS and node["gpus"] == mock.gpus, node
    [gpu] = [x for x in node["resources"] if x["resource"] == "nvidia.com/gpu"]
    assert gpu["allocatable"] == gpu["planned"] == want, gpu
    assert HOLDER in [p["name"] for p in gpu["pods"]], gpu  # still holding its GPU across the switch
