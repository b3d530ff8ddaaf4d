"""The fault matrix, part 2: faults in the middle of install and join, hostile inputs on real hosts, huge outputs.

Part 1 lives next to the features it breaks (test_lab: sshd down, dropped packets, host keys, auth,
sudo; test_install: dpkg lock, unreachable repository, full disk, host lock; test_cluster: failing
kubeadm init, secrets). Every test here asserts the per-host error, no traceback, the exit status,
the other hosts unaffected, and a re-run converging to the state of a host that never failed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.labtests import interrupt

pytestmark = pytest.mark.faults

SUDO_PW = "Ft-sudo-pw-41"


def fleet(sudo_password: str) -> str:
    """cp-1, gpu-1 (sudo with a password) and gpu-2: the fleet of most tests here."""
    return f"""
hosts:
  - name: cp-1
    role: control-plane
  - name: gpu-1
    gpus: 2
    sudo: password
    sudo_password: {json.dumps(sudo_password)}
  - name: gpu-2
    gpus: 2
"""


FLEET = fleet(SUDO_PW)
ENV = {"GPUK8S_LAB_SUDO_PASSWORD": SUDO_PW}


def gpuk8s(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    e = {**os.environ, "GPUK8S_LOG_FILE": str(tmp_path / "gpuk8s.log"), "NO_COLOR": "1", **ENV, **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "gpuk8s", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=e, cwd=tmp_path)


def by_host(report: dict) -> dict[str, dict]:
    return {h["name"]: h for h in report["hosts"]}


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)


def leftovers(h) -> list[str]:
    """Temporary files of interrupted atomic writes, anywhere in the host's own /etc."""
    return [str(p) for p in h.upper("/etc").rglob(".gpuk8s.*")]


def assert_same_as(lab, name: str, clean: str) -> None:
    """Host `name` converged to what host `clean` (which never failed) has."""
    a, b = lab.host(name), lab.host(clean)
    for path in ("/etc/containerd/config.toml", "/etc/sysctl.d/99-gpuk8s-kubernetes.conf",
                 "/etc/modules-load.d/gpuk8s-kubernetes.conf", "/etc/apt/sources.list.d/kubernetes.list"):
        assert a.read(path) == b.read(path), f"{name}:{path} differs from {clean}"
    assert a.state()["packages"] == b.state()["packages"]
    assert tomllib.loads(a.read("/etc/containerd/config.toml") or "")  # a whole, parseable file
    assert leftovers(a) == []


def nodes(lab) -> dict[str, dict]:
    out = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json").stdout
    return {n["metadata"]["name"]: n for n in json.loads(out)["items"]}


