"""MIG end to end on the lab, through `gpuk8s install` and `gpuk8s verify` (docs/mig.md): an A100 node with
all-1g.10gb under the single strategy and an H200 node with 2 x 3g.71gb under the mixed strategy end with
their MIG resources allocatable and the test pods done; a host whose GPU is held needs a reboot while the
others complete, and --allow-reboot reboots it (the lab's `systemctl reboot`: SSH drops and comes back); a
second install changes nothing; a reboot keeps the layout (gpuk8s-mig.service), one without the unit shows in
verify; back to none restores whole GPUs and removes the MIG labels."""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

FLEET = """hosts:
  - name: cp-1
    role: control-plane
  - name: a100
    gpus: 2
  - name: h200
    gpus: 2
    gpu_model: NVIDIA H200
    gpu_memory_mib: 143771
    driver: 570.124.06
  - name: held
    gpus: 2
"""
SINGLE = {"strategy": "single", "config": "all-1g.10gb"}
MIXED = {"strategy": "mixed", "config": [{"devices": "all", "mig-devices": {"3g.71gb": 2}}]}
NONE = {"strategy": "none"}


def write_inventory(lab: Any, mig: dict[str, dict[str, Any]]) -> str:
    inv = yaml.safe_load(lab.inventory.read_text())
    for h in inv["hosts"]:
        if h["name"] in mig:
            h["mig"] = mig[h["name"]]
    path = lab.root / "inventory-mig.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return str(path)


def run(run_cli: Any, *args: str) -> dict[str, Any]:
    t = time.monotonic()
    r = run_cli(*args, "-o", "json", timeout=900)
    rep = json.loads(r.stdout)
    rep["_rc"], rep["_s"] = r.returncode, round(time.monotonic() - t, 1)
    print(f"{args[0]} took {rep['_s']} s (exit {r.returncode})")
    if r.returncode:  # what a failing assertion below needs to be understood
        print("phases:", [(p["name"], p["status"], p["message"][:300]) for p in rep["phases"]
                          if p["status"] != "unchanged"], "nodes:", [(n["node"], n["ok"]) for n in rep["nodes"]])
    return rep


def phase(rep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in rep["phases"] if p["name"] == name)


def checks(rep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in rep["nodes"]}


def nodes(lab: Any) -> dict[str, dict[str, Any]]:
    out = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json").stdout
    return {n["metadata"]["name"]: n for n in json.loads(out)["items"]}


def mig_writes(lab: Any, host: str) -> int:
    return sum(1 for a in lab.host(host).commands() if a[0] == "nvidia-smi"
               and any(w in a for w in ("-mig", "-r", "-cgi", "-dci", "-dgi")))


