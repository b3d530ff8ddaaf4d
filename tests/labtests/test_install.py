"""gpuk8s install --prepare-only (node preparation) end to end on the lab: content, idempotence, faults, dry run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest
import tomllib
import yaml

FRESH = """
hosts:
  - name: cp-1
    role: control-plane
  - name: ubuntu-gpu
    gpus: 2
    sudo: password
    sudo_password: Lab-Install-pw-7
  - name: alinux-gpu
    os: alinux-3
    gpus: 2
    containerd_config: |
      # containerd.io's shipped config
      disabled_plugins = ["cri"]
"""
SUDO_ENV = {"GPUK8S_LAB_SUDO_PASSWORD": "Lab-Install-pw-7"}

# argv[0] of faked commands that change a host; a run that changes nothing must call none of them
CHANGING = {("apt-get", "install"), ("apt-get", "update"), ("dnf", "install"), ("modprobe", None), ("swapoff", None),
            ("nvidia-ctk", "runtime"), ("systemctl", "restart"), ("systemctl", "enable"), ("apt-mark", "hold"),
            ("curl", None), ("gpg", None), ("sysctl", "-p")}


def changing_calls(calls: list[list[str]]) -> list[list[str]]:
    out = []
    for argv in calls:
        if argv[:1] == ["curl"] and "/dev/null" in argv[1:]:
            continue  # preflight's net.sources probe: asks whether a source answers, writes nothing
        if argv[:1] == ["nvidia-ctk"] and "--config=/tmp/gpuk8s-check." in " ".join(argv):
            continue  # on copies in a scratch directory: the nvidia-runtime check asks what it would write
        words = [a for a in argv[1:] if not a.startswith("-") or a == "-p"]
        for name, sub in CHANGING:
            if argv[0] == name and (sub is None or sub in argv[1:] or (words and words[0] == sub)):
                out.append(argv)
    return out


def install(run_cli, lab, *args: str, env: dict[str, str] | None = None):
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--prepare-only", *args,
                env={**SUDO_ENV, **(env or {})})
    assert r.stdout, r.stderr
    return r, json.loads(r.stdout)


def by_host(report: dict) -> dict[str, dict]:
    return {h["name"]: h for h in report["hosts"]}


def test_fresh_hosts_are_prepared_and_a_second_run_changes_nothing(lab_up, run_cli, tmp_path):
    lab = lab_up(FRESH)
    r, rep = install(run_cli, lab)
    assert r.returncode == 0, json.dumps(rep, indent=1) + r.stderr
    hosts = by_host(rep)
    assert all(h["status"] == "done" for h in hosts.values())

    for name in ("ubuntu-gpu", "alinux-gpu"):
        h = lab.host(name)
        cfg = tomllib.loads(h.read("/etc/containerd/config.toml"))
        cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
        assert cri["default_runtime_name"] == "nvidia"
        assert cri["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
        assert cri["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
        assert cri["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
        assert "cri" not in cfg.get("disabled_plugins", [])
        # containerd itself (the real binary) reads the result the same way
        dump = h.exec("containerd config dump").stdout
        assert 'default_runtime_name = "nvidia"' in dump
        assert h.read("/etc/sysctl.d/99-gpuk8s-kubernetes.conf").count(" = 1") == 3
        assert h.read("/etc/modules-load.d/gpuk8s-kubernetes.conf").split("\n")[1:3] == ["overlay", "br_netfilter"]
        fstab = h.read("/etc/fstab")
        assert "# /swap.img" in fstab and not any(ln.startswith("/swap.img") for ln in fstab.splitlines())
        st = h.state()
        assert st["swap"] == [] and {"overlay", "br_netfilter"} <= set(st["modules"])
        assert st["sysctl"]["net.ipv4.ip_forward"] == "1"
        assert st["packages"]["nvidia-container-toolkit"].startswith("1.17.8-1")
        assert st["packages"]["libnvidia-container1"].startswith("1.17.8-1")
        assert st["packages"]["kubeadm"].startswith("1.30.")
        assert st["services"]["containerd"] == "active" and "kubelet" in st["enabled"]

    ub, al = lab.host("ubuntu-gpu"), lab.host("alinux-gpu")
    assert "pkgs.k8s.io/core:/stable:/v1.30/deb/ /" in ub.read("/etc/apt/sources.list.d/kubernetes.list")
    toolkit_list = ub.read("/etc/apt/sources.list.d/nvidia-container-toolkit.list")
    assert "libnvidia-container/stable/deb/$(ARCH) /" in toolkit_list
    # the lab host's own driver package is held as a well-kept server's is; install adds the Kubernetes packages
    assert ub.state()["holds"] == ["nvidia-driver-535-server", "kubelet", "kubeadm", "kubectl"]
    assert ub.read("/etc/yum.repos.d/kubernetes.repo") is None
    repo = al.read("/etc/yum.repos.d/kubernetes.repo")
    assert "baseurl=https://pkgs.k8s.io/core:/stable:/v1.30/rpm/" in repo and "exclude=kubelet kubeadm" in repo
    assert "baseurl=https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch" in al.read(
        "/etc/yum.repos.d/nvidia-container-toolkit.repo")
    assert al.read("/etc/apt/sources.list.d/kubernetes.list") is None
    assert al.state()["packages"]["nvidia-container-toolkit"] == "1.17.8-1"
    # originals kept once; a file gpuk8s created is recorded as absent before
    assert al.read("/var/lib/gpuk8s/backup/etc/containerd/config.toml").endswith('disabled_plugins = ["cri"]\n')
    assert ub.read("/var/lib/gpuk8s/backup/etc/fstab").count("/swap.img\tnone") == 1
    assert ub.upper("/var/lib/gpuk8s/backup/etc/containerd/config.toml.absent").exists()
    # the CPU-only control plane gets no toolkit and no nvidia runtime
    cp = lab.host("cp-1")
    assert "nvidia-container-toolkit" not in cp.state()["packages"]
    assert "nvidia" not in tomllib.loads(cp.read("/etc/containerd/config.toml"))["plugins"][
        "io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]

    before = {n: len(h.commands()) for n, h in lab.hosts.items()}
    files = {n: h.read("/etc/containerd/config.toml") for n, h in lab.hosts.items()}
    r2, rep2 = install(run_cli, lab)
    assert r2.returncode == 0, r2.stderr
    for h in rep2["hosts"]:
        assert h["status"] == "done" and h["changed"] == 0 and h["unchanged"] == len(h["steps"]) > 0, h
    for n, h in lab.hosts.items():
        assert changing_calls(h.commands()[before[n]:]) == [], n
        assert h.read("/etc/containerd/config.toml") == files[n]
    # the sudo password went over stdin only
    secret = SUDO_ENV["GPUK8S_LAB_SUDO_PASSWORD"]
    assert secret not in r.stdout + r.stderr + r2.stdout + r2.stderr
    assert secret not in (tmp_path / "gpuk8s.log").read_text()
    assert all(secret not in " ".join(a) for h in lab.hosts.values() for a in h.commands())


def test_docker_daemon_json_keeps_other_settings(lab_up, run_cli):
    lab = lab_up("""
