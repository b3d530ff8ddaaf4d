"""The lab's simulated Kubernetes: kubeadm init/join over the lab network, kubectl, GPU capacity rules."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.lab.fakes.fake import CNI_MANIFESTS  # the stand-in the lab serves for Calico's manifest

FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: gpu-1
    gpus: 2
  - name: gpu-2
    gpus: 4
"""


@pytest.fixture
def prepared(lab_up, run_cli):
    lab = lab_up(FLEET)
    r = run_cli("install", "-i", str(lab.inventory), "--prepare-only")
    assert r.returncode == 0, r.stdout + r.stderr
    return lab


def join_parts(text: str) -> tuple[str, str, str]:
    m = re.search(r"kubeadm join (\S+) --token (\S+) \\\s+--discovery-token-ca-cert-hash (\S+)", text)
    assert m, text
    return m.group(1), m.group(2), m.group(3)


def nodes(lab) -> dict[str, dict]:
    r = lab.host("cp-1").exec("kubectl get nodes -o json")
    return {n["metadata"]["name"]: n for n in json.loads(r.stdout)["items"]}


DEVICE_PLUGIN = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvidia-device-plugin-daemonset, namespace: kube-system}
spec:
  selector: {matchLabels: {name: nvidia-device-plugin-ds}}
  template:
    metadata: {labels: {name: nvidia-device-plugin-ds}}
    spec:
      containers: [{name: nvidia-device-plugin-ctr, image: "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"}]
"""


def test_kubeadm_init_join_and_gpu_capacity(prepared):
    lab = prepared
    cp, w1, w2 = lab.host("cp-1"), lab.host("gpu-1"), lab.host("gpu-2")
    init = cp.exec("kubeadm init")
    endpoint, token, ca = join_parts(init.stdout)
    assert endpoint == f"{cp.address}:6443"
    assert cp.read("/etc/kubernetes/admin.conf") is not None

    # a wrong token fails as kubeadm fails, over the lab network, and the node is not added
    wrong = "abcdef.0123456789abcdef"
    r = w1.exec(f"kubeadm join {endpoint} --token {wrong} --discovery-token-ca-cert-hash {ca}", check=False)
    assert r.returncode == 1
    assert 'could not find a JWS signature in the cluster-info ConfigMap for token ID "abcdef"' in r.stderr
    assert w1.read("/etc/kubernetes/kubelet.conf") is None
    r = w1.exec(f"kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash sha256:{'0' * 64}",
                check=False)
    assert r.returncode == 1 and "none of the public keys" in r.stderr

    # the right token from a JoinConfiguration file; a fresh one from `token create`
    w1.write("/root/join.yaml", "apiVersion: kubeadm.k8s.io/v1beta3\nkind: JoinConfiguration\ndiscovery:\n"
             f"  bootstrapToken:\n    apiServerEndpoint: {endpoint}\n    token: {token}\n"
             f"    caCertHashes: [{ca}]\n", 0o600)
    assert w1.exec("kubeadm join --config /root/join.yaml").returncode == 0
    fresh = cp.exec("kubeadm token create --print-join-command").stdout
    _, token2, _ = join_parts(fresh.replace(" --discovery", " \\\n --discovery"))
    assert token2 != token
    assert w2.exec(f"kubeadm join {endpoint} --token {token2} --discovery-token-ca-cert-hash {ca}").returncode == 0
    r = w2.exec(f"kubeadm join {endpoint} --token {token2} --discovery-token-ca-cert-hash {ca}", check=False)
    assert r.returncode == 1 and "kubelet.conf already exists" in r.stderr

    n = nodes(lab)
    assert set(n) == {"cp-1", "gpu-1", "gpu-2"}
    assert all(x["status"]["conditions"][0]["status"] == "False" for x in n.values())  # no CNI yet
    assert "nvidia.com/gpu" not in n["gpu-1"]["status"]["allocatable"]

    for manifest in (CNI_MANIFESTS["calico"], DEVICE_PLUGIN):
        cp.write("/root/m.yaml", manifest)
        assert cp.exec("kubectl apply -f /root/m.yaml").returncode == 0
    n = nodes(lab)
    assert all(x["status"]["conditions"][0]["status"] == "True" for x in n.values())
    assert n["gpu-1"]["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert n["gpu-2"]["status"]["allocatable"]["nvidia.com/gpu"] == "4"

    # GPUs show only where the node's runtime really defaults to nvidia
    cfg = w2.read("/etc/containerd/config.toml").replace('default_runtime_name = "nvidia"',
                                                          'default_runtime_name = "runc"')
    w2.write("/etc/containerd/config.toml", cfg)
    assert nodes(lab)["gpu-2"]["status"]["allocatable"]["nvidia.com/gpu"] == "0"

    ds = json.loads(cp.exec("kubectl get ds -n kube-system nvidia-device-plugin-daemonset -o json").stdout)
    assert ds["status"]["numberReady"] == 3
    assert cp.exec("kubectl label node gpu-1 nvidia.com/gpu.present=true").returncode == 0
    assert nodes(lab)["gpu-1"]["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"


@pytest.mark.faults
def test_join_fails_when_the_api_server_port_is_unreachable(prepared):
    lab = prepared
    cp, w1 = lab.host("cp-1"), lab.host("gpu-1")
    endpoint, token, ca = join_parts(cp.exec("kubeadm init").stdout)
    # this lab's API server only: the labs of make test's other workers share the PID namespace (a bare pattern
    # stopped theirs too, and their next kubectl was refused)
    pattern = shlex.quote(f"{lab.root}/fakes/[f]ake.py kube-apiserver {cp.address}$")
    # gone, not only signalled: a server still shutting down holds its socket and the join times out instead
    cp.exec(f"pkill -f {pattern}; for i in $(seq 100); do pgrep -f {pattern} >/dev/null || exit 0; sleep 0.1; done;"
            " exit 1")
    r = w1.exec(f"kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash {ca}", check=False)
    assert r.returncode == 1 and f"dial tcp {endpoint}: connect: connection refused" in r.stderr
    r = cp.exec("kubectl get nodes", check=False)
    assert r.returncode == 1 and "was refused" in r.stderr


def test_kubeadm_init_runs_its_preflight(lab_up):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n")
    cp = lab.host("cp-1")
    cp.exec("apt-get update >/dev/null; true")
    # kubeadm is not installed on a fresh host: the lab has no kubeadm until install put it there
    assert cp.exec("command -v kubeadm", check=False).returncode != 0
    cp.exec("echo 'deb [signed-by=/k] https://pkgs.k8s.io/core:/stable:/v1.30/deb/ /' "
            "> /etc/apt/sources.list.d/k.list && curl -o /tmp/k https://pkgs.k8s.io/x && gpg --dearmor < /tmp/k > /k "
            "&& apt-get update >/dev/null && apt-get install -y kubeadm >/dev/null")
    r = cp.exec("kubeadm init", check=False)
    assert r.returncode == 1
    assert "[ERROR Swap]" in r.stderr and "[ERROR FileContent--proc-sys-net-ipv4-ip_forward]" in r.stderr
    assert cp.read("/etc/kubernetes/admin.conf") is None
