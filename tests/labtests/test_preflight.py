"""gpuk8s preflight end to end against lab fleets: verdicts, JSON schema, exit codes, secrets."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "preflight.schema.json").read_text())

MIXED = """
hosts:
  - name: cp-1
    role: control-plane
  - name: good-1
    gpus: 2
  - name: old-driver
    gpus: 2
    driver: "410.48"
  - name: nvml-broken
    overrides:
      nvidia-smi: {stdout: "Failed to initialize NVML: Driver/library version mismatch\\n", exit: 18}
  - name: wrong-count
    gpus: 3
    inventory_gpus: 4
  - name: cri-off
    containerd_config: "disabled_plugins = [\\"cri\\"]\\n"
  - name: centos
    os: centos-7
    kernel: 3.10.0-1160.el7.x86_64
  - name: dead
    faults: [sshd-stopped]
  - name: pw-host
    sudo: password
    sudo_password: Zq8-lab-sudo-pw
"""


def checks_by_host(report: dict) -> dict[str, dict[str, dict]]:
    return {h["name"]: {c["id"]: c for c in h["checks"]} for h in report["hosts"]}


@pytest.fixture
def mixed(lab_up, run_cli):
    lab = lab_up(MIXED)
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "0",
                env={"GPUK8S_LAB_SUDO_PASSWORD": "Zq8-lab-sudo-pw"})
    return lab, r


def test_mixed_fleet_verdicts(mixed):
    lab, r = mixed
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    jsonschema.validate(report, SCHEMA)
    c = checks_by_host(report)
    assert all(ch["status"] != "fail" for ch in c["good-1"].values())
    assert c["good-1"]["gpu.count"]["status"] == "pass"
    assert c["old-driver"]["gpu.driver-version"]["status"] == "fail"
    assert "410.48 is older than 418.87.01" in c["old-driver"]["gpu.driver-version"]["message"]
    assert c["old-driver"]["gpu.cuda"]["status"] == "warn"
    assert "version mismatch" in c["nvml-broken"]["gpu.driver"]["message"]
    assert "reboot" in c["nvml-broken"]["gpu.driver"]["remedy"]
    assert c["wrong-count"]["gpu.count"]["status"] == "fail"
    assert "expects 4 GPU(s), nvidia-smi lists 3" in c["wrong-count"]["gpu.count"]["message"]
    assert c["cri-off"]["runtime.cri-plugin"]["status"] == "fail"
    assert c["centos"]["os.supported"]["status"] == "fail"
    assert "CentOS Linux 7" in c["centos"]["os.supported"]["message"]
    assert c["dead"] == {"ssh.reachable": c["dead"]["ssh.reachable"]}
    assert "refused" in c["dead"]["ssh.reachable"]["message"]
    assert c["pw-host"]["ssh.sudo"]["status"] == "pass"
    assert c["cp-1"]["gpu.driver"]["status"] == "skip"  # a CPU-only control plane is fine
    cluster = {ch["id"]: ch for ch in report["cluster"]["checks"]}
    assert cluster["cluster.reachable"]["status"] == "fail" and "dead" in cluster["cluster.reachable"]["message"]
    assert cluster["cluster.os-consistent"]["status"] == "fail"
    assert "centos" in cluster["cluster.os-consistent"]["message"]
    assert "cp-1" not in cluster["cluster.kernel-consistent"]["message"]
    assert report["summary"]["hosts_failed"] == 6


def test_sudo_password_never_leaks(mixed, tmp_path):
    lab, r = mixed
    secret = "Zq8-lab-sudo-pw"
    assert secret not in r.stdout and secret not in r.stderr
    assert secret not in (tmp_path / "gpuk8s.log").read_text()
    for h in lab.hosts.values():
        assert all(secret not in " ".join(argv) for argv in h.commands())


def test_one_probe_run_per_host(lab_up, run_cli):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: w-1\n")
    r = run_cli("--verbose", "preflight", "-i", str(lab.inventory), "--no-network")
    assert r.returncode == 0, r.stdout + r.stderr
    for h in lab.hosts.values():
        # the probe runs its GPU query (--query-gpu=index,name,...) exactly once per host and run (its other
        # nvidia-smi queries, compute_cap and the MIG modes, are sections of the same run)
        gpu_queries = [a for a in h.commands() if a[0] == "nvidia-smi" and "--query-gpu=index,name," in " ".join(a)]
        assert len(gpu_queries) == (1 if h.name == "w-1" else 0)
    log = r.stderr
    assert log.count("gpuk8s fact probe (read-only)") == 2


def test_ignore_turns_a_failure_into_a_warning(lab_up, run_cli):
    lab = lab_up("""
hosts:
  - name: cp-1
    role: control-plane
  - name: old
    driver: "410.48"
""")
    r = run_cli("preflight", "-i", str(lab.inventory), "--no-network", "-o", "json")
    assert r.returncode == 1
    r = run_cli("preflight", "-i", str(lab.inventory), "--no-network", "-o", "json",
                "--ignore", "gpu.driver-version")
    assert r.returncode == 0, r.stdout
    c = checks_by_host(json.loads(r.stdout))["old"]["gpu.driver-version"]
    assert c["status"] == "warn" and c["ignored"] and c["message"].endswith("(ignored)")
    r = run_cli("preflight", "-i", str(lab.inventory), "--ignore", "no.such-check")
    assert r.returncode == 2 and "unknown check id" in r.stderr


def test_network_matrix_measures_real_links(lab_up, run_cli):
    lab = lab_up("""
hosts:
  - name: cp-1
    role: control-plane
    link: {rate: 5gbit}
  - name: fast
    link: {rate: 5gbit}
  - name: slow
    link: {rate: 100mbit}
""")
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "1")
    report = json.loads(r.stdout)
    links = {link["worker"]: link for link in report["cluster"]["links"]}
    assert links["slow"]["gbit_per_s"] < 0.12
    assert links["fast"]["gbit_per_s"] > 5 * links["slow"]["gbit_per_s"]
    assert links["fast"]["rtt_ms"] is not None and links["fast"]["rtt_ms"] < 1
    bw = [c for c in report["cluster"]["checks"] if c["id"] == "net.bandwidth"]
    assert any(c["status"] == "warn" and c["message"].startswith("slow:") and "10 GbE" in c["message"] for c in bw)
    # piped: plain text, no box drawing, but the matrix is there
    r = run_cli("preflight", "-i", str(lab.inventory), "--network-seconds", "0")
    assert "control plane <-> slow" in r.stdout and "\u2502" not in r.stdout


HANG_FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: hang
    faults: [drop-packets]
"""


def test_sigint_exits_130_promptly(lab_up, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    lab = lab_up(HANG_FLEET)
    env = {**os.environ, "GPUK8S_LOG_FILE": str(tmp_path / "log")}
    p = subprocess.Popen([sys.executable, "-m", "gpuk8s", "preflight", "-i", str(lab.inventory)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)  # cp-1 answered; 'hang' is waiting on its 5 s connect timeout
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 130, err
    assert time.monotonic() - t0 < 3
    assert "interrupted" in err and "Traceback" not in err


def test_unreachable_host_is_named_and_others_go_on(lab_up, run_cli):
    lab = lab_up(HANG_FLEET + "  - name: fine\n")
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    c = checks_by_host(json.loads(r.stdout))
    assert "timeout" in c["hang"]["ssh.reachable"]["message"] and "within 5 s" in c["hang"]["ssh.reachable"]["message"]
    assert c["fine"]["gpu.driver"]["status"] == "pass"
