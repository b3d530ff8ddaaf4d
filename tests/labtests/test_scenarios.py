"""Scenarios (issue 41, docs/testing.md): realistic inventories that combine features, installed once, then day-two
steps, with the invariants (tests/labtests/invariants.py) checked after every step.

hgx-day-one: bare HGX H100 servers with gpuk8s's driver, one cut into MIG (mixed, 2 x 3g.40gb per GPU), one on DRA
whose preinstalled 535 driver gpuk8s replaces by branch 580 (preflight blocked this composition: its dra.driver
floor looked at the running driver), one time-sliced, monitoring deployed (its exporter's MIG series were counted as
whole GPUs), two InfiniBand NDR ports per GPU node with `fabric:` set (issue 43: every preflight checks them, install
deploys the RDMA device plugin and labels the nodes), on Kubernetes 1.36 (the default minor). Steps: install
--allow-reboot, verify, verify --fabric (RDMA between the nodes' rails), the invariants, a re-run that changes
nothing, the invariants again, a port pulled on one node named by preflight; day two: the managed nodes moved to
branch 595 with `driver upgrade`, its client killed (SIGKILL) as soon as the first node has rebooted into 595, then
the same command again, itself killed after each phase in turn until a run ends: it finishes that node (uncordoned)
and upgrades the other, and the invariants hold.

alinux-newest and docker-mps: below, at their inventories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from gpuk8s import versions
from tests.labtests import interrupt, invariants
from tests.labtests import test_docker_runtime as docker
from tests.labtests import test_mirrors as mirrors_test
from tests.labtests.test_install import changing_calls

HGX_DAY_ONE = """
cluster:
  kubernetes_version: "1.36"
defaults:
  # two InfiniBand NDR ports per GPU node (issue 43: the inventory's fabric is checked by every preflight)
  rdma: [{device: mlx5_0, state: "4: ACTIVE", phys_state: "5: LinkUp", rate: "400 Gb/sec (4X NDR)",
          link_layer: InfiniBand, sm_lid: "0x1"},
         {device: mlx5_1, state: "4: ACTIVE", phys_state: "5: LinkUp", rate: "400 Gb/sec (4X NDR)",
          link_layer: InfiniBand, sm_lid: "0x1"}]
hosts:
  - {name: cp-1, role: control-plane, rdma: []}
  - {name: mig-1, gpus: 2, gpu_model: "NVIDIA H100 80GB HBM3", gpu_memory_mib: 81559, nvswitches: 4, driver: null,
     modules: [overlay, nouveau], driver_inventory: {manage: true},
     mig_layout: {strategy: mixed, config: [{devices: all, mig-devices: {"3g.40gb": 2}}]}}
  - {name: dra-1, gpus: 2, gpu_model: "NVIDIA H100 80GB HBM3", gpu_memory_mib: 81559, driver: "535.104.05",
     driver_inventory: {manage: true, branch: "580"}, allocator: dra}
  - {name: ts-1, gpus: 2, gpu_model: "NVIDIA H100 80GB HBM3", gpu_memory_mib: 81559,
     gpu_sharing: {strategy: time-slicing, replicas: 4}}
