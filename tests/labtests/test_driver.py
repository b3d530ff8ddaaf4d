"""The driver's state, read by preflight in the same probe on the lab's hosts (docs/driver.md): a well-kept host,
an HGX board without fabric manager, a bare server (no driver, nouveau loaded) with and without
driver: {manage: true}, a host whose packages were upgraded without a reboot, loose packages and no persistenced."""

from __future__ import annotations

import json
import time

import yaml

FLEET = """
hosts:
  - {name: cp-1, role: control-plane}
  - {name: gpu-ok, gpus: 2}
  - {name: hgx, gpus: 8, gpu_model: "NVIDIA H100 80GB HBM3", nvswitches: 4, driver: "580.95.05", driver_flavor: open}
  - {name: bare, gpus: 4, gpu_model: "NVIDIA H100 80GB HBM3", driver: null, modules: [overlay, nouveau]}
  - {name: bare-managed, gpus: 4, gpu_model: "NVIDIA H100 80GB HBM3", driver: null, modules: [overlay, nouveau],
     driver_inventory: {manage: true}}
  - {name: upgraded, gpus: 2, driver: "570.124.06", driver_libraries: "570.195.03"}
  - {name: loose, gpus: 2, driver_held: false, persistenced: false}
"""


def test_preflight_reads_the_driver_state_in_its_one_probe(lab_up, run_cli):
    lab = lab_up(FLEET)
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--no-network")
    assert r.returncode == 1, r.stderr
    c = {h["name"]: {x["id"]: x for x in h["checks"]} for h in json.loads(r.stdout)["hosts"]}

    ok = c["gpu-ok"]
    assert {i: ok[i]["status"] for i in ok if i.startswith("driver.")} == {
        "driver.mismatch": "pass", "driver.nouveau": "pass", "driver.secure-boot": "skip",
        "driver.fabric-manager": "pass", "driver.persistence": "pass", "driver.held": "pass"}
    assert "535.104.05 (proprietary)" in ok["driver.mismatch"]["message"]

    hgx = c["hgx"]
    assert "580.95.05 (open)" in hgx["driver.mismatch"]["message"]  # /proc/driver/nvidia/version of open modules
    assert hgx["driver.fabric-manager"]["status"] == "fail"
    assert hgx["driver.fabric-manager"]["message"].startswith("4 NVSwitch(es) and no fabric manager")

    bare = c["bare"]  # the user's driver: preflight names what is missing and blocks it
    assert bare["gpu.driver"]["status"] == "fail" and "not installed" in bare["gpu.driver"]["message"]
    assert bare["driver.nouveau"]["status"] == "warn"
    assert "driver.plan" not in bare

    managed = c["bare-managed"]  # gpuk8s's driver: the plan from lspci's GPUs, the host not blocked by the driver
    assert managed["gpu.driver"]["status"] == "skip"
    assert "install installs the driver" in managed["gpu.driver"]["message"]
    assert managed["driver.plan"]["status"] == "pass"
    assert "branch 580, open modules (Turing or newer GPUs" in managed["driver.plan"]["message"]
    assert "install blacklists it" in managed["driver.nouveau"]["remedy"]

    up = c["upgraded"]  # nvidia-smi's real two-line mismatch text, and the versions that explain it
    assert up["gpu.driver"]["status"] == "fail" and "version mismatch" in up["gpu.driver"]["message"]
    assert up["driver.mismatch"]["status"] == "fail"
    assert "570.124.06 is loaded, but the driver's libraries are 570.195.03" in up["driver.mismatch"]["message"]

    loose = c["loose"]
    assert loose["driver.held"]["status"] == "warn" and "apt-mark hold nvidia-driver-535-server" in \
        loose["driver.held"]["remedy"]
    assert loose["driver.persistence"]["status"] == "warn"

    probes = [argv for argv in lab.host("gpu-ok").commands() if argv[:1] == ["lspci"]]
    assert len(probes) == 1  # lspci ran once, inside the one probe


BARE = """
hosts:
  - {name: cp-1, role: control-plane}
  - {name: bare-1, gpus: 4, gpu_model: "NVIDIA H100 80GB HBM3", driver: null, modules: [overlay, nouveau],
     driver_inventory: {manage: true}}
  - {name: bare-2, gpus: 2, gpu_model: "NVIDIA A100-SXM4-80GB", driver: null,
     driver_inventory: {manage: true, flavor: proprietary}}
  - {name: hgx, gpus: 8, gpu_model: "NVIDIA H100 80GB HBM3", nvswitches: 4, driver: null, modules: [overlay, nouveau],
     driver_inventory: {manage: true, branch: "595"}}
"""