cluster: {container_runtime: docker}
hosts:
  - name: cp-1
    role: control-plane
    runtime: docker
    runtime_version: 24.0.7
  - name: gpu-1
    runtime: docker
    runtime_version: 24.0.7
""")
    lab.host("gpu-1").write("/etc/docker/daemon.json", '{"log-driver": "json-file", "exec-opts": ["a=b"]}\n')
    r, rep = install(run_cli, lab, "--ignore", "runtime.kubernetes-compat")
    assert r.returncode == 0, json.dumps(rep, indent=1)
    d = json.loads(lab.host("gpu-1").read("/etc/docker/daemon.json"))
    assert d["default-runtime"] == "nvidia"
    assert d["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "args": []}
    assert d["exec-opts"] == ["a=b", "native.cgroupdriver=systemd"]
    assert d["log-driver"] == "json-file"
    assert "default-runtime" not in json.loads(lab.host("cp-1").read("/etc/docker/daemon.json"))
    assert lab.host("gpu-1").exec("docker info").stdout.count("Default Runtime: nvidia") == 1
    assert lab.host("gpu-1").read("/var/lib/gpuk8s/backup/etc/docker/daemon.json").startswith('{"log-driver"')


def test_docker_on_kubernetes_without_dockershim_gets_cri_dockerd(lab_up, run_cli):
    """Issue 16: no longer blocked by preflight; install sets up cri-dockerd (tests/labtests/test_docker_runtime.py
    has the whole install on Docker)."""
    lab = lab_up("cluster: {container_runtime: docker}\nhosts:\n  - name: cp-1\n    role: control-plane\n"
                 "    runtime: docker\n    runtime_version: 24.0.7\n")
    r, rep = install(run_cli, lab)
    assert r.returncode == 0, json.dumps(rep, indent=1)
    h = by_host(rep)["cp-1"]
    assert h["status"] == "done"
    assert [s["name"] for s in h["steps"] if s["playbook"] == "cri-dockerd"][:1] == ["cri-dockerd-binary"]
    assert lab.host("cp-1").exec("test -S /var/run/cri-dockerd.sock", check=False).returncode == 0


def set_install(lab, **settings) -> None:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["install"] = {**inv.get("install", {}), **settings}
    lab.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))


@pytest.mark.faults
def test_dpkg_lock_and_unreachable_repository_fail_that_host_only_and_a_rerun_completes(lab_up, run_cli):
    lab = lab_up("""
