"""Pure renderers: kubeadm configurations and the manifests gpuk8s applies. No SSH, no side effects.

kubeadm configurations are built as data and dumped with yaml.safe_dump, so no inventory value can
change their structure. Secrets (token, certificate key) are passed in and never logged by callers.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Sequence
from typing import Any

import yaml

from gpuk8s import gpuplan, mirrors, versions
from gpuk8s.facts.model import CRI_SOCKETS
from gpuk8s.gpuplan import GPU_RESOURCE
from gpuk8s.inventory.model import Host, Inventory, Taint
from gpuk8s.kube import manifests as kube_manifests
from gpuk8s.kube.client import label_args, taint_args
from gpuk8s.versions import Release


def new_token() -> str:
    """A bootstrap token, [a-z0-9]{6}.[a-z0-9]{16}, minted here so it is known (and masked) before use."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return ".".join("".join(secrets.choice(alphabet) for _ in range(n)) for n in (6, 16))


def new_certificate_key() -> str:
    return secrets.token_hex(32)


def api_version(inv: Inventory) -> str:
    """The kubeadm configuration API of the cluster's minor, as the version matrix gives it (v1beta4 where
    kubeadm has it)."""
    return versions.kubernetes_or_default(inv.cluster.kubernetes_version).kubeadm_api


def endpoint(inv: Inventory) -> str:
    ep = inv.cluster.control_plane_endpoint or inv.control_planes[0].address
    return ep if ":" in ep and not ep.count(":") > 1 else f"{ep}:6443"


# kubeadm's default taint of a control plane, which nodeRegistration.taints replaces when it is set
CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def kubeadm_init_config(inv: Inventory, cp: Host, version: str, token: str | None,
                        certificate_key: str | None, taints: Sequence[Taint] = ()) -> str:
    """InitConfiguration + ClusterConfiguration + KubeletConfiguration for the first control plane; `taints`: it
    registers with them besides kubeadm's control-plane taint (a quarantined control plane)."""
    c = inv.cluster
    init: dict[str, Any] = {
        "apiVersion": api_version(inv), "kind": "InitConfiguration",
        "localAPIEndpoint": {"advertiseAddress": cp.address, "bindPort": 6443},
        "nodeRegistration": {"name": cp.name, "criSocket": CRI_SOCKETS[c.container_runtime]},
    }
    if taints:
        init["nodeRegistration"]["taints"] = registration_taints(cp, taints)
    if token:
        init["bootstrapTokens"] = [{"token": token, "ttl": "2h0m0s", "usages": ["signing", "authentication"],
                                    "groups": ["system:bootstrappers:kubeadm:default-node-token"]}]
    if certificate_key:
        init["certificateKey"] = certificate_key
    cluster: dict[str, Any] = {
        "apiVersion": api_version(inv), "kind": "ClusterConfiguration", "clusterName": c.name,
        "kubernetesVersion": version,
        "networking": {"podSubnet": c.pod_cidr, "serviceSubnet": c.service_cidr},
    }
    if c.control_plane_endpoint or len(inv.control_planes) > 1:
        cluster["controlPlaneEndpoint"] = endpoint(inv)
    repo = mirrors.kubeadm_repository(inv)  # the inventory's registry mirror (docs/mirrors.md)
    if repo:
        # kubeadm's images from there; its coredns from REPO/coredns:TAG (kubeadm drops coredns' own path for
        # any repository but its default, as `kubeadm config images list --image-repository` prints it)
        cluster["imageRepository"] = repo
    kubelet = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
               "cgroupDriver": "systemd"}
    return yaml.safe_dump_all([init, cluster, kubelet], sort_keys=False)


def token_config(inv: Inventory, token: str) -> str:
    """For `kubeadm token create --config`: the token travels in a file, never on a command line."""
    return yaml.safe_dump({"apiVersion": api_version(inv), "kind": "InitConfiguration",
                           "bootstrapTokens": [{"token": token, "ttl": "1h0m0s"}]}, sort_keys=False)


def upload_certs_config(inv: Inventory, certificate_key: str) -> str:
    return yaml.safe_dump({"apiVersion": api_version(inv), "kind": "InitConfiguration",
                           "certificateKey": certificate_key}, sort_keys=False)