def test_mig_install_verify_reboot_and_back_to_none(lab_up, run_cli):
    lab = lab_up(FLEET)
    lab.host("held").hold_gpu(1, 4242, "python3")
    inv = write_inventory(lab, {"a100": SINGLE, "h200": MIXED, "held": SINGLE})

    # 1. the held GPU refuses its reset: that host needs a reboot (with the command), the others complete
    rep = run(run_cli, "install", "-i", inv, "--force")
    assert rep["_rc"] != 0
    mig = phase(rep, "mig")
    assert mig["status"] == "failed" and "needs a reboot: held" in mig["message"], mig
    assert mig["hosts"]["held"].startswith("needs-reboot") and "sudo systemctl reboot" in mig["hosts"]["held"]
    assert mig["hosts"]["a100"].startswith("changed") and mig["hosts"]["h200"].startswith("changed")
    c = checks(rep)
    assert c["a100"]["ok"] and (c["a100"]["resource"], c["a100"]["allocatable_gpus"]) == ("nvidia.com/gpu", 14)
    assert c["a100"]["pod"], c["a100"]  # the test pod asked for one MIG device and succeeded
    assert c["h200"]["ok"], c["h200"]
    assert (c["h200"]["resource"], c["h200"]["expected_gpus"]) == ("nvidia.com/mig-3g.71gb", 4)
    assert not c["held"]["ok"] and c["held"]["cause_id"] == "gpu.mig-resources", c["held"]
    assert "0 of 14 nvidia.com/gpu" in c["held"]["cause"] and "7 x 1g.10gb" in c["held"]["cause"]

    n = nodes(lab)
    a100, h200 = n["a100"], n["h200"]
    assert a100["status"]["allocatable"]["nvidia.com/gpu"] == "14"
    assert h200["status"]["allocatable"]["nvidia.com/mig-3g.71gb"] == "4"
    assert "nvidia.com/gpu" not in h200["status"]["allocatable"]
    la, lh = a100["metadata"]["labels"], h200["metadata"]["labels"]
    assert la["nvidia.com/mig.strategy"] == "single" and lh["nvidia.com/mig.strategy"] == "mixed"
    assert la["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb" and la["nvidia.com/gpu.count"] == "14"
    assert lh["nvidia.com/mig-3g.71gb.count"] == "4" and lh["nvidia.com/mig-3g.71gb.product"].endswith("-MIG-3g.71gb")
    assert la["nvidia.com/device-plugin.config"] == "mig-single"
    assert lh["nvidia.com/device-plugin.config"] == "mig-mixed"
    cm = json.loads(lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf -n kube-system get "
                                          "configmap nvidia-device-plugin-configs -o json").stdout)
    assert {k: yaml.safe_load(v)["flags"]["migStrategy"] for k, v in cm["data"].items()} == {
        "none": "none", "mig-single": "single", "mig-mixed": "mixed"}

    # a pod asking for one 3g.71gb slice runs there and sees one MIG device, as nvidia-smi -L shows it in a container
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slice", "namespace": "default"},
           "spec": {"nodeName": "h200", "restartPolicy": "Never", "containers": [{
               "name": "c", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "command": ["nvidia-smi", "-L"],
               "resources": {"limits": {"nvidia.com/mig-3g.71gb": 1}}}]}}
    cp = lab.host("cp-1")
    cp.write("/root/slice.yaml", yaml.safe_dump(pod))
    cp.exec("kubectl --kubeconfig /etc/kubernetes/admin.conf apply -f /root/slice.yaml")
    logs = cp.exec("kubectl --kubeconfig /etc/kubernetes/admin.conf logs slice").stdout
    assert "MIG 3g.71gb" in logs and logs.count("Device") == 1, logs
    cp.exec("kubectl --kubeconfig /etc/kubernetes/admin.conf delete pod slice")

    # 2. --allow-reboot: gpuk8s reboots the held host, waits for SSH, finishes; everything verified
    before = lab.host("held").state().get("boots", 0)
    rep = run(run_cli, "install", "-i", inv, "--force", "--allow-reboot")
    assert rep["_rc"] == 0, json.dumps(phase(rep, "mig")) + json.dumps(rep["nodes"])[:2000]
    assert lab.host("held").state().get("boots", 0) == before + 1
    assert phase(rep, "mig")["hosts"]["held"].startswith("changed: rebooted"), phase(rep, "mig")
    assert all(c["ok"] for c in rep["nodes"]), rep["nodes"]
    assert checks(rep)["held"]["allocatable_gpus"] == 14

    # 3. a second install changes nothing: no MIG command that writes, no phase changed
    writes = {h: mig_writes(lab, h) for h in ("a100", "h200", "held")}
    rep = run(run_cli, "install", "-i", inv, "--force")
    assert rep["_rc"] == 0 and not rep["changed"], [(p["name"], p["status"]) for p in rep["phases"]]
    assert phase(rep, "mig")["status"] == "unchanged"
    assert {h: mig_writes(lab, h) for h in writes} == writes

    # 4. a reboot: the instances are gone, gpuk8s-mig.service re-creates them; verify passes
    lab.host("a100").reboot()
    rep = run(run_cli, "verify", "-i", inv)
    assert rep["_rc"] == 0 and checks(rep)["a100"]["allocatable_gpus"] == 14, rep["nodes"]
    # without the unit (disabled by hand), verify names the lost layout
    h = lab.host("h200")
    h.update_state(enabled=[u for u in h.state()["enabled"] if u != "gpuk8s-mig"])
    h.reboot()
    rep = run(run_cli, "verify", "-i", inv)
    c = checks(rep)["h200"]
    assert rep["_rc"] != 0 and c["cause_id"] == "gpu.mig-resources", c
    assert "0 of 4 nvidia.com/mig-3g.71gb" in c["cause"] and "no MIG devices" in c["cause"], c
    rep = run(run_cli, "install", "-i", inv, "--force")
    assert rep["_rc"] == 0 and phase(rep, "mig")["hosts"]["h200"].startswith("changed"), phase(rep, "mig")

    # 5. back to none: whole GPUs, MIG labels and resources gone
    rep = run(run_cli, "install", "-i", write_inventory(lab, {"a100": NONE, "h200": NONE, "held": NONE}), "--force")
    assert rep["_rc"] == 0, json.dumps(phase(rep, "mig")) + json.dumps(rep["nodes"])[:2000]
    for name in ("a100", "h200", "held"):
        c = checks(rep)[name]
        assert (c["resource"], c["allocatable_gpus"]) == ("nvidia.com/gpu", 2), c
    n = nodes(lab)
    for name in ("a100", "h200", "held"):
        assert not [k for k in n[name]["metadata"]["labels"] if k.startswith(("nvidia.com/mig", "nvidia.com/mig-"))]
        assert not [k for k in n[name]["status"]["allocatable"] if k.startswith("nvidia.com/mig-")]
        assert n[name]["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "none"


def test_time_slicing_of_mixed_mig_devices(lab_up, run_cli):
    """Time-slicing replicates the mixed strategy's MIG resources (docs/mig.md): 2 x 3g.71gb on 2 GPUs with
    replicas 2 is 8 nvidia.com/mig-3g.71gb, and verify's sharing proof runs on that resource."""
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: h200\n    gpus: 2\n"
                 "    gpu_model: NVIDIA H200\n    gpu_memory_mib: 143771\n    driver: 570.124.06\n")
    inv = yaml.safe_load(lab.inventory.read_text())
    for h in inv["hosts"]:
        if h["name"] == "h200":
            h["mig"] = MIXED
            h["gpu_sharing"] = {"strategy": "time-slicing", "replicas": 2}
    path = lab.root / "inventory-mig-ts.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    rep = run(run_cli, "install", "-i", str(path), "--force")
    assert rep["_rc"] == 0, json.dumps(rep["nodes"])[:3000]
    c = checks(rep)["h200"]
    assert (c["resource"], c["expected_gpus"], c["allocatable_gpus"]) == ("nvidia.com/mig-3g.71gb", 8, 8)
    assert c["proof"].startswith("8 one-slice pods bound, 1 more Pending (Insufficient nvidia.com/mig-3g.71gb)"), c
    assert "a pod asking for 2 rejected: UnexpectedAdmissionError" in c["proof"]
    labels = nodes(lab)["h200"]["metadata"]["labels"]
    assert labels["nvidia.com/mig-3g.71gb.replicas"] == "2"
    assert labels["nvidia.com/device-plugin.config"] == "time-slicing-2-mig-mixed-3g.71gb"
