"""The inventory as a run from a bundle sees it (pure): every source install reads is the serving host's copy.

`gpuk8s install --bundle` serves the unpacked bundle from one host of the cluster (gpuk8s/data/bundle_serve.py) and
runs with this inventory instead of the user's: install.ROLE_repo at http://HOST:PORT/repos/ROLE (plain http,
with the key the bundle records pinned: apt verifies the repository's own signature as it would from the
internet), the registry mirror at HOST:PORT (every image gpuk8s names, kubeadm's imageRepository, containerd's
hosts.toml for each upstream registry; Docker's daemon.json insecure-registries), cri-dockerd's release
archive at http://HOST:PORT/files/cri-dockerd (its sha256 pin unchanged), the CNI manifest at
http://HOST:PORT/manifests/CNI.yaml with the sha256 the bundle records, and the exact Kubernetes patch the bundle
holds. Nothing else of the inventory changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuk8s import mirrors
from gpuk8s.bundle.manifest import Manifest
from gpuk8s.bundle.verify import Verified
from gpuk8s.bundle.writer import digest
from gpuk8s.inventory.model import Inventory, RegistrySettings

DEFAULT_PORT = 5480
CRI_DOCKERD = "files/cri-dockerd"  # cri-dockerd's release archives in a bundle (Docker hosts)

# gpuk8s's own package source files (playbooks/kubernetes-prerequisites.yaml, nvidia-container-toolkit.yaml,
# containerd.yaml with _shared.yaml's docker-source, nvidia-driver.yaml): a run from a bundle points them at the
# serving host and puts them back when it ends (tests/unit/test_mirrors.py checks the list against the
# playbooks)
SOURCE_FILES = (
    "/etc/apt/sources.list.d/kubernetes.list", "/etc/apt/sources.list.d/nvidia-container-toolkit.list",
    "/etc/apt/sources.list.d/gpuk8s-docker.list", "/etc/apt/sources.list.d/gpuk8s-driver.list",
    "/etc/yum.repos.d/kubernetes.repo", "/etc/yum.repos.d/nvidia-container-toolkit.repo",
    "/etc/yum.repos.d/gpuk8s-docker.repo", "/etc/yum.repos.d/gpuk8s-cuda-rhel8.repo",
)


@dataclass(frozen=True)
class BundleFile:
    """A bundle a run serves: the file, its sha256 and size (what the serving host's copy must be), its manifest
    (verified: every member as it says), and where it is served (None: the first control plane)."""

    path: Path
    sha256: str
    size: int
    manifest: Manifest
    host: str | None = None
    port: int = DEFAULT_PORT
    keep: bool = False  # --keep-serving: the server and the hosts' sources outlive the run


def bundle_file(path: Path, v: Verified, host: str | None = None, port: int = DEFAULT_PORT,
                keep: bool = False) -> BundleFile:
    """The file `v` verified, with its own sha256 (a second read: the copy on the serving host is checked
    against it)."""
    whole = digest(path)
    return BundleFile(path, whole.sha256, whole.size, v.manifest, host, port, keep)


def endpoint(address: str, port: int) -> str:
    """host:port, an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def served(inv: Inventory, m: Manifest, address: str, port: int = DEFAULT_PORT) -> Inventory:
    base = f"http://{endpoint(address, port)}"
    install = inv.install
    changes: dict[str, Any] = {}
    for r in m.repos:
        changes[f"{r.role}_repo"] = f"{base}/repos/{r.role}"
        changes[f"{r.role}_repo_insecure_http"] = True
        changes[f"{r.role}_repo_key_fingerprint"] = r.fingerprint
    if any(path.startswith(f"{CRI_DOCKERD}/") for path in m.files):
        changes["cri_dockerd_url"] = f"{base}/{CRI_DOCKERD}"
    cni = inv.cluster.cni
    entry = m.files.get(f"manifests/{cni}.yaml")
    if entry is not None:
        changes[f"{cni}_manifest"] = f"{base}/manifests/{cni}.yaml"
        changes[f"{cni}_manifest_sha256"] = entry.sha256
    registry = RegistrySettings(mirror=endpoint(address, port), insecure_http=True)
    cluster = dataclasses.replace(inv.cluster, kubernetes_version=m.kubernetes)
    return dataclasses.replace(inv, install=dataclasses.replace(install, **changes), registry=registry,
                               cluster=cluster)


def source_files(served_inv: Inventory) -> list[str]:
    """What a run from a bundle points at the serving host on each host, and puts back when it ends: the package
    source files, and containerd's hosts.toml of every registry the served inventory mirrors (the serving host's
    own among them)."""
    return [*SOURCE_FILES, *sorted(mirrors.hosts_files(served_inv))]
