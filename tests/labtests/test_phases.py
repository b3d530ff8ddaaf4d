"""The phases on the lab: --dry-run plans every cluster phase and changes nothing, before and after an install;
a change of the device plugin template is applied again by the next install."""

from __future__ import annotations

import json
import re

import yaml

from gpuk8s import flows
from gpuk8s.inventory.loader import load
from gpuk8s.kube import manifests
from gpuk8s.phases.base import Options
from tests.labtests.test_install import snapshot

FLEET = "hosts:\n  - name: cp-1\n    role: control-plane\n  - name: gpu-1\n    gpus: 2\n  - name: gpu-2\n"
WRITES = {("kubeadm", w) for w in ("init", "join", "token", "reset")} | {
    ("kubectl", w) for w in ("apply", "label", "taint", "delete", "create", "patch")}


def cluster_writes(lab) -> list[list[str]]:
    return [a for h in lab.hosts.values() for a in h.commands()
            if any(a[0] == tool and verb in a[1:] for tool, verb in WRITES)]


def test_dry_run_plans_every_cluster_phase_and_changes_nothing(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    before = snapshot(lab)
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--dry-run", "--kubeconfig-out",
                str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    plans = {p["name"]: p for p in rep["plans"]}
    assert list(plans) == ["prepare", "driver", "health", "mig", "init", "kubeconfig", "cni", "join", "gpu", "verify"]
    assert plans["mig"]["status"] == "unchanged"  # no host asks for MIG or has it on
    assert plans["driver"]["status"] == "unchanged"  # no host has driver: {manage: true}
    assert plans["health"]["status"] == "unchanged"
    assert plans["health"]["reason"].endswith(": 2 of 2 GPU host(s) healthy")
    assert all(plans[n]["status"] == "would-change" for n in ("prepare", "init", "kubeconfig", "cni", "join", "gpu"))
    init = plans["init"]["changes"][1]
    assert init["host"] == "cp-1"
    assert "kubeadm init --config /etc/kubernetes/gpuk8s-init-RANDOM.yaml" in init["commands"]
    assert "<token minted at run time>" in init["stdin"]
    assert [c["what"] for c in plans["join"]["changes"]][1:] == ["kubeadm join gpu-1", "kubeadm join gpu-2"]
    gpu = plans["gpu"]["changes"]
    assert [c["what"].split()[1] for c in gpu] == ["runtimeclass-nvidia.yaml", "nvidia-device-plugin-configs.yaml",
                                                   "nvidia-device-plugin.yaml",
                                                   "nvidia-device-plugin-mps-control-daemon.yaml"]
    assert "kind: DaemonSet" in gpu[2]["manifest"]
    assert snapshot(lab) == before and cluster_writes(lab) == []
    assert not (tmp_path / "kc").exists()
    # the text output shows the same: every phase, the exact commands and manifests
    r = run_cli("install", "-i", str(lab.inventory), "--dry-run")
    assert r.returncode == 0, r.stderr
    for name in ("init", "kubeconfig", "cni", "join", "gpu", "verify"):
        assert f"== phase {name}:" in r.stdout
    assert "kubeadm init --config" in r.stdout and "kind: RuntimeClass" in r.stdout
    assert snapshot(lab) == before and cluster_writes(lab) == []

    # after the install, a dry run plans nothing for the cluster and still changes nothing
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
    writes, before = len(cluster_writes(lab)), snapshot(lab)
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--dry-run", "--kubeconfig-out",
                str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
    statuses = {p["name"]: p["status"] for p in json.loads(r.stdout)["plans"]}
    assert statuses == {"prepare": "unchanged", "driver": "unchanged", "health": "unchanged", "mig": "unchanged",
                        "init": "unchanged", "kubeconfig": "unchanged",
                        "cni": "unchanged", "join": "unchanged", "gpu": "unchanged",
                        "verify": "would-change"}  # its test pods
    assert len(cluster_writes(lab)) == writes and snapshot(lab) == before


def test_a_changed_device_plugin_template_is_applied_by_the_next_install(lab_up, monkeypatch, tmp_path):
    lab = lab_up(FLEET)
    inv = load(lab.inventory)
    opts = Options(kubeconfig_out=tmp_path / "kc", kubeconfig_force=True, test_pods=False)
    rep = flows.install(inv, concurrency=4, ignore=set(), sudo_passwords={}, options=opts)
    assert rep.ok, rep.to_json()

    def applied() -> str:
        out = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get ds -n kube-system "
                                    "nvidia-device-plugin-daemonset -o json").stdout
        return json.loads(out)["metadata"]["annotations"][manifests.ANNOTATION]

    first = applied()
    assert first == manifests.device_plugin(inv).sha256
    rep = flows.install(inv, concurrency=4, ignore=set(), sudo_passwords={}, options=opts)
    assert {p.name: p.status for p in rep.phases}["gpu"] == "unchanged"
    original = manifests.device_plugin_template()
    changed = original + "# one more line\n"  # any byte of the template
    monkeypatch.setattr(manifests, "device_plugin_template", lambda: changed)
    rep = flows.install(inv, concurrency=4, ignore=set(), sudo_passwords={}, options=opts)
    gpu = next(p for p in rep.phases if p.name == "gpu")
    assert gpu.status == "changed" and "applied nvidia-device-plugin.yaml" in gpu.message
    assert applied() != first and applied() == manifests.device_plugin(inv).sha256
    runtime_class = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get runtimeclass nvidia "
                                          "-o json").stdout
    assert yaml.safe_load(runtime_class)["handler"] == "nvidia"  # applied on a cluster with GPU nodes


def test_skip_and_only_phases_on_the_lab(lab_up, run_cli, tmp_path):
    """--skip-phases leaves a phase out (shown as skipped); --only-phase runs one after the lock, install's prepare
    then reading every host without applying anything (a drifted host stays as it is); a wrong name changes
    nothing and exits 2."""
    lab = lab_up(FLEET)
    before = snapshot(lab)
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--skip-phases", "verify,nope")
    assert r.returncode == 2 and json.loads(r.stdout)["kind"] == "phase-selection", r.stdout + r.stderr
    assert snapshot(lab) == before and cluster_writes(lab) == []
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--skip-phases", "verify", "--kubeconfig-out",
                str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
    phases = {p["name"]: p for p in json.loads(r.stdout)["phases"]}
    assert phases["verify"]["status"] == "skipped" and phases["gpu"]["status"] == "changed"
    w = lab.host("gpu-2")
    drifted = w.read("/etc/containerd/config.toml").replace('default_runtime_name = "nvidia"',
                                                            'default_runtime_name = "runc"')
    w.write("/etc/containerd/config.toml", drifted)
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--only-phase", "gpu", "--kubeconfig-out",
                str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
    phases = {p["name"]: p for p in json.loads(r.stdout)["phases"]}
    assert [n for n, p in phases.items() if p["status"] != "skipped"] == ["lock", "gpu"]
    pending = re.search(r"(\d+) step\(s\) that would change were not applied", phases["prepare"]["message"])
    assert pending is not None and int(pending.group(1)) >= 1, phases["prepare"]  # the drift, seen and left
    assert w.read("/etc/containerd/config.toml") == drifted  # prepare read the hosts, applied nothing
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'default_runtime_name = "nvidia"' in w.read("/etc/containerd/config.toml")  # a whole install repairs it