"""
FABRIC = "\ngpu_defaults:\n  fabric: {link_layer: infiniband, expect: {ports: 2, rate: 400}}\n"


def timed(run_cli: Any, *args: str) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    r = run_cli(*args, "-o", "json", timeout=900)
    took = time.monotonic() - t0
    assert r.stdout, r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout), took


def what_changed(rep: dict[str, Any]) -> list[Any]:
    """A re-run's changes, for its assertion's message: the phases and the preparation steps that changed."""
    steps = [(h["name"], st["name"]) for h in (rep.get("prepare") or {}).get("hosts", []) for st in h.get("steps", [])
             if st.get("status") == "changed"]
    return [(p["name"], p["message"][:300]) for p in rep["phases"] if p["status"] == "changed"] + steps


def with_monitoring(lab_up: Any, fleet: str) -> tuple[Any, str]:
    """The lab of `fleet`, its inventory with monitoring deployed."""
    lab = lab_up(fleet)
    lab.inventory.write_text(lab.inventory.read_text() + "\nmonitoring:\n  enabled: true\n")
    return lab, str(lab.inventory)


def test_hgx_day_one(lab_up, run_cli, tmp_path):
    lab, inv = with_monitoring(lab_up, HGX_DAY_ONE)
    lab.inventory.write_text(lab.inventory.read_text() + FABRIC)
    kc = tmp_path / "kc"
    seconds: dict[str, float] = {}

    rc, rep, seconds["install"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc), "--allow-reboot")
    assert rc == 0, json.dumps(rep)[-6000:]
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert all(n["ok"] for n in nodes.values()), nodes
    assert "580." in lab.host("dra-1").exec("cat /proc/driver/nvidia/version").stdout
    planned = {"mig-1": {"nvidia.com/mig-3g.40gb": 4}, "dra-1": {"gpu": 2}, "ts-1": {"nvidia.com/gpu": 8}}
    # status counts DRA's GPUs with the GPUs (its footer's "GPUs in cluster"): 8 time-sliced + 2 on DRA
    totals = {"nvidia.com/mig-3g.40gb": 4, "nvidia.com/gpu": 10}
    invariants.all_hold(lab, run_cli, inv, planned, {"dra-1"}, totals)

    rc, rep, seconds["verify"] = timed(run_cli, "verify", "-i", inv)
    assert rc == 0, json.dumps(rep)[-6000:]
    mon = next(p for p in rep["phases"] if p["name"] == "monitoring-verify")["hosts"]
    assert mon["mig-1"] == "exporter dcgm-exporter-mig-1: 4 GPU(s) reported, as planned", mon  # 4 MIG instances

    # the fabric proven (issue 43): RDMA write between the three nodes' rails in a ring, through the RDMA device
    # plugin's resource, on MIG, DRA and time-sliced nodes alike; NCCL across a node's GPUs needs them whole: none is
    rc, rep, seconds["verify --fabric"] = timed(run_cli, "verify", "-i", inv, "--fabric")
    assert rc == 0, json.dumps(rep)[-6000:]
    fab = {(f["subject"]["name"], f["id"]): f for f in rep["findings"]}
    assert {n: fab[(n, "fabric.rdma")]["message"] for n in ("mig-1", "dra-1", "ts-1")} == {
        n: "4 RDMA write test(s) with its ring neighbours at 388 Gb/s" for n in ("mig-1", "dra-1", "ts-1")}, fab
    assert all(fab[(n, "fabric.nccl")]["status"] == "skip" for n in ("mig-1", "dra-1", "ts-1")), fab
    invariants.all_hold(lab, run_cli, inv, planned, {"dra-1"}, totals)

    rc, rep, seconds["re-run"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc), "--allow-reboot")
    assert rc == 0 and not rep["changed"], json.dumps(rep)[-4000:]
    invariants.all_hold(lab, run_cli, inv, planned, {"dra-1"}, totals)
    # the fabric: every GPU node's two NDR ports passed preflight above; a cable pulled on ts-1 is named by the
    # next preflight (that host, that port), and nothing else of the cluster changes
    ts = lab.host("ts-1")
    ts.write_rdma([{"device": "mlx5_1", "state": "1: DOWN", "phys_state": "3: Disabled", "rate": "40 Gb/sec (4X QDR)",
                    "link_layer": "InfiniBand", "sm_lid": "0x1"}])
    rc, rep, seconds["preflight, a port down"] = timed(run_cli, "preflight", "-i", inv, "--network-seconds", "0")
    got = {h["name"]: {c["id"]: (c["status"], c["message"]) for c in h["checks"] if c["id"].startswith("fabric.")}
           for h in rep["hosts"]}
    assert got["ts-1"]["fabric.ports"][0] == "fail" and "mlx5_1 port 1 (Down/Disabled, 40 Gb/s)" in got["ts-1"][
        "fabric.ports"][1], got["ts-1"]
    # (InfiniBand: no RoCE GIDs to check; no topology modelled for these hosts)
    assert all(v[0] == "pass" for n in ("mig-1", "dra-1") for k, v in got[n].items()
               if k not in ("fabric.roce-gid", "fabric.roce-mtu", "fabric.affinity")), got
    assert got["mig-1"]["fabric.roce-gid"][0] == got["mig-1"]["fabric.affinity"][0] == "skip", got
    assert got["mig-1"]["fabric.roce-mtu"][0] == "skip", got  # not RoCE
    ts.write_rdma([{"device": "mlx5_1", "state": "4: ACTIVE", "phys_state": "5: LinkUp",
                    "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand", "sm_lid": "0x1"}])

    # day two: branch 595 for the managed nodes; the client killed once mig-1 runs 595 (after its reboot, before or
    # after its uncordon: whichever the kill meets), then the same command again
    doc = yaml.safe_load(lab.inventory.read_text())
    for h in doc["hosts"]:
        if isinstance(h.get("driver"), dict):
            h["driver"]["branch"] = "595"
    path = tmp_path / "inventory-595.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, "GPUK8S_LOG_FILE": str(tmp_path / "killed.log"), "NO_COLOR": "1"}
    sshd_before = lab.host("mig-1").sshd_pid()
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "gpuk8s", "driver", "upgrade", "-i", str(path), "--yes", "-o", "json"],
                         env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         stdin=subprocess.DEVNULL)
    while p.poll() is None and "595." not in lab.host("mig-1").exec("cat /proc/driver/nvidia/version",
                                                                    check=False).stdout:
        assert time.monotonic() - t0 < 300, "mig-1 never rebooted into 595"
        time.sleep(0.2)
    killed = p.poll() is None
    p.kill()
    p.wait(timeout=30)
    seconds["driver upgrade (killed)"] = time.monotonic() - t0
    # as an operator would: the same command once the rebooting host answers SSH again (a re-run while it is still
    # down names it "not reachable", upgrades the others, and the next re-run finishes it)
    while lab.host("mig-1").sshd_pid() in (None, sshd_before):  # the lab's reboot restarts its sshd
        assert time.monotonic() - t0 < 300, "mig-1 did not come back"
        time.sleep(0.2)
    time.sleep(1)
    # again: the client's connections to the first control plane (its cluster lock, its kubectl) cut while dra-1
    # reboots into 595; the run ends by itself, naming the lost connection, and leaves the lock free
    sshd_before = lab.host("dra-1").sshd_pid()
    t1 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "gpuk8s", "driver", "upgrade", "-i", str(path), "--yes", "-o", "json"],
                         env={**env, "GPUK8S_LOG_FILE": str(tmp_path / "cut.log")}, cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    while p.poll() is None and lab.host("dra-1").sshd_pid() in (None, sshd_before):
        assert time.monotonic() - t1 < 300, "dra-1 never rebooted"
        time.sleep(0.05)
    cut = lab.host("cp-1").cut_connections() if p.poll() is None else 0
    out, _ = p.communicate(timeout=300)
    seconds["driver upgrade (cp-1 cut while dra-1 reboots)"] = time.monotonic() - t1
    print(f"cut {cut} connection(s) to cp-1; exit {p.returncode}: {out[-1500:]}")
    if cut:
        assert p.returncode != 0 and "the connection to cp-1 was lost" in out, out[-4000:]
    invariants.lock_free(lab)
    while lab.host("dra-1").sshd_pid() is None:
        assert time.monotonic() - t1 < 300, "dra-1 did not come back"
        time.sleep(0.2)
    # the same command again, itself killed after each phase in turn (tests/labtests/interrupt.py) until a run ends
    t1 = time.monotonic()
    runs = interrupt.every_phase_end(tmp_path, ("driver", "upgrade", "-i", str(path), "--yes", "-o", "json"))
    seconds["driver upgrade (again, killed after each phase)"] = time.monotonic() - t1
    assert runs[-1].rc == 0, [r.where() for r in runs] + [runs[-1].stdout[-4000:]]
    up = next(x for x in json.loads(runs[-1].stdout)["phases"] if x["name"] == "driver-upgrade")["hosts"]
    assert up["mig-1"].startswith("already at driver 595."), up
    assert "driver 580.95.05 -> 595.71.05" in up["dra-1"] or up["dra-1"].startswith("already at driver 595."), up
    print(f"killed mid-run: {killed}; the re-run: {up}")
    for name in ("mig-1", "dra-1"):
        assert "595." in lab.host(name).exec("cat /proc/driver/nvidia/version").stdout
    invariants.all_hold(lab, run_cli, str(path), planned, {"dra-1"}, totals)
    print("hgx-day-one seconds:", {k: round(v, 1) for k, v in seconds.items()})


# alinux-newest: Alibaba Cloud Linux 3 on the newest minor (1.37: install brings containerd 2.x), HAMi on one node,
# the health gate meeting an Xid 79 (a GPU off the bus) on one and a pending row remap on another, monitoring
# deployed; a site in mainland China's position: no public source reachable, every package and image from mirrors.
# Day two: the faults cleared (a reboot, a GPU reset) and the nodes released (doctor names the GPU count label of the
# node that had lost a GPU, install relabels it), monitoring removed and deployed again, then reset of every node.
ALINUX_NEWEST = """
cluster:
  kubernetes_version: "1.37"