def test_bare_servers_become_a_cluster_in_one_install_and_a_rerun_changes_nothing(lab_up, run_cli, tmp_path):
    lab = lab_up(BARE)
    kc = tmp_path / "kc"
    # without --allow-reboot: the node nouveau holds is named, the one without nouveau gets its module loaded
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(kc))
    rep = json.loads(r.stdout)
    drv = next(p for p in rep["phases"] if p["name"] == "driver")
    assert drv["hosts"]["bare-2"].startswith("changed: driver 580.95.05 installed, no module loaded: modprobe nvidia")
    assert drv["hosts"]["bare-1"].startswith("needs-reboot: nouveau holds the GPUs: reboot it")
    assert r.returncode == 1 and drv["status"] == "failed" and "--allow-reboot" in drv["remedy"]
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert nodes["bare-2"]["allocatable_gpus"] == 2 and nodes["bare-2"]["ok"]
    assert not nodes["bare-1"]["ok"] and not nodes["bare-1"]["ready"]  # left out: not joined

    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(kc), "--allow-reboot")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    drv = next(p for p in rep["phases"] if p["name"] == "driver")
    assert drv["hosts"]["bare-1"].startswith("changed: nouveau holds the GPUs; driver 580.95.05 answers after")
    assert drv["hosts"]["bare-1"].endswith("(rebooted)")
    assert drv["hosts"]["hgx"].startswith("changed: nouveau holds the GPUs; driver 595.71.05 answers after")
    assert {n["node"]: n["allocatable_gpus"] for n in rep["nodes"] if n["node"] != "cp-1"} == {
        "bare-1": 4, "bare-2": 2, "hgx": 8}
    assert all(n["ok"] for n in rep["nodes"])

    b1, hgx = lab.host("bare-1"), lab.host("hgx")
    assert "Open Kernel Module for x86_64  580.95.05" in b1.exec("cat /proc/driver/nvidia/version").stdout
    assert "nouveau" not in b1.exec("lsmod").stdout
    assert "blacklist nouveau" in b1.read("/etc/modprobe.d/blacklist-nouveau.conf")
    assert [p for p in b1.exec("apt-mark showhold").stdout.split() if "nvidia" in p] == sorted([
        "linux-modules-nvidia-580-server-open-5.15.0-105-generic", "nvidia-headless-no-dkms-580-server-open",
        "nvidia-utils-580-server"])
    assert "x86_64 Kernel Module  580.95.05" in lab.host("bare-2").exec("cat /proc/driver/nvidia/version").stdout
    # the HGX board: fabric manager of the driver's version, running
    assert "nvidia-fabricmanager-595" in hgx.exec("apt-mark showhold").stdout
    assert hgx.exec("systemctl is-active nvidia-fabricmanager nvidia-persistenced").stdout.split() == [
        "active", "active"]

    pf = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--no-network")
    c = {h["name"]: {x["id"]: x["status"] for x in h["checks"]} for h in json.loads(pf.stdout)["hosts"]}
    for name in ("bare-1", "bare-2", "hgx"):
        assert {i: s for i, s in c[name].items() if i.startswith("driver.") and s not in ("pass", "skip")} == {}, name
        assert c[name]["driver.held"] == "pass" and c[name]["driver.mismatch"] == "pass", name

    before = {h: len(lab.host(h).commands()) for h in ("bare-1", "hgx")}
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(kc), "--allow-reboot")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and not rep["changed"], r.stdout
    assert next(p for p in rep["phases"] if p["name"] == "driver")["status"] == "unchanged"
    for h in ("bare-1", "hgx"):  # no package, module or reboot command the second time
        calls = lab.host(h).commands()[before[h]:]
        assert not [a for a in calls if a[:2] in (["apt-get", "install"], ["systemctl", "reboot"])
                    or a[:1] == ["modprobe"]], h


MANAGED = """
hosts:
  - {name: cp-1, role: control-plane}
  - {name: gpu-1, gpus: 2, gpu_model: "NVIDIA H100 80GB HBM3", driver: null, driver_inventory: {manage: true}}
  - {name: gpu-2, gpus: 2, gpu_model: "NVIDIA H100 80GB HBM3", nvswitches: 4, driver: null,
     driver_inventory: {manage: true}}
"""