hosts:
  - name: cp-1
    role: control-plane
  - name: locked
  - name: offline
    faults: [repo-unreachable]
  - name: fine
""")
    set_install(lab, package_lock_timeout=1)
    holder = lab.host("locked").hold_dpkg_lock()
    try:
        r, rep = install(run_cli, lab)
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1
    hosts = by_host(rep)
    assert hosts["cp-1"]["status"] == "done" and hosts["fine"]["status"] == "done"
    locked = hosts["locked"]
    assert locked["status"] == "failed"
    assert "kubernetes-packages-apt failed with exit status 100" in locked["message"]
    assert "Could not get lock /var/lib/dpkg/lock-frontend" in locked["message"]
    assert f"held by process {holder.pid}" in locked["message"] or "held by process" in locked["message"]
    offline = hosts["offline"]
    assert offline["status"] == "failed"
    assert "kubernetes-apt-key" in offline["message"] and "Could not resolve host: pkgs.k8s.io" in offline["message"]
    # the failed step is named with what it printed; the steps before it are done and stay done
    failed = [s for s in offline["steps"] if s["status"] == "failed"]
    assert [s["name"] for s in failed] == ["kubernetes-apt-key"] and failed[0]["exit_status"] != 0
    assert all(s["status"] == "not-run" for s in offline["steps"][offline["steps"].index(failed[0]) + 1:])
    # nothing half-written on the failed hosts: no temporary files left next to the targets
    for name in ("locked", "offline"):
        assert lab.host(name).upper("/etc").is_dir()  # the host's own /etc changes were looked at
        leftovers = [p for d in ("/etc/apt/keyrings", "/etc/containerd", "/etc")
                     for p in lab.host(name).upper(d).glob(".gpuk8s.*")]
        assert leftovers == [], leftovers

    lab.host("offline").update_state(unreachable_hosts=[])
    r2, rep2 = install(run_cli, lab)
    assert r2.returncode == 0, json.dumps(rep2, indent=1)
    hosts2 = by_host(rep2)
    assert hosts2["fine"]["changed"] == 0
    assert hosts2["locked"]["changed"] > 0 and hosts2["offline"]["changed"] > 0
    # converged to the same state as a host that never failed
    for name in ("locked", "offline"):
        fine = lab.host("fine").read("/etc/containerd/config.toml")
        assert lab.host(name).read("/etc/containerd/config.toml") == fine
        assert lab.host(name).state()["packages"] == lab.host("fine").state()["packages"]


def snapshot(lab) -> dict[str, bytes]:
    """Every file of every host's own view, except the lab's bookkeeping (fakes record their calls)."""
    out = {}
    for h in lab.hosts.values():
        for p in sorted((h.dir / "upper").rglob("*")):
            rel = str(p.relative_to(h.dir))
            if "gpuk8s-lab" in rel or not p.is_file():
                continue
            out[f"{h.name}:{rel}"] = p.read_bytes()
    return out


def test_dry_run_prints_the_commands_and_changes_nothing(lab_up, run_cli):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: gpu-1\n    os: alinux-3\n")
    before = snapshot(lab)
    r = run_cli("install", "-i", str(lab.inventory), "--dry-run")  # a dry run stops after preparation
    assert r.returncode == 0, r.stderr
    assert snapshot(lab) == before
    assert changing_calls([a for h in lab.hosts.values() for a in h.commands()]) == []
    out = r.stdout
    assert "== gpu-1 (" in out and "== cp-1 (" in out
    assert "swapoff -a" in out and "nvidia-ctk runtime configure --runtime=containerd --set-as-default" in out
    assert "dnf install -y -q --disableexcludes=kubernetes" in out
    assert "# write /etc/sysctl.d/99-gpuk8s-kubernetes.conf atomically" in out
    assert "would change" in out
    # JSON says the same per step
    r, rep = install(run_cli, lab, "--dry-run")
    steps = {s["name"]: s for s in by_host(rep)["gpu-1"]["steps"]}
    assert steps["swap-off"]["status"] == "would-change" and "swapoff -a" in steps["swap-off"]["commands"]
    assert snapshot(lab) == before


@pytest.mark.faults
def test_host_lock_busy_and_stale(lab_up, run_cli):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: w-1\n")
    w = lab.host("w-1")
    w.exec("mkdir -p /var/lib/gpuk8s && echo 'gpuk8s on elsewhere (pid 1), since then' > /var/lib/gpuk8s/lock.owner")
    holder = subprocess.Popen(["nsenter", "-t", str(w.sshd_pid()), "-n", "-m", "-u", "flock",
                               "/var/lib/gpuk8s/lock", "sleep", "60"], start_new_session=True)
    try:
        time.sleep(0.3)
        r, rep = install(run_cli, lab)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock and the sleep that holds the lock
        holder.wait()
    busy = by_host(rep)["w-1"]
    assert r.returncode == 1 and busy["status"] == "busy"
    assert "another gpuk8s run is preparing this host: gpuk8s on elsewhere (pid 1)" in busy["message"]
    assert changing_calls(w.commands()) == []
    # the holder is gone but its owner note remains: a stale lock, taken over with a message
    r, rep = install(run_cli, lab)
    h = by_host(rep)["w-1"]
    assert r.returncode == 0 and h["status"] == "done"
    assert "took over a stale lock left by gpuk8s on elsewhere (pid 1)" in h["lock"]
    assert not w.upper("/var/lib/gpuk8s/lock.owner").exists() or w.read("/var/lib/gpuk8s/lock.owner") is None


@pytest.mark.faults
def test_full_disk_while_writing_a_file_leaves_the_old_one_and_a_rerun_completes(lab_up, run_cli):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: full\n  - name: fine\n")
    full = lab.host("full")
    old = "# the host's own setting\nnet.ipv4.ip_forward = 1\n"
    # a 16 KiB tmpfs over /etc/sysctl.d in the host's view, holding the old file, then filled up
    full.exec("mount -t tmpfs -o size=16k tmpfs /etc/sysctl.d && "
              f"printf '%s' {shlex.quote(old)} > /etc/sysctl.d/99-gpuk8s-kubernetes.conf && "
              "dd if=/dev/zero of=/etc/sysctl.d/filler bs=1k count=64 2>/dev/null; true")
    r, rep = install(run_cli, lab)
    assert r.returncode == 1
    h = by_host(rep)["full"]
    assert h["status"] == "failed" and "sysctl-at-boot" in h["message"]
    assert "No space left on device" in h["message"]
    assert by_host(rep)["fine"]["status"] == "done"
    assert full.exec("cat /etc/sysctl.d/99-gpuk8s-kubernetes.conf").stdout == old
    assert full.exec("ls -A /etc/sysctl.d").stdout.split() == ["99-gpuk8s-kubernetes.conf", "filler"]
    full.exec("rm /etc/sysctl.d/filler")
    r, rep = install(run_cli, lab)
    assert r.returncode == 0, json.dumps(rep, indent=1)
    assert "net.ipv4.ip_forward = 1" in full.exec("cat /etc/sysctl.d/99-gpuk8s-kubernetes.conf").stdout
    assert full.exec("cat /var/lib/gpuk8s/backup/etc/sysctl.d/99-gpuk8s-kubernetes.conf").stdout == old


# -- repository signing keys pinned by fingerprint -------------------------------------------------------------

def lab_key_fingerprint(url_host: str) -> str:
    """The fingerprint of the key the lab's fake curl serves at a host (tests/lab/fakes/fake.py)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("lab_fake", Path(__file__).parents[1] / "lab" / "fakes" / "fake.py")
    assert spec is not None and spec.loader is not None
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    return str(fake.lab_key_fingerprint(url_host))