defaults:
  os: alinux-3
hosts:
  - {name: cp-1, role: control-plane}
  - {name: hami-1, gpus: 2, gpu_sharing: {strategy: hami, replicas: 10}}
  - {name: fell, gpus: 2, health: {xid: [{gpu: 1, xid: 79}], lost: [1]}}
  - {name: remap, gpus: 2, health: {remap_pending: [1]}}
"""


def quarantined(lab: Any) -> dict[str, str]:
    return {n["metadata"]["name"]: t.get("value", "") for n in invariants.kubectl_json(lab, "get nodes")["items"]
            for t in n.get("spec", {}).get("taints", []) if t["key"] == "gpuk8s.io/quarantine"}


def behind_mirrors(lab: Any, run_cli: Any, inv: str) -> None:
    """A site that reaches none of the public sources (tests/labtests/test_mirrors.py: PUBLIC), its inventory
    pointing at a registry mirror and at package mirrors, the registry holding what `gpuk8s images` names."""
    for h in lab.hosts.values():
        h.update_state(unreachable_hosts=mirrors_test.PUBLIC)
    doc = yaml.safe_load(Path(inv).read_text())
    # the patch pinned, as docs/mirrors.md advises: the images to mirror are then exactly kubeadm's
    doc["cluster"]["kubernetes_version"] = versions.kubernetes_or_default(doc["cluster"]["kubernetes_version"]
                                                                          ).latest_patch
    doc["install"].update(toolkit_repo="https://pkgs.lab.example/libnvidia-container",
                          kubernetes_repo="https://pkgs.lab.example/kubernetes/core:/stable:",
                          containerd_repo="https://pkgs.lab.example/docker-ce/linux")
    doc["registry"] = {"mirror": f"{mirrors_test.MIRROR}/k8s",
                       "overrides": {"nvcr.io": f"{mirrors_test.MIRROR}/nvcr"}, "manifests": mirrors_test.FILES}
    Path(inv).write_text(yaml.safe_dump(doc, sort_keys=False))
    held = mirrors_test.fill_mirror(lab, run_cli, Path(inv))
    assert all(i.startswith(f"{mirrors_test.MIRROR}/") for i in held)


def all_from_the_mirror(lab: Any) -> None:
    """Every container of every pod (the DaemonSets', Deployments' and gpuk8s's own) runs an image of the mirror."""
    pods = invariants.kubectl_json(lab, "get pods -A")["items"]
    images = {c["image"] for p in pods for k in ("containers", "initContainers") for c in p["spec"].get(k) or []}
    assert images and all(i.startswith(f"{mirrors_test.MIRROR}/") for i in images), sorted(images)


def test_alinux_newest(lab_up, run_cli, tmp_path):
    lab, inv = with_monitoring(lab_up, ALINUX_NEWEST)
    behind_mirrors(lab, run_cli, inv)
    kc = tmp_path / "kc"
    seconds: dict[str, float] = {}

    rc, rep, seconds["install"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc))
    assert rc == 0, json.dumps(rep)[-6000:]
    assert quarantined(lab) == {"fell": "health.xid", "remap": "health.row-remap-pending"}
    # HAMi registers GPUs x replicas; fell's device plugin offers the GPU still on the bus (it tolerates the
    # quarantine: status names the node and its GPUs, no pod lands there)
    planned = {"hami-1": {"nvidia.com/gpu": 20}, "fell": {"nvidia.com/gpu": 1}, "remap": {"nvidia.com/gpu": 2}}
    totals = {"nvidia.com/gpu": 23}
    invariants.offered_once(lab, planned, set())
    invariants.none_cordoned(lab)
    invariants.lock_free(lab)
    st = invariants.status_matches(run_cli, inv, totals)
    assert {n["node"]: n["quarantine"] for n in st["nodes"] if n["quarantine"]} == \
        {"fell": "health.xid", "remap": "health.row-remap-pending"}
    all_from_the_mirror(lab)  # HAMi's, the exporter's, Prometheus's and the CNI's too

    rc, rep, seconds["re-run"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc))
    assert rc == 0 and not rep["changed"], what_changed(rep)

    # day two: the faults cleared, the nodes released; the cluster is healthy: doctor silent
    lab.host("remap").exec("nvidia-smi -i 1 -r")
    lab.host("fell").reboot()
    rc, rep, seconds["health --release"] = timed(run_cli, "health", "--release", "fell", "remap", "-i", inv)
    assert rc == 0, json.dumps(rep)[-4000:]
    assert quarantined(lab) == {}
    planned["fell"] = {"nvidia.com/gpu": 2}
    totals = {"nvidia.com/gpu": 24}
    invariants.offered_once(lab, planned, set())
    invariants.none_cordoned(lab)
    invariants.lock_free(lab)
    invariants.status_matches(run_cli, inv, totals)
    # fell's GPU back on the bus, its count label still install's from when one was lost: doctor names that alone
    rc, rep, seconds["doctor, a stale label"] = timed(run_cli, "doctor", "-i", inv, "--all")
    assert rc == 1 and [(f["id"], f["subject"]["name"]) for f in rep["findings"]] == [("gpu.labels-stale", "fell")], \
        rep["findings"]
    assert "nvidia.com/gpu.count=1 (plan: 2)" in rep["findings"][0]["message"]
    # the next install gives the node its count (the only change), then none
    rc, rep, seconds["install after the release"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc))
    assert rc == 0 and what_changed(rep) == [("lock", "held on cp-1 until this run ends"), ("gpu", "labels on fell")], \
        what_changed(rep)
    invariants.all_hold(lab, run_cli, inv, planned, set(), totals)

    # monitoring removed, then deployed again
    for args in (("monitoring", "--remove"), ("monitoring",)):
        rc, rep, seconds[" ".join(args)] = timed(run_cli, *args, "-i", inv)
        assert rc == 0, json.dumps(rep)[-4000:]
        invariants.all_hold(lab, run_cli, inv, planned, set(), totals)
    rc, rep, seconds["install again"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc))
    assert rc == 0 and not rep["changed"], what_changed(rep)
    all_from_the_mirror(lab)

    # reset --all killed after each phase in turn, then run to its end
    t0 = time.monotonic()
    runs = interrupt.every_phase_end(tmp_path, ("reset", "--all", "-i", inv, "--yes", "-o", "json"))
    seconds["reset --all (killed after each phase)"] = time.monotonic() - t0
    assert runs[-1].rc == 0, [r.where() for r in runs] + [runs[-1].stdout[-4000:]]
    invariants.lock_free(lab)
    for name in lab.hosts:
        assert lab.host(name).read("/etc/kubernetes/kubelet.conf") is None, name
    print("alinux-newest seconds:", {k: round(v, 1) for k, v in seconds.items()})


