"""Rendered kubeadm configurations and manifests, without SSH; manifests validated against Kubernetes schemas."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace

import kubernetes_validate
import pytest
import yaml

from gpuk8s.inventory.loader import loads
from gpuk8s.kube import manifests, render

INV = loads("""
cluster: {name: ml, kubernetes_version: "1.30", pod_cidr: 10.32.0.0/16}
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - {name: cp-2, address: 10.0.0.11, role: control-plane}
  - {name: cp-3, address: 10.0.0.12, role: control-plane}
  - {name: gpu-1, address: 10.0.0.21, role: worker, gpus: 8}
""")


@pytest.mark.parametrize("version", ["1.29", "1.30", "1.31"])
def test_every_rendered_manifest_is_valid_for_the_target_version(version):
    inv = replace(INV, cluster=replace(INV.cluster, kubernetes_version=version))
    docs = render.manifests(inv)
    checked = 0
    for name, text in docs.items():
        if not name.endswith(".yaml"):
            continue
        for d in yaml.safe_load_all(text):
            if d["apiVersion"].startswith(("kubeadm.k8s.io", "kubelet.config.k8s.io")):
                continue  # not API objects: checked field by field below
            kubernetes_validate.validate(d, version, strict=True)
            checked += 1
    assert checked == 3  # DaemonSet, RuntimeClass, Pod


def test_the_validator_would_catch_a_mistake():
    bad = yaml.safe_load(manifests.device_plugin(INV).applied_text())
    bad["spec"]["template"]["spec"]["tolerations"][0]["effekt"] = "NoSchedule"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_kubeadm_init_configuration():
    init, cluster, kubelet = yaml.safe_load_all(
        render.kubeadm_init_config(INV, INV.control_planes[0], "v1.30.5", "abcdef.0123456789abcdef", "k" * 64))
    assert init["apiVersion"] == "kubeadm.k8s.io/v1beta3" and init["kind"] == "InitConfiguration"
    assert init["localAPIEndpoint"]["advertiseAddress"] == "10.0.0.10"
    assert init["nodeRegistration"] == {"name": "cp-1", "criSocket": "unix:///var/run/containerd/containerd.sock"}
    assert init["bootstrapTokens"][0]["token"] == "abcdef.0123456789abcdef" and init["certificateKey"] == "k" * 64
    assert cluster["networking"] == {"podSubnet": "10.32.0.0/16", "serviceSubnet": "10.96.0.0/12"}
    assert cluster["kubernetesVersion"] == "v1.30.5" and cluster["clusterName"] == "ml"
    assert cluster["controlPlaneEndpoint"] == "10.0.0.10:6443"  # three control planes need an endpoint
    assert kubelet["cgroupDriver"] == "systemd"
    bare = render.kubeadm_init_config(INV, INV.control_planes[0], "v1.30.5", None, None)
    assert "bootstrapTokens" not in bare and "certificateKey" not in bare
    v131 = replace(INV, cluster=replace(INV.cluster, kubernetes_version="1.31"))
    assert render.api_version(v131) == "kubeadm.k8s.io/v1beta4"


def test_join_configuration_for_workers_and_control_planes():
    w = yaml.safe_load(render.join_config(INV, INV.host("gpu-1"), "10.0.0.10:6443", "t" * 6 + "." + "u" * 16,
                                          "sha256:" + "0" * 64))
    assert w["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "10.0.0.10:6443"
    assert "controlPlane" not in w and w["nodeRegistration"]["name"] == "gpu-1"
    c = yaml.safe_load(render.join_config(INV, INV.host("cp-2"), "10.0.0.10:6443", "x", "sha256:y", "key"))
    assert c["controlPlane"] == {"localAPIEndpoint": {"advertiseAddress": "10.0.0.11", "bindPort": 6443},
                                 "certificateKey": "key"}


def test_tokens_and_keys_have_kubeadms_format():
    assert re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", render.new_token())
    assert render.new_token() != render.new_token()
    assert re.fullmatch(r"[0-9a-f]{64}", render.new_certificate_key())


@pytest.mark.parametrize(("driver", "cuda"), [((580, 159, 4), "13.0"), ((535, 104, 5), "12.2"),
                                               ((470, 82, 1), "11.8"), ((450, 36, 6), "10.1"),
                                               ((418, 87, 1), "10.1")])
def test_verify_image_runs_on_the_driver(driver, cuda):
    assert f"cuda:{cuda}" in render.verify_image(INV, driver)


def test_render_shows_no_secret(run_cli, tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                   "  - {name: gpu-1, address: 10.0.0.21, role: worker, gpus: 8}\n")
    r = run_cli("render", "-i", str(inv))
    assert r.returncode == 0, r.stderr
    assert "kind: DaemonSet" in r.stdout and "kind: JoinConfiguration" in r.stdout
    assert "<minted at join time>" in r.stdout and not re.search(r"[a-z0-9]{6}\.[a-z0-9]{16}", r.stdout)
    r = run_cli("render", "-i", str(inv), "--output-dir", str(tmp_path / "out"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "kubeadm-init.yaml", "kubeadm-join-worker.yaml", "node-labels-taints.sh", "nvidia-device-plugin.yaml",
        "runtimeclass-nvidia.yaml", "verify-pod.yaml"]


def test_node_commands_quote_and_match_what_install_sets(tmp_path):
    inv = loads("""
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - name: gpu-1
    address: 10.0.0.21
    gpus: 8
    labels: {example.com/team: vision}
    taints: ["nvidia.com/gpu=present:NoSchedule", "dedicated:NoExecute"]
""")
    text = render.node_commands(inv)
    assert text.splitlines()[3:] == [
        "kubectl label node gpu-1 example.com/team=vision nvidia.com/gpu.present=true --overwrite",
        "kubectl taint node gpu-1 nvidia.com/gpu=present:NoSchedule dedicated:NoExecute --overwrite"]
    script = tmp_path / "n.sh"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
