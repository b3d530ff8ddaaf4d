"""gpuk8s install on Docker hosts: cri-dockerd installed from its release archive (sha256 checked), kubeadm pointed
at its socket, every GPU schedulable, and a second run that changes nothing."""

from __future__ import annotations

import hashlib
import json

import yaml

from gpuk8s import versions
from tests.labtests.test_install import changing_calls

PIN = versions.cri_dockerd()
MINOR = versions.default_minor()
FLEET = f"""
defaults:
  runtime: docker
  runtime_version: "24.0.7"
cluster:
  container_runtime: docker
  kubernetes_version: "{MINOR}"
hosts:
  - name: cp-1
    role: control-plane
  - name: gpu-1
    gpus: 4
  - name: gpu-2
    os: alinux-3
    gpus: 2
"""
SOCKET = "/var/run/cri-dockerd.sock"


def lab_archive_sha256(lab) -> str:
    """The sha256 of the archive the lab serves in place of cri-dockerd's release (the lab's hosts are x86_64)."""
    from tests.lab.lab import _fake_module

    return hashlib.sha256(_fake_module().cri_dockerd_archive(PIN.version, "amd64", lab.root)).hexdigest()


def set_sha256(lab, sha256: dict[str, str] | None) -> None:
    """install.cri_dockerd_sha256 of the lab's inventory (which pins the lab's archive); None: the matrix's pin."""
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["install"].pop("cri_dockerd_sha256", None)
    if sha256 is not None:
        inv["install"]["cri_dockerd_sha256"] = sha256
    lab.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))


def install(run_cli, lab, tmp_path, *args: str):
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "admin"),
                *args)
    assert r.stdout, r.stderr
    return r, json.loads(r.stdout)


def test_docker_install_sets_up_cri_dockerd_and_every_gpu_is_schedulable(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    assert yaml.safe_load(lab.inventory.read_text())["install"]["cri_dockerd_sha256"]["amd64"] == lab_archive_sha256(
        lab) != PIN.sha256["amd64"]

    # the archive the lab serves is not the real release: with the matrix's sha256 nothing is unpacked
    set_sha256(lab, None)
    r, rep = install(run_cli, lab, tmp_path, "--prepare-only")
    assert r.returncode != 0
    hosts = {h["name"]: h for h in rep["hosts"]}
    for name in ("cp-1", "gpu-1", "gpu-2"):
        assert hosts[name]["status"] == "failed", hosts[name]
        assert "cri-dockerd-binary" in hosts[name]["message"] and f"not the pinned {PIN.sha256['amd64']}" in hosts[
            name]["message"], hosts[name]["message"]
        assert lab.host(name).read("/usr/local/bin/cri-dockerd") is None

    # pinned to the lab's archive (as a mirror of a rebuilt release would be): the whole install
    set_sha256(lab, {"amd64": lab_archive_sha256(lab)})
    r, rep = install(run_cli, lab, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert rep["ok"] and rep["changed"]
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert nodes["gpu-1"]["allocatable_gpus"] == 4 and nodes["gpu-2"]["allocatable_gpus"] == 2
    assert all(n["ok"] and n["ready"] for n in nodes.values()), nodes

    for name in ("cp-1", "gpu-1", "gpu-2"):
        h = lab.host(name)
        assert h.exec("/usr/local/bin/cri-dockerd --version").stdout.startswith(f"cri-dockerd {PIN.version} (")
        assert h.exec(f"test -S {SOCKET} && systemctl is-active cri-docker.socket cri-docker.service "
                      "&& systemctl is-enabled cri-docker.socket cri-docker.service", check=False).returncode == 0
        # cri-dockerd runs with the CNI plugin and the pause image of this node's kubeadm
        pause = [ln for ln in h.exec("kubeadm config images list --kubernetes-version \"$(kubeadm version -o short)\""
                                     ).stdout.splitlines() if "/pause:" in ln]
        assert len(pause) == 1
        dropin = h.read("/etc/systemd/system/cri-docker.service.d/10-gpuk8s.conf") or ""
        assert f"--network-plugin=cni --pod-infra-container-image={pause[0]}\n" in dropin
        assert "ListenStream=%t/cri-dockerd.sock" in (h.read("/etc/systemd/system/cri-docker.socket") or "")
        daemon = json.loads(h.read("/etc/docker/daemon.json") or "{}")
        assert "native.cgroupdriver=systemd" in daemon["exec-opts"]
        assert (daemon.get("default-runtime") == "nvidia") == (name != "cp-1")  # control planes have no GPUs
    # the archive came from the release URL of the pin, once per host
    fetched = [a for a in lab.host("gpu-1").commands() if a[0] == "curl" and any("cri-dockerd" in x for x in a)]
    assert len(fetched) == 2 and fetched[-1][-1] == f"{PIN.url}/{PIN.archive('amd64')}"

    # a second run changes nothing and calls nothing that changes a host
    before = {name: len(h.commands()) for name, h in lab.hosts.items()}
    r2, rep2 = install(run_cli, lab, tmp_path)
    assert r2.returncode == 0 and rep2["ok"] and not rep2["changed"], r2.stdout
    assert {p["name"]: p["status"] for p in rep2["phases"]}["prepare"] == "unchanged"
    for name, h in lab.hosts.items():
        assert changing_calls(h.commands()[before[name]:]) == [], name

    # the socket gone (cri-docker.socket stopped): install notices and starts it again
    g = lab.host("gpu-2")
    g.exec("systemctl stop cri-docker.socket")
    assert g.exec(f"test -S {SOCKET}", check=False).returncode != 0
    r3, rep3 = install(run_cli, lab, tmp_path)
    assert r3.returncode == 0 and rep3["ok"], r3.stdout
    assert g.exec(f"test -S {SOCKET}", check=False).returncode == 0


def test_kubeadm_refuses_a_cri_dockerd_socket_that_is_not_there(lab_up, run_cli, tmp_path):
    """The lab's kubeadm honours the criSocket gpuk8s gives it: without cri-dockerd, init fails as real kubeadm does."""
    lab = lab_up(FLEET.replace("  - name: gpu-2\n    os: alinux-3\n    gpus: 2\n", ""))
    r, rep = install(run_cli, lab, tmp_path, "--prepare-only")
    assert r.returncode == 0, r.stdout
    cp = lab.host("cp-1")
    # without a criSocket, kubeadm finds two endpoints on a Docker host whose containerd runs: it refuses to guess
    cp.exec("systemctl start containerd")
    res = cp.exec("kubeadm init", check=False)
    assert res.returncode == 1 and ("found multiple CRI endpoints on the host. Please define which one do you wish "
                                    "to use by setting the 'criSocket' field in the kubeadm configuration file: "
                                    f"unix:///var/run/containerd/containerd.sock, unix://{SOCKET}") in res.stderr
    cp.exec("systemctl stop cri-docker.socket")
    cfg = ("apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nnodeRegistration:\n"
           f"  criSocket: unix://{SOCKET}\n")
    cp.write("/root/init.yaml", cfg)
    res = cp.exec("kubeadm init --config /root/init.yaml", check=False)
    assert res.returncode == 1
    assert (f"validate CRI v1 runtime API for endpoint \"unix://{SOCKET}\": rpc error: code = Unavailable desc = "
            f"connection error: desc = \"transport: Error while dialing: dial unix {SOCKET}: connect: no such file "
            "or directory\"") in res.stderr
    assert "[preflight] Some fatal errors occurred" in res.stderr
