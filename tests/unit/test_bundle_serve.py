"""The bundle server (gpuk8s/data/bundle_serve.py) with real clients on loopback: the real apt-get reads every
repository the bundle carries (flat ones and Docker's dists/ with a detached signature), verifies their
signatures with the keys the manifest pins and downloads the packages; the real skopeo pulls images through the
OCI distribution API (kubeadm's names without a registry, containerd's `ns`); nothing outside the repositories
and the manifests is served; the server ends when its stdin ends."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s import versions
from gpuk8s.bundle import create as build
from gpuk8s.bundle.aptsource import TOOLKIT_PKGS
from gpuk8s.phases.bundle import READY, server_source
from tests.bundleupstream import Upstream, free_port, missing_tools
from tests.unit.test_bundle_create import CONTAINERD, KERNEL, KUBE, OLDER, TOOLKIT, all_images, inventory

BRANCH = versions.drivers().default_branch
DRIVER_DEBS = (f"nvidia-headless-no-dkms-{BRANCH}-server-open", f"nvidia-utils-{BRANCH}-server",
               f"linux-modules-nvidia-{BRANCH}-server-open-{KERNEL}")

pytestmark = pytest.mark.skipif(bool(missing_tools()) or not Path("/usr/bin/apt-get").exists(),
                                reason=f"needs apt-get and {', '.join(missing_tools()) or 'nothing else'} (.ci/run)")


@contextlib.contextmanager
def serving(bundle: Path, into: Path) -> Iterator[int]:
    """`bundle` unpacked into `into` and served on loopback by the bundle server, as the serving host runs it: its
    port; the server ends when its stdin does (checked)."""
    into.mkdir()
    subprocess.run(f"zstd -dcq {bundle} | tar -x -C {into}", shell=True, check=True)
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", server_source(), str(into), "127.0.0.1", str(port)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().decode().strip() == READY
        yield port
    finally:
        assert p.stdin is not None
        p.stdin.close()
        assert p.wait(10) == 0  # its stdin ended: so did it


def test_a_kept_server_serves_until_its_file_is_gone(tmp_path: Path) -> None:
    """--keep-serving: `--while FILE` serves with its stdin closed, and ends within seconds of FILE's removal."""
    (tmp_path / "b" / "manifests").mkdir(parents=True)
    (tmp_path / "b" / "manifests" / "calico.yaml").write_text("kind: List\n")
    keep = tmp_path / "serving"
    keep.touch()
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", server_source(), str(tmp_path / "b"), "127.0.0.1", str(port),
                          "--while", str(keep)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().decode().strip() == READY
        time.sleep(1.5)  # its stdin ended at once: it serves on
        got = urllib.request.urlopen(f"http://127.0.0.1:{port}/manifests/calico.yaml", timeout=5).read()
        assert got == b"kind: List\n" and p.poll() is None
        keep.unlink()
        assert p.wait(5) == 0
    finally:
        p.kill()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, build.Created]]:
    root = tmp_path_factory.mktemp("served")
    u = Upstream(root / "upstream")
    u.build(KUBE, TOOLKIT, CONTAINERD, OLDER)
    u.build_ubuntu_driver([KERNEL])
    u.start()
    try:
        u.push(all_images(u))
        (root / "b").mkdir()
        (root / "s").mkdir()
        # with a managed-driver host's packages from Ubuntu's archive (what its driver steps install)
        made = build.create(inventory(u), [build.TargetSpec("ubuntu-22.04", "x86_64", "containerd", True, (BRANCH,),
                                                            (KERNEL,), DRIVER_DEBS)],
                            root / "b" / "b.tar.zst", root / "s", level=3, ubuntu_keyring=str(u.ubuntu_keyring))
    finally:
        u.stop()
    with serving(made.path, root / "unpacked") as port:
        yield f"127.0.0.1:{port}", root, made