# -- the connection cut in the middle of a step ----------------------------------------------------------
def test_connection_cut_in_the_middle_of_a_step(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    cut = lab.host("gpu-2")
    cut.set_delay("apt-get", 3)  # apt-get on gpu-2 takes 3 s: time to cut the connection while it runs
    p = gpuk8s(tmp_path, "install", "-i", str(lab.inventory), "-o", "json", "--prepare-only")
    wait_for(lambda: any(a[0] == "apt-get" for a in cut.commands()), 60, "apt-get started on gpu-2")
    assert cut.cut_connections() >= 1
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    assert "Traceback" not in err
    hosts = by_host(json.loads(out))
    assert hosts["cp-1"]["status"] == "done" and hosts["gpu-1"]["status"] == "done"
    h = hosts["gpu-2"]
    assert h["status"] == "failed"
    assert h["message"].startswith("cut: the connection to gpu-2 ")
    assert "steps had finished; it was at step" in h["message"]  # where it stopped
    assert "re-run" in h["remedy"]

    # the step goes on without a reader; once it ends, the script exits and the host lock is free
    cut.set_delay("apt-get", 0)
    wait_for(cut.lock_free, 60, "gpu-2's host lock released after the cut")
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--prepare-only", env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    assert by_host(json.loads(r.stdout))["gpu-1"]["changed"] == 0
    assert_same_as(lab, "gpu-2", "gpu-1")


# -- the rpm database locked by another dnf (dnf 4 would wait for it without end) ----------------------------
def test_rpm_lock_held_fails_that_host_within_the_lock_timeout(lab_up, run_cli, tmp_path):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n    os: alinux-3\n"
                 "  - name: locked\n    os: alinux-3\n  - name: fine\n    os: alinux-3\n")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["install"] = {**inv["install"], "package_lock_timeout": 2}
    lab.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    holder = lab.host("locked").hold_rpm_lock()
    try:
        t0 = time.monotonic()
        r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--prepare-only")
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    hosts = by_host(json.loads(r.stdout))
    assert hosts["fine"]["status"] == "done" and hosts["cp-1"]["status"] == "done", r.stdout
    h = hosts["locked"]
    assert h["status"] == "failed" and "step kubernetes-packages-dnf failed" in h["message"]
    assert f"the rpm database is locked by process {holder.pid} (python3) for more than 2 s" in h["message"]
    assert took < 60
    assert not [a for a in lab.host("locked").commands() if a[:2] == ["dnf", "install"]]  # dnf never started
    # the holder is gone; its pid file stays behind, stale, as after a killed dnf: the re-run goes on
    assert lab.host("locked").read("/var/lib/dnf/rpmdb_lock.pid") == str(holder.pid)
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--prepare-only")
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = lab.host("locked"), lab.host("fine")
    assert a.state()["packages"] == b.state()["packages"]
    assert a.read("/etc/containerd/config.toml") == b.read("/etc/containerd/config.toml")
    assert leftovers(a) == []


# -- a wrong sudo password during install ---------------------------------------------------------------
def test_wrong_sudo_password_fails_that_host_fast_and_the_right_one_completes(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    wrong = "not-the-Ft-password"
    t0 = time.monotonic()
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--prepare-only",
                env={"GPUK8S_LAB_SUDO_PASSWORD": wrong})
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    hosts = by_host(json.loads(r.stdout))
    assert hosts["gpu-2"]["status"] == "done" and hosts["cp-1"]["status"] == "done"
    h = hosts["gpu-1"]
    assert h["status"] == "blocked" and "ssh.sudo" in h["message"]
    assert "sudo rejected the password given for gpuk8s" in h["message"]
    assert took < 60  # sudo -S met end of input instead of waiting on a prompt
    assert lab.host("gpu-1").read("/etc/containerd/config.toml") is None  # nothing was done on it
    log = (tmp_path / "gpuk8s.log").read_text()
    for text in (r.stdout, r.stderr, log):
        assert wrong not in text and SUDO_PW not in text

    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--prepare-only", env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same_as(lab, "gpu-1", "gpu-2")


