"""`gpuk8s bundle create`: everything an inventory's hosts need, in one file, built on a connected machine.

For each target (a distinct OS release, architecture and container runtime among the hosts): the apt repositories
install reads (gpuk8s/bundle/aptsource.py) copied with their signatures, only the packages the target needs
(resolved against the target's own indexes, gpuk8s/bundle/debrepo.py); once for all targets: every image of
`gpuk8s images` in one OCI layout (gpuk8s/bundle/images.py), the CNI manifest checked against its pin, the SBOM;
then the manifest and the file (gpuk8s/bundle/writer.py). What the target's packages need from the distribution's
own archive (libc6, iptables, conntrack: what every host of that OS has or its OS mirror serves) is named, not
carried.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuk8s import __version__, mirrors, versions
from gpuk8s.bundle import debrepo, fetch, images, rpmrepo, rpmsource, sbom, wheel, writer
from gpuk8s.bundle.aptsource import (
    UBUNTU_KEYRING,
    AptRepo,
    RepoCopy,
    SourceError,
    deb_arch,
    repos_for,
    wanted_rels,
)
from gpuk8s.bundle.coverage import declared_debs, driver_debs, managed_branch, os_name, rpm_family
from gpuk8s.bundle.manifest import FileEntry, Manifest, RepoKey, Target
from gpuk8s.bundle.site import CRI_DOCKERD
from gpuk8s.facts.model import HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Inventory

SBOM = "sbom.spdx.json"
MAX_MANIFEST_FILE = 16 << 20  # a CNI manifest (calico's is ~0.3 MB)
MAX_ARCHIVE = 512 << 20  # a release archive (cri-dockerd's is ~20 MB)
_REF = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,200}(:[A-Za-z0-9._-]{1,128})?(@sha256:[0-9a-f]{64})?$")
_TARGET = re.compile(r"^(?P<os>[a-z][a-z0-9]{0,31}-[0-9][0-9.]{0,15})/(?P<arch>x86_64|aarch64)"
                     r"(?:/(?P<kernel>[0-9][A-Za-z0-9._+~-]{0,63}))?$")


@dataclass(frozen=True)
class TargetSpec:
    """A kind of host to build for: its OS release, architecture and runtime, whether any such host has GPUs, the
    driver branches its managed-driver hosts ask for and the kernels they run (where known)."""

    os: str
    arch: str
    runtime: str
    gpu: bool
    branches: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    debs: tuple[str, ...] = ()  # Ubuntu: the driver packages its managed hosts' driver steps install


@dataclass
class Created:
    manifest: Manifest
    path: Path
    bytes: int
    seconds: float
    os_packages: dict[str, list[str]] = field(default_factory=dict)  # target -> what its OS archive must serve
    images: int = 0
    signature: Path | None = None  # FILE.asc, where bundle create signed it
    wheels: int = 0  # gpuk8s's wheel and its dependencies' (wheel/)
    no_wheels: list[str] = field(default_factory=list)  # what could not be carried as a wheel, with why


def branches_of(inv: Inventory, facts: Mapping[str, HostFacts | None] | None = None) -> tuple[str, ...]:
    """The driver branches the inventory's managed-driver GPU hosts ask for, but those of hosts read as Ubuntu (an
    RPM-family target declared on the command line, whose hosts bundle create cannot tell apart, gets them)."""
    facts = facts or {}
    return tuple(sorted({managed_branch(h) for h in inv.hosts if managed_branch(h) and not (
        (f := facts.get(h.name)) is not None and not rpm_family(os_name(f)))}))


def parse_target(text: str, runtime: str, gpu: bool = True, branches: tuple[str, ...] = (),
                 inv: Inventory | None = None, facts: Mapping[str, HostFacts | None] | None = None) -> TargetSpec:
    """A target declared on the command line for hosts bundle create cannot read: OS-RELEASE/ARCH[/KERNEL]. An
    RPM-family target takes the driver branches (DKMS builds for any kernel; KERNEL names its kernel-devel); an
    Ubuntu one the driver packages of the hosts not read for each KERNEL declared (coverage.declared_debs)."""
    m = _TARGET.match(text.strip())
    if not m:
        raise SourceError(f"--target {text[:80]!r} is not OS-RELEASE/ARCH[/KERNEL]",
                          "write it as ubuntu-22.04/x86_64 (ID-VERSION_ID of /etc/os-release, then uname -m), with "
                          "/KERNEL (uname -r) for the driver's modules of hosts whose driver gpuk8s manages")
    os_, arch, kernel = m.group("os"), m.group("arch"), m.group("kernel")
    kernels = (kernel,) if kernel else ()
    if rpm_family(os_):
        return TargetSpec(os_, arch, runtime, gpu, branches, kernels if branches else ())
    debs = declared_debs(inv, facts or {}, kernels) if inv is not None and kernels and gpu else ()
    got = tuple(b for b in branches if any(d.startswith(f"nvidia-headless-no-dkms-{b}-") for d in debs))
    return TargetSpec(os_, arch, runtime, gpu, got, kernels if debs else (), debs)


def targets_from(inv: Inventory, facts: Mapping[str, HostFacts | None]) -> list[TargetSpec]:
    """The distinct targets among the inventory's hosts whose facts were read."""
    found = []
    for h in inv.hosts:
        f = facts.get(h.name)
        if f is not None:
            b = managed_branch(h)
            found.append(TargetSpec(os_name(f), f.arch, inv.cluster.container_runtime, is_gpu_node(h),
                                    (b,) if b else (), (f.kernel,) if b else (), driver_debs(h, f)))
    return merge(found)


