"""Health before a node joins (issue 32), on the lab: install judges each GPU host's GPUs before it joins; a host
with an Xid 79 (a GPU off the bus) and one with a pending row remap join quarantined with the evidence, the healthy
one normally; verify tests only the healthy; status shows the quarantine; `gpuk8s health --release` keeps a node
still failing in quarantine and releases it once its fault is cleared (a GPU reset for the remap, a reboot for the
lost GPU); a re-run of install changes nothing and quarantines no node that joined."""

from __future__ import annotations

import json

import jsonschema

from tests.labtests.gpucluster import KUBECTL, STATUS_SCHEMA

FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: fine
  - name: fell
    health: {xid: [{gpu: 1, xid: 79}], lost: [1]}
  - name: remap
    health: {remap_pending: [2]}
"""


def taints(lab, node: str) -> list[dict]:
    doc = json.loads(lab.hosts["cp-1"].exec(KUBECTL + f"get node {node} -o json").stdout)
    return doc["spec"].get("taints", [])


def quarantine(lab, node: str) -> str | None:
    return next((t.get("value", "") for t in taints(lab, node) if t["key"] == "gpuk8s.io/quarantine"), None)


def test_install_quarantines_unhealthy_hosts_and_release_lifts_it_once_fixed(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    inv, kc = str(lab.inventory), str(tmp_path / "kc")
    r = run_cli("install", "-i", inv, "-o", "json", "--kubeconfig-out", kc)
    assert "Traceback" not in r.stderr, r.stderr
    rep = json.loads(r.stdout)
    assert r.returncode == 0, r.stdout  # the policy (quarantine) was followed: the cluster is as asked
    phases = {p["name"]: p for p in rep["phases"]}
    health = phases["health"]
    assert health["status"] == "passed" and health["message"].startswith("1 of 3 GPU host(s) healthy")
    assert health["hosts"]["fine"] == "healthy"
    assert health["hosts"]["fell"].startswith("quarantined (gpuk8s.io/quarantine=health.xid:NoSchedule)")
    assert health["hosts"]["remap"].startswith("quarantined (gpuk8s.io/quarantine=health.row-remap-pending:")
    assert "gpuk8s health --release fell remap" in health["remedy"]
    assert phases["join"]["hosts"]["fell"] == "joined, quarantined (gpuk8s.io/quarantine=health.xid:NoSchedule)"
    # the evidence, per host: the kernel's line of the Xid, the GPU the remap waits on
    found = {(f["subject"]["name"], f["id"]): f for f in rep["findings"]}
    assert "NVRM: Xid (PCI:0000:11:00): 79, GPU has fallen off the bus." in found["fell", "health.xid"]["evidence"]
    assert found["fell", "health.xid"]["status"] == "fail"
    assert "GPU 2 (0000:12:00)" in found["remap", "health.row-remap-pending"]["message"]
    assert not [k for k in found if k[0] == "fine"]

    # the readings rode in the fact probes install runs anyway (preflight, and the one after the playbooks changed
    # the host): no probe of its own, one `nvidia-smi -q` per probe
    calls = lab.host("fine").commands()
    probes = [a for a in calls if a[:2] == ["nvidia-smi", "--version"]]
    assert len(probes) == 2 and len([a for a in calls if a[:2] == ["nvidia-smi", "-q"]]) == 2, calls
    assert not [a for a in lab.host("cp-1").commands() if a[:2] == ["nvidia-smi", "-q"]]  # no GPUs: not judged

    # the taint is on the node from its registration (JoinConfiguration), the healthy node has none
    assert quarantine(lab, "fell") == "health.xid" and quarantine(lab, "remap") == "health.row-remap-pending"
    assert quarantine(lab, "fine") is None
    # verify: a test pod on the healthy node only; the quarantined are named, not failed
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert nodes["fine"]["ok"] and nodes["fine"]["pod"] and not nodes["fine"]["quarantine"]
    assert nodes["fell"]["quarantine"] == "health.xid" and not nodes["fell"]["pod"]
    assert nodes["remap"]["quarantine"] == "health.row-remap-pending" and not nodes["remap"]["pod"]
    assert "1/4 nodes ok" not in phases["verify"]["message"] and "2 quarantined (fell, remap)" in \
        phases["verify"]["message"]
    # the device plugin tolerates the quarantine: the quarantined nodes' GPUs are counted (fell's lost one is not)
    st = json.loads(run_cli("status", "-i", inv, "-o", "json").stdout)
    jsonschema.validate(st, STATUS_SCHEMA)
    by = {n["node"]: n for n in st["nodes"]}
    assert by["fell"]["quarantine"] == "health.xid" and by["fine"]["quarantine"] == ""
    assert by["remap"]["resources"][0]["allocatable"] == 4 and by["fell"]["resources"][0]["allocatable"] == 3
    assert "fell (quarantined: health.xid)" in run_cli("status", "-i", inv).stdout

    # a re-run changes nothing: the joined nodes are not judged again, the taints stay
    r = run_cli("install", "-i", inv, "-o", "json", "--kubeconfig-out", kc)
    again = json.loads(r.stdout)
    assert r.returncode == 0 and not again["changed"], [p for p in again["phases"] if p["status"] == "changed"]
    assert {p["name"]: p for p in again["phases"]}["health"]["message"] == "no GPU host to join"
    assert quarantine(lab, "fell") == "health.xid"

    # release: refused while the fault is there, done once it is cleared
    r = run_cli("health", "--release", "remap", "fine", "-i", inv, "-o", "json")
    got = {h["name"]: {f["id"]: f for f in h["findings"]} for h in json.loads(r.stdout)["hosts"]}
    assert r.returncode == 1
    assert got["remap"]["health.release"]["status"] == "fail" and "kept in quarantine" in \
        got["remap"]["health.release"]["message"]
    assert got["fine"]["health.release"]["message"] == "not quarantined"
    assert quarantine(lab, "remap") == "health.row-remap-pending"
    lab.hosts["remap"].exec("nvidia-smi -i 2 -r")  # the reset activates the remap
    lab.hosts["fell"].reboot()  # the GPU is back on the bus, the kernel log starts anew
    r = run_cli("health", "--release", "remap", "fell", "-i", inv)
    assert r.returncode == 0, r.stdout
    assert "released: the quarantine taint (health.row-remap-pending) removed" in r.stdout
    assert quarantine(lab, "remap") is None and quarantine(lab, "fell") is None
    assert run_cli("health", "--release", "-i", inv).returncode == 2  # the nodes must be named