# -- SIGINT at a random point of install -------------------------------------------------------------
SEED = int(os.environ.get("GPUK8S_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))


PHASES = ["preflight and node preparation", "kubeadm init", "CNI", "join control planes and workers",
          "NVIDIA device plugin", "verify every node and GPU"]


# today's half of them (tests/labtests/interrupt.py: sample; make test-interruptions, GPUK8S_INTERRUPT=all, runs all)
@pytest.mark.parametrize("phase", interrupt.half(PHASES))
def test_sigint_at_a_random_point_of_install(lab_up, run_cli, tmp_path, phase):
    """SIGINT a random 0-1.5 s after a phase starts (the phases of a 3-host install take 0.2-4 s each)."""
    delay = random.Random(f"{SEED}-{phase}").uniform(0, 1.5)
    why = f"SIGINT {delay:.2f} s into phase '{phase}' (GPUK8S_FAULT_SEED={SEED} reproduces it)"
    lab = lab_up(FLEET)
    p = gpuk8s(tmp_path, "install", "-i", str(lab.inventory), "--kubeconfig-out", str(tmp_path / "kc"))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True)
    reader.start()
    wait_for(lambda: any(f"==> Running phase: {phase}" in ln for ln in lines) or p.poll() is not None, 120,
             f"phase {phase} started")
    assert p.poll() is None, f"install ended before phase {phase}: " + "".join(lines)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)
    reader.join(timeout=10)
    err = "".join(lines)
    print(f"{why}: exit status {p.returncode}; last lines: {err.strip().splitlines()[-2:]}")
    assert "Traceback" not in err, why + err
    if p.returncode == 0:  # the install had finished before the signal came
        assert "verify every node and GPU" in err, why
    else:
        assert p.returncode == 130, why + err
        assert err.rstrip().endswith("interrupted"), why
    for h in lab.hosts.values():
        wait_for(h.lock_free, 60, f"{why}: {h.name}'s host lock released")
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"), env=ENV)
    assert r.returncode == 0, why + r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert {n["node"]: (n["ok"], n["allocatable_gpus"]) for n in rep["nodes"]} == {
        "cp-1": (True, 0), "gpu-1": (True, 2), "gpu-2": (True, 2)}, why
    assert_same_as(lab, "gpu-1", "gpu-2")
    for h in lab.hosts.values():
        assert leftovers(h) == [], why
        assert h.read("/var/lib/gpuk8s/lock.owner") is None, why
    assert nodes(lab)["gpu-1"]["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"


# -- a worker that cannot reach the API server's port -------------------------------------------------
def test_join_of_a_worker_that_cannot_reach_the_api_server(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET + "  - name: walled\n    gpus: 2\n  - name: open\n    gpus: 2\n")
    inv = yaml.safe_load(lab.inventory.read_text())
    first = tmp_path / "first.yaml"
    first.write_text(yaml.safe_dump({**inv, "hosts": [h for h in inv["hosts"] if h["name"] not in ("walled", "open")]}))
    r = run_cli("install", "-i", str(first), "-o", "json", env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    cp_addr = lab.host("cp-1").address
    walled = lab.host("walled")
    walled.block(cp_addr)
    t0 = time.monotonic()
    r = run_cli("join", "-i", str(lab.inventory), "-o", "json", env=ENV)
    assert time.monotonic() - t0 < 120
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    rep = json.loads(r.stdout)
    join = next(p for p in rep["phases"] if p["name"] == "join")
    assert join["hosts"]["open"] == "joined"
    assert join["hosts"]["walled"].startswith(f"failed: walled cannot reach the API server at {cp_addr}:6443")
    assert "no route to host" in join["hosts"]["walled"]
    assert f"let walled reach TCP {cp_addr}:6443" in join["remedy"]
    assert "walled" not in nodes(lab) and nodes(lab)["open"]
    # the join file (a token) and kubeadm's output are gone
    assert walled.exec("ls /etc/kubernetes/gpuk8s-join-* /var/lib/gpuk8s/kubeadm-join.* 2>/dev/null",
                       check=False).stdout == ""
    tokens = json.loads((lab.root / "cluster" / "state.json").read_text())["tokens"]
    assert len(tokens) >= 2  # install's and this join's
    emitted = r.stdout + r.stderr + (tmp_path / "gpuk8s.log").read_text()
    assert not [t for t in tokens if t in emitted]  # also not in the failure's own text

    walled.block(cp_addr, on=False)
    r = run_cli("join", "-i", str(lab.inventory), "-o", "json", env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert next(p for p in rep["phases"] if p["name"] == "join")["hosts"]["walled"] == "joined"
    assert {n["node"]: n["allocatable_gpus"] for n in rep["nodes"]}["walled"] == 2


# -- huge outputs ---------------------------------------------------------------------------------------
def peak_rss_mib(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run gpuk8s in a child of a fresh interpreter and return its peak resident set size."""
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True, "
            "stdin=subprocess.DEVNULL); sys.stdout.write(r.stdout); sys.stderr.write(r.stderr); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)")
    e = {**os.environ, "GPUK8S_LOG_FILE": str(tmp_path / "gpuk8s.log"), "NO_COLOR": "1", **ENV}
    r = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "gpuk8s", *args], capture_output=True,
                       text=True, env=e, timeout=300)
    *rest, rss = r.stderr.rstrip("\n").split("\n")
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout, "\n".join(rest)), int(rss) / 1024


TEN_MB = 10 * 1024 * 1024


def test_ten_megabytes_of_output_neither_hang_nor_grow_memory(lab_up, tmp_path):
    lab = lab_up(FLEET)
    inv = str(lab.inventory)
    base, base_rss = peak_rss_mib(tmp_path, "preflight", "-i", inv, "-o", "json", "--network-seconds", "0")
    assert base.returncode == 0, base.stdout + base.stderr
    line = "GPU 0: this driver talks far too much " + "x" * 86 + "\n"  # 128 bytes
    loud = lab.host("gpu-2")
    loud.set_override("nvidia-smi", stdout=line, repeat=TEN_MB // len(line))
    t0 = time.monotonic()
    r, rss = peak_rss_mib(tmp_path, "preflight", "-i", inv, "-o", "json", "--network-seconds", "0")
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    report = json.loads(r.stdout)
    checks = {h["name"]: {c["id"]: c for c in h["checks"]} for h in report["hosts"]}
    assert checks["gpu-2"]["gpu.driver"]["status"] == "fail"
    assert checks["gpu-2"]["ssh.reachable"]["status"] == "pass"
    assert checks["gpu-2"]["runtime.version"]["status"] == "pass"  # later sections still arrived
    assert all(c["status"] != "fail" for c in checks["gpu-1"].values())
    assert took < 120
    assert rss - base_rss < 30, f"peak RSS {rss:.0f} MiB against {base_rss:.0f} MiB without the 10 MB output"
    print(f"10 MB output: preflight {took:.1f} s, peak RSS {rss:.0f} MiB (without: {base_rss:.0f} MiB)")

    # the same flood from a command a playbook step runs: the step's output is kept to its tail
    loud.clear_override("nvidia-smi")
    loud.set_override("swapoff", stdout=line, repeat=TEN_MB // len(line), exit=1)
    r, rss = peak_rss_mib(tmp_path, "install", "-i", inv, "-o", "json", "--prepare-only")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    h = by_host(json.loads(r.stdout))["gpu-2"]
    assert h["status"] == "failed" and "step swap-off failed with exit status 1" in h["message"]
    assert len(h["message"]) < 2000
    assert rss - base_rss < 30, f"peak RSS {rss:.0f} MiB during install with a 10 MB step output"
    loud.clear_override("swapoff")
    r, _ = peak_rss_mib(tmp_path, "install", "-i", inv, "-o", "json", "--prepare-only")
    assert r.returncode == 0, r.stdout
    assert_same_as(lab, "gpu-2", "gpu-1")


# -- hostile values that pass validation, on real hosts ------------------------------------------------
CANARY = "/var/tmp/gpuk8s-canary"
REL = "gpuk8s-canary-rel"  # a file name cannot hold '/': this canary lands in the working directory
HOSTILE_NAME = f"x;touch {REL};$(touch {REL})`touch {REL}`'\"\\"
HOSTILE = f"x;touch {CANARY};$(touch {CANARY})`touch {CANARY}`'\"\\"


def test_hostile_paths_and_password_run_nothing_on_any_host(lab_up, run_cli, tmp_path):
    # the canary works: pasted unquoted into a shell command, the value's first part creates the file
    subprocess.run(["sh", "-c", "echo " + HOSTILE.split("'")[0]], capture_output=True)
    assert os.path.exists(CANARY)
    os.remove(CANARY)

    pw = f"pw-{HOSTILE}"
    lab = lab_up(fleet(pw))
    inv = yaml.safe_load(lab.inventory.read_text())
    # local paths are the only inventory values validation lets through with metacharacters
    d = tmp_path / f"keys {HOSTILE_NAME}"
    d.mkdir()
    shutil.copy(lab.key, d / "id")
    shutil.copy(lab.known_hosts, d / "known_hosts")
    inv["ssh"]["identity_file"] = str(d / "id")
    inv["ssh"]["known_hosts"] = str(d / "known_hosts")
    inv["hosts"][1]["labels"] = {"example.com/team": "a-b_c.d"}
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(inv))
    env = {"GPUK8S_LAB_SUDO_PASSWORD": pw}
    for args in (("preflight", "--network-seconds", "0"), ("install", "--dry-run"), ("install",)):
        r = run_cli(*args[:1], "-i", str(path), *args[1:], env=env)
        assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
        assert pw not in r.stdout + r.stderr
    assert not os.path.exists(CANARY) and not (tmp_path / REL).exists()
    for h in lab.hosts.values():
        r = h.exec(f"ls -d {CANARY} / /root/{REL} /home/*/{REL} /{REL} 2>/dev/null", check=False)
        assert r.stdout.split() == ["/"], h.name
        assert all(CANARY not in " ".join(a) for a in h.commands()), h.name
    assert nodes(lab)["gpu-1"]["metadata"]["labels"]["example.com/team"] == "a-b_c.d"
    assert pw not in (tmp_path / "gpuk8s.log").read_text()



# -- host keys: unknown refused unless trust on first use is asked for; changed always refused -------------
def test_unknown_host_key_needs_accept_new_and_a_changed_one_is_always_refused(lab_up, run_cli, tmp_path):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: new-1\n    faults: [unknown-hostkey]\n"
                 "  - name: moved-1\n    faults: [changed-hostkey]\n")
    before = lab.known_hosts.read_text()
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    c = {h["name"]: {x["id"]: x for x in h["checks"]} for h in json.loads(r.stdout)["hosts"]}
    new, moved = c["new-1"]["ssh.reachable"], c["moved-1"]["ssh.reachable"]
    assert new["status"] == "fail" and "is not in" in new["message"] and "SHA256:" in new["message"]
    assert "ssh-keyscan" in new["remedy"] and "accept-new" in new["remedy"]
    assert moved["status"] == "fail" and "CHANGED" in moved["message"] and "SHA256:" in moved["message"]
    assert "ssh-keygen" in moved["remedy"]
    assert all(x["status"] != "fail" for x in c["cp-1"].values())
    assert lab.known_hosts.read_text() == before  # nothing was trusted silently

    inv = yaml.safe_load(lab.inventory.read_text())
    inv["ssh"]["host_key_policy"] = "accept-new"
    lab.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "0")
    c = {h["name"]: {x["id"]: x for x in h["checks"]} for h in json.loads(r.stdout)["hosts"]}
    assert c["new-1"]["ssh.reachable"]["status"] == "pass"
    assert c["moved-1"]["ssh.reachable"]["status"] == "fail"  # accept-new never replaces a known key
    new_addr = lab.host("new-1").address
    added = [ln for ln in lab.known_hosts.read_text().splitlines() if ln not in before.splitlines()]
    assert len(added) == 1 and added[0].startswith(f"{new_addr} ssh-")
    assert "trusted new host key for " + new_addr in (tmp_path / "gpuk8s.log").read_text()
    # once recorded, the key is verified like any other: the next run needs no opt-in
    inv["ssh"]["host_key_policy"] = "strict"
    lab.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "0")
    c = {h["name"]: {x["id"]: x for x in h["checks"]} for h in json.loads(r.stdout)["hosts"]}
    assert c["new-1"]["ssh.reachable"]["status"] == "pass"