def _apt(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    for d in ("state/lists/partial", "cache/archives/partial", "etc/preferences.d", "etc/apt.conf.d", "dl"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "status").touch()
    opts = [f"Dir::Etc={root}/etc", f"Dir::Etc::SourceList={root}/sources.list", "Dir::Etc::SourceParts=-",
            f"Dir::State={root}/state", f"Dir::State::status={root}/status", f"Dir::Cache={root}/cache",
            "APT::Architecture=amd64", "Debug::NoLocking=1", "Acquire::Retries=0", "APT::Sandbox::User=root"]
    return subprocess.run(["apt-get", "-q", *[x for o in opts for x in ("-o", o)], *args], capture_output=True,
                          text=True, cwd=root / "dl", timeout=120)


def test_the_real_apt_reads_verifies_and_downloads_from_the_served_repositories(served: tuple[str, Path,
                                                                                         build.Created]) -> None:
    where, root, made = served
    apt = root / "apt"
    keys = {"kubernetes": f"v{KUBE.rsplit('.', 1)[0]}/deb/Release.key", "toolkit": "gpgkey",
            "containerd": "ubuntu/gpg"}
    rings = {}
    for role, key in keys.items():
        rings[role] = apt / f"{role}.gpg"
        apt.mkdir(exist_ok=True)
        data = urllib.request.urlopen(f"http://{where}/repos/{role}/{key}").read()
        subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(rings[role])], input=data, check=True)
    base = f"http://{where}/repos"
    minor = KUBE.rsplit(".", 1)[0]
    # the playbooks' own source lines (playbooks/kubernetes-prerequisites.yaml, nvidia-container-toolkit.yaml,
    # _shared.yaml docker-apt-source), with the served URLs
    # and the driver's (playbooks/nvidia-driver.yaml driver-apt-source), verified with the Ubuntu keyring the hosts
    # have: a keyring of several keys
    ubuntu = root / "upstream" / "ubuntu-archive-keyring.gpg"
    (apt / "sources.list").write_text(
        f"deb [signed-by={rings['kubernetes']}] {base}/kubernetes/v{minor}/deb/ /\n"
        f"deb [signed-by={rings['toolkit']}] {base}/toolkit/stable/deb/$(ARCH) /\n"
        f"deb [signed-by={rings['containerd']}] {base}/containerd/ubuntu jammy stable\n"
        f"deb [signed-by={ubuntu}] {base}/driver_apt jammy-updates restricted\n")
    r = _apt(apt, "update")
    assert r.returncode == 0 and "W:" not in r.stderr and "E:" not in r.stderr, r.stdout + r.stderr
    # Docker's Release says Acquire-By-Hash: the bundle holds its indexes by every hash Release lists (apt asks
    # by the strongest: SHA512)
    assert any(f.startswith("repos/containerd/ubuntu/dists/jammy/stable/binary-amd64/by-hash/SHA512/")
               for f in made.manifest.files), sorted(made.manifest.files)
    want = [f"kubeadm={KUBE}-1.1", f"kubelet={KUBE}-1.1", f"containerd.io={CONTAINERD}~ubuntu.22.04~jammy",
            *[f"{p}={TOOLKIT}" for p in TOOLKIT_PKGS], *DRIVER_DEBS]
    r = _apt(apt, "download", *want)
    assert r.returncode == 0, r.stdout + r.stderr
    got = sorted(p.name for p in (apt / "dl").glob("*.deb"))
    assert len(got) == len(want) and f"kubeadm_{KUBE}-1.1_amd64.deb" in got, got
    # a key other than the repository's: apt refuses the repository
    (apt / "sources.list").write_text(f"deb [signed-by={rings['toolkit']}] {base}/kubernetes/v{minor}/deb/ /\n")
    r = _apt(apt, "update")
    assert "NO_PUBKEY" in r.stdout + r.stderr or "not signed" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_real_skopeo_pulls_every_image_by_the_names_the_cluster_asks_for(served: tuple[str, Path,
                                                                                        build.Created]) -> None:
    where, root, made = served
    # kubeadm's (imageRepository: the server), coredns by kubeadm's name for it; gpuk8s's (the mirror's names);
    # through containerd's mirror request (?ns=) the registry's name is kept
    for ref in (f"kube-apiserver:v{KUBE}", "coredns:v1.11.3", "nvidia/k8s-device-plugin:" +
                next(i for i in made.manifest.images if "k8s-device-plugin" in i).rsplit(":", 1)[1],
                "calico/node:v3.28.0"):
        r = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{where}/{ref}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (ref, r.stderr)
        assert '"schemaVersion": 2' in r.stdout or '"schemaVersion":2' in r.stdout
    r = subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{where}/pause:3.10.1",
                        f"oci:{root}/pulled:pause"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    req = urllib.request.Request(f"http://{where}/v2/pause/manifests/3.10.1?ns=registry.k8s.io", method="HEAD")
    assert urllib.request.urlopen(req).status == 200
    layer = next(f.rsplit("/", 1)[1] for f, e in made.manifest.files.items()
                 if f.startswith("images/blobs/") and e.size > 4000)  # a layer (the stand-in's: 4 KB of noise)
    for missing in ("pause/manifests/9.9", "nothere/manifests/v1", "pause/blobs/sha256:" + "0" * 64,
                    f"pause/manifests/sha256:{layer}"):  # a blob that is no manifest is not served as one
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{where}/v2/{missing}")
        assert e.value.code == 404


