"""A hostile or broken host, a local user on a host, a second operator: on the lab, over real SSH and sudo.

Each test here failed on the code before the hostile-hosts fixes: the sudo password reached a command's
stdin when sudo did not ask for it, a planted iperf3 pid file chose what gpuk8s killed, two installs ran
kubeadm init side by side, and a cut-off kubeadm init left its token on the control plane.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuk8s.inventory.loader import load
from gpuk8s.inventory.model import Host
from gpuk8s.remote import Session

pytestmark = pytest.mark.faults

SUDO_PW = "Hh-sudo-pw-57"
FLEET = f"""
hosts:
  - name: cp-1
    role: control-plane
  - name: gpu-1
    gpus: 2
    sudo: password
    sudo_password: {SUDO_PW}
  - name: gpu-2
    gpus: 2
    sudo: password
    sudo_password: {SUDO_PW}
"""
ENV = {"GPUK8S_LAB_SUDO_PASSWORD": SUDO_PW}
PAYLOAD = bytes(range(256)) * 64 + b"apiVersion: v1\nno newline at the end"


def _host(lab, name: str, sudo_mode: str) -> Host:
    h = next(x for x in load(lab.inventory).hosts if x.name == name)
    sudo = dataclasses.replace(h.ssh.sudo, mode=sudo_mode)
    return dataclasses.replace(h, ssh=dataclasses.replace(h.ssh, sudo=sudo))


def _digest_through_sudo(host: Host) -> str:
    with Session(host, SUDO_PW) as s:
        res = s.run("sha256sum", sudo=True, stdin=PAYLOAD)
    assert res.ok, res.stderr
    assert "@@gpuk8s-sudo" not in res.stderr  # the markers never reach the caller
    return res.stdout.split()[0]


def test_sudo_stdin_is_byte_exact_whether_sudo_asks_or_not(lab_up):
    lab = lab_up(FLEET)
    want = hashlib.sha256(PAYLOAD).hexdigest()
    # 1. sudo asks for the password (gpu-1: a password rule, nothing cached)
    assert _digest_through_sudo(_host(lab, "gpu-1", "password")) == want
    # 2. NOPASSWD on the host while gpuk8s has a password: sudo does not ask, the password must not be sent
    assert _digest_through_sudo(_host(lab, "cp-1", "password")) == want
    # 3. a cached timestamp: the first command asks, the second one does not
    gpu2 = lab.host("gpu-2")
    gpu2.write("/etc/sudoers.d/zz-timestamp", "Defaults timestamp_type=global, timestamp_timeout=5\n", 0o440)
    host = _host(lab, "gpu-2", "password")
    with Session(host, SUDO_PW) as s:
        assert s.run("true", sudo=True).ok
        res = s.run("sudo -n true && echo cached", sudo=False)
        assert res.stdout.strip() == "cached", "the lab did not cache the sudo timestamp"
        second = s.run("sha256sum", sudo=True, stdin=PAYLOAD)
    assert second.ok and second.stdout.split()[0] == want
    # and a plain NOPASSWD host with gpuk8s in nopasswd mode (sudo -n) is unchanged
    assert _digest_through_sudo(_host(lab, "cp-1", "nopasswd")) == want


def test_a_wrong_password_fails_fast_and_is_sent_once(lab_up):
    lab = lab_up(FLEET)
    with Session(_host(lab, "gpu-1", "password"), "wrong-password") as s:
        t0 = time.monotonic()
        res = s.run("echo ran", sudo=True, stdin=b"payload")
    assert time.monotonic() - t0 < 20
    assert not res.ok and "ran" not in res.stdout
    assert "@@gpuk8s-sudo" not in res.stderr


def test_a_planted_iperf3_pid_file_kills_nothing(lab_up, run_cli):
    """A local user on the control plane plants /tmp/gpuk8s-iperf3.pid (the old fixed path) and keeps
    rewriting it during the bandwidth test: the process it names must survive, the measurement must work."""
    lab = lab_up(FLEET)
    cp = lab.host("cp-1")
    victim = int(cp.exec("sleep 600 >/dev/null 2>&1 & echo $!").stdout.strip())
    stop = threading.Event()

    def plant() -> None:
        while not stop.is_set():
            cp.exec(f"printf '%s\\n' {victim} > /tmp/gpuk8s-iperf3.pid", check=False)
            stop.wait(0.05)

    planter = threading.Thread(target=plant, daemon=True)
    planter.start()
    try:
        r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "1", env=ENV)
    finally:
        stop.set()
        planter.join()
    assert "Traceback" not in r.stderr
    links = json.loads(r.stdout)["cluster"]["links"]
    assert links and all(link["gbit_per_s"] for link in links), links  # the server did run and answer
    assert cp.exec(f"kill -0 {victim}", check=False).returncode == 0, "gpuk8s killed the planted pid"
    assert cp.exec("cat /tmp/gpuk8s-iperf3.pid").stdout.strip() == str(victim)
    assert "5201" not in cp.exec("ss -Htln").stdout  # the server it started is gone
    assert cp.exec("ls -d /tmp/gpuk8s-iperf3.* 2>/dev/null | grep -v '\\.pid$'", check=False).stdout == ""
    cp.exec(f"kill {victim}", check=False)


def _gpuk8s(tmp_path: Path, *args: str, log: str) -> subprocess.Popen[str]:
    e = {**os.environ, "GPUK8S_LOG_FILE": str(tmp_path / log), "NO_COLOR": "1", **ENV}
    return subprocess.Popen([sys.executable, "-m", "gpuk8s", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=e, cwd=tmp_path)


def _lines_of(p: subprocess.Popen[str]) -> list[str]:
    lines: list[str] = []
    assert p.stderr is not None
    threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True).start()  # type: ignore[union-attr]
    return lines


def _wait(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def _nodes(lab) -> set[str]:
    out = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json").stdout
    return {n["metadata"]["name"] for n in json.loads(out)["items"]}


def test_two_concurrent_installs_one_proceeds_the_other_names_the_holder(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    lab.host("cp-1").set_delay("kubeadm", 4)  # the first install is in kubeadm init for a while
    first = _gpuk8s(tmp_path, "install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out",
                    str(tmp_path / "kc1"), log="first.log")
    assert first.stderr is not None
    _wait(lambda: lab.host("cp-1").exec("cat /var/lib/gpuk8s/cluster.lock.owner", check=False).stdout != "",
          60, "the first install to take the cluster lock")
    t0 = time.monotonic()
    second = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc2"),
                     env=ENV)
    assert time.monotonic() - t0 < 30  # it stops at once, it does not wait for the lock
    assert second.returncode == 1, second.stdout + second.stderr
    rep = json.loads(second.stdout)
    lock = rep["phases"][0]
    assert lock["name"] == "lock" and lock["status"] == "failed"
    assert re.search(rf"another gpuk8s run is changing this cluster: gpuk8s on \S+ \(pid {first.pid}\), since "
                     r"\d{4}-\d\d-\d\dT", lock["message"]), lock["message"]
    assert rep["prepare"] is None  # it touched no host
    out, err = first.communicate(timeout=240)
    assert first.returncode == 0, out + err
    lab.host("cp-1").set_delay("kubeadm", 0)
    assert _nodes(lab) == {"cp-1", "gpu-1", "gpu-2"}
    init_calls = [a for a in lab.host("cp-1").commands() if a[:2] == ["kubeadm", "init"]]
    assert len(init_calls) == 1  # one kubeadm init, by the run that held the lock
    # the lock went with the first run: a re-run takes it and changes nothing
    again = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc1"),
                    env=ENV)
    assert again.returncode == 0, again.stdout + again.stderr
    assert lab.host("cp-1").exec("cat /var/lib/gpuk8s/cluster.lock.owner", check=False).stdout == ""


def _secret_files(host) -> str:
    return host.exec("ls -a /etc/kubernetes /var/lib/gpuk8s 2>/dev/null; "
                     "cat /etc/kubernetes/gpuk8s-* /var/lib/gpuk8s/*.* 2>/dev/null", check=False).stdout


def test_a_cut_off_kubeadm_init_leaves_no_secret_on_the_host(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET.replace("    gpus: 2\n    sudo: password", "    gpus: 2\n    role: control-plane\n"
                               "    sudo: password", 1))  # two control planes: a certificate key too
    cp = lab.host("cp-1")
    cp.set_delay("kubeadm", 3)
    p = _gpuk8s(tmp_path, "install", "-i", str(lab.inventory), "--kubeconfig-out", str(tmp_path / "kc"),
                log="cut.log")
    lines = _lines_of(p)
    _wait(lambda: any(a[:2] == ["kubeadm", "init"] for a in cp.commands()) or p.poll() is not None, 120,
          "kubeadm init to start")
    assert p.poll() is None, "".join(lines)
    # while kubeadm runs, its configuration (token, certificate key) is on the host: the case under test
    assert cp.exec("ls /etc/kubernetes/gpuk8s-init-*", check=False).stdout.strip()
    p.send_signal(signal.SIGKILL)  # gone without any cleanup of its own
    p.wait(timeout=30)
    _wait(lambda: cp.read("/etc/kubernetes/admin.conf") is not None, 60, "kubeadm init to finish on its own")
    time.sleep(1.0)
    st = json.loads((lab.root / "cluster" / "state.json").read_text())
    secrets = [*st["tokens"], st["certificate_key"]]
    assert all(secrets)
    seen = _secret_files(cp)
    for s in secrets:
        assert s not in seen
    assert not re.search(r"gpuk8s-init-|kubeadm-init\.", seen)  # the run's files are gone
    cp.set_delay("kubeadm", 0)
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"),
                env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads((lab.root / "cluster" / "state.json").read_text())
    seen = _secret_files(cp) + _secret_files(lab.host("gpu-1")) + _secret_files(lab.host("gpu-2"))
    for s in [*st["tokens"], st["certificate_key"]]:
        assert s not in seen


def test_a_cni_manifest_with_another_sha256_is_not_applied(lab_up, run_cli, tmp_path):
    import yaml

    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: gpu-1\n    gpus: 1\n")
    inv = yaml.safe_load(lab.inventory.read_text())
    right = inv["install"]["calico_manifest_sha256"]
    inv["install"]["calico_manifest_sha256"] = "0" * 64  # what a tampered mirror would fail
    lab.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"))
    assert r.returncode == 1, r.stdout + r.stderr
    cni = next(p for p in json.loads(r.stdout)["phases"] if p["name"] == "cni")
    assert cni["status"] == "failed"
    assert f"sha256 of the manifest is {right}, not the pinned {'0' * 64}" in cni["message"]
    ds = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get ds -A -o json").stdout
    assert "calico-node" not in ds  # nothing applied
    inv["install"]["calico_manifest_sha256"] = right
    lab.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
