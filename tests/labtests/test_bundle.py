"""Air-gapped bundles on the lab (issue 44). `bundle verify -i`: whether a bundle covers each host, read over SSH as
preflight reads it. `bundle create` then `install --bundle` and `join --bundle` with every public source out of
reach: the bundle built on this machine from the internet its loopback serves (tests/bundleupstream.py: real
signed apt repositories, a real registry, skopeo), copied to the first control plane, served from there (the lab's
apt and containerd speak to it for real: the real gpg and gpgv on the real keys and signatures, each .deb fetched
and checked, each image's manifest asked for over HTTP), and every GPU schedulable."""

from __future__ import annotations

import base64
import json
import socket
import time
from pathlib import Path

import pytest
import yaml

from gpuk8s import versions
from tests.bundleupstream import DRIVER_RELEASES, Upstream, missing_tools
from tests.labtests import invariants
from tests.labtests.test_mirrors import PUBLIC
from tests.unit.test_bundle import good
from tests.unit.test_bundle_create import CONTAINERD, KUBE, TOOLKIT, all_images

FLEET = """
hosts:
  - {name: cp-1, role: control-plane}
  - {name: gpu-1, gpus: 2, driver: null, modules: [overlay, nouveau], driver_inventory: {manage: true}}
  - {name: al-1, os: alinux-3, gpus: 2}
"""


