"""`gpuk8s bundle create` against the internet as this machine's loopback serves it (tests/bundleupstream.py: real
apt-ftparchive repositories signed by real gpg keys, a real registry filled by the real skopeo): what it takes from
each source, that the signatures stay verifiable in the bundle, that a source that lies is refused, and that what
it writes `bundle verify` takes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s import mirrors, versions
from gpuk8s.bundle import create as build
from gpuk8s.bundle import fetch
from gpuk8s.bundle.aptsource import SourceError
from gpuk8s.bundle.verify import verify
from gpuk8s.inventory.loader import loads
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube import images
from tests.bundleupstream import CALICO, Upstream, missing_tools
from tests.lab.fakes.kube import kubeadm_images

pytestmark = pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(missing_tools())} "
                                "(apt-get install apt-utils dpkg gnupg skopeo docker-registry zstd; .ci/run does)")

KUBE = versions.kubernetes_or_default(versions.matrix().default).latest_patch
OLDER = KUBE.rsplit(".", 1)[0] + "." + str(int(KUBE.rsplit(".", 1)[1]) - 1)
TOOLKIT = versions.install_defaults()["toolkit_version"]
CONTAINERD = versions.matrix().containerd_version
KERNEL, OTHER_KERNEL = "5.15.0-105-generic", "6.8.0-40-generic"  # two kernels Ubuntu 22.04 hosts run (GA, HWE)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    u = Upstream(tmp_path_factory.mktemp("upstream"))
    u.build(KUBE, TOOLKIT, CONTAINERD, OLDER)
    u.build_ubuntu_driver([KERNEL, OTHER_KERNEL])
    u.start()
    u.push(all_images(u))
    yield u
    u.stop()


def all_images(u: Upstream, inv: Inventory | None = None, kube: str = KUBE) -> list[str]:
    """What the registry must hold: `gpuk8s images`, kubeadm's list of the release, the CNI manifest's image; by
    the names the inventory's mirror gives them."""
    inv = inv or inventory(u)
    refs = [*kubeadm_images(f"v{kube}"), CALICO]
    return list(dict.fromkeys([n.image for n in images.needed_images(inv)] + [mirrors.image(inv, r) for r in refs]))


def inventory(u: Upstream, kubernetes: str = KUBE, **install: object) -> Inventory:
    doc = {"cluster": {"kubernetes_version": kubernetes, "cni": "calico"},
           "registry": {"mirror": u.mirror, "insecure_http": True},
           "install": {**u.install_section(), **install},
           "hosts": [{"name": "cp-1", "address": "10.0.0.1", "role": "control-plane"},
                     {"name": "gpu-1", "address": "10.0.0.2", "gpus": 8}]}
    return loads(json.dumps(doc))


def make(u: Upstream, tmp: Path, inv: Inventory | None = None) -> build.Created:
    staging = tmp / "staging"
    staging.mkdir()
    return build.create(inv or inventory(u), [build.TargetSpec("ubuntu-22.04", "x86_64", "containerd", True)],
                        tmp / "b.tar.zst", staging, level=3)