def spaced(fp: str) -> str:
    """A fingerprint as gpg prints it (gpg --with-fingerprint), which the inventory accepts."""
    return " ".join(fp[i:i + 4] for i in range(0, 40, 4))


def holds_key(h, path: str, fp: str) -> bool:
    """The (binary) keyring at `path` in the host's view is the lab key with that fingerprint."""
    return f"lab-fingerprint: {fp}".encode() in h.upper(path).read_bytes()


def key_calls(h) -> list[list[str]]:
    return [a for a in h.commands() if a[0] == "curl" and a[-1].endswith(("/gpgkey", ".key"))]


def test_pinned_https_repository_keys_install_and_a_re_pinned_key_is_replaced(lab_up, run_cli):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: gpu-1\n    gpus: 2\n")
    fp_nvidia, fp_k8s = lab_key_fingerprint("nvidia.github.io"), lab_key_fingerprint("pkgs.k8s.io")
    set_install(lab, toolkit_repo={"url": "https://nvidia.github.io/libnvidia-container",
                                   "key_fingerprint": spaced(fp_nvidia)},
                kubernetes_repo={"url": "https://pkgs.k8s.io/core:/stable:", "key_fingerprint": fp_k8s.lower()})
    assert "cni.lab.invalid" in lab.inventory.read_text()  # the lab's CNI settings are kept
    r, rep = install(run_cli, lab)
    assert r.returncode == 0, json.dumps(rep, indent=1) + r.stderr
    gpu = lab.host("gpu-1")
    steps = {s["name"]: s["status"] for s in by_host(rep)["gpu-1"]["steps"]}
    assert steps["kubernetes-apt-key"] == steps["toolkit-apt-key"] == "changed"
    assert holds_key(gpu, "/etc/apt/keyrings/kubernetes-apt-keyring.gpg", fp_k8s)
    assert holds_key(gpu, "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg", fp_nvidia)
    # https stays https, through redirects too; each fetched key was read by gpg before it was installed
    calls = key_calls(gpu)
    assert [c[-1] for c in calls] == ["https://pkgs.k8s.io/core:/stable:/v1.30/deb/Release.key",
                                      "https://nvidia.github.io/libnvidia-container/gpgkey"]
    assert all(" ".join(c).count("--proto =https --proto-redir =https") == 1 for c in calls)
    assert any(a[0] == "gpg" and "--show-keys" in a and "--with-colons" in a for a in gpu.commands())
    assert gpu.state()["packages"]["kubeadm"].startswith("1.30.")

    # a second run only reads the installed keyrings' fingerprints
    before = len(gpu.commands())
    r, rep = install(run_cli, lab)
    assert r.returncode == 0 and by_host(rep)["gpu-1"]["changed"] == 0, json.dumps(rep, indent=1)
    later = gpu.commands()[before:]
    assert [a for a in changing_calls(later) if "--show-keys" not in a] == []
    assert any("--show-keys" in a and a[-1] == "/etc/apt/keyrings/kubernetes-apt-keyring.gpg" for a in later)

    # the repository rotates its key and the inventory pins the new one: the installed keyring no longer
    # passes the check and is replaced
    new = "0123456789ABCDEF0123456789ABCDEF01234567"
    gpu.update_state(served_keys={"pkgs.k8s.io": new})
    lab.host("cp-1").update_state(served_keys={"pkgs.k8s.io": new})
    set_install(lab, kubernetes_repo={"url": "https://pkgs.k8s.io/core:/stable:", "key_fingerprint": new})
    r, rep = install(run_cli, lab)
    assert r.returncode == 0, json.dumps(rep, indent=1)
    steps = {s["name"]: s["status"] for s in by_host(rep)["gpu-1"]["steps"]}
    assert steps["kubernetes-apt-key"] == "changed" and steps["toolkit-apt-key"] == "unchanged"
    assert holds_key(gpu, "/etc/apt/keyrings/kubernetes-apt-keyring.gpg", new)