def registration_taints(host: Host, taints: Sequence[Taint]) -> list[dict[str, str]]:
    """nodeRegistration.taints: set, it replaces kubeadm's default, so a control plane's is added back."""
    return ([dict(CONTROL_PLANE_TAINT)] if host.is_control_plane else []) + [
        {"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect} for t in taints]


def join_config(inv: Inventory, host: Host, api_endpoint: str, token: str, ca_hash: str,
                certificate_key: str | None = None, taints: Sequence[Taint] = ()) -> str:
    """`taints`: the node registers with them (a quarantined node: no pod lands on it before the gpu phase);
    kubeadm then leaves out its own default, so a control plane's is added back."""
    doc: dict[str, Any] = {
        "apiVersion": api_version(inv), "kind": "JoinConfiguration",
        "discovery": {"bootstrapToken": {"apiServerEndpoint": api_endpoint, "token": token,
                                         "caCertHashes": [ca_hash]}},
        "nodeRegistration": {"name": host.name, "criSocket": CRI_SOCKETS[inv.cluster.container_runtime]},
    }
    if taints:
        doc["nodeRegistration"]["taints"] = registration_taints(host, taints)
    if host.is_control_plane:
        doc["controlPlane"] = {"localAPIEndpoint": {"advertiseAddress": host.address, "bindPort": 6443},
                               "certificateKey": certificate_key}
    return yaml.safe_dump(doc, sort_keys=False)


def verify_image(inv: Inventory, driver: Release | None) -> str:
    """install.verify_image, else the newest GPU test image of the version matrix that the driver can run."""
    if inv.install.verify_image:
        return mirrors.image(inv, inv.install.verify_image)
    return mirrors.image(inv, versions.cuda_test_image(driver))


def test_pod(name: str, node: str, image: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app.kubernetes.io/managed-by": "gpuk8s"}},
        "spec": {
            # through the scheduler (not nodeName), so that a node without free GPUs gives its message;
            # every taint tolerated: the pod tests the GPUs of this node, not its taints
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "nvidia-smi", "image": image, "command": ["nvidia-smi", "-L"],
                            "resources": {"limits": {GPU_RESOURCE: 1}}}],
        },
    }, sort_keys=False)


def claim_template(name: str, namespace: str, device_class: str) -> str:
    """A ResourceClaimTemplate asking one device of `device_class` (the DRA driver's quickstart's shape,
    tests/fixtures/real/dra/demo-gpu-test1-v0.4.0.yaml)."""
    return yaml.safe_dump({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "gpuk8s"}},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}},
    }, sort_keys=False)


def claim_test_pod(name: str, node: str, image: str, template: str) -> str:
    """test_pod, its GPU through a claim made from `template` instead of an extended resource (a dra node)."""
    doc = yaml.safe_load(test_pod(name, node, image))
    ctr = doc["spec"]["containers"][0]
    ctr["resources"] = {"claims": [{"name": "gpu"}]}
    doc["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return yaml.safe_dump(doc, sort_keys=False)


def node_commands(inv: Inventory) -> str:
    """The kubectl commands that give every node the labels and taints of its GPU plan, as install sets them."""
    lines = ["#!/bin/sh", "# labels and taints of the inventory's nodes, as gpuk8s install sets them", "set -e"]
    for plan in gpuplan.plans(inv).values():
        if plan.labels:
            lines.append("kubectl " + shlex.join(label_args(plan.node, plan.labels)))
        if plan.taints:
            lines.append("kubectl " + shlex.join(taint_args(plan.node, [str(t) for t in plan.taints])))
    return "\n".join(lines) + "\n"


def full_version(inv: Inventory) -> str:
    v = inv.cluster.kubernetes_version
    return f"v{v}" if v.count(".") == 2 else f"v{v}.0"


def manifests(inv: Inventory) -> dict[str, str]:
    """Everything `gpuk8s render` shows: name -> YAML. Secrets appear as placeholders, never as values."""
    out = {"kubeadm-init.yaml": kubeadm_init_config(inv, inv.control_planes[0], full_version(inv), None, None)}
    for m in kube_manifests.wanted(inv, gpuplan.plans(inv)):
        out[m.name] = m.applied_text()  # what install applies, annotated with the rendered text's sha256
    out["node-labels-taints.sh"] = node_commands(inv)
    worker = next((h for h in inv.hosts if not h.is_control_plane), None)
    if worker is not None:
        out["kubeadm-join-worker.yaml"] = join_config(inv, worker, endpoint(inv), "<minted at join time>",
                                                      "sha256:<hash of the cluster CA>")
        out["verify-pod.yaml"] = test_pod(f"gpuk8s-verify-{worker.name}", worker.name, verify_image(inv, None))
    return out