def test_a_bundle_holds_what_install_asks_for_with_the_repositories_signatures(upstream: Upstream,
                                                                               tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # gpuk8s's wheels (here a distribution installed as pip lays one out: the checkout is an editable install)
    from gpuk8s.bundle import wheel
    from tests.unit.test_bundle_wheel import installed

    demo = installed(tmp_path / "py" / "lib" / "site-packages")
    monkeypatch.setattr(wheel, "wheels", lambda out: wheel.Wheels(
        {f"wheel/{(w := wheel.rebuild(demo, out)).name}": w}, ["other: no pip RECORD of its installed files"]))
    (tmp_path / "b").mkdir()
    made = make(upstream, tmp_path / "b")
    assert made.wheels == 1 and made.no_wheels == ["other: no pip RECORD of its installed files"]
    assert "wheel/demo_pkg-1.0-py3-none-any.whl" in made.manifest.files
    sbom = json.loads(subprocess.run(f"zstd -dcq {made.path} | tar -xO sbom.spdx.json", shell=True, check=True,
                                     capture_output=True, text=True).stdout)
    assert "pkg:pypi/demo-pkg@1.0" in {r["referenceLocator"] for p in sbom["packages"]
                                       for r in p.get("externalRefs", [])}
    m = made.manifest
    files = set(m.files)
    minor = KUBE.rsplit(".", 1)[0]
    # the pinned patch, not the older one beside it; what kubeadm depends on, from the same repository
    for name in ("kubelet", "kubeadm", "kubectl"):
        assert f"repos/kubernetes/v{minor}/deb/amd64/{name}_{KUBE}-1.1_amd64.deb" in files
        assert f"repos/kubernetes/v{minor}/deb/amd64/{name}_{OLDER}-1.1_amd64.deb" not in files
    assert f"repos/kubernetes/v{minor}/deb/amd64/cri-tools_{minor}.0-1.1_amd64.deb" in files
    assert f"repos/kubernetes/v{minor}/deb/amd64/kubernetes-cni_1.6.0-1.1_amd64.deb" in files
    # NVIDIA's ./ file names, Docker's pool/ under dists/, each repository's signed metadata and key
    assert {f"repos/toolkit/stable/deb/amd64/{p}_{TOOLKIT}_amd64.deb" for p in
            ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
             "libnvidia-container1")} <= files
    assert f"repos/containerd/ubuntu/pool/stable/amd64/containerd.io_{CONTAINERD}~ubuntu.22.04~jammy_amd64.deb" in files
    assert {f"repos/kubernetes/v{minor}/deb/InRelease", f"repos/kubernetes/v{minor}/deb/Release.key",
            f"repos/kubernetes/v{minor}/deb/Packages", f"repos/kubernetes/v{minor}/deb/Packages.gz",
            "repos/toolkit/gpgkey", "repos/containerd/ubuntu/gpg", "repos/containerd/ubuntu/dists/jammy/Release",
            "repos/containerd/ubuntu/dists/jammy/Release.gpg",
            "repos/containerd/ubuntu/dists/jammy/stable/binary-amd64/Packages.gz",
            "manifests/calico.yaml", "sbom.spdx.json", "images/index.json", "images/oci-layout"} <= files
    assert m.kubernetes == KUBE
    assert {r.role: r.fingerprint for r in m.repos} == {r: upstream.fingerprints[r] for r in
                                                         ("kubernetes", "toolkit", "containerd")}  # no driver here
    # what the distribution's archive serves is named, not carried
    assert made.os_packages["ubuntu-22.04 x86_64"] == sorted(
        ["conntrack", "ethtool", "iproute2", "iptables", "libc6", "libseccomp2", "mount", "socat", "util-linux"])
    # every image of `gpuk8s images` under its upstream name, and the CNI manifest's own
    wanted = {n.upstream for n in images.needed_images(inventory(upstream))} | {CALICO} | set(
        kubeadm_images(f"v{KUBE}"))
    assert "registry.k8s.io/pause:3.10.1" in wanted or any("/pause:" in w for w in wanted)
    # and coredns also by the name kubeadm asks a repository of its own for (REPO/coredns:TAG)
    coredns = next(w for w in wanted if w.startswith("registry.k8s.io/coredns/coredns:"))
    assert set(m.images) == wanted | {coredns.replace("/coredns/coredns:", "/coredns:")}
    # what it wrote bundle verify takes
    v = verify(made.path)
    assert v.ok, v.problems
    assert v.files == len(m.files)