# docker-mps: Docker hosts (kubeadm through cri-dockerd) on the default minor, Ubuntu and Alibaba Cloud Linux mixed,
# MPS on one node, time-slicing on another, a whole-GPU node. Before the install, cri-dockerd's archive against the
# matrix's sha256 (the lab's archive is not the real release: nothing unpacked); after it, what cri-dockerd runs with
# on each host. Day two: a host joined, the cluster upgraded to the newest minor, the joined host reset, a stopped
# cri-docker.socket started again by install.
DOCKER_MPS = """
defaults:
  runtime: docker
  runtime_version: "24.0.7"
cluster:
  container_runtime: docker
  kubernetes_version: "1.36"
hosts:
  - {name: cp-1, role: control-plane}
  - {name: mps-1, gpus: 2, gpu_sharing: {strategy: mps, replicas: 4}}
  - {name: ts-1, os: alinux-3, gpus: 2, gpu_sharing: {strategy: time-slicing, replicas: 2}}
  - {name: whole, gpus: 2}
  - {name: late, gpus: 2}
"""


def test_docker_mps(lab_up, run_cli, tmp_path):
    lab = lab_up(DOCKER_MPS)
    doc = yaml.safe_load(lab.inventory.read_text())
    kc = tmp_path / "kc"
    seconds: dict[str, float] = {}

    def write(hosts: list[str], minor: str | None = None) -> str:
        if minor:
            doc["cluster"]["kubernetes_version"] = minor
        path = tmp_path / "inventory.yaml"
        path.write_text(yaml.safe_dump({**doc, "hosts": [h for h in doc["hosts"] if h["name"] in hosts]},
                                       sort_keys=False))
        return str(path)

    first = ["cp-1", "mps-1", "ts-1", "whole"]
    pin = versions.cri_dockerd()
    lab_sha = doc["install"]["cri_dockerd_sha256"]  # the lab's inventory pins the lab's archive
    assert lab_sha["amd64"] == docker.lab_archive_sha256(lab) != pin.sha256["amd64"]
    # the matrix's sha256 against the lab's archive (not the real release): nothing unpacked on any host
    del doc["install"]["cri_dockerd_sha256"]
    rc, rep, seconds["prepare, the real release's sha256"] = timed(run_cli, "install", "-i", write(first),
                                                                    "--prepare-only")
    assert rc != 0
    for h in rep["hosts"]:
        assert h["status"] == "failed" and "cri-dockerd-binary" in h["message"] and \
            f"not the pinned {pin.sha256['amd64']}" in h["message"], h
        assert lab.host(h["name"]).read("/usr/local/bin/cri-dockerd") is None
    doc["install"]["cri_dockerd_sha256"] = lab_sha  # as a mirror of a rebuilt release would be pinned

    inv = write(first)
    rc, rep, seconds["install"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc))
    assert rc == 0, json.dumps(rep)[-6000:]
    planned = {"mps-1": {"nvidia.com/gpu": 8}, "ts-1": {"nvidia.com/gpu": 4}, "whole": {"nvidia.com/gpu": 2}}
    invariants.all_hold(lab, run_cli, inv, planned, set(), {"nvidia.com/gpu": 14})
    for name in first:
        docker.cri_dockerd_as_planned(lab.host(name), gpus=name != "cp-1")
    # the archive came from the release URL of the pin, once per install
    fetched = [a for a in lab.host("whole").commands() if a[0] == "curl" and any("cri-dockerd" in x for x in a)]
    assert len(fetched) == 2 and fetched[-1][-1] == f"{pin.url}/{pin.archive('amd64')}", fetched
    # a re-run changes nothing and calls nothing that changes a host
    before = {name: len(lab.host(name).commands()) for name in first}
    rc, rep, seconds["re-run"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc))
    assert rc == 0 and not rep["changed"], what_changed(rep)
    for name in first:
        assert changing_calls(lab.host(name).commands()[before[name]:]) == [], name

    inv = write([*first, "late"])
    rc, rep, seconds["join"] = timed(run_cli, "join", "-i", inv)
    assert rc == 0, json.dumps(rep)[-4000:]
    planned["late"] = {"nvidia.com/gpu": 2}
    invariants.all_hold(lab, run_cli, inv, planned, set(), {"nvidia.com/gpu": 16})

    newest = versions.supported_minors()[0]  # newest first
    rc, rep, seconds[f"upgrade to {newest}"] = timed(run_cli, "upgrade", "-i", inv, "--to", newest, "--yes")
    assert rc == 0, json.dumps(rep)[-4000:]
    inv = write([*first, "late"], newest)
    invariants.all_hold(lab, run_cli, inv, planned, set(), {"nvidia.com/gpu": 16})
    rc, rep, seconds["install after the upgrade"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc))
    assert rc == 0 and not rep["changed"], what_changed(rep)

    rc, rep, seconds["reset late"] = timed(run_cli, "reset", "late", "-i", inv, "--yes")
    assert rc == 0, json.dumps(rep)[-4000:]
    del planned["late"]
    invariants.all_hold(lab, run_cli, write(first), planned, set(), {"nvidia.com/gpu": 14})

    # cri-dockerd's socket gone on the Alibaba Cloud Linux node: install notices and starts it again
    g = lab.host("ts-1")
    g.exec("systemctl stop cri-docker.socket")
    assert g.exec(f"test -S {docker.SOCKET}", check=False).returncode != 0
    rc, rep, seconds["install, a socket stopped"] = timed(run_cli, "install", "-i", write(first), "--kubeconfig-out",
                                                         str(kc))
    assert rc == 0 and rep["ok"], json.dumps(rep)[-4000:]
    assert g.exec(f"test -S {docker.SOCKET}", check=False).returncode == 0
    invariants.all_hold(lab, run_cli, write(first), planned, set(), {"nvidia.com/gpu": 14})
    print("docker-mps seconds:", {k: round(v, 1) for k, v in seconds.items()})