def carried_branches(t: TargetSpec) -> tuple[str, ...]:
    """The driver branches a target's part of the bundle holds: the RPM family's, resolved branch by branch;
    Ubuntu's, those whose packages its hosts' driver steps install (not branches a --target merely named)."""
    if not t.gpu:
        return ()
    if rpm_family(t.os):
        return t.branches
    return tuple(b for b in t.branches if any(d.startswith(f"nvidia-headless-no-dkms-{b}-") for d in t.debs))


def merge(targets: Iterable[TargetSpec]) -> list[TargetSpec]:
    """One target per OS release, architecture and runtime: GPUs where any has them, every branch and kernel."""
    out: dict[tuple[str, str, str], TargetSpec] = {}
    for t in targets:
        k = (t.os, t.arch, t.runtime)
        o = out.get(k)
        out[k] = t if o is None else TargetSpec(*k, o.gpu or t.gpu, tuple(sorted({*o.branches, *t.branches})),
                                                tuple(sorted({*o.kernels, *t.kernels})),
                                                tuple(sorted({*o.debs, *t.debs})))
    return [out[k] for k in sorted(out)]


def with_branches(targets: list[TargetSpec], extra: tuple[str, ...]) -> list[TargetSpec]:
    """`--driver-branch`: more branches for the RPM-family targets whose hosts have a managed driver (to upgrade to
    later; an Ubuntu target carries what its hosts' driver steps install, read from their facts)."""
    if not extra:
        return targets
    known = versions.drivers().branches
    for b in extra:
        if b not in known:
            raise SourceError(f"--driver-branch {b[:20]!r}: not a driver branch gpuk8s installs",
                              f"use one of {', '.join(known)} (gpuk8s versions)")
    if not any(t.branches and rpm_family(t.os) for t in targets):
        raise SourceError("--driver-branch: no Alibaba Cloud Linux host of the inventory has driver: {manage: true}",
                          "set driver.manage on the hosts whose driver gpuk8s installs (docs/driver.md)")
    return [dataclasses.replace(t, branches=tuple(sorted({*t.branches, *extra}))) if t.branches and rpm_family(t.os)
            else t for t in targets]


_EL8 = re.compile(r"^(alinux-3|(rhel|rocky|almalinux|centos|anolis|ol)-8(\.[0-9]+)?)$")


def _check(t: TargetSpec) -> None:
    if rpm_family(t.os) and not _EL8.match(t.os):
        raise SourceError(f"{t.os} {t.arch}: bundles serve Ubuntu and the RHEL 8 family (Alibaba Cloud Linux 3)",
                          "install those hosts through mirrors: (docs/mirrors.md)")
    if t.runtime not in ("containerd", "docker"):
        raise SourceError(f"{t.os} {t.arch} with {t.runtime}: bundles serve containerd and Docker hosts",
                          "set cluster.container_runtime to containerd or docker")


