"""gpuk8s on Docker hosts: what cri-dockerd runs with (checked by the docker-mps scenario after its install,
tests/labtests/test_scenarios.py, which also checks the release archive's sha256, a re-run that changes nothing and
a stopped socket started again), and kubeadm against a cri-dockerd socket that is not there."""

from __future__ import annotations

import hashlib
import json

from gpuk8s import versions

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


def install(run_cli, lab, tmp_path, *args: str):
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "admin"),
                *args)
    assert r.stdout, r.stderr
    return r, json.loads(r.stdout)


def cri_dockerd_as_planned(h, gpus: bool) -> None:
    """cri-dockerd on `h` as install leaves it: the pinned version, its socket and service active and enabled,
    running with the CNI plugin and the pause image of this node's kubeadm; Docker with systemd's cgroup driver and,
    on a GPU node, nvidia as its default runtime. (Install, re-run and repair on Docker hosts: the docker-mps
    scenario, tests/labtests/test_scenarios.py.)"""
    assert h.exec("/usr/local/bin/cri-dockerd --version").stdout.startswith(f"cri-dockerd {PIN.version} (")
    assert h.exec(f"test -S {SOCKET} && systemctl is-active cri-docker.socket cri-docker.service "
                  "&& systemctl is-enabled cri-docker.socket cri-docker.service", check=False).returncode == 0
    pause = [ln for ln in h.exec("kubeadm config images list --kubernetes-version \"$(kubeadm version -o short)\""
                                 ).stdout.splitlines() if "/pause:" in ln]
    assert len(pause) == 1
    dropin = h.read("/etc/systemd/system/cri-docker.service.d/10-gpuk8s.conf") or ""
    assert f"--network-plugin=cni --pod-infra-container-image={pause[0]}\n" in dropin, h.name
    assert "ListenStream=%t/cri-dockerd.sock" in (h.read("/etc/systemd/system/cri-docker.socket") or "")
    daemon = json.loads(h.read("/etc/docker/daemon.json") or "{}")
    assert "native.cgroupdriver=systemd" in daemon["exec-opts"]
    assert (daemon.get("default-runtime") == "nvidia") == gpus, h.name


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