def test_driver_upgrade_across_a_branch_node_by_node_with_a_gpu_job_waited_for(lab_up, run_cli, tmp_path):
    lab = lab_up(MANAGED)
    kc = tmp_path / "kc"
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(kc), "--allow-reboot")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the operator moves the managed nodes to R595 in the inventory, then asks for the upgrade
    inv = yaml.safe_load(lab.inventory.read_text())
    for h in inv["hosts"]:
        if "driver" in h:
            h["driver"]["branch"] = "595"
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))

    plan = run_cli("driver", "upgrade", "-i", str(path), "-o", "json", "--dry-run")
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    changes = next(p for p in json.loads(plan.stdout)["plans"] if p["name"] == "driver-upgrade")["changes"]
    assert any("nvidia-headless-no-dkms-595-server-open" in c.get("commands", "") for c in changes)
    assert [c["what"] for c in changes if c.get("commands") == "sudo systemctl reboot"] == [
        "reboot gpu-1 into driver 595 (open), from 580.95.05", "reboot gpu-2 into driver 595 (open), from 580.95.05"]
    assert "595" not in lab.host("gpu-1").exec("cat /proc/driver/nvidia/version").stdout  # a dry run changed nothing

    job = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "train-0", "namespace": "ml",
                        "annotations": {"lab.gpuk8s.io/runs-seconds": "5", "lab.gpuk8s.io/created": str(time.time())},
                        "ownerReferences": [{"kind": "Job", "name": "train"}]},
           "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "cuda",
                                                          "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf apply -f - <<'X'\n" + json.dumps(job)
                          + "\nX\n")
    t0 = time.monotonic()
    r = run_cli("driver", "upgrade", "-i", str(path), "-o", "json", "--yes", "--gpu-pod-timeout", "120")
    seconds = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rep = json.loads(r.stdout)
    up = next(p for p in rep["phases"] if p["name"] == "driver-upgrade")
    assert "waited for GPU pods ml/train-0" in up["hosts"]["gpu-1"], up
    for name in ("gpu-1", "gpu-2"):
        assert "driver 580.95.05 -> 595.71.05 (open, held)" in up["hosts"][name] and "uncordoned" in up["hosts"][name]
        assert "Open Kernel Module for x86_64  595.71.05" in lab.host(name).exec(
            "cat /proc/driver/nvidia/version").stdout
        held = lab.host(name).exec("apt-mark showhold").stdout.split()
        assert "nvidia-headless-no-dkms-595-server-open" in held and not [p for p in held if "-580" in p], held
    assert "nvidia-fabricmanager-595" in lab.host("gpu-2").exec("apt-mark showhold").stdout
    assert lab.host("gpu-2").exec("systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
    assert {f["id"] for f in rep["findings"]} == {"driver.upgraded"}
    assert all(n["ok"] for n in rep["nodes"]) and {n["node"]: n["allocatable_gpus"] for n in rep["nodes"]}[
        "gpu-2"] == 2
    down = {n: float(up["hosts"][n].split("GPUs back after ")[1].split(" s")[0]) for n in ("gpu-1", "gpu-2")}
    print(f"driver upgrade of 2 nodes: {seconds:.1f} s; GPU-down per node: {down}")

    # a re-run changes nothing; install agrees with the upgraded nodes (no downgrade back to 580)
    r = run_cli("driver", "upgrade", "-i", str(path), "-o", "json", "--yes")
    assert r.returncode == 0 and next(p for p in json.loads(r.stdout)["phases"]
                                      if p["name"] == "driver-upgrade")["status"] == "unchanged", r.stdout[-2000:]
    r = run_cli("install", "-i", str(path), "-o", "json", "--kubeconfig-out", str(kc))
    assert r.returncode == 0 and not json.loads(r.stdout)["changed"], r.stdout[-3000:]


def test_an_unattended_upgrade_without_reboot_is_named_and_install_repairs_it(lab_up, run_cli, tmp_path):
    lab = lab_up(MANAGED.replace("nvswitches: 4, ", ""))
    kc = tmp_path / "kc"
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(kc), "--allow-reboot")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the archive publishes 580.126.09; an unattended upgrade (holds lifted by hand) installs it, no reboot follows
    g1 = lab.host("gpu-1")
    g1.update_state(archive_updates={"580": ["580.126.09"]})
    g1.exec("apt-get update -q >/dev/null && apt-get install -y -q --allow-change-held-packages "
            "nvidia-headless-no-dkms-580-server-open nvidia-utils-580-server >/dev/null")
    smi = g1.exec("nvidia-smi", check=False)
    assert smi.returncode == 18 and smi.stdout.splitlines() == [
        "Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 580.126"]

    pf = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--no-network")
    c = {x["id"]: x for x in next(h for h in json.loads(pf.stdout)["hosts"] if h["name"] == "gpu-1")["checks"]}
    assert c["driver.mismatch"]["status"] == "skip"  # managed: install repairs it, so it does not block
    assert "580.95.05 is loaded, the libraries are 580.126.09" in c["driver.mismatch"]["message"]

    doc = run_cli("doctor", "-i", str(lab.inventory), "-o", "json", "node/gpu-1")
    assert doc.returncode == 1, doc.stdout[-3000:]
    found = json.loads(doc.stdout)["findings"]
    cause = next(f for f in found if f["id"] == "gpu.driver")
    assert "version mismatch" in cause["message"]
    assert any("driver: module 580.95.05 (open), libraries 580.126.09" in e for e in cause["evidence"]), cause

    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(kc), "--allow-reboot")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    drv = next(p for p in json.loads(r.stdout)["phases"] if p["name"] == "driver")
    assert drv["hosts"]["gpu-1"].startswith("changed: module 580.95.05 is loaded, 580.126.09 is installed; "
                                            "driver 580.126.09 answers after"), drv
    assert g1.exec("nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split() == [
        "580.126.09", "580.126.09"]