def _cri_dockerd(inv: Inventory, arch: str, staging: Path, purls: dict[str, str],
                 say: Callable[[str], None]) -> dict[str, Path]:
    """cri-dockerd's release archive for a Docker target's architecture (Docker itself is the host's: preflight
    checks its version), checked against its pin here as install checks it on the host."""
    a = deb_arch(arch)
    want = inv.install.cri_dockerd_sha256.get(a, "")
    if not want:
        raise SourceError(f"cri-dockerd publishes no release archive for {arch}",
                          "use containerd on those hosts (cluster.container_runtime: containerd)")
    name = versions.cri_dockerd().archive(a)
    url = f"{inv.install.cri_dockerd_url}/{name}"
    say(f"cri-dockerd: {url}")
    data = fetch.get(url, MAX_ARCHIVE, allow_http=True)
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise SourceError(f"{url} has sha256 {got}; its pin is {want}", "check install.cri_dockerd_sha256")
    path = f"{CRI_DOCKERD}/{name}"
    dest = staging / path
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    purls[path] = f"pkg:github/mirantis/cri-dockerd@v{versions.cri_dockerd().version}"
    return {path: dest}


def _cni_manifest(inv: Inventory, staging: Path) -> tuple[dict[str, Path], list[str]]:
    """The CNI manifest (its pin proves it, over http too, as install checks it) and the images it names."""
    cni = inv.cluster.cni
    url: str = getattr(inv.install, f"{cni}_manifest")
    pin = mirrors.manifest_sha256(inv, cni)
    if not pin:
        raise SourceError(f"install.{cni}_manifest ({url}) has no sha256 pin, so the bundle cannot prove what it "
                          "carries", f"set install.{cni}_manifest_sha256")
    data = fetch.get(url, MAX_MANIFEST_FILE, allow_http=True)
    got = hashlib.sha256(data).hexdigest()
    if got != pin:
        raise SourceError(f"{url} has sha256 {got}; its pin is {pin}", f"check install.{cni}_manifest_sha256")
    dest = staging / "manifests" / f"{cni}.yaml"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    return {f"manifests/{cni}.yaml": dest}, mirrors.images_in(data.decode("utf-8", errors="replace"))


def _rpm_target(inv: Inventory, t: TargetSpec, staging: Path, copies: dict[tuple[str, str, str], RepoCopy],
                keys: dict[str, str], purls: dict[str, str], os_packages: dict[str, list[str]],
                kube_versions: set[str], say: Callable[[str], None]) -> None:
    """An RPM-family target: its dnf repositories copied (gpuk8s/bundle/rpmsource.py), resolution against them.
    The driver (managed-driver hosts): each branch's open modules, built by DKMS on the host against the running
    kernel's headers, which the OS archive serves (kernel-devel-KERNEL, named with the rest of the OS's)."""
    label = f"{t.os} {t.arch}"
    owner: dict[tuple[str, str, str], rpmsource.RpmCopy] = {}
    # what is resolved together: every repository but the driver's; the driver's once per branch (one branch's
    # packages at a time, as an enabled module stream shows them to dnf; each branch has the same names)
    groups: dict[str, tuple[list[rpmrepo.RpmPackage], list[rpmrepo.RpmPackage]]] = {"": ([], [])}
    for r in rpmsource.repos_for(inv, t.arch, t.runtime, t.gpu, t.branches):
        copy = copies.get((r.role, r.url, ""))
        if copy is None:
            say(f"{r.role}: {r.url} (signature)")
            copy = copies[(r.role, r.url, "")] = rpmsource.RpmCopy(r, staging)
            copy.signed()
        assert isinstance(copy, rpmsource.RpmCopy)
        keys[r.role] = copy.fingerprint
        parts = [(b, rpmsource.of_branches(copy.packages, (b,)),
                  dataclasses.replace(r, wanted=tuple(w for w in r.wanted if w[1] == f"{b}.*")))
                 for b in t.branches] if r.role == "driver" else [("", copy.packages, r)]
        for group, seen, asked in parts:
            pkgs, wanted = groups.setdefault(group, ([], []))
            wanted += rpmsource.wanted_packages(rpmrepo.RpmIndex(seen, t.arch), asked)
            for p in seen:
                pkgs.append(p)
                owner.setdefault((p.name, p.evr, p.arch), copy)
    missing = {f"kernel-devel-{k}" for k in (t.kernels if t.gpu and t.branches else ())}
    for pkgs, wanted in groups.values():
        res = rpmrepo.resolve(rpmrepo.RpmIndex(pkgs, t.arch), wanted)
        missing |= {m.split(" ", 1)[0] for m in res.missing}
        for p in res.chosen.values():
            say(f"{label}: {p.name} {p.evr}")
            name = owner[(p.name, p.evr, p.arch)].rpm_package(p)
            purls[name] = f"pkg:rpm/{t.os.split('-', 1)[0]}/{p.name}@{p.evr}?arch={p.arch}"
            if p.name == "kubeadm":
                kube_versions.add(p.version)
    os_packages[label] = sorted(missing)