def test_the_signatures_in_the_bundle_verify_with_the_pinned_keys(upstream: Upstream, tmp_path: Path) -> None:
    """What apt on a site's host checks: InRelease (or Release and Release.gpg) against the key the manifest pins,
    and each index against Release's sha256, as the bundle carries them."""
    made = make(upstream, tmp_path)
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(f"zstd -dc {made.path} | tar -x -C {out}", shell=True, check=True)
    minor = KUBE.rsplit(".", 1)[0]
    for key, signed in ((f"repos/kubernetes/v{minor}/deb/Release.key", [f"repos/kubernetes/v{minor}/deb/InRelease"]),
                        ("repos/containerd/ubuntu/gpg", ["repos/containerd/ubuntu/dists/jammy/Release.gpg",
                                                         "repos/containerd/ubuntu/dists/jammy/Release"])):
        ring = tmp_path / "ring.gpg"
        subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(ring), str(out / key)], check=True)
        r = subprocess.run(["gpgv", "--keyring", str(ring), *[str(out / s) for s in signed]], capture_output=True)
        assert r.returncode == 0, r.stderr
    rel = (out / "repos/containerd/ubuntu/dists/jammy/Release").read_text()
    import hashlib
    gz = out / "repos/containerd/ubuntu/dists/jammy/stable/binary-amd64/Packages.gz"
    assert hashlib.sha256(gz.read_bytes()).hexdigest() in rel


def test_a_source_that_lies_is_refused(upstream: Upstream, tmp_path: Path) -> None:
    # a key other than the pinned one
    inv = inventory(upstream, kubernetes_repo={**upstream.install_section()["kubernetes_repo"],
                                               "key_fingerprint": "0" * 40})
    (tmp_path / "a").mkdir()
    with pytest.raises(SourceError, match="the inventory pins 0000"):
        make(upstream, tmp_path / "a", inv)
    # a package whose bytes are not what the signed index says
    minor = KUBE.rsplit(".", 1)[0]
    deb = upstream.www / "kubernetes" / f"v{minor}" / "deb" / "amd64" / f"kubectl_{KUBE}-1.1_amd64.deb"
    saved = deb.read_bytes()
    try:
        deb.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
        (tmp_path / "b").mkdir()
        with pytest.raises(fetch.FetchError, match="its index names"):
            make(upstream, tmp_path / "b")
    finally:
        deb.write_bytes(saved)
    # a version the repository does not have
    (tmp_path / "c").mkdir()
    with pytest.raises(SourceError, match="no kubelet version matching"):
        make(upstream, tmp_path / "c", inventory(upstream, kubernetes=KUBE.rsplit(".", 1)[0] + ".99"))


