"""The dnf repositories an RPM-family target (Alibaba Cloud Linux 3, the RHEL 8 family) needs, and copying what it
needs of each into a bundle as its publisher signed it: the signing key (checked against the inventory's pin),
repodata/repomd.xml (verified by gpgv against that key where the repository signs it: repomd.xml.asc), every
metadata file repomd.xml lists (each against its sha256 there), and the .rpm files resolution chose, each against
the sha256 primary.xml names. dnf on each host checks every package's own signature with the same key (the
playbooks' .repo files: gpgcheck=1), so serving the copy over plain http adds no trust.

The repositories and paths are the playbooks' (kubernetes-prerequisites.yaml, nvidia-container-toolkit.yaml,
containerd.yaml): under `repos/ROLE/` the bundle holds what is under the inventory's URL for that role.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuk8s.bundle import fetch, rpmrepo
from gpuk8s.bundle.aptsource import MAX_KEY, TOOLKIT_PKGS, RepoCopy, SourceError
from gpuk8s.driver import rules
from gpuk8s.inventory.model import Inventory

MAX_REPOMD = 8 << 20
_KUBERNETES_PKGS = ("kubelet", "kubeadm", "kubectl")


@dataclass(frozen=True)
class RpmRepo:
    """One dnf repository as a playbook writes its .repo file: baseurl URL/DIST, gpgkey URL/KEY."""

    role: str
    base: str
    dist: str  # "v1.NN/rpm", "stable/rpm/x86_64", "rhel/8/x86_64/stable"
    key: str
    allow_http: bool
    fingerprint: str | None
    # (name, version or "" for the newest or "580.*" for a driver branch's newest, release or "" for any)
    wanted: tuple[tuple[str, str, str], ...]
    suite: str = ""  # (none: one index per URL; kept for the bundle's cache key)

    @property
    def url(self) -> str:
        return f"{self.base.rstrip('/')}/{self.dist}"

    def under(self, rel: str) -> str:
        """A path under url as a path under base (what the bundle holds below repos/ROLE/)."""
        return f"{self.dist}/{rel}"


def repos_for(inv: Inventory, arch: str, runtime: str, gpu: bool, branches: tuple[str, ...] = ()) -> list[RpmRepo]:
    """The repositories install reads on an RPM-family host of `arch`, with what it installs from each (the
    playbooks' dnf install lines: NAME-VERSION or NAME-VERSION-RELEASE); with `branches` (the driver branches
    of its managed-driver hosts) NVIDIA's RHEL 8 repository (install.driver_repo), each branch's open driver and
    fabric manager (playbooks/nvidia-driver.yaml: the nvidia-driver:BRANCH-open stream's nvidia-open)."""
    i, c = inv.install, inv.cluster
    minor = ".".join(c.kubernetes_version.split(".")[:2])
    patch = c.kubernetes_version if c.kubernetes_version.count(".") == 2 else ""
    out = [RpmRepo("kubernetes", i.kubernetes_repo, f"v{minor}/rpm", f"v{minor}/rpm/repodata/repomd.xml.key",
                   i.kubernetes_repo_insecure_http, i.kubernetes_repo_key_fingerprint,
                   tuple((p, patch, "") for p in _KUBERNETES_PKGS))]
    if gpu:
        version, _, release = i.toolkit_version.partition("-")
        out.append(RpmRepo("toolkit", i.toolkit_repo, f"stable/rpm/{arch}", "gpgkey", i.toolkit_repo_insecure_http,
                           i.toolkit_repo_key_fingerprint, tuple((p, version, release) for p in TOOLKIT_PKGS)))
    if runtime == "containerd":
        out.append(RpmRepo("containerd", i.containerd_repo, f"rhel/8/{arch}/stable", "rhel/gpg",
                           i.containerd_repo_insecure_http, i.containerd_repo_key_fingerprint,
                           (("containerd.io", i.containerd_version.split("-")[0], ""),)))
    if gpu and branches:
        d = rules.cuda_arch_dir(arch)
        wanted = tuple(w for b in branches for w in (("nvidia-open", f"{b}.*", ""),
                                                    (rules.rhel_fabric_manager(b), f"{b}.*", "")))
        out.append(RpmRepo("driver", i.driver_repo, d, f"{d}/{rules.CUDA_KEY}", i.driver_repo_insecure_http,
                           i.driver_repo_key_fingerprint, wanted))
    return out


_DRIVER_VERSION = re.compile(r"^[0-9]{3}\.[0-9]")


def of_branches(packages: list[rpmrepo.RpmPackage], branches: tuple[str, ...]) -> list[rpmrepo.RpmPackage]:
    """What an enabled nvidia-driver:BRANCH-open module stream lets dnf see of NVIDIA's repository: of the packages
    versioned as drivers are (VERSION 580.x: the streams' packages, which share the driver's version), those of
    these branches; every other package as it is (egl-wayland and the like, outside any stream)."""
    prefixes = tuple(f"{b}." for b in branches)
    streamed = {p.name for p in packages if _DRIVER_VERSION.match(p.version)}
    return [p for p in packages if p.name not in streamed or p.version.startswith(prefixes)]


def _decompress(name: str, data: bytes) -> bytes:
    """primary.xml as createrepo_c compresses it (gz, xz, bz2 or zst), within rpmrepo.MAX_PRIMARY."""
    cap = rpmrepo.MAX_PRIMARY
    if name.endswith(".gz"):
        out = gzip.GzipFile(fileobj=io.BytesIO(data)).read(cap + 1)
    elif name.endswith(".xz"):
        out = lzma.LZMADecompressor().decompress(data, cap + 1)
    elif name.endswith(".bz2"):
        out = bz2.BZ2Decompressor().decompress(data, cap + 1)
    elif name.endswith(".zst"):
        p = subprocess.run(["zstd", "-dcq"], input=data, capture_output=True, timeout=300)
        if p.returncode != 0:
            raise SourceError(f"{name}: zstd could not decompress it", "check the repository")
        out = p.stdout[:cap + 1]
    else:
        out = data
    if len(out) > cap:
        raise SourceError(f"{name} decompresses past {cap} bytes", "a repository index that large is refused")
    return out


class RpmCopy(RepoCopy):
    """One dnf repository copied into `staging/repos/ROLE/` (RepoCopy's paths, key check and gpgv)."""

    def __init__(self, repo: RpmRepo, staging: Path) -> None:
        super().__init__(repo, staging)  # type: ignore[arg-type]  # the same fields RepoCopy reads
        self.rpm = repo
        self.packages: list[rpmrepo.RpmPackage] = []

    def signed(self) -> None:
        """The key (checked against the pin), repomd.xml (verified where signed), every metadata file it lists."""
        r = self.rpm
        key = self._add(r.key, fetch.get(f"{r.base.rstrip('/')}/{r.key}", MAX_KEY, r.allow_http))
        keyring = self._keyring(key)
        md = fetch.get(f"{r.url}/repodata/repomd.xml", MAX_REPOMD, r.allow_http)
        self._add(f"{r.dist}/repodata/repomd.xml", md)
        if not fetch.missing(f"{r.url}/repodata/repomd.xml.asc", r.allow_http):
            sig = self._add(f"{r.dist}/repodata/repomd.xml.asc",
                            fetch.get(f"{r.url}/repodata/repomd.xml.asc", MAX_KEY, r.allow_http))
            self._gpgv(keyring, [sig, self._path(f"{r.dist}/repodata/repomd.xml")], "repomd.xml")
        listed = rpmrepo.repomd(md)
        if "primary" not in listed:
            raise SourceError(f"{r.url}: its repomd.xml lists no primary metadata (with a sha256)",
                              "check the repository URL")
        for kind, (href, sha) in sorted(listed.items()):
            data = fetch.get(f"{r.url}/{href}", rpmrepo.MAX_PRIMARY, r.allow_http)
            if hashlib.sha256(data).hexdigest() != sha:
                raise SourceError(f"{r.url}/{href}: its sha256 is not what repomd.xml says",
                                  "the repository changed under its metadata: run bundle create again")
            self._add(f"{r.dist}/{href}", data)
            if kind == "primary":
                self.packages = rpmrepo.parse_primary(_decompress(href, data))

    def rpm_package(self, p: rpmrepo.RpmPackage) -> str:
        """The package into the copy (once); its bundle path."""
        return self.fetch_file(p.href, p.size, p.sha256, f"{p.name}-{p.evr}")


def wanted_packages(index: rpmrepo.RpmIndex, repo: RpmRepo) -> list[rpmrepo.RpmPackage]:
    """What `dnf install NAME-VERSION[-RELEASE]` picks: the newest package of that name and version (a branch,
    "580.*": the newest of the branch)."""
    out = []
    for name, version, release in repo.wanted:
        hits = [p for p in index.by_name.get(name, []) if (not version or p.version == version or (
            version.endswith(".*") and p.version.startswith(version[:-1]))) and (not release or p.release == release)]
        if not hits:
            want = "-".join(x for x in (name, version, release) if x)
            raise SourceError(f"{repo.url}: no {want} in its primary.xml",
                              f"check the version the inventory pins (install.{repo.role}_repo and its version)")
        out.append(hits[0])  # newest first
    return out