@pytest.mark.faults
def test_a_key_that_is_not_the_pinned_one_fails_that_host_only_and_installs_nothing(lab_up, run_cli):
    lab = lab_up("""
hosts:
  - name: cp-1
    role: control-plane
  - name: fine
    gpus: 2
  - name: forged
    gpus: 2
  - name: downgraded
    gpus: 2
""")
    fp_mirror, fp_nvidia = lab_key_fingerprint("mirror.lab.invalid"), lab_key_fingerprint("nvidia.github.io")
    forged_fp = lab_key_fingerprint("attacker.lab.invalid")
    set_install(lab, kubernetes_repo={"url": "http://mirror.lab.invalid/k8s", "insecure_http": True,
                                      "key_fingerprint": fp_mirror},
                toolkit_repo={"url": "https://nvidia.github.io/libnvidia-container", "key_fingerprint": fp_nvidia})
    # whoever is on the path of the plain-http mirror serves its own key to one host
    lab.host("forged").update_state(served_keys={"mirror.lab.invalid": forged_fp})
    # and redirects another host's https key URL to plain http
    lab.host("downgraded").update_state(redirects={"nvidia.github.io": "http://nvidia.github.io"})
    r, rep = install(run_cli, lab)
    assert r.returncode == 1
    hosts = by_host(rep)
    assert hosts["cp-1"]["status"] == "done" and hosts["fine"]["status"] == "done"

    forged = hosts["forged"]
    assert forged["status"] == "failed" and "kubernetes-apt-key" in forged["message"]
    assert (f"the key served at http://mirror.lab.invalid/k8s/v1.30/deb/Release.key has fingerprint {forged_fp}, "
            f"the inventory pins {fp_mirror}") in forged["message"]
    failed = [s for s in forged["steps"] if s["status"] == "failed"]
    assert [s["name"] for s in failed] == ["kubernetes-apt-key"]
    assert all(s["status"] == "not-run" for s in forged["steps"][forged["steps"].index(failed[0]) + 1:])
    h = lab.host("forged")
    assert not h.upper("/etc/apt/keyrings/kubernetes-apt-keyring.gpg").exists()
    assert list(h.upper("/etc/apt/keyrings").glob("*")) == []  # no keyring, no temporary file
    assert h.read("/etc/apt/sources.list.d/kubernetes.list") is None
    assert not any(a[0] == "gpg" and "--dearmor" in a for a in h.commands())
    assert "--proto =http,https --proto-redir =http,https" in " ".join(key_calls(h)[0])

    down = hosts["downgraded"]
    assert down["status"] == "failed" and "toolkit-apt-key" in down["message"]
    assert 'Protocol "http" not supported or disabled in libcurl' in down["message"]
    assert not lab.host("downgraded").upper("/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg").exists()

    fine = lab.host("fine")
    assert holds_key(fine, "/etc/apt/keyrings/kubernetes-apt-keyring.gpg", fp_mirror)
    assert "http://mirror.lab.invalid/k8s/v1.30/deb/ /" in fine.read("/etc/apt/sources.list.d/kubernetes.list")
    assert fine.state()["packages"]["kubeadm"].startswith("1.30.")

    # the path is clean again: a re-run completes the failed hosts
    lab.host("forged").update_state(served_keys={})
    lab.host("downgraded").update_state(redirects={})
    r, rep = install(run_cli, lab)
    assert r.returncode == 0, json.dumps(rep, indent=1)
    assert holds_key(h, "/etc/apt/keyrings/kubernetes-apt-keyring.gpg", fp_mirror)