@pytest.mark.parametrize("path", ["/manifest.json", "/images/index.json", "/repos/../manifest.json",
                                  "/repos/kubernetes/%2e%2e/%2e%2e/manifest.json", "/repos/", "/sbom.spdx.json",
                                  "/repos/kubernetes/..%2f..%2fmanifest.json", "/etc/passwd", "/v2/../manifest.json",
                                  "/files/../manifest.json", "/files/%2e%2e/sbom.spdx.json", "/wheel/"])
def test_nothing_but_the_repositories_and_manifests_is_served(served: tuple[str, Path, build.Created],
                                                              path: str) -> None:
    where, _, _ = served
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{where}{path}")
    assert e.value.code in (400, 404)


def test_the_bundle_scripts_render_and_parse() -> None:
    """The serving host's commands (playbooks/cluster/bundle-*.sh): rendered with hostile-looking values, each
    value one quoted word, and `sh -n` takes them."""
    from gpuk8s.phases import shell

    values = {"sha256": "a" * 64, "size": 123, "offset": 0, "address": "10.0.0.1", "port": 5480,
              "server": "print('x'); $(reboot) `id`"}
    for name, keep in (("bundle-state", False), ("bundle-append", False), ("bundle-unpack", False),
                       ("bundle-serve", False), ("bundle-serve", True)):
        text = shell.command(name, keep=keep, **values)
        r = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)
    files = ["/etc/apt/sources.list.d/kubernetes.list", "/etc/containerd/certs.d/[fd00::1]:5480/hosts.toml",
             "/etc/x y/$(reboot)"]
    for mode, serving in (("in", True), ("in", False), ("out", False)):
        text = shell.command("bundle-sources", mode=mode, files=files, serving=serving)
        r = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, (mode, r.stderr)
    assert "gk_copy '/etc/x y/$(reboot)' \"$d/before\"" in shell.command("bundle-sources", mode="in", files=files,
                                                                         serving=True)
    serve = shell.command("bundle-serve", keep=False, **values)
    assert "'print('\"'\"'x'\"'\"'); $(reboot) `id`'" in serve  # one single-quoted word


@pytest.mark.skipif(not Path("/usr/bin/dnf").exists() or bool(missing_tools(rpm=True)),
                    reason="needs dnf, rpmbuild, createrepo_c, cpio (apt-get install dnf rpm createrepo-c cpio; "
                           ".ci/run does)")