ALINUX = """
hosts:
  - {name: cp-1, role: control-plane}
  - {name: al-1, os: alinux-3, gpus: 4, gpu_model: "NVIDIA H100 80GB HBM3", nvswitches: 4, driver: null,
     modules: [overlay, nouveau], driver_inventory: {manage: true},
     containerd_config: "# containerd.io's shipped config\\ndisabled_plugins = [\\"cri\\"]\\n"}
"""


def test_a_bare_alibaba_cloud_linux_server_gets_nvidias_open_driver_by_dkms(lab_up, run_cli, tmp_path):
    lab = lab_up(ALINUX)
    kc = tmp_path / "kc"
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(kc), "--allow-reboot")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert {n["node"]: n["allocatable_gpus"] for n in rep["nodes"]}["al-1"] == 4
    al = lab.host("al-1")
    assert "baseurl=https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64" in al.read(
        "/etc/yum.repos.d/gpuk8s-cuda-rhel8.repo")
    assert al.state()["dnf_modules"] == {"nvidia-driver": "580-open"}
    assert "Open Kernel Module for x86_64  580.95.05" in al.exec("cat /proc/driver/nvidia/version").stdout
    locks = al.read("/etc/dnf/plugins/versionlock.list").split()
    assert "nvidia-open-3:580.95.05-1.el8.*" in locks and "nvidia-fabricmanager-3:580.95.05-1.el8.*" in locks
    assert "kernel-devel-5.10.134-16.1.al8.x86_64" in al.state()["packages"]  # DKMS built against it
    pf = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--no-network")
    c = {x["id"]: x["status"] for x in next(h for h in json.loads(pf.stdout)["hosts"] if h["name"] == "al-1")["checks"]}
    assert {i: st for i, st in c.items() if i.startswith("driver.") and st not in ("pass", "skip")} == {}
    assert c["driver.held"] == "pass" and c["driver.kernel-headers"] == "pass"
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(kc), "--allow-reboot")
    assert r.returncode == 0 and not json.loads(r.stdout)["changed"], r.stdout[-3000:]

    # day two (issue 41): the operator moves al-1 to branch 595. install refuses to change a running node's driver
    # (it would replace the packages under its GPU pods) and names driver upgrade; driver upgrade switches the
    # stream with its packages and the locks, reboots it into 595; a re-run and install change nothing
    inv = yaml.safe_load(lab.inventory.read_text())
    for h in inv["hosts"]:
        if h.get("name") == "al-1":
            h["driver"] = {"manage": True, "branch": "595"}
    path = tmp_path / "inventory-595.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    r = run_cli("install", "-i", str(path), "-o", "json", "--prepare-only", "--allow-reboot")
    assert r.returncode == 1, r.stdout[-3000:]
    held = next(x for x in json.loads(r.stdout)["hosts"] if x["name"] == "al-1")
    assert held["status"] == "blocked" and "driver.plan" in held["message"], held
    assert "this node is in the cluster and runs driver 580.95.05" in held["message"], held
    assert "580.95.05" in al.exec("cat /proc/driver/nvidia/version").stdout  # nothing changed under its pods
    r = run_cli("driver", "upgrade", "-i", str(path), "-o", "json", "--yes")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    up = next(p for p in json.loads(r.stdout)["phases"] if p["name"] == "driver-upgrade")
    assert "driver 580.95.05 -> 595.71.05 (open, held)" in up["hosts"]["al-1"], up
    assert al.state()["dnf_modules"] == {"nvidia-driver": "595-open"}
    assert "Open Kernel Module for x86_64  595.71.05" in al.exec("cat /proc/driver/nvidia/version").stdout
    locks = al.read("/etc/dnf/plugins/versionlock.list").split()
    assert "nvidia-open-3:595.71.05-1.el8.*" in locks and not [x for x in locks if ":580." in x], locks
    r = run_cli("driver", "upgrade", "-i", str(path), "-o", "json", "--yes")
    assert r.returncode == 0 and next(p for p in json.loads(r.stdout)["phases"]
                                      if p["name"] == "driver-upgrade")["status"] == "unchanged", r.stdout[-2000:]
    r = run_cli("install", "-i", str(path), "-o", "json", "--kubeconfig-out", str(kc), "--allow-reboot")
    assert r.returncode == 0 and not json.loads(r.stdout)["changed"], r.stdout[-3000:]