def test_alinux_with_pinned_keys_uses_the_checked_local_key_files(lab_up, run_cli):
    lab = lab_up("""
hosts:
  - name: cp-1
    role: control-plane
  - name: al
    os: alinux-3
    gpus: 2
  - name: al-forged
    os: alinux-3
    gpus: 2
""")
    fp_nvidia, fp_k8s = lab_key_fingerprint("nvidia.github.io"), lab_key_fingerprint("pkgs.k8s.io")
    set_install(lab, toolkit_repo={"url": "https://nvidia.github.io/libnvidia-container", "key_fingerprint": fp_nvidia},
                kubernetes_repo={"url": "https://pkgs.k8s.io/core:/stable:", "key_fingerprint": fp_k8s})
    lab.host("al-forged").update_state(served_keys={"pkgs.k8s.io": [fp_k8s, lab_key_fingerprint("extra")]})
    r, rep = install(run_cli, lab)
    hosts = by_host(rep)
    assert hosts["al"]["status"] == "done" and hosts["cp-1"]["status"] == "done", json.dumps(rep, indent=1)
    al = lab.host("al")
    k8s_repo = al.read("/etc/yum.repos.d/kubernetes.repo")
    toolkit_repo = al.read("/etc/yum.repos.d/nvidia-container-toolkit.repo")
    assert "\ngpgkey=file:///etc/pki/rpm-gpg/gpuk8s-kubernetes.asc\n" in k8s_repo
    assert "\ngpgkey=file:///etc/pki/rpm-gpg/gpuk8s-nvidia-container-toolkit.asc\n" in toolkit_repo
    assert "http" not in "".join(ln for ln in (k8s_repo + toolkit_repo).splitlines() if ln.startswith("gpgkey="))
    assert f"lab-fingerprint: {fp_k8s}" in al.read("/etc/pki/rpm-gpg/gpuk8s-kubernetes.asc")
    assert f"lab-fingerprint: {fp_nvidia}" in al.read("/etc/pki/rpm-gpg/gpuk8s-nvidia-container-toolkit.asc")
    assert [c[-1] for c in key_calls(al)] == [
        "https://pkgs.k8s.io/core:/stable:/v1.30/rpm/repodata/repomd.xml.key",
        "https://nvidia.github.io/libnvidia-container/gpgkey"]
    assert al.state()["packages"]["nvidia-container-toolkit"] == "1.17.8-1"
    steps = [s["name"] for s in hosts["al"]["steps"]]
    assert steps.index("kubernetes-rpm-key") < steps.index("kubernetes-yum-repo")

    # a key file that holds the pinned key and another one is refused: dnf would trust both
    forged = hosts["al-forged"]
    assert r.returncode == 1 and forged["status"] == "failed" and "kubernetes-rpm-key" in forged["message"]
    assert f"holds several keys ({fp_k8s} {lab_key_fingerprint('extra')}), the inventory pins {fp_k8s}" in \
        forged["message"]
    f = lab.host("al-forged")
    assert f.read("/etc/yum.repos.d/kubernetes.repo") is None
    assert list(f.upper("/etc/pki/rpm-gpg").glob("*")) == []  # no key file, no temporary file