def test_the_same_sources_give_the_same_bundle(upstream: Upstream, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = make(upstream, tmp_path / "a"), make(upstream, tmp_path / "b")
    assert a.path.read_bytes() == b.path.read_bytes()


def test_targets_come_from_the_hosts_and_the_command_line() -> None:
    from gpuk8s.facts.model import OSInfo
    from tests.unit.test_checks import facts

    inv = loads("cluster: {kubernetes_version: '1.36'}\nhosts:\n  - {name: cp-1, address: 10.0.0.1, role: "
                "control-plane}\n  - {name: gpu-1, address: 10.0.0.2, gpus: 8}\n  - {name: gpu-2, address: 10.0.0.3,"
                " gpus: 8}\n")
    import dataclasses
    noble = dataclasses.replace(facts(), os=OSInfo("ubuntu", ("debian",), "24.04", "Ubuntu 24.04", "debian"))
    got = build.targets_from(inv, {"cp-1": facts(), "gpu-1": facts(), "gpu-2": None})
    assert got == [build.TargetSpec("ubuntu-22.04", "x86_64", "containerd", True)]
    got = build.merge([*build.targets_from(inv, {"cp-1": noble, "gpu-1": facts(), "gpu-2": None}),
                       build.parse_target("ubuntu-22.04/aarch64", "containerd")])
    assert [(t.os, t.arch, t.gpu) for t in got] == [("ubuntu-22.04", "aarch64", True), ("ubuntu-22.04", "x86_64", True),
                                                    ("ubuntu-24.04", "x86_64", False)]
    for bad in ("ubuntu", "ubuntu-22.04/x86_64;rm", "../x/x86_64", "ubuntu-22.04/sparc"):
        with pytest.raises(SourceError, match="is not OS-RELEASE/ARCH"):
            build.parse_target(bad, "containerd")


def test_an_index_that_decompresses_past_the_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip
    import lzma

    from gpuk8s.bundle import aptsource, debrepo

    monkeypatch.setattr(debrepo, "MAX_INDEX", 1 << 16)
    bomb = b"Package: x\n" + b"0" * (1 << 20)  # 1 MiB of zeros: a few KB compressed
    for sfx, data in ((".gz", gzip.compress(bomb)), (".xz", lzma.compress(bomb))):
        assert len(data) < 1 << 16
        with pytest.raises(SourceError, match="decompresses past"):
            aptsource._DECOMPRESS[sfx](data)
    assert aptsource._DECOMPRESS[".gz"](gzip.compress(b"small")) == b"small"
    # every hash section Release lists, for apt's by-hash (the strongest one it asks for)
    text = "Acquire-By-Hash: yes\nMD5Sum:\n " + "a" * 32 + " 3 Packages\nSHA512:\n " + "b" * 128 + " 3 Packages\n"
    assert aptsource.release_hashes(text) == {"MD5Sum": {"Packages": "a" * 32}, "SHA512": {"Packages": "b" * 128}}


@pytest.fixture(scope="module")
def rpm_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    from tests.bundleupstream import missing_tools as missing

    if missing(rpm=True):
        pytest.skip(f"needs {', '.join(missing(rpm=True))} (apt-get install rpm createrepo-c cpio; .ci/run does)")
    u = Upstream(tmp_path_factory.mktemp("rpm-upstream"))
    u.build(KUBE, TOOLKIT, CONTAINERD, OLDER)
    u.build_rpm(KUBE, TOOLKIT, CONTAINERD, OLDER)
    u.start()
    u.push(all_images(u))
    yield u
    u.stop()


def test_an_alibaba_cloud_linux_target_gets_its_dnf_repositories(rpm_upstream: Upstream, tmp_path: Path) -> None:
    """An RPM-family target beside an Ubuntu one: each repository's repodata as published (repomd.xml verified
    against its signature where it has one, every file it lists against its sha256), the packages dnf install asks
    for and what they require from the same repositories, the rest named."""
    u = rpm_upstream
    (tmp_path / "s").mkdir()
    made = build.create(inventory(u), [build.TargetSpec("alinux-3", "x86_64", "containerd", True),
                                       build.TargetSpec("ubuntu-22.04", "x86_64", "containerd", True)],
                        tmp_path / "b.tar.zst", tmp_path / "s", level=3)
    files = set(made.manifest.files)
    minor = KUBE.rsplit(".", 1)[0]
    rel = "150500.1.1"
    for name in ("kubelet", "kubeadm", "kubectl"):
        assert f"repos/kubernetes/v{minor}/rpm/x86_64/{name}-{KUBE}-{rel}.x86_64.rpm" in files
        assert f"repos/kubernetes/v{minor}/rpm/x86_64/{name}-{OLDER}-{rel}.x86_64.rpm" not in files
    assert f"repos/kubernetes/v{minor}/rpm/x86_64/cri-tools-{minor}.0-{rel}.x86_64.rpm" in files
    v, _, r = TOOLKIT.partition("-")
    assert f"repos/toolkit/stable/rpm/x86_64/nvidia-container-toolkit-{v}-{r}.x86_64.rpm" in files
    assert f"repos/containerd/rhel/8/x86_64/stable/Packages/containerd.io-{CONTAINERD}.el8.x86_64.rpm" in files
    for d in (f"kubernetes/v{minor}/rpm", "toolkit/stable/rpm/x86_64", "containerd/rhel/8/x86_64/stable"):
        assert {f"repos/{d}/repodata/repomd.xml", f"repos/{d}/repodata/primary.xml.gz",
                f"repos/{d}/repodata/filelists.xml.gz", f"repos/{d}/repodata/other.xml.gz"} <= files, d
    assert f"repos/kubernetes/v{minor}/rpm/repodata/repomd.xml.asc" in files  # signed: verified, kept
    assert "repos/containerd/rhel/gpg" in files and "repos/toolkit/gpgkey" in files
    # the Ubuntu target's from the same bundle; one Kubernetes version for both
    assert f"repos/kubernetes/v{minor}/deb/amd64/kubeadm_{KUBE}-1.1_amd64.deb" in files
    assert made.manifest.kubernetes == KUBE
    # (/bin/sh: rpmbuild's own requirement of a package with a shell script in it, as real packages have)
    assert made.os_packages["alinux-3 x86_64"] == sorted(
        ["/bin/sh", "conntrack", "container-selinux", "iptables", "libseccomp", "socat"]), made.os_packages
    assert verify(made.path).ok
    # the SBOM names each rpm by its purl
    sbom = json.loads(subprocess.run(f"zstd -dcq {made.path} | tar -xO sbom.spdx.json", shell=True, check=True,
                                     capture_output=True).stdout)
    purls = {r["referenceLocator"] for p in sbom["packages"] for r in p.get("externalRefs", [])}
    assert f"pkg:rpm/alinux/kubeadm@{KUBE}-{rel}?arch=x86_64" in purls, sorted(purls)[:5]


def test_a_repomd_its_key_did_not_sign_is_refused(rpm_upstream: Upstream, tmp_path: Path) -> None:
    u = rpm_upstream
    minor = KUBE.rsplit(".", 1)[0]
    asc = u.www / "kubernetes" / f"v{minor}" / "rpm" / "repodata" / "repomd.xml.asc"
    md = asc.with_name("repomd.xml")
    saved = md.read_bytes()
    try:
        md.write_bytes(saved.replace(b"<revision>", b"<revision>1"))
        (tmp_path / "s").mkdir()
        with pytest.raises(SourceError, match="its repomd.xml is not signed by the key"):
            build.create(inventory(u), [build.TargetSpec("alinux-3", "x86_64", "containerd", True)],
                         tmp_path / "b.tar.zst", tmp_path / "s", level=3)
    finally:
        md.write_bytes(saved)


def test_alibaba_cloud_linux_hosts_whose_driver_gpuk8s_manages_get_nvidias_driver_of_their_branch(
        rpm_upstream: Upstream, tmp_path: Path) -> None:
    """NVIDIA's RHEL 8 repository (install.driver_repo) copied for the branch the managed-driver hosts ask for:
    its open driver and what it requires of the same version (the module stream's view: another branch's packages
    and unrelated CUDA packages are left), fabric manager, the repodata with the module streams' modules.yaml; the
    DKMS modules' build needs (dkms from EPEL, the kernel's headers for each kernel the hosts run) named."""
    from gpuk8s.bundle.coverage import gaps
    from gpuk8s.driver import rules
    from tests.bundleupstream import DRIVER_RELEASES

    u = rpm_upstream
    branch = versions.drivers().default_branch
    other = next(b for b in DRIVER_RELEASES if b != branch)
    kernel = "5.10.134-16.1.al8.x86_64"
    inv_doc = json.loads(json.dumps({"cluster": {"kubernetes_version": KUBE, "cni": "calico"},
                                     "registry": {"mirror": u.mirror, "insecure_http": True},
                                     "install": u.install_section(),
                                     "hosts": [{"name": "cp-1", "address": "10.0.0.1", "role": "control-plane"},
                                               {"name": "gpu-1", "address": "10.0.0.2", "gpus": 8,
                                                "driver": {"manage": True}}]}))
    inv = loads(json.dumps(inv_doc))
    assert build.branches_of(inv) == (branch,)
    (tmp_path / "s").mkdir()
    # the inventory's branch, and another one for a later driver upgrade (bundle create --driver-branch)
    targets = build.with_branches(
        [build.TargetSpec("alinux-3", "x86_64", "containerd", True, (branch,), (kernel,))], (other,))
    made = build.create(inv, targets, tmp_path / "b.tar.zst", tmp_path / "s", level=3)
    files = set(made.manifest.files)
    carried = {f.rsplit("/", 1)[1] for f in files if f.startswith("repos/driver/x86_64/") and f.endswith(".rpm")}
    assert carried == {f"{n}-{DRIVER_RELEASES[b]}-1.el8.x86_64.rpm" for b in (branch, other) for n in (
        "nvidia-open", "nvidia-driver", "nvidia-driver-libs", "nvidia-kmod-common", "kmod-nvidia-open-dkms",
        rules.rhel_fabric_manager(b))} | {"egl-wayland-1.1.13-3.el8.x86_64.rpm"}, carried
    assert not any("cuda-toolkit" in f for f in files)
    # a package outside the module streams that the driver requires, from the same repository: carried
    assert "repos/driver/x86_64/egl-wayland-1.1.13-3.el8.x86_64.rpm" in files
    assert f"repos/driver/x86_64/{rules.CUDA_KEY}" in files and "repos/driver/x86_64/repodata/repomd.xml" in files
    assert any(f.startswith("repos/driver/x86_64/repodata/") and "modules" in f for f in files), sorted(files)
    assert {"dkms", "libglvnd", f"kernel-devel-{kernel}"} <= set(made.os_packages["alinux-3 x86_64"])
    target, = made.manifest.targets
    assert target.driver_branches == tuple(sorted((branch, other))) and target.kernels == ()
    assert any(r.role == "driver" and r.fingerprint == u.fingerprints["driver"] for r in made.manifest.repos)
    assert verify(made.path).ok

    # coverage: the branch is the bundle's, any kernel (DKMS builds on the host); another branch is named
    import dataclasses

    from gpuk8s.facts.model import OSInfo
    from tests.unit.test_checks import facts
    alinux = OSInfo("alinux", ("rhel", "fedora", "centos", "anolis"), "3", "Alibaba Cloud Linux 3", "rhel")
    f = dataclasses.replace(facts(kernel="5.10.999-1.al8.x86_64"), os=alinux)
    assert gaps(made.manifest, inv, {"cp-1": f, "gpu-1": f}) == []
    inv_doc["hosts"][1]["driver"]["branch"] = other
    assert gaps(made.manifest, loads(json.dumps(inv_doc)), {"cp-1": f, "gpu-1": f}) == []
    absent = next(b for b in versions.drivers().branches if b not in DRIVER_RELEASES)
    inv_doc["hosts"][1]["driver"]["branch"] = absent
    got = gaps(made.manifest, loads(json.dumps(inv_doc)), {"cp-1": f, "gpu-1": f})
    assert [(g.host, g.what) for g in got] == [("gpu-1", "driver-branch")], got
    assert f"driver branch {absent}" in got[0].message
    with pytest.raises(SourceError, match="not a driver branch gpuk8s installs"):
        build.with_branches(targets, ("999",))


def test_ubuntu_hosts_whose_driver_gpuk8s_manages_get_their_driver_from_ubuntus_archive(upstream: Upstream,
                                                                                        tmp_path: Path) -> None:
    """Ubuntu's archive (jammy-updates restricted) copied with its signature: what the driver steps of each managed
    host install (its branch's packages of its modules' flavour, its running kernel's precompiled modules) and what
    they depend on in the same archive; the InRelease verified with a keyring of several keys, by the pinned one;
    the kernel image named (the OS archive's)."""
    from gpuk8s.bundle.coverage import gaps
    from tests.unit.test_checks import facts

    u = upstream
    branch = versions.drivers().default_branch
    doc = {"cluster": {"kubernetes_version": KUBE, "cni": "calico"},
           "registry": {"mirror": u.mirror, "insecure_http": True}, "install": u.install_section(),
           "hosts": [{"name": "cp-1", "address": "10.0.0.1", "role": "control-plane"},
                     {"name": "gpu-1", "address": "10.0.0.2", "gpus": 8, "driver": {"manage": True}}]}
    inv = loads(json.dumps(doc))
    seen = {"cp-1": facts(), "gpu-1": facts(kernel=KERNEL)}
    targets = build.targets_from(inv, seen)
    (t,) = targets
    assert t.debs == (f"linux-modules-nvidia-{branch}-server-open-{KERNEL}",
                      f"nvidia-headless-no-dkms-{branch}-server-open", f"nvidia-utils-{branch}-server"), t.debs
    (tmp_path / "s").mkdir()
    made = build.create(inv, targets, tmp_path / "b.tar.zst", tmp_path / "s", level=3,
                        ubuntu_keyring=str(u.ubuntu_keyring))
    files = set(made.manifest.files)
    carried = {f.rsplit("/", 1)[1].split("_")[0] for f in files if f.startswith("repos/driver_apt/pool/")}
    assert carried == {f"linux-modules-nvidia-{branch}-server-open-{KERNEL}", f"nvidia-headless-no-dkms-{branch}-"
                       "server-open", f"nvidia-utils-{branch}-server", f"nvidia-kernel-common-{branch}-server",
                       f"libnvidia-compute-{branch}-server"}, carried  # not the other kernel's, not another branch
    assert "repos/driver_apt/dists/jammy-updates/InRelease" in files
    assert "repos/driver_apt/dists/jammy-updates/restricted/binary-amd64/Packages.xz" in files
    assert not [f for f in files if f.startswith("repos/driver_apt/") and f.endswith((".gpg", ".asc", ".key"))]
    assert f"linux-image-{KERNEL}" in made.os_packages["ubuntu-22.04 x86_64"]
    target, = made.manifest.targets
    assert (target.kernels, target.driver_branches) == ((KERNEL,), (branch,))
    assert any(r.role == "driver_apt" and r.fingerprint == u.fingerprints["ubuntu"] for r in made.manifest.repos)
    assert verify(made.path).ok
    assert gaps(made.manifest, inv, seen) == []
    got = gaps(made.manifest, inv, {**seen, "gpu-1": facts(kernel=OTHER_KERNEL)})
    assert [(g.host, g.what) for g in got] == [("gpu-1", "kernel")] and OTHER_KERNEL in got[0].message
    # exactly what the host installs: the same branch with the other modules' flavour is not covered
    proprietary = json.loads(json.dumps(doc))
    proprietary["hosts"][1]["driver"]["flavor"] = "proprietary"
    got = gaps(made.manifest, loads(json.dumps(proprietary)), seen)
    assert [(g.host, g.what) for g in got] == [("gpu-1", "driver-branch"), ("gpu-1", "kernel")], got
    assert got[0].message.endswith(f"lacks nvidia-headless-no-dkms-{branch}-server")  # utils: the same for both
    assert f"linux-modules-nvidia-{branch}-server-{KERNEL}" in got[1].message
    # an Ubuntu host's driver packages need its kernel: a declared Ubuntu target without one carries no driver,
    # nor do the branches of hosts read as Ubuntu make a declared RPM-family target carry one
    assert build.parse_target("ubuntu-22.04/x86_64", "containerd", branches=(branch,), inv=inv).branches == ()
    assert build.branches_of(inv, seen) == () and build.branches_of(inv, {}) == (branch,)
    # gpu-1 not reached, its kind and kernel declared: what its driver steps would install (open modules, flavor
    # auto, as preflight assumes for GPUs it cannot classify) for that kernel; covered once it is read
    declared = build.parse_target(f"ubuntu-22.04/x86_64/{KERNEL}", "containerd", branches=(branch,), inv=inv,
                                  facts={"cp-1": seen["cp-1"], "gpu-1": None})
    assert (declared.debs, declared.kernels, declared.branches) == (t.debs, (KERNEL,), (branch,)), declared
    (tmp_path / "s4").mkdir()
    made = build.create(inv, build.merge([build.targets_from(inv, {"cp-1": seen["cp-1"]})[0], declared]),
                        tmp_path / "e.tar.zst", tmp_path / "s4", level=3, ubuntu_keyring=str(u.ubuntu_keyring))
    assert (made.manifest.targets[0].kernels, made.manifest.targets[0].driver_branches) == ((KERNEL,), (branch,))
    assert gaps(made.manifest, inv, seen) == []
    with pytest.raises(SourceError, match="not OS-RELEASE/ARCH\\[/KERNEL\\]"):
        build.parse_target("ubuntu-22.04/x86_64/$(reboot)", "containerd")

    # the keyring's other key pinned: its Release is refused, naming the key that signed; no keyring: named
    doc["install"]["driver_apt_repo"]["key_fingerprint"] = u.fingerprints["ubuntu-2012"]
    (tmp_path / "s2").mkdir()
    with pytest.raises(SourceError, match=f"signed by {u.fingerprints['ubuntu']}, not by the pinned"):
        build.create(loads(json.dumps(doc)), targets, tmp_path / "c.tar.zst", tmp_path / "s2", level=3,
                     ubuntu_keyring=str(u.ubuntu_keyring))
    (tmp_path / "s3").mkdir()
    with pytest.raises(SourceError, match="no such keyring on this machine") as e:
        build.create(inv, targets, tmp_path / "d.tar.zst", tmp_path / "s3", level=3,
                     ubuntu_keyring=str(tmp_path / "none.gpg"))
    assert "apt-get install ubuntu-keyring" in e.value.remedy


def test_a_docker_target_gets_cri_dockerds_archive_checked_against_its_pin(upstream: Upstream,
                                                                          tmp_path: Path) -> None:
    """Docker hosts: cri-dockerd's release archive of the target's architecture (checked against
    install.cri_dockerd_sha256, as install checks it on the host), no containerd.io (Docker is the host's); a run
    from the bundle fetches it from the serving host; an archive whose sha256 is not the pin is refused."""
    from gpuk8s import versions
    from gpuk8s.bundle import site

    inv = inventory(upstream)
    staging = tmp_path / "s"
    staging.mkdir()
    made = build.create(inv, [build.TargetSpec("ubuntu-22.04", "x86_64", "docker", True)], tmp_path / "d.tar.zst",
                        staging, level=3)
    pin = versions.cri_dockerd()
    path = f"files/cri-dockerd/{pin.archive('amd64')}"
    assert made.manifest.files[path].sha256 == inv.install.cri_dockerd_sha256["amd64"]
    assert not any(f.startswith("repos/containerd/") for f in made.manifest.files)
    assert made.manifest.targets[0].runtime == "docker"
    served = site.served(inv, made.manifest, "10.0.0.1")
    assert served.install.cri_dockerd_url == "http://10.0.0.1:5480/files/cri-dockerd"
    assert served.install.cri_dockerd_sha256 == inv.install.cri_dockerd_sha256  # the pin stays
    wrong = inventory(upstream, cri_dockerd_sha256={"amd64": "0" * 64})
    (tmp_path / "w").mkdir()
    with pytest.raises(SourceError, match=f"{pin.archive('amd64')} has sha256 .*; its pin is 0000"):
        build.create(wrong, [build.TargetSpec("ubuntu-22.04", "x86_64", "docker", True)], tmp_path / "w.tar.zst",
                     tmp_path / "w", level=3)