def test_the_real_dnf_reads_and_verifies_a_served_rpm_repository(tmp_path: Path) -> None:
    """An Alibaba Cloud Linux target's Kubernetes repository, served: the real dnf imports the key the bundle
    carries, verifies repomd.xml against its signature (repo_gpgcheck=1), reads primary.xml and names the
    package's location, which the server serves; a package the bundle does not carry is not there."""
    u = Upstream(tmp_path / "up")
    u.build(KUBE, TOOLKIT, CONTAINERD, OLDER)
    u.build_rpm(KUBE, TOOLKIT, CONTAINERD, OLDER)
    u.start()
    try:
        u.push(all_images(u))
        (tmp_path / "s").mkdir()
        made = build.create(inventory(u), [build.TargetSpec("alinux-3", "x86_64", "containerd", True)],
                            tmp_path / "b.tar.zst", tmp_path / "s", level=3)
    finally:
        u.stop()
    x = tmp_path / "x"
    with serving(made.path, x) as port:
        minor = KUBE.rsplit(".", 1)[0]
        base = f"http://127.0.0.1:{port}/repos/kubernetes/v{minor}/rpm"
        root = tmp_path / "root"
        (root / "etc" / "yum.repos.d").mkdir(parents=True)
        key = x / f"repos/kubernetes/v{minor}/rpm/repodata/repomd.xml.key"
        (root / "etc" / "yum.repos.d" / "kubernetes.repo").write_text(
            f"[kubernetes]\nname=Kubernetes\nbaseurl={base}/\nenabled=1\ngpgcheck=1\nrepo_gpgcheck=1\n"
            f"gpgkey=file://{key}\n")
        r = subprocess.run(["dnf", "-y", "-q", "--installroot", str(root), "--releasever", "8", "--forcearch", "x86_64",
                            f"--setopt=reposdir={root / 'etc' / 'yum.repos.d'}", "repoquery", "--qf",
                            "%{name}-%{version}-%{release} %{location}", "kubeadm"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        where = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith("kubeadm-"))
        rel = "150500.1.1"
        assert set(where) == {f"kubeadm-{KUBE}-{rel}", f"kubeadm-{OLDER}-{rel}"}, r.stdout
        assert urllib.request.urlopen(f"{base}/{where[f'kubeadm-{KUBE}-{rel}']}").status == 200
        with pytest.raises(urllib.error.HTTPError):  # the publisher's index names it; the bundle need not carry it
            urllib.request.urlopen(f"{base}/{where[f'kubeadm-{OLDER}-{rel}']}")
        # a repomd.xml its key did not sign: dnf refuses the repository
        md = x / f"repos/kubernetes/v{minor}/rpm/repodata/repomd.xml"
        md.write_bytes(md.read_bytes().replace(b"<revision>", b"<revision>9"))
        r = subprocess.run(["dnf", "-y", "-q", "--installroot", str(root), "--releasever", "8", "--forcearch", "x86_64",
                            f"--setopt=reposdir={root / 'etc' / 'yum.repos.d'}", "--refresh", "repoquery", "kubeadm"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 or f"kubeadm-{KUBE}" not in r.stdout, r.stdout + r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not Path("/etc/containerd").is_dir(),
                    reason="needs root, unshare and /etc/containerd (Debian's containerd, .ci/run installs it): the "
                           "script's own paths are mounted over in a mount namespace")
def test_a_hosts_sources_are_put_back_as_they_were_and_a_cut_run_keeps_how_they_were(tmp_path: Path) -> None:
    """bundle-sources.sh run for real, with /etc/apt/sources.list.d, /etc/containerd and /var/lib empty tmpfs
    mounts of a mount namespace of its own: `in` keeps each file as it was and puts the last run's
    served copy in place; `out` keeps what the run left and puts back what was (mode and all, a file that was
    absent removed); a run cut before its `out` leaves its copy of how the files were, which the next run keeps."""
    from gpuk8s.phases import shell

    apt, toml = "/etc/apt/sources.list.d/kubernetes.list", "/etc/containerd/certs.d/10.0.0.1:5480/hosts.toml"
    mine = "/etc/containerd/certs.d/docker.io/hosts.toml"
    files = [apt, toml, mine]
    script = tmp_path / "steps.sh"
    run_in = shell.command("bundle-sources", mode="in", files=files, serving=True)
    run_out = shell.command("bundle-sources", mode="out", files=files, serving=True)
    (tmp_path / "in.sh").write_text(run_in)
    (tmp_path / "out.sh").write_text(run_out)
    state = "for f in {}; do if [ -e $f ]; then echo \"$f $(stat -c %a $f) $(cat $f)\"; else echo \"$f -\"; fi; " \
            "done; echo ==".format(" ".join(files))
    serve = f"printf 'served\\n' > {apt}; mkdir -p {toml.rsplit('/', 1)[0]}; printf 'plain\\n' > {toml}; " \
            f"printf 'bundle\\n' > {mine}"
    script.write_text("set -e\n" + "\n".join([
        "for d in /etc/apt/sources.list.d /etc/containerd /var/lib; do mount -t tmpfs none $d; done",
        f"mkdir -p /etc/containerd/certs.d/docker.io; printf 'site\\n' > {mine}; chmod 0640 {mine}",
        state,
        f"sh {tmp_path}/in.sh", serve, state,  # the first run: nothing served before; the playbooks write
        f"sh {tmp_path}/out.sh", state,  # put back
        f"sh {tmp_path}/in.sh", state,  # the next run finds what the last one left
        f"sh {tmp_path}/in.sh", "printf 'changed\\n' > " + apt,  # cut: no out; then a run again
        f"sh {tmp_path}/in.sh", state,
        f"sh {tmp_path}/out.sh", state,
        "ls -a /var/lib/gpuk8s/bundle-sources",
    ]) + "\n")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", str(script)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    states = r.stdout.split("==\n")
    first = f"{apt} -\n{toml} -\n{mine} 640 site\n"
    assert states[0] == first
    assert states[1] == f"{apt} 644 served\n{toml} 644 plain\n{mine} 640 bundle\n"
    assert states[2] == first  # put back as it was, mode and all; what was absent removed
    assert states[3] == states[1]  # the next run from a bundle finds what the last one left: nothing to change
    assert states[4] == states[1]  # after the cut run, the next one puts the last whole run's copies in place
    assert states[5] == first  # how they were before the cut run, not what it left
    assert states[6].split() == [".", "..", "lock", "served"]  # nothing of before/ left