def kubeadm_list(deb: Path, version: str, work: Path) -> list[str]:
    """`kubeadm config images list` of the kubeadm in `deb` (the bundle's own, from its signed repository): pause,
    etcd and coredns are kubeadm's choice per release, and only kubeadm says which (docs/mirrors.md). An .rpm
    (a bundle for the RPM family only) is unpacked by rpm2cpio and cpio."""
    root = work / "kubeadm"
    if deb.suffix == ".rpm":
        root.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(f"rpm2cpio {shlex.quote(str(deb))} | cpio -idm --quiet", shell=True, cwd=root,
                           capture_output=True, text=True, timeout=300)
    else:
        r = subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, text=True, timeout=300)
    binary = root / "usr" / "bin" / "kubeadm"
    if r.returncode != 0 or not binary.is_file():
        raise SourceError(f"{deb.name}: no usr/bin/kubeadm in it ({r.stderr.strip()[:200] or 'dpkg-deb -x'})",
                          "check the Kubernetes repository the inventory names")
    r = subprocess.run([str(binary), "config", "images", "list", "--kubernetes-version", f"v{version}"],
                       capture_output=True, text=True, timeout=120, cwd=work, env={"PATH": "/usr/bin:/bin"})
    refs = [line.strip() for line in r.stdout.splitlines()[:64] if line.strip()]
    if r.returncode != 0 or not refs or not all(_REF.match(x) for x in refs):
        raise SourceError(f"kubeadm {version} config images list failed: "
                          f"{(r.stderr.strip().splitlines() or ['no image listed'])[-1][:200]}",
                          "run bundle create on a machine of an architecture the bundle serves (kubeadm runs here)")
    shutil.rmtree(root, ignore_errors=True)
    return refs


