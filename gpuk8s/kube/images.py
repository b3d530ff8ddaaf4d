"""Every image a cluster of this inventory runs, at the chosen versions, as gpuk8s names it (`gpuk8s images`, and
the registries preflight checks each host reaches): kubeadm's, the CNI's, those of the manifests gpuk8s renders
(gpuk8s/kube/manifests.py, gpuk8s/kube/monitoring.py) and the GPU test's. Above the manifests, so that it can
render them; gpuk8s/mirrors.py keeps the rewriting of one reference. Computed once per run by its callers."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuk8s import gpuplan, mirrors, versions
from gpuk8s.inventory.model import Inventory, RegistrySettings
from gpuk8s.kube import manifests
from gpuk8s.kube import monitoring as mon


@dataclass(frozen=True)
class NeededImage:
    image: str  # as gpuk8s writes it (the mirror's name where one is configured)
    upstream: str  # where the image is published
    used_by: str  # what runs it


def kubeadm_images(inv: Inventory) -> list[NeededImage]:
    """kubeadm's control-plane images that gpuk8s can name: kube-apiserver, -controller-manager, -scheduler,
    -proxy at the version kubeadm init will run (pin the patch in cluster.kubernetes_version to be exact).
    pause, etcd and coredns are kubeadm's choice per release (`kubeadm config images list`), listed by that
    command with the same imageRepository."""
    v = inv.cluster.kubernetes_version
    exact = v.count(".") == 2
    # kubeadm init runs at the version of the kubeadm installed (phases/init.py): the patch written in the
    # inventory, else the newest one the repository has (the version matrix's latest_patch, as best known)
    version = "v" + (v if exact else versions.kubernetes_or_default(v).latest_patch).lstrip("v")
    used_by = "kubeadm" if exact else f"kubeadm (if {version} is the newest patch the repository installs)"
    out = []
    for comp in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        up = f"{mirrors.KUBEADM_REGISTRY}/{comp}:{version}"
        out.append(NeededImage(mirrors.image(inv, up), up, used_by))
    return out


def _upstream_inventory(inv: Inventory) -> Inventory:
    return replace(inv, registry=RegistrySettings())


def manifest_images(inv: Inventory) -> list[tuple[str, str]]:
    """(upstream image, used by) of the manifests gpuk8s renders for this inventory (as applied, before any
    mirror): the GPU manifests where a node has GPUs, HAMi where a node asks for it, monitoring if enabled."""
    up = _upstream_inventory(inv)
    plans = gpuplan.plans(up)
    out: list[tuple[str, str]] = []
    ms = list(manifests.wanted(up, plans))
    if inv.monitoring.enabled:
        ms += mon.wanted(up, plans, mon.resolve_mode(up, None))
    for m in ms:
        for ref in mirrors.images_in(m.text):
            out.append((ref, m.name))
    return out


def needed_images(inv: Inventory) -> list[NeededImage]:
    """Every image a cluster of this inventory runs, at the chosen versions, as gpuk8s names it (`gpuk8s
    images`): kubeadm's (those gpuk8s can name), the CNI's, the GPU manifests', monitoring's, the GPU test's."""
    out = kubeadm_images(inv)
    cni = inv.cluster.cni
    for up in versions.cni_images(getattr(inv.install, f"{cni}_manifest")):
        out.append(NeededImage(mirrors.image(inv, up), up, f"{cni} (CNI manifest)"))
    for up, used_by in manifest_images(inv):
        out.append(NeededImage(mirrors.image(inv, up), up, used_by))
    tests = [inv.install.verify_image] if inv.install.verify_image else list(versions.matrix().cuda_test_images)
    for up in tests:
        out.append(NeededImage(mirrors.image(inv, up), up, "verify (GPU test pod)"))
    if manifests.fabric_wanted(inv):
        up = versions.fabric().test_image
        out.append(NeededImage(mirrors.image(inv, up), up, "verify --fabric (nccl-tests, perftest)"))
    seen: set[str] = set()
    unique = []
    for n in out:
        if n.image not in seen:
            seen.add(n.image)
            unique.append(n)
    return unique