def test_bundle_verify_names_the_host_and_kernel_a_bundle_does_not_cover(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    inv = str(lab.inventory)
    kernel = lab.host("gpu-1").exec("uname -r").stdout.strip()
    branch = versions.drivers().default_branch
    asked = yaml.safe_load(lab.inventory.read_text())["cluster"]["kubernetes_version"]
    minor = versions.kubernetes_or_default(asked)
    ubuntu = {"os": "ubuntu-22.04", "arch": "x86_64", "runtime": "containerd", "kernels": ["5.4.0-1-generic"],
              "driver_branches": [branch]}
    bundle = good(tmp_path, kubernetes=minor.latest_patch, targets=[ubuntu])
    r = run_cli("bundle", "verify", str(bundle), "-i", inv, "-o", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    got = {(g["host"], g["what"]): g["message"] for g in json.loads(r.stdout)["coverage"]}
    assert set(got) == {("gpu-1", "kernel"), ("al-1", "target")}, got
    assert got["gpu-1", "kernel"].startswith(f"gpu-1: kernel {kernel}: the bundle has no driver modules for it")
    assert got["al-1", "target"].startswith("al-1: alinux-3 x86_64 with containerd: the bundle has no packages")

    alinux = {"os": "alinux-3", "arch": "x86_64", "runtime": "containerd"}
    whole = good(tmp_path, kubernetes=minor.latest_patch, targets=[{**ubuntu, "kernels": [kernel]}, alinux])
    r = run_cli("bundle", "verify", str(whole), "-i", inv)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "covers every host of the inventory" in r.stdout and "whole: 3 file(s)" in r.stdout


# the demo fleet (tests/lab/fleets/demo.yaml: one control plane, three GPU workers, Ubuntu 22.04, containerd), its
# control plane (the serving host) reached as a user whose sudo asks for a password (the bundle's copy streams
# through sudo's prompt), and an Alibaba Cloud Linux 3 GPU host that joins later with gpu-3
SUDO_PW = "Air-sudo-pw-57"
ENV = {"GPUK8S_LAB_SUDO_PASSWORD": SUDO_PW}
_DEMO = yaml.safe_load((Path(__file__).resolve().parents[1] / "lab" / "fleets" / "demo.yaml").read_text())
for _h in _DEMO["hosts"]:
    if _h["name"] == "cp-1":
        _h.update(sudo="password", sudo_password=SUDO_PW)
    if _h["name"] == "gpu-3":  # bare: its driver from the bundle's copy of Ubuntu's archive
        _h.update(driver=None, driver_inventory={"manage": True})
# al-1 is bare: gpuk8s installs its driver, from NVIDIA's RHEL 8 repository as the bundle carries it
_DEMO["hosts"].append({"name": "al-1", "os": "alinux-3", "gpus": 2, "driver": None,
                       "driver_inventory": {"manage": True}})
AIRGAP_FLEET = yaml.safe_dump(_DEMO, sort_keys=False)
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"


def _create(run_cli, tmp_path, site: dict, kube: str, name: str, *extra: str,
            kernels: tuple[str, ...] = ()) -> tuple[Path, dict, float]:
    """`bundle create` on the connected machine for Kubernetes `kube`: the site's inventory with its sources
    pointed at the internet as this machine's loopback serves it (tests/bundleupstream.py)."""
    minor = kube.rsplit(".", 1)[0]
    up = Upstream(tmp_path / f"upstream-{name}")
    older = f"{minor}.{int(kube.rsplit('.', 1)[1]) - 1}"
    toolkit = versions.install_defaults(minor)["toolkit_version"]
    up.build(kube, toolkit, CONTAINERD, older)
    up.build_rpm(kube, toolkit, CONTAINERD, older)
    up.build_ubuntu_driver(list(kernels))
    up.start()
    try:
        laptop = dict(site, cluster={**site["cluster"], "kubernetes_version": kube},
                      install={**site.get("install", {}), **up.install_section()},
                      registry={"mirror": up.mirror, "insecure_http": True})
        laptop_inv = tmp_path / f"laptop-{name}.yaml"
        laptop_inv.write_text(yaml.safe_dump(laptop, sort_keys=False))
        from gpuk8s.inventory.loader import load
        up.push(all_images(up, load(laptop_inv), kube))
        bundle = tmp_path / f"{name}.tar.zst"
        t0 = time.monotonic()
        r = run_cli("bundle", "create", "-i", str(laptop_inv), str(bundle), "-o", "json", "--ubuntu-keyring",
                    str(up.ubuntu_keyring), *extra, timeout=600)
        built = time.monotonic() - t0
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return bundle, json.loads(r.stdout), built
    finally:
        up.stop()


SERVED = "/var/lib/gpuk8s/bundle-sources/served"  # the sources as the last run from a bundle left them


def _sources(h) -> str:
    """Each package source file and hosts.toml of the host, with its mode and sha256."""
    return h.exec("for f in /etc/apt/sources.list.d/* /etc/yum.repos.d/* /etc/containerd/certs.d/*/hosts.toml; do "
                  "[ -f \"$f\" ] && echo \"$f $(stat -c %a \"$f\") $(sha256sum < \"$f\")\"; done; true").stdout


def _listening(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((address, port)) == 0


@pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(missing_tools())} (.ci/run installs them)")
def test_install_and_join_from_a_bundle_with_every_public_source_out_of_reach(lab_up, run_cli, tmp_path):
    cli = run_cli

    def run_cli(*args, **kw):  # noqa: F811 - every run with cp-1's sudo password
        return cli(*args, env=ENV, **kw)

    lab = lab_up(AIRGAP_FLEET)
    site = yaml.safe_load(lab.inventory.read_text())
    site["cluster"]["kubernetes_version"] = KUBE
    site["hosts"] = [h for h in site["hosts"] if h["name"] not in ("gpu-3", "al-1")]  # joined later
    inv = tmp_path / "site.yaml"
    inv.write_text(yaml.safe_dump(site, sort_keys=False))
    full = dict(site, hosts=yaml.safe_load(lab.inventory.read_text())["hosts"])
    full_inv = tmp_path / "site-full.yaml"
    full_inv.write_text(yaml.safe_dump(full, sort_keys=False))

    # the connected machine: the site's inventory, the internet as its loopback serves it; al-1's driver branch
    # and another one, for the driver upgrade planned below (--driver-branch); gpu-3's driver packages and its
    # kernel's modules from Ubuntu's archive
    branch = versions.drivers().default_branch
    later = max(DRIVER_RELEASES)
    assert later != branch
    kernel = lab.host("gpu-3").exec("uname -r").stdout.strip()
    bundle, made, built = _create(run_cli, tmp_path, full, KUBE, "site", "--driver-branch", later, kernels=(kernel,))
    assert made["targets"] == [
        {"os": "alinux-3", "arch": "x86_64", "runtime": "containerd", "kernels": [],
         "driver_branches": sorted([branch, later])},
        {"os": "ubuntu-22.04", "arch": "x86_64", "runtime": "containerd", "kernels": [kernel],
         "driver_branches": [branch]}], made
    assert made["coverage"] == [], made  # gpu-1 and gpu-2 bring their own drivers
    # every Ubuntu host has Ubuntu's archive keys (the ubuntu-keyring package): here, the stand-in archive's
    ring = base64.b64encode((tmp_path / "upstream-site" / "ubuntu-archive-keyring.gpg").read_bytes()).decode()
    for name in ("cp-1", "gpu-1", "gpu-2", "gpu-3"):
        lab.host(name).exec(f"echo {ring} | base64 -d > /usr/share/keyrings/ubuntu-archive-keyring.gpg")
    print(f"bundle: {made['bytes']} bytes, {made['files']} files, {made['images']} images, built in {built:.1f} s")

    # what each host's sources are before any run from the bundle: put back so when each run ends. gpu-1 has a
    # hosts.toml of the site's own (a run from the bundle replaces it, then puts it back, mode and all)
    mine = "/etc/containerd/certs.d/docker.io/hosts.toml"
    lab.host("gpu-1").exec(f"mkdir -p /etc/containerd/certs.d/docker.io && "
                           f"printf 'server = \"https://site\"\\n' > {mine} && chmod 0640 {mine}")
    before = {n: _sources(lab.host(n)) for n in ("cp-1", "gpu-1", "gpu-2", "gpu-3", "al-1")}
    assert mine in before["gpu-1"] and "/etc/apt/sources.list.d/kubernetes.list" not in before["cp-1"], before

    # the site: nothing public answers
    for h in lab.hosts.values():
        h.update_state(unreachable_hosts=PUBLIC)
    r = run_cli("bundle", "verify", str(bundle), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr

    # a corrupted copy is refused, the file named, before any host is contacted
    bad = tmp_path / "bad.tar.zst"
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    r = run_cli("install", "-i", str(inv), "--bundle", str(bad), "-o", "json")
    assert r.returncode == 1 and "bad.tar.zst" in r.stdout, r.stdout + r.stderr
    assert lab.host("cp-1").exec("test -e /var/lib/gpuk8s/bundle && echo there || echo none").stdout.strip() == "none"

    # a copy cut half-way by an earlier run: a part whose bytes are not the bundle's is removed and the run stops,
    # naming it; a part that is the bundle's beginning is gone on from (the first run below sends the rest only)
    import hashlib
    sha = hashlib.sha256(bundle.read_bytes()).hexdigest()
    lab.host("cp-1").exec("mkdir -p /var/lib/gpuk8s/bundle")  # through the host's mount, so its overlay sees it
    part = lab.host("cp-1").upper(f"/var/lib/gpuk8s/bundle/{sha}.tar.zst.part")
    half = bundle.stat().st_size // 2
    wrong = bytearray(bundle.read_bytes()[:half])
    wrong[10] ^= 1
    part.write_bytes(bytes(wrong))
    r = run_cli("install", "-i", str(inv), "--bundle", str(bundle), "-o", "json", timeout=900)
    assert r.returncode == 1, r.stdout[-3000:]
    assert r.stdout.strip(), r.stderr[-3000:]
    failed = next(p for p in json.loads(r.stdout)["phases"] if p["name"] == "bundle")
    assert f"not {sha}: it was removed, the next run copies it again" in failed["message"], failed
    assert not part.exists()
    part.write_bytes(bundle.read_bytes()[:half])

    t0 = time.monotonic()
    r = run_cli("install", "-i", str(inv), "--bundle", str(bundle), "-o", "json", timeout=900)
    seconds = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    served = next(p for p in rep["phases"] if p["name"] == "bundle")
    cp = lab.host("cp-1")
    address = next(h["address"] for h in site["hosts"] if h["name"] == "cp-1")
    assert served["status"] == "changed" and f"served from cp-1 at http://{address}:5480" in served["message"]
    assert f"copied {bundle.stat().st_size - half} bytes" in served["message"], served
    checks = {n["node"]: n for n in rep["nodes"]}
    assert checks["gpu-1"]["allocatable_gpus"] == 8 and checks["gpu-2"]["allocatable_gpus"] == 8, checks
    assert all(n["ok"] for n in checks.values()), checks
    print(f"install from the bundle, 3 hosts: {seconds:.1f} s")

    # what the hosts took came from the bundle: packages at its versions, fetched from the served copies
    for name in ("cp-1", "gpu-1", "gpu-2"):
        h = lab.host(name)
        # the run pointed its sources at the serving host (kept for the next run from a bundle), and put them
        # back as they were when it ended
        srcs = h.read(SERVED + "/etc/apt/sources.list.d/kubernetes.list")
        assert srcs and f"http://{address}:5480/repos/kubernetes/v{KUBE.rsplit('.', 1)[0]}/deb/ /" in srcs, srcs
        assert _sources(h) == before[name], (name, _sources(h), before[name])
        pkgs = h.state()["packages"]
        assert pkgs["kubeadm"] == f"{KUBE}-1.1" and pkgs["kubelet"] == f"{KUBE}-1.1", pkgs
        fetched = " ".join(" ".join(a) for a in h.commands())
        assert "apt-get" in fetched
    assert lab.host("gpu-1").state()["packages"]["nvidia-container-toolkit"] == TOOLKIT
    images = invariants.images_of(lab)
    assert images and all(i.startswith(f"{address}:5480/") for i in images), images
    # the invariants of the scenarios (tests/labtests/invariants.py), doctor included, on the inventory as the user
    # wrote it (doctor and status need no bundle: they read)
    invariants.all_hold(lab, run_cli, str(inv), {"gpu-1": {"nvidia.com/gpu": 8}, "gpu-2": {"nvidia.com/gpu": 8}},
                        set(), {"nvidia.com/gpu": 16})
    # the server ended with the run; the unpacked bundle stays for the next run
    assert not _listening(address, 5480)
    assert cp.exec("test -s /var/lib/gpuk8s/bundle/*/manifest.json && echo kept").stdout.strip() == "kept"

    # a re-run from the same bundle copies nothing and changes nothing
    r = run_cli("install", "-i", str(inv), "--bundle", str(bundle), "-o", "json", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    again = json.loads(r.stdout)
    assert "copied" not in next(p for p in again["phases"] if p["name"] == "bundle")["message"]
    assert not [p["name"] for p in again["phases"] if p["status"] == "changed"
                and p["name"] not in ("lock", "bundle", "kubeconfig")], again["phases"]
    # verify alone from the bundle (prepare only reads): the workers' sources are pointed all the same, so their
    # test pods pull from the serving host (gpu-2's image store emptied, as the kubelet's image GC would); put back
    lab.host("gpu-2").exec("rm -f /var/lib/gpuk8s-lab/pulled.json")
    r = run_cli("install", "-i", str(inv), "--bundle", str(bundle), "--only-phase", "verify", "-o", "json",
                timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert all(n["ok"] for n in json.loads(r.stdout)["nodes"]), r.stdout[-3000:]
    assert _sources(lab.host("gpu-2")) == before["gpu-2"]

    # day two: an Ubuntu and an Alibaba Cloud Linux host join from the same bundle (dnf reads its served copy)
    # (--keep-serving: the server and the hosts' sources outlive the run, until the next run from a bundle)
    r = run_cli("join", "gpu-3", "al-1", "-i", str(full_inv), "--bundle", str(bundle), "--keep-serving", "-o",
                "json", timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert "kept serving after the run" in next(p for p in json.loads(r.stdout)["phases"]
                                                if p["name"] == "bundle")["message"]
    assert _listening(address, 5480)
    nodes = json.loads(cp.exec(f"{KUBECTL} get nodes -o json").stdout)["items"]
    gpus = {n["metadata"]["name"]: n["status"]["allocatable"].get("nvidia.com/gpu") for n in nodes}
    assert gpus.get("gpu-3") == "4" and gpus.get("al-1") == "2", gpus
    assert lab.host("gpu-3").state()["packages"]["kubeadm"] == f"{KUBE}-1.1"
    # gpu-3's driver: its branch's open driver and its kernel's precompiled modules, fetched from the bundle's copy
    # of Ubuntu's archive (verified there with Ubuntu's keyring of the host), loaded
    g3 = lab.host("gpu-3")
    assert g3.read("/etc/apt/sources.list.d/gpuk8s-driver.list").strip() == (
        f"deb [signed-by=/usr/share/keyrings/ubuntu-archive-keyring.gpg] http://{address}:5480/repos/driver_apt "
        "jammy-updates restricted")
    modules = f"linux-modules-nvidia-{branch}-server-open-{kernel}"
    assert any(u.startswith(f"http://{address}:5480/repos/driver_apt/pool/restricted/{modules}_")
               for u in g3.state()["fetched"]), g3.state()["fetched"]
    assert f"Open Kernel Module for x86_64  {DRIVER_RELEASES[branch]}" in g3.exec(
        "cat /proc/driver/nvidia/version").stdout
    al = lab.host("al-1")
    assert al.state()["packages"]["kubeadm"] == f"{KUBE}-150500.1.1", al.state()["packages"]
    # read from the served repodata, each .rpm located there (the lab's dnf fetched and checked it)
    located = al.state()["dnf_files"][f"kubeadm={KUBE}-150500.1.1"][0]
    assert located.startswith(f"http://{address}:5480/repos/kubernetes/"), located
    # al-1's driver: NVIDIA's open driver of the inventory's branch, from the bundle's copy of NVIDIA's repository
    # (its key fetched from there and checked against the fingerprint the bundle recorded), built and loaded
    release = DRIVER_RELEASES[branch]
    assert f"http://{address}:5480/repos/driver/x86_64/nvidia-open-{release}-1.el8.x86_64.rpm" in \
        al.state()["fetched"], al.state()["fetched"]
    assert f"baseurl=http://{address}:5480/repos/driver/x86_64" in al.read("/etc/yum.repos.d/gpuk8s-cuda-rhel8.repo")
    assert al.read("/etc/pki/rpm-gpg/gpuk8s-cuda-rhel8.asc").startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert f"Open Kernel Module for x86_64  {release}" in al.exec("cat /proc/driver/nvidia/version").stdout
    planned = {"gpu-1": {"nvidia.com/gpu": 8}, "gpu-2": {"nvidia.com/gpu": 8}, "gpu-3": {"nvidia.com/gpu": 4},
               "al-1": {"nvidia.com/gpu": 2}}
    invariants.all_hold(lab, run_cli, str(full_inv), planned, set(), {"nvidia.com/gpu": 22})
    assert f"baseurl=http://{address}:5480/repos/kubernetes/" in al.read("/etc/yum.repos.d/kubernetes.repo")

    # day two: al-1's driver moved to another branch from the bundle (`driver upgrade --bundle`). A branch the
    # bundle does not hold is refused before the node is touched, naming it; the one it holds is installed
    def on_branch(b: str) -> tuple[dict, Path]:
        doc = dict(full, hosts=[dict(h, driver={"manage": True, "branch": b}) if h["name"] == "al-1" else h
                                for h in full["hosts"]])
        path = tmp_path / f"site-{b}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return doc, path

    missing = next(b for b in versions.drivers().branches if b not in (branch, later) and int(b) >= 535)
    r = run_cli("driver", "upgrade", "-i", str(on_branch(missing)[1]), "--bundle", str(bundle), "--dry-run", "-o",
                "json", timeout=900)  # the plan says what the run does: al-1 left as it is, nothing drained
    plan = next(p for p in json.loads(r.stdout)["plans"] if p["name"] == "driver-upgrade")
    assert plan["status"] == "unknown" and [c["what"] for c in plan["changes"]] == [
        f"al-1: driver branch {missing} (driver: manage): not in the bundle (it holds "
        f"{', '.join(sorted([branch, later]))} for alinux-3): al-1 is left as it was"], plan
    r = run_cli("driver", "upgrade", "-i", str(on_branch(missing)[1]), "--bundle", str(bundle), "--yes", "-o", "json",
                timeout=900)
    assert r.returncode != 0, r.stdout[-3000:]
    assert f"driver branch {missing}" in r.stdout and "al-1 was left as it was" in r.stdout, r.stdout[-3000:]
    assert release in al.exec("cat /proc/driver/nvidia/version").stdout
    # that run ended the server the join kept, and put every host's sources back as they were before the join
    assert not _listening(address, 5480)
    assert _sources(g3) == before["gpu-3"] and _sources(al) == before["al-1"], (_sources(g3), _sources(al))
    assert not next(n for n in json.loads(cp.exec(f"{KUBECTL} get nodes -o json").stdout)["items"]
                    if n["metadata"]["name"] == "al-1")["spec"].get("unschedulable")
    full, later_inv = on_branch(later)
    r = run_cli("driver", "upgrade", "-i", str(later_inv), "--bundle", str(bundle), "--yes", "-o", "json",
                "--no-test-pods", timeout=900)  # the GPUs proven by the invariants below
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    loaded = al.exec("cat /proc/driver/nvidia/version").stdout
    assert f"Open Kernel Module for x86_64  {DRIVER_RELEASES[later]}" in loaded, loaded
    assert f"http://{address}:5480/repos/driver/x86_64/nvidia-open-{DRIVER_RELEASES[later]}-1.el8.x86_64.rpm" in \
        al.state()["fetched"]
    full_inv = later_inv
    invariants.all_hold(lab, run_cli, str(full_inv), planned, set(), {"nvidia.com/gpu": 22})

    # an upgrade of one minor from a second bundle (the next minor's, built the same way)
    nxt = versions.kubernetes_or_default(
        f"1.{int(KUBE.split('.')[1]) + 1}").latest_patch if f"1.{int(KUBE.split('.')[1]) + 1}" in \
        versions.supported_minors() else None
    if nxt is None:
        return  # the matrix's newest minor: nothing to upgrade to (said in docs/airgap.md)
    second, _, _ = _create(run_cli, tmp_path, full, nxt, "next", kernels=(kernel,))
    r = run_cli("upgrade", "-i", str(full_inv), "--bundle", str(second), "--yes", "-o", "json", timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert any(p["name"] == "bundle" and p["status"] == "changed" for p in rep["phases"]), rep["phases"]
    for name in ("cp-1", "gpu-1", "gpu-2", "gpu-3"):
        assert lab.host(name).state()["packages"]["kubelet"] == f"{nxt}-1.1", name
    assert lab.host("al-1").state()["packages"]["kubelet"] == f"{nxt}-150500.1.1"
    nodes = json.loads(cp.exec(f"{KUBECTL} get nodes -o json").stdout)["items"]
    assert {n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"] for n in nodes} == {
        n: f"v{nxt}" for n in ("cp-1", "gpu-1", "gpu-2", "gpu-3", "al-1")}
    assert all(not n["spec"].get("unschedulable") for n in nodes)
    invariants.all_hold(lab, run_cli, str(full_inv), planned, set(), {"nvidia.com/gpu": 22})
    # the serving host keeps one bundle: the first one's unpacked copy went when the second was unpacked
    second_sha = hashlib.sha256(second.read_bytes()).hexdigest()
    kept = set(cp.exec("ls /var/lib/gpuk8s/bundle").stdout.split())
    assert kept == {second_sha, f"{second_sha}.lock"}, kept


def test_install_preflight_refuses_a_bundle_that_lacks_a_hosts_kernel(lab_up, run_cli, tmp_path):
    """A managed-driver host whose kernel the bundle has no modules for: install's preflight names it and its
    kernel (bundle.coverage), before anything of the host changes; a whole bundle file stands in (its packages
    are never reached: the host is refused first)."""
    lab = lab_up(FLEET)
    kernel = lab.host("gpu-1").exec("uname -r").stdout.strip()
    site = yaml.safe_load(lab.inventory.read_text())
    site["hosts"] = [h for h in site["hosts"] if h["name"] != "al-1"]
    inv = tmp_path / "site.yaml"
    inv.write_text(yaml.safe_dump(site, sort_keys=False))
    minor = versions.kubernetes_or_default(site["cluster"]["kubernetes_version"])
    ubuntu = {"os": "ubuntu-22.04", "arch": "x86_64", "runtime": "containerd", "kernels": ["5.4.0-1-generic"],
              "driver_branches": [versions.drivers().default_branch]}
    bundle = good(tmp_path, kubernetes=minor.latest_patch, targets=[ubuntu])
    r = run_cli("install", "-i", str(inv), "--bundle", str(bundle), "--dry-run", "-o", "json", timeout=600)
    rep = json.loads(r.stdout)
    hosts = {h["name"]: h for h in rep["prepare"]["hosts"]}
    assert hosts["gpu-1"]["status"] == "blocked", hosts["gpu-1"]
    assert "bundle.coverage" in hosts["gpu-1"]["message"] and f"kernel {kernel}" in hosts["gpu-1"]["message"]
    assert hosts["cp-1"]["status"] != "blocked", hosts["cp-1"]