def create(inv: Inventory, targets: list[TargetSpec], out: Path, staging: Path,
           say: Callable[[str], None] = lambda _: None, level: int = 19, ubuntu_keyring: str = UBUNTU_KEYRING
           ) -> Created:
    """Build the bundle at `out`, with `staging` (an empty directory) for the files on their way in."""
    start = time.monotonic()
    if not targets:
        raise SourceError("no target to build for: no host's facts could be read and none was declared",
                          "pass --target OS-RELEASE/ARCH (ubuntu-22.04/x86_64) for hosts this machine cannot reach")
    for t in targets:
        _check(t)
    copies: dict[tuple[str, str, str], RepoCopy] = {}  # (role, url, suite): jammy and noble share Docker's URL
    files: dict[str, Path] = {}
    os_packages: dict[str, list[str]] = {}
    kube_versions: set[str] = set()
    keys: dict[str, str] = {}
    purls: dict[str, str] = {}
    kubeadm_deb: Path | None = None
    for t in targets:
        if t.runtime == "docker":
            files.update(_cri_dockerd(inv, t.arch, staging, purls, say))
        if rpm_family(t.os):
            _rpm_target(inv, t, staging, copies, keys, purls, os_packages, kube_versions, say)
            continue
        label = f"{t.os} {t.arch}"
        pkgs: list[debrepo.DebPackage] = []
        owner: dict[tuple[str, str, str], RepoCopy] = {}
        wanted: list[debrepo.Rel] = []
        for r in repos_for(inv, t.os, t.arch, t.runtime, t.gpu, t.debs, ubuntu_keyring):
            copy = copies.get((r.role, r.url, r.suite))
            if copy is None:
                say(f"{r.role}: {r.url} {r.suite} (signature)".replace("  ", " "))
                copy = copies[(r.role, r.url, r.suite)] = RepoCopy(r, staging)
                copy.signed()
            keys[r.role] = copy.fingerprint
            idx = copy.index(deb_arch(t.arch))
            wanted += wanted_rels(idx, r)
            for ps in idx.by_name.values():
                for p in ps:
                    pkgs.append(p)
                    owner.setdefault((p.name, p.version, p.arch), copy)
        res = debrepo.resolve(debrepo.Index(pkgs, deb_arch(t.arch)), wanted)
        os_packages[label] = sorted(m.split(" ", 1)[0] for m in res.missing)
        for p in res.chosen.values():
            say(f"{label}: {p.name} {p.version}")
            name = owner[(p.name, p.version, p.arch)].package(p)
            distro = t.os.split("-", 1)[0]
            purls[name] = f"pkg:deb/{distro}/{p.name}@{p.version}?arch={p.arch}"
            if p.name == "kubeadm":
                kube_versions.add(p.version.split("-", 1)[0])
                if deb_arch(t.arch) == deb_arch(platform.machine()):
                    kubeadm_deb = staging / name
    for copy in copies.values():
        files.update(copy.files)
    if len(kube_versions) != 1:
        raise SourceError(f"the targets got Kubernetes {', '.join(sorted(kube_versions)) or 'none'}",
                          "pin cluster.kubernetes_version to a patch release (1.33.2) so every target gets the same")
    if kubeadm_deb is None:
        kubeadm_deb = next((f for f in files.values() if f.name.startswith("kubeadm-") and f.suffix == ".rpm"
                            and platform.machine() in f.name), None)
    version = kube_versions.pop()
    if kubeadm_deb is None:
        raise SourceError(f"no target is of this machine's architecture ({platform.machine()}), so its kubeadm "
                          "cannot list the images of its release", "run bundle create on a machine of an "
                          "architecture the bundle serves")
    cni_files, cni_images = _cni_manifest(inv, staging)
    files.update(cni_files)
    exact = dataclasses.replace(inv, cluster=dataclasses.replace(inv.cluster, kubernetes_version=version))
    wanted_images = images.sources(exact)
    named = {i.name for i in wanted_images}
    listed = kubeadm_list(kubeadm_deb, version, staging)
    for ref in dict.fromkeys([*listed, *cni_images]):
        if ref not in named:
            named.add(ref)
            wanted_images.append(images.ImageSource(ref, mirrors.image(inv, ref)))
    say(f"images: {len(wanted_images)} into one OCI layout")
    copied = images.copy(inv, wanted_images, staging / images.LAYOUT, {t.arch for t in targets})
    for ref in listed:
        other = images.kubeadm_alias(ref)
        if other and other not in copied:
            images.alias(staging / images.LAYOUT, ref, other)
            copied.append(other)
    files.update(images.layout_files(staging / images.LAYOUT))
    # gpuk8s itself, as installed here, and what it requires: a site runs the gpuk8s that built its bundle
    whl = wheel.wheels(staging / wheel.DIR)
    say(f"wheels: {len(whl.built)}" + (f" (not carried: {'; '.join(whl.missing)})" if whl.missing else ""))
    files.update(whl.built)
    for path in whl.built:
        dist, ver = Path(path).name.split("-")[:2]
        purls[path] = f"pkg:pypi/{dist.replace('_', '-')}@{ver}"
    # the driver carried: the RPM family's branches (DKMS: any kernel); Ubuntu's branches and the kernels whose
    # precompiled modules its hosts install
    m = Manifest(f"gpuk8s {__version__}", version,
                 tuple(Target(t.os, t.arch, t.runtime, kernels=() if rpm_family(t.os) or not t.debs else t.kernels,
                              driver_branches=carried_branches(t)) for t in targets), tuple(copied),
                 repos=tuple(RepoKey(role, fpr) for role, fpr in sorted(keys.items())))
    say(f"sha256 of {len(files)} files")
    known = {n: writer.digest(p) for n, p in files.items()}
    _sbom(m, known, purls, files, staging)
    written = writer.write(out, m, files, level=level, known=known)
    return Created(written, out, out.stat().st_size, time.monotonic() - start, os_packages, len(copied),
                   wheels=len(whl.built), no_wheels=whl.missing)


def _sbom(m: Manifest, known: Mapping[str, FileEntry], purls: Mapping[str, str], files: dict[str, Path],
          staging: Path) -> None:
    """The SPDX document of every file but itself, as a file of the bundle (docs/airgap.md)."""
    # SOURCE_DATE_EPOCH (reproducible-builds.org): the same inputs give the same bundle, SBOM included
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    when = time.gmtime(int(epoch) if epoch.isdigit() and len(epoch) < 12 else time.time())
    doc = sbom.spdx(dataclasses.replace(m, files=dict(known)), time.strftime("%Y-%m-%dT%H:%M:%SZ", when), purls)
    dest = staging / SBOM
    dest.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    files[SBOM] = dest


def clean(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


__all__ = ["AptRepo", "Created", "TargetSpec", "create", "merge", "parse_target", "targets_from"]
