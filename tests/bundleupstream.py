"""The internet, as `gpuk8s bundle create` sees it, on this machine's loopback: the three apt repositories install
reads (Kubernetes' flat repository with `amd64/` file names, NVIDIA's flat one with `./` names, Docker's with
dists/ and pool/ and a detached Release.gpg) built by the real apt-ftparchive from stand-in .deb files (dpkg-deb),
signed by a real gpg key each; a real OCI registry (Debian's docker-registry) holding a small real image under
every name `gpuk8s images` lists, put there by the real skopeo; the CNI manifest. Only the packages' contents are
stand-ins (empty packages with the real names, versions and dependency fields).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuk8s import versions
from gpuk8s.driver import rules
from tests.lab.fakes.fake import CNI_MANIFESTS, LAB_ROOT, UBUNTU_DRIVERS, cri_dockerd_archive
from tests.lab.fakes.kube import kubeadm_images

TOOLS = ("apt-ftparchive", "dpkg-deb", "gpg", "gpgv", "skopeo", "docker-registry", "zstd")
# kubeadm's Depends as pkgs.k8s.io writes it (tests/fixtures/real/repos/deb-packages-pkgs-k8s-kubeadm-1.27-...)
KUBEADM_DEPENDS = "kubelet (>= 1.19.0),kubectl (>= 1.19.0),kubernetes-cni (>= 1.1.1),cri-tools (>= 1.25.0)"
# a stand-in's: what kubelet needs from the distribution's own archive
KUBELET_DEPENDS = ("iptables (>= 1.4.21), kubernetes-cni (>= 1.1.1), iproute2, socat, util-linux, mount, ethtool, "
                   "conntrack")
CALICO = "docker.io/calico/node:v3.28.0"


RPM_TOOLS = ("rpmbuild", "createrepo_c", "modifyrepo_c", "rpm2cpio", "cpio")
# NVIDIA's RHEL 8 repository's driver branches: the default and the lab's newest, at the lab's releases
DRIVER_RELEASES = {b: UBUNTU_DRIVERS[b] for b in sorted({versions.drivers().default_branch, max(UBUNTU_DRIVERS)})}


def missing_tools(rpm: bool = False) -> list[str]:
    return [t for t in (*TOOLS, *(RPM_TOOLS if rpm else ())) if shutil.which(t) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def _deb(out: Path, name: str, version: str, arch: str, depends: str = "", size: int = 2048,
         script: str = "") -> Path:
    root = out.parent / f".build-{name}-{version}-{arch}"
    (root / "DEBIAN").mkdir(parents=True)
    control = f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: lab <lab@lab.example>\n"
    if depends:
        control += f"Depends: {depends}\n"
    control += f"Description: stand-in for {name}\n"
    (root / "DEBIAN" / "control").write_text(control)
    (root / "usr" / "share" / "doc" / name).mkdir(parents=True)
    (root / "usr" / "share" / "doc" / name / "payload").write_bytes(os.urandom(size))  # incompressible: real sizes
    if script:  # the package's command, a stand-in
        (root / "usr" / "bin").mkdir(parents=True)
        (root / "usr" / "bin" / name).write_text(script)
        (root / "usr" / "bin" / name).chmod(0o755)
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)], check=True,
                   capture_output=True)
    shutil.rmtree(root)
    return out


def _rpm(out: Path, name: str, version: str, release: str, arch: str, requires: str = "", size: int = 2048,
         script: str = "", epoch: int = 0) -> Path:
    """A stand-in .rpm built by the real rpmbuild: the real name, version, release and Requires, `size` bytes of
    noise, and the package's command where `script` gives one."""
    top = out.parent / f".rpmbuild-{name}-{version}"
    for sub in ("SPECS", "SOURCES", "BUILD", "RPMS", "SRPMS", "BUILDROOT"):
        (top / sub).mkdir(parents=True, exist_ok=True)
    (top / "SOURCES" / "payload").write_bytes(os.urandom(size))
    (top / "SOURCES" / "cmd").write_text(script or "#!/bin/sh\n")
    spec = (f"Name: {name}\nVersion: {version}\nRelease: {release}\nSummary: stand-in for {name}\nLicense: none\n"
            + (f"Epoch: {epoch}\n" if epoch else "")
            + (f"Requires: {requires}\n" if requires else "")
            + "%description\nstand-in\n%install\n"
            + "mkdir -p %{buildroot}/usr/share/doc/" + name + " %{buildroot}/usr/bin\n"
            + "cp %{_sourcedir}/payload %{buildroot}/usr/share/doc/" + name + "/\n"
            + ("install -m 755 %{_sourcedir}/cmd %{buildroot}/usr/bin/" + name + "\n" if script else "")
            + "%files\n/usr/share/doc/" + name + "/payload\n" + ("/usr/bin/" + name + "\n" if script else ""))
    (top / "SPECS" / f"{name}.spec").write_text(spec)
    r = subprocess.run(["rpmbuild", "-bb", "--quiet", "--define", f"_topdir {top}", "--target", arch,
                        "--define", "_build_id_links none", "--nodeps", str(top / "SPECS" / f"{name}.spec")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"rpmbuild {name}: {r.stderr[-500:]}")
    built = next((top / "RPMS").rglob("*.rpm"))
    out.mkdir(parents=True, exist_ok=True)
    dest = out / built.name
    shutil.move(str(built), dest)
    shutil.rmtree(top)
    return dest


def _release(dist: Path, suite: str, component: str, arches: tuple[str, ...]) -> Path:
    """DIST/Release by the real apt-ftparchive, for suite SUITE (codename jammy) and one component; Acquire-By-Hash:
    yes, as Docker's and Ubuntu's archives say (apt then asks for by-hash/SHA512/HASH). Unsigned: its path."""
    rel = dist / "Release"
    opts = {"Acquire-By-Hash": "yes", "Suite": suite, "Codename": "jammy", "Components": component,
            "Architectures": " ".join(arches)}
    rel.write_bytes(subprocess.run(
        ["apt-ftparchive", *[x for k, v in opts.items() for x in ("-o", f"APT::FTPArchive::Release::{k}={v}")],
         "release", "."], cwd=dist, check=True, capture_output=True).stdout)
    return rel


def _kubeadm(version: str) -> str:
    """A stand-in kubeadm that answers `config images list --kubernetes-version vX` as the lab's kubeadm does
    (tests/lab/fakes/kube.py: the real command's lines, per release)."""
    lines = "\n".join(kubeadm_images(f"v{version}"))
    return (f"#!/bin/sh\n[ \"$1 $2 $3 $4 $5\" = \"config images list --kubernetes-version v{version}\" ] || "
            f"{{ echo \"kubeadm stand-in: $*\" >&2; exit 1; }}\ncat <<'EOF'\n{lines}\nEOF\n")


class Upstream:
    """Built in `root`; `start()` serves it; `inventory(...)` points an inventory at it."""

    def __init__(self, root: Path, arches: tuple[str, ...] = ("amd64",), lab_root: Path = LAB_ROOT) -> None:
        self.root = root
        self.lab_root = lab_root  # the lab whose hosts run what it serves (cri-dockerd's stand-in names it)
        self.www = root / "www"
        # a short home of its own: gpg-agent's socket lives in it, and a Unix socket's path is at most 107 bytes
        # (a pytest worker's tmp_path alone can be longer)
        self.gnupg = Path(tempfile.mkdtemp(prefix="gk-gpg-"))
        self.arches = arches
        self.fingerprints: dict[str, str] = {}
        self.http: ThreadingHTTPServer | None = None
        self.registry: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.registry_port = 0

    # -- building -------------------------------------------------------------------------------------------------

    def _gpg(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
        r = subprocess.run(["gpg", "--batch", "--homedir", str(self.gnupg), *args], capture_output=True, **kw)
        if r.returncode != 0:
            raise RuntimeError(f"gpg {' '.join(args[:3])}: {r.stderr.decode(errors='replace')[-500:]}")
        return r

    def _key(self, role: str) -> str:
        uid = f"lab {role} repository <{role}@lab.example>"
        self._gpg("--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        out = self._gpg("--with-colons", "--list-keys", uid).stdout.decode()
        fpr = next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:"))
        self.fingerprints[role] = fpr
        return fpr

    def _sign(self, fpr: str, release: Path, inline: bool) -> None:
        if inline:
            self._gpg("--local-user", fpr, "--clearsign", "-o", str(release.with_name("InRelease")), str(release))
            release.unlink()  # the flat repositories here serve InRelease only
        else:
            self._gpg("--local-user", fpr, "--armor", "--detach-sign", "-o", str(release.with_name("Release.gpg")),
                      str(release))

    def _export(self, fpr: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(self._gpg("--armor", "--export", fpr).stdout)

    def build(self, kubernetes: str, toolkit: str, containerd: str, older_patch: str) -> None:
        """The repositories at these versions (and an older Kubernetes patch beside them)."""
        self.gnupg.chmod(0o700)
        minor = kubernetes.rsplit(".", 1)[0]
        # Kubernetes: https://pkgs.k8s.io/core:/stable:/v1.NN/deb/ (flat; Filename amd64/NAME_VERSION_ARCH.deb)
        kube = self.www / "kubernetes" / f"v{minor}" / "deb"
        fpr = self._key("kubernetes")
        for arch in self.arches:
            for v in (older_patch, kubernetes):
                _deb(kube / arch / f"kubelet_{v}-1.1_{arch}.deb", "kubelet", f"{v}-1.1", arch, KUBELET_DEPENDS)
                _deb(kube / arch / f"kubeadm_{v}-1.1_{arch}.deb", "kubeadm", f"{v}-1.1", arch, KUBEADM_DEPENDS,
                     script=_kubeadm(v))
                _deb(kube / arch / f"kubectl_{v}-1.1_{arch}.deb", "kubectl", f"{v}-1.1", arch)
            _deb(kube / arch / f"cri-tools_{minor}.0-1.1_{arch}.deb", "cri-tools", f"{minor}.0-1.1", arch)
            _deb(kube / arch / f"kubernetes-cni_1.6.0-1.1_{arch}.deb", "kubernetes-cni", "1.6.0-1.1", arch)
        self._flat(kube, fpr, ".")
        self._export(fpr, kube / "Release.key")
        # NVIDIA's toolkit: https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)/ (flat; Filename ./NAME)
        fpr = self._key("toolkit")
        self._export(fpr, self.www / "nvidia" / "gpgkey")
        for arch in self.arches:
            d = self.www / "nvidia" / "stable" / "deb" / arch
            base = f"nvidia-container-toolkit-base (= {toolkit})"
            for name, dep in (("libnvidia-container1", ""), ("libnvidia-container-tools",
                                                              f"libnvidia-container1 (>= {toolkit})"),
                              ("nvidia-container-toolkit-base", ""),
                              ("nvidia-container-toolkit", f"{base}, libnvidia-container-tools (>= {toolkit})")):
                _deb(d / f"{name}_{toolkit}_{arch}.deb", name, toolkit, arch, dep)
            self._flat(d, fpr, "")
        # Docker: https://download.docker.com/linux/ubuntu jammy stable (dists/, pool/; Release.gpg beside Release)
        fpr = self._key("containerd")
        u = self.www / "docker" / "ubuntu"
        self._export(fpr, u / "gpg")
        for arch in self.arches:
            v = f"{containerd}~ubuntu.22.04~jammy"  # containerd.io 2.2.6-1 is 2.2.6-1~ubuntu.22.04~jammy there
            _deb(u / "pool" / "stable" / arch / f"containerd.io_{v}_{arch}.deb", "containerd.io", v, arch,
                 "libc6 (>= 2.34), libseccomp2 (>= 2.5.0)", size=8192)
            idx = u / "dists" / "jammy" / "stable" / f"binary-{arch}"
            idx.mkdir(parents=True)
            text = subprocess.run(["apt-ftparchive", "packages", f"pool/stable/{arch}"], cwd=u, check=True,
                                  capture_output=True).stdout
            (idx / "Packages").write_bytes(text)
            (idx / "Packages.gz").write_bytes(gzip.compress(text, mtime=0))
        rel = _release(u / "dists" / "jammy", "jammy", "stable", self.arches)
        self._sign(fpr, rel, inline=False)
        # cri-dockerd's release archives (Docker hosts): the lab's stand-in (the lab's own root: its hosts run it)
        pin = versions.cri_dockerd()
        for arch in pin.sha256:
            archive = self.www / "cri-dockerd" / f"v{pin.version}" / pin.archive(arch)
            archive.parent.mkdir(parents=True, exist_ok=True)
            archive.write_bytes(cri_dockerd_archive(pin.version, arch, self.lab_root))
        # the CNI manifest
        cni = self.www / "cni" / "calico.yaml"
        cni.parent.mkdir(parents=True)
        cni.write_text(CNI_MANIFESTS["calico"])  # the lab's stand-in for calico's manifest (its image: CALICO)

    def build_ubuntu_driver(self, kernels: list[str], arch: str = "amd64") -> None:
        """Ubuntu's archive (install.driver_apt_repo: ubuntu/, dists/jammy-updates/restricted, pool/restricted/),
        signed as Ubuntu signs it (InRelease, Acquire-By-Hash) by a key in a keyring of two keys, as Ubuntu's
        archive keyring holds several (`ubuntu_keyring`: what bundle create and the hosts verify with): per branch
        of DRIVER_RELEASES the open -server driver's packages at the lab's versions (tests/lab/fakes/fake.py
        UBUNTU_DRIVERS, as Ubuntu spells them) with a subset of their Depends (the kernel-common and compute library
        of the same version), and per kernel its signed precompiled modules (Depends: the kernel's image, which the
        host runs and the OS archive serves, and the branch's kernel-common)."""
        fpr = self._key("ubuntu")
        self._key("ubuntu-2012")  # an older key in the same keyring, as Ubuntu's has: the pin says which signs
        u = self.www / "ubuntu"
        pool = u / "pool" / "restricted"
        for b, v in DRIVER_RELEASES.items():
            pv = f"{v}-0ubuntu0.22.04.1"
            common = f"nvidia-kernel-common-{b}-server"
            for name, dep in ((common, ""), (f"libnvidia-compute-{b}-server", ""),
                              (f"nvidia-headless-no-dkms-{b}-server-open", f"{common} (= {pv})"),
                              (f"nvidia-utils-{b}-server", f"libnvidia-compute-{b}-server (= {pv})")):
                _deb(pool / f"{name}_{pv}_{arch}.deb", name, pv, arch, dep)
            for k in kernels:
                kv = f"{k.split('-')[0]}-105.115"  # the lab's version of a kernel's modules package
                name = f"linux-modules-nvidia-{b}-server-open-{k}"
                _deb(pool / f"{name}_{kv}_{arch}.deb", name, kv, arch,
                     f"linux-image-{k} | linux-image-unsigned-{k}, {common} (>= {v})")
        idx = u / "dists" / "jammy-updates" / "restricted" / f"binary-{arch}"
        idx.mkdir(parents=True)
        text = subprocess.run(["apt-ftparchive", "packages", "pool/restricted"], cwd=u, check=True,
                              capture_output=True).stdout
        (idx / "Packages").write_bytes(text)
        (idx / "Packages.xz").write_bytes(lzma.compress(text))
        rel = _release(u / "dists" / "jammy-updates", "jammy-updates", "restricted", (arch,))
        self._gpg("--local-user", fpr, "--clearsign", "-o", str(rel.with_name("InRelease")), str(rel))
        self.ubuntu_keyring.write_bytes(self._gpg("--export", self.fingerprints["ubuntu-2012"], fpr).stdout)

    @property
    def ubuntu_keyring(self) -> Path:
        return self.root / "ubuntu-archive-keyring.gpg"

    def build_rpm(self, kubernetes: str, toolkit: str, containerd: str, older_patch: str, arch: str = "x86_64") -> None:
        """The three dnf repositories (after build(): the same keys), built by the real rpmbuild and createrepo_c,
        repomd.xml signed (repomd.xml.asc) as pkgs.k8s.io's and NVIDIA's are: Kubernetes' v1.NN/rpm/ (its key at
        repodata/repomd.xml.key), NVIDIA's stable/rpm/ARCH/, Docker's rhel/8/ARCH/stable (its key at rhel/gpg)."""
        minor = kubernetes.rsplit(".", 1)[0]
        kube = self.www / "kubernetes" / f"v{minor}" / "rpm"
        rel = "150500.1.1"  # pkgs.k8s.io's OBS release of every package
        for v in (older_patch, kubernetes):
            _rpm(kube / arch, "kubelet", v, rel, arch, "iptables >= 1.4.21, kubernetes-cni >= 1.1.1, conntrack, socat")
            _rpm(kube / arch, "kubeadm", v, rel, arch, "kubelet >= 1.19.0, kubectl >= 1.19.0, kubernetes-cni >= "
                 "1.1.1, cri-tools >= 1.25.0", script=_kubeadm(v))
            _rpm(kube / arch, "kubectl", v, rel, arch)
        _rpm(kube / arch, "cri-tools", f"{minor}.0", rel, arch)
        _rpm(kube / arch, "kubernetes-cni", "1.6.0", rel, arch)
        self._repodata(kube, self.fingerprints["kubernetes"])
        self._export(self.fingerprints["kubernetes"], kube / "repodata" / "repomd.xml.key")
        tk = self.www / "nvidia" / "stable" / "rpm" / arch
        version, _, release = toolkit.partition("-")
        for name, dep in (("libnvidia-container1", ""), ("libnvidia-container-tools", f"libnvidia-container1 >= "
                                                                                      f"{version}"),
                          ("nvidia-container-toolkit-base", ""),
                          ("nvidia-container-toolkit", f"nvidia-container-toolkit-base = {version}-{release}, "
                                                       f"libnvidia-container-tools >= {version}")):
            _rpm(tk, name, version, release, arch, dep)
        self._repodata(tk, self.fingerprints["toolkit"])
        d = self.www / "docker" / "rhel" / "8" / arch / "stable"
        cv = containerd.split("-")[0]
        # Docker names it containerd.io-2.2.6-1.el8 for the matrix's 2.2.6-1 (gpuk8s/data/versions.yaml)
        _rpm(d / "Packages", "containerd.io", cv, containerd.split("-")[1] + ".el8", arch,
             "container-selinux >= 2:2.74, libseccomp",
             size=8192)
        self._repodata(d, self.fingerprints["containerd"], sign=False)  # Docker's: packages signed, metadata not
        self._export(self.fingerprints["containerd"], self.www / "docker" / "rhel" / "gpg")
        self._cuda_rhel8(arch)

    def _cuda_rhel8(self, arch: str) -> None:
        """NVIDIA's RHEL 8 repository (install.driver_repo: cuda/repos/rhel8/ARCH/, its key D42D0685.pub beside
        repodata, as developer.download.nvidia.com lays it out): per branch of DRIVER_RELEASES the open driver as
        NVIDIA packages it (epoch 3; NVIDIA/yum-packaging-nvidia-driver's nvidia-driver.spec: nvidia-driver requires
        nvidia-driver-libs and nvidia-kmod-common of its own version; the DKMS modules need dkms, from EPEL),
        fabric manager, an unrelated CUDA package of another version, and the modules.yaml of the
        nvidia-driver:BRANCH-open streams. Unsigned metadata (NVIDIA signs the packages)."""
        d = self.www / "cuda" / "rhel8" / ("sbsa" if arch == "aarch64" else arch)
        fpr = self._key("driver")
        docs = []
        for branch, v in DRIVER_RELEASES.items():
            rel = "1.el8"
            same = f"3:{v}"
            made = [("nvidia-driver-libs", "libglvnd >= 1.0, egl-wayland"), ("nvidia-kmod-common", ""),
                    ("kmod-nvidia-open-dkms", f"dkms, nvidia-kmod-common = {same}"),
                    ("nvidia-driver", f"nvidia-driver-libs = {same}, nvidia-kmod-common = {same}"),
                    ("nvidia-open", f"nvidia-driver = {same}, kmod-nvidia-open-dkms = {same}"),
                    (rules.rhel_fabric_manager(branch), "")]
            for name, req in made:
                _rpm(d, name, v, rel, arch, req, epoch=3)
            docs.append(f"---\ndocument: modulemd\nversion: 2\ndata:\n  name: nvidia-driver\n  stream: {branch}-open\n"
                        f"  version: 1\n  context: 00000000\n  arch: {arch}\n  summary: stand-in\n"
                        f"  description: stand-in\n  license:\n    module: [MIT]\n  artifacts:\n    rpms:\n"
                        + "".join(f"      - {n}-3:{v}-{rel}.{arch}\n" for n, _ in made) + "...\n")
        _rpm(d, "cuda-toolkit-12-8", "12.8.1", "1", arch)
        _rpm(d, "egl-wayland", "1.1.13", "3.el8", arch)  # outside any stream, in NVIDIA's repository (the spec's
        # nvidia-driver-libs requires it on RHEL 8)
        subprocess.run(["createrepo_c", "-q", "--simple-md-filenames", str(d)], check=True, capture_output=True)
        (d / "modules.yaml").write_text("".join(docs))
        subprocess.run(["modifyrepo_c", "--mdtype=modules", "--simple-md-filenames", str(d / "modules.yaml"),
                        str(d / "repodata")], check=True, capture_output=True)
        (d / "modules.yaml").unlink()
        self._export(fpr, d / rules.CUDA_KEY)

    def _repodata(self, d: Path, fpr: str, sign: bool = True) -> None:
        subprocess.run(["createrepo_c", "-q", "--simple-md-filenames", str(d)], check=True, capture_output=True)
        if sign:
            self._gpg("--local-user", fpr, "--armor", "--detach-sign", "-o", str(d / "repodata" / "repomd.xml.asc"),
                      str(d / "repodata" / "repomd.xml"))

    def _flat(self, d: Path, fpr: str, where: str) -> None:
        text = subprocess.run(["apt-ftparchive", "packages", where or "."], cwd=d, check=True,
                              capture_output=True).stdout
        (d / "Packages").write_bytes(text)
        (d / "Packages.gz").write_bytes(gzip.compress(text, mtime=0))
        rel = d / "Release"
        out = subprocess.run(["apt-ftparchive", "release", "."], cwd=d, check=True, capture_output=True).stdout
        rel.write_bytes(out)
        self._sign(fpr, rel, inline=True)

    @property
    def cni_sha256(self) -> str:
        return hashlib.sha256((self.www / "cni" / "calico.yaml").read_bytes()).hexdigest()

    # -- serving --------------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(self.www)))
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.registry_port = free_port()
        store = self.root / "registry"
        store.mkdir(exist_ok=True)
        cfg = self.root / "registry.yml"
        cfg.write_text(f"version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {store}}}}}\n"
                       f"http: {{addr: 127.0.0.1:{self.registry_port}}}\n")
        self.registry = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.registry_port}/v2/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.gnupg), "--kill", "all"], capture_output=True)
        shutil.rmtree(self.gnupg, ignore_errors=True)
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        if self.registry is not None:
            self.registry.terminate()
            self.registry.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mirror(self) -> str:
        return f"127.0.0.1:{self.registry_port}"

    def push(self, names: list[str]) -> None:
        """A small real image (one layer) under each name in the registry, for every architecture built."""
        src = self.root / "oci-src"
        if not src.exists():
            oci_image(src, self.arches)
        for name in names:
            subprocess.run(["skopeo", "copy", "--quiet", "--multi-arch", "all", "--dest-tls-verify=false",
                            f"oci:{src}:img", f"docker://{name}"], check=True, capture_output=True)

    def install_section(self) -> dict[str, Any]:
        """The inventory's install: block for these sources (plain http: each with its key's fingerprint)."""
        def repo(role: str, path: str) -> dict[str, Any]:  # the same URLs serve the deb and the rpm layouts
            return {"url": f"{self.url}/{path}", "insecure_http": True, "key_fingerprint": self.fingerprints[role]}

        out = {"kubernetes_repo": repo("kubernetes", "kubernetes"), "toolkit_repo": repo("toolkit", "nvidia"),
               "containerd_repo": repo("containerd", "docker"),
               "calico_manifest": f"{self.url}/cni/calico.yaml", "calico_manifest_sha256": self.cni_sha256}
        pin = versions.cri_dockerd()
        archives = {a: self.www / "cri-dockerd" / f"v{pin.version}" / pin.archive(a) for a in pin.sha256}
        if all(f.exists() for f in archives.values()):
            out["cri_dockerd_url"] = f"{self.url}/cri-dockerd/v{pin.version}"
            out["cri_dockerd_sha256"] = {a: hashlib.sha256(f.read_bytes()).hexdigest() for a, f in archives.items()}
        if "driver" in self.fingerprints:  # build_rpm() made NVIDIA's RHEL 8 repository
            out["driver_repo"] = repo("driver", "cuda/rhel8")
        if "ubuntu" in self.fingerprints:  # build_ubuntu_driver() made Ubuntu's archive
            out["driver_apt_repo"] = repo("ubuntu", "ubuntu")
        return out


def oci_image(dest: Path, arches: tuple[str, ...]) -> None:
    """A real OCI image layout at `dest`: one image (an index over one manifest per architecture, each a config and
    one gzip'd tar layer), tagged `img`."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes, media: str) -> dict[str, Any]:
        d = hashlib.sha256(data).hexdigest()
        (blobs / d).write_bytes(data)
        return {"mediaType": media, "digest": f"sha256:{d}", "size": len(data)}

    manifests = []
    for arch in arches:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            data = f"stand-in image for {arch}\n".encode() + os.urandom(4096)
            info = tarfile.TarInfo("payload")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        raw = buf.getvalue()
        layer = blob(gzip.compress(raw, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
        config = blob(json.dumps({"architecture": arch, "os": "linux", "config": {},
                                  "rootfs": {"type": "layers",
                                             "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]}}).encode(),
                      "application/vnd.oci.image.config.v1+json")
        man = blob(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": config, "layers": [layer]}).encode(),
                   "application/vnd.oci.image.manifest.v1+json")
        manifests.append({**man, "platform": {"architecture": arch, "os": "linux"}})
    index = blob(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                             "manifests": manifests}).encode(), "application/vnd.oci.image.index.v1+json")
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {**index, "annotations": {"org.opencontainers.image.ref.name": "img"}}]}))
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
