"""The fabric on the lab (issue 43): hosts with RDMA ports (the lab's /sys/class/infiniband, each file holding what
the kernel's sysfs holds, values as real ibstatus texts show them: tests/fixtures/real/fabric/ibstat), read by the
real probe over SSH; preflight names the host and the port that is down, and the one at a lower rate; a port
brought up is seen by the next run."""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import yaml

from gpuk8s.phases import fabric_nccl as fn
from tests.labtests.test_preflight import checks_by_host

UP = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "InfiniBand", "sm_lid": "0x1"}
NDR, HDR = "400 Gb/sec (4X NDR)", "200 Gb/sec (4X HDR)"  # ibstatus-bf3-roce-200-hdr-400-ndr-deepep-17
DOWN = {"state": "1: DOWN", "phys_state": "3: Disabled", "rate": "40 Gb/sec (4X QDR)", "link_layer": "InfiniBand",
        "sm_lid": "0x1"}  # ibstatus-cx6dx-roce-disabled-100-edr-magnate3's down port's values
def with_fabric(lab, tmp_path, fabric: dict) -> tuple[Path, dict]:
    """The lab's inventory with gpu_defaults' fabric: set, written beside the test (its path, its document)."""
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["gpu_defaults"] = {"fabric": fabric}
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv, doc


FLEET = yaml.safe_dump({"hosts": [
    {"name": "cp-1", "role": "control-plane"},
    {"name": "gpu-1", "gpus": 2, "rdma": [{"device": "mlx5_0", **UP, "rate": NDR}, {"device": "mlx5_1", **DOWN}]},
    {"name": "gpu-2", "gpus": 2, "rdma": [{"device": "mlx5_0", **UP, "rate": NDR},
                                          {"device": "mlx5_1", **UP, "rate": HDR}]},
]})


def test_preflight_names_the_port_down_and_the_port_slow(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    inv, _ = with_fabric(lab, tmp_path, {"link_layer": "infiniband", "expect": {"ports": 2, "rate": 400}})

    def preflight() -> dict[str, dict[str, dict]]:
        r = run_cli("preflight", "-i", str(inv), "-o", "json", "--network-seconds", "0")
        assert r.stdout.strip(), r.stderr[-2000:]
        return checks_by_host(json.loads(r.stdout))

    c = preflight()
    one, two = c["gpu-1"], c["gpu-2"]
    assert one["fabric.ports"]["status"] == "fail", one["fabric.ports"]
    assert ("1 active InfiniBand port(s), fabric.expect.ports is 2; not active: mlx5_1 port 1 (Down/Disabled, "
            "40 Gb/s)") in one["fabric.ports"]["message"]
    assert two["fabric.ports"]["status"] == "pass" and two["fabric.rate"]["status"] == "fail"
    assert two["fabric.rate"]["message"] == "below the expected 400 Gb/s: mlx5_1 port 1 (Active/LinkUp, 200 Gb/s)"
    assert all(two[i]["status"] == "pass" for i in ("fabric.link-layer", "fabric.subnet-manager"))
    assert not any(i.startswith("fabric.") for i in c["cp-1"])  # no GPUs: no fabric
    # the cable replaced: gpu-1's port up at 400, seen by the next run
    lab.host("gpu-1").write_rdma([{"device": "mlx5_1", **UP, "rate": NDR}])
    c = preflight()
    assert {i: x["status"] for i, x in c["gpu-1"].items() if i.startswith("fabric.")} == {
        "fabric.ports": "pass", "fabric.link-layer": "pass", "fabric.subnet-manager": "pass", "fabric.rate": "pass",
        "fabric.roce-gid": "skip", "fabric.roce-mtu": "skip",
        "fabric.gpudirect": "warn",  # the lab's 535 driver: proprietary modules
        "fabric.affinity": "skip",  # no topology modelled for this host
        "fabric.acs": "pass"}  # lspci -vvv: no device with ACS modelled
    assert c["gpu-1"]["fabric.rate"]["message"] == "2 x 400 Gb/s"


# Four HGX H100 nodes (8 GPUs, NVSwitches), two NDR InfiniBand ports each (the same rails on every node), one link
# with errors on ib-3's second port: its sysfs still reads Active at 400 Gb/s (preflight passes), its RDMA bandwidth
# is a quarter, its error counters count.
IB_FLEET = yaml.safe_dump({"hosts": [
    {"name": "cp-1", "role": "control-plane"},
    *({"name": f"ib-{i}", "gpus": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_memory_mib": 81559, "nvswitches": 4,
       "fabricmanager": True,
       "rdma": [{"device": "mlx5_0", **UP, "rate": NDR},
                {"device": "mlx5_1", **UP, "rate": NDR,
                 "counters": {"symbol_error": 4127, "link_error_recovery": 3} if i == 3 else {}}]}
      for i in range(1, 5)),
]})


def test_verify_fabric_names_the_node_and_port_of_a_degraded_link(lab_up, run_cli, tmp_path):
    lab = lab_up(IB_FLEET)
    inv, doc = with_fabric(lab, tmp_path, {"link_layer": "infiniband", "expect": {"ports": 2, "rate": 400}})
    lab.host("ib-3").write_fabric({"throughput": {"mlx5_1/1": 0.25}})
    # before the nodes join: health's fabric level reads the ports' error counters over SSH
    r = run_cli("health", "ib-2", "ib-3", "-i", str(inv), "--level", "fabric", "-o", "json")
    h = {x["name"]: {f["id"]: f for f in x["findings"]} for x in json.loads(r.stdout)["hosts"]}
    assert r.returncode == 1 and h["ib-3"]["health.rdma-links"]["status"] == "fail", r.stdout[-2000:]
    assert h["ib-3"]["health.rdma-links"]["message"] == "mlx5_1: symbol_error 4127, link_error_recovery 3"
    assert h["ib-2"]["health.rdma-links"]["message"] == "2 InfiniBand port(s) Active at 400 Gb/s, no error counted"
    r = run_cli("install", "-i", str(inv), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"))
    rep = json.loads(r.stdout)
    assert r.returncode == 0, json.dumps([p for p in rep["phases"] if p["status"] == "failed"])[:4000]
    gpu = next(p for p in rep["phases"] if p["name"] == "gpu")
    assert "applied rdma-device-plugin.yaml" in gpu["message"], gpu
    # labels from the fabric's ports; the RDMA devices allocatable through the plugin
    nodes = {n["metadata"]["name"]: n for n in json.loads(lab.host("cp-1").exec(
        "kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json").stdout)["items"]}
    labels = {k: v for k, v in nodes["ib-2"]["metadata"]["labels"].items() if k.startswith("gpuk8s.io/fabric")}
    nccl = labels.pop("gpuk8s.io/fabric-nccl")
    assert labels == {"gpuk8s.io/fabric": "infiniband", "gpuk8s.io/fabric-ports": "2", "gpuk8s.io/fabric-rate": "400"}
    # NCCL's environment for the nodes' HCAs: one ConfigMap (the nodes are alike), named by the label
    assert {n["metadata"]["labels"]["gpuk8s.io/fabric-nccl"] for n in nodes.values() if n["metadata"]["name"] != "cp-1"
            } == {nccl}
    cm = json.loads(lab.host("cp-1").exec(f"kubectl --kubeconfig /etc/kubernetes/admin.conf -n default get configmap "
                                          f"{nccl} -o json").stdout)
    assert cm["data"] == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}
    assert nodes["ib-2"]["status"]["allocatable"]["rdma/fabric"] == "1000"
    assert "rdma/fabric" not in nodes["cp-1"]["status"]["allocatable"]
    # the RDMA user space from the distribution, the verbs modules loaded and kept at boot; not on the control plane
    steps = {(h["name"], st["name"]): st["status"] for h in rep["prepare"]["hosts"] for st in h["steps"]}
    assert steps[("ib-2", "rdma-packages-apt")] == steps[("ib-2", "rdma-modules-loaded")] == "changed"
    assert ("cp-1", "rdma-packages-apt") not in steps and ("ib-2", "peermem-loaded") not in steps  # gpudirect: auto
    lsmod = lab.host("ib-2").exec("lsmod").stdout
    assert "\nib_uverbs " in lsmod and "\nrdma_ucm " in lsmod
    assert lab.host("ib-2").read("/etc/modules-load.d/gpuk8s-rdma.conf").endswith("ib_uverbs\nrdma_ucm\n")
    # a re-run changes nothing
    r = run_cli("install", "-i", str(inv), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"))
    assert r.returncode == 0 and not json.loads(r.stdout)["changed"], r.stdout[-3000:]
    # status: the fabric per node and the RDMA device plugin's slots in use
    st = {n["node"]: n for n in json.loads(run_cli("status", "-i", str(inv), "-o", "json").stdout)["nodes"]}
    assert st["ib-2"]["fabric"]["gpuk8s.io/fabric"] == "infiniband" and st["ib-2"]["rdma"] == {
        "requested": 0, "allocatable": 1000}, st["ib-2"]
    table = run_cli("status", "-i", str(inv)).stdout
    assert "RDMA fabric" in table and "0/1000" in table, table

    t0 = time.monotonic()
    r = run_cli("verify", "-i", str(inv), "--fabric", "-o", "json")
    took = time.monotonic() - t0
    rep = json.loads(r.stdout)
    assert r.returncode == 1, rep["phases"]
    fabric = next(p for p in rep["phases"] if p["name"] == "fabric")
    print(f"verify --fabric on four nodes: {took:.1f} s; its fabric phase: {fabric['message']}")  # the note's figure
    assert fabric["status"] == "failed", fabric
    assert fabric["message"].startswith("4 node(s), 8 link(s), 4 of 4 pair(s) measured in "), fabric
    got = {(f["subject"]["name"], f["id"]): f for f in rep["findings"]}
    bad = got[("ib-3", "fabric.rdma")]
    assert bad["status"] == "fail", bad
    # the port slow in both its pairs is named on its node, with each reading and the floor
    assert bad["message"] == ("mlx5_1 (its port: slow in every pair): 97 Gb/s RDMA write ib-2 -> ib-3, floor 320 "
                              "Gb/s; 97 Gb/s RDMA write ib-3 -> ib-4, floor 320 Gb/s"), bad
    one = got[("ib-1", "fabric.rdma")]
    assert one["message"] == "4 RDMA write test(s) with its ring neighbours at 388 Gb/s", one
    for n in ("ib-2", "ib-4"):  # ib-3's neighbours: their slow reading is ib-3's port
        assert got[(n, "fabric.rdma")]["status"] == "pass", got[(n, "fabric.rdma")]
        assert got[(n, "fabric.rdma")]["message"] == ("3 RDMA write test(s) with its ring neighbours at 388 Gb/s; "
                                                      "1 slow, named on ib-3"), got[(n, "fabric.rdma")]
    # NCCL across each node's eight GPUs, against the published 8 x H100 figure
    for n in ("ib-1", "ib-2", "ib-3", "ib-4"):
        f = got[(n, "fabric.nccl")]
        assert f["status"] == "pass" and f["message"].startswith("472.84 GB/s bus bandwidth across 8 x NVIDIA H100 "
                                                                 "80GB HBM3 (NVSwitch) at 4096 MiB, floor 378.88"), f
    # NCCL across nodes, in pairs of the ring (ib-1 + ib-2 and ib-3 + ib-4, then ib-2 + ib-3 and ib-4 + ib-1): the
    # pairs of ib-3 run at its slow NIC's share; ib-3, slow in both, is named; its neighbours pass
    pair = got[("ib-3", "fabric.nccl-pairs")]
    mem = "32 of 32 connections through host memory: no GPUDirect RDMA path on both nodes"  # the 535 driver: no dma-buf
    assert pair["status"] == "fail" and pair["message"] == (
        f"this node: slow in every pair: 23.34 GB/s all-reduce ib-2 + ib-3 at 4096 MiB, floor 76.8 GB/s, {mem}; "
        f"23.34 GB/s all-reduce ib-3 + ib-4 at 4096 MiB, floor 76.8 GB/s, {mem}"), pair
    assert got[("ib-1", "fabric.nccl-pairs")] == {**got[("ib-1", "fabric.nccl-pairs")], "status": "pass", "message": (
        f"93.35 GB/s all-reduce ib-1 + ib-2 at 4096 MiB, floor 76.8 GB/s, {mem}; 93.35 GB/s all-reduce ib-4 + ib-1 "
        f"at 4096 MiB, floor 76.8 GB/s, {mem}")}
    assert got[("ib-2", "fabric.nccl-pairs")]["message"].endswith(
        f"23.34 GB/s all-reduce ib-2 + ib-3 at 4096 MiB, floor 76.8 GB/s, {mem}: slow, named on ib-3")
    # nothing of the test left behind
    pods = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get pods -A -o name").stdout
    assert "gpuk8s-fabric" not in pods
    assert "gpuk8s-fabric" not in lab.host("cp-1").exec(
        "kubectl --kubeconfig /etc/kubernetes/admin.conf get secrets -A -o name").stdout
    # --quarantine: the node of the slow port is tainted as health taints (its neighbours are not), and takes no
    # new pods; the link replaced, the next run proves it and lifts the taint
    r = run_cli("verify", "-i", str(inv), "--fabric", "--quarantine", "-o", "json")
    fabric = next(p for p in json.loads(r.stdout)["phases"] if p["name"] == "fabric")
    assert r.returncode == 1 and fabric["hosts"] == {"ib-3": "quarantined (fabric.rdma)"}, fabric
    st = {n["node"]: n for n in json.loads(run_cli("status", "-i", str(inv), "-o", "json").stdout)["nodes"]}
    assert st["ib-3"]["quarantine"] == "fabric.rdma" and not st["ib-2"]["quarantine"]
    # health's release does not lift it: its checks do not test the fabric
    r = run_cli("health", "ib-3", "-i", str(inv), "--release", "-o", "json")
    assert "kept in quarantine (fabric.rdma)" in r.stdout, r.stdout[-2000:]
    lab.host("ib-3").write_fabric({})
    r = run_cli("verify", "-i", str(inv), "--fabric", "--quarantine", "-o", "json")
    fabric = next(p for p in json.loads(r.stdout)["phases"] if p["name"] == "fabric")
    assert r.returncode == 0 and fabric["hosts"] == {
        "ib-3": "released: fabric.rdma passed (it was quarantined for it)"}, r.stdout[-3000:]
    st = {n["node"]: n for n in json.loads(run_cli("status", "-i", str(inv), "-o", "json").stdout)["nodes"]}
    assert not st["ib-3"]["quarantine"]
    assert run_cli("verify", "-i", str(inv), "--quarantine").returncode == 2  # only with --fabric

    # fabric: removed from the inventory: the labels, the RDMA device plugin and the NCCL ConfigMap go, but not the
    # ConfigMap while a pod takes its environment from it (a job started before), nor anything gpuk8s did not make
    kubectl = "kubectl --kubeconfig /etc/kubernetes/admin.conf "
    lab.host("cp-1").exec(kubectl + "apply -f - <<'EOF'\n" + yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"],
                                 "envFrom": [{"configMapRef": {"name": nccl}}]}]}}) + "EOF\n")
    lab.host("cp-1").exec(kubectl + "apply -f - <<'EOF'\n" + yaml.safe_dump({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpuk8s-nccl-users-own", "namespace": "default"},
        "data": {"a": "b"}}) + "EOF\n")
    doc.pop("gpu_defaults")
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))

    def cluster() -> tuple[dict[str, dict], set[str], set[str]]:
        nodes = {n["metadata"]["name"]: n for n in json.loads(lab.host("cp-1").exec(kubectl + "get nodes -o json")
                                                               .stdout)["items"]}
        cms = {c["metadata"]["name"] for c in json.loads(lab.host("cp-1").exec(
            kubectl + "-n default get configmaps -o json").stdout)["items"]}
        ds = {d["metadata"]["name"] for d in json.loads(lab.host("cp-1").exec(
            kubectl + "-n kube-system get daemonsets -o json").stdout)["items"]}
        return nodes, cms, ds

    r = run_cli("install", "-i", str(inv), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout[-3000:]
    nodes, cms, ds = cluster()
    assert not any(k.startswith("gpuk8s.io/fabric") for n in nodes.values() for k in n["metadata"]["labels"])
    assert "rdma-shared-dp-ds" not in ds and "rdma/fabric" not in nodes["ib-2"]["status"]["allocatable"]
    assert {nccl, "gpuk8s-nccl-users-own"} <= cms  # the job's, and the user's own
    lab.host("cp-1").exec(kubectl + "-n default delete pod job")
    r = run_cli("install", "-i", str(inv), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"))
    gpu = next(p for p in json.loads(r.stdout)["phases"] if p["name"] == "gpu")
    assert "removed 1 NCCL ConfigMap(s) no node names" in gpu["message"], gpu
    _, cms, _ = cluster()
    assert nccl not in cms and "gpuk8s-nccl-users-own" in cms


# RoCE: two hosts with 200 Gb/s RoCE ports; the GID tables are those of a real host's ports (show_gids of
# tests/fixtures/real/fabric/rdma/show-gids-roce-ens-np0-nccl-1131: v1 and v2 for the link-local address and for
# 11.0.0.72), on roce-2 without the IPv4 entries (its netdev has no address: only the link-local GIDs)
ROCE = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet",
        "sm_lid": "0x0"}
LINK_LOCAL = [{"index": 0, "gid": "fe80:0000:0000:0000:a288:c2ff:fe5b:03ec", "type": "IB/RoCE v1", "ndev": "ens3np0"},
              {"index": 1, "gid": "fe80:0000:0000:0000:a288:c2ff:fe5b:03ec", "type": "RoCE v2", "ndev": "ens3np0"}]
IPV4 = [{"index": 2, "gid": "0000:0000:0000:0000:0000:ffff:0b00:0048", "type": "IB/RoCE v1", "ndev": "ens3np0"},
        {"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0b00:0048", "type": "RoCE v2", "ndev": "ens3np0"}]
ROCE_FLEET = yaml.safe_dump({"hosts": [
    {"name": "cp-1", "role": "control-plane"},
    {"name": "roce-1", "gpus": 2, "rdma": [{"device": "mlx5_0", **ROCE, "gids": LINK_LOCAL + IPV4}]},
    {"name": "roce-2", "gpus": 2, "rdma": [{"device": "mlx5_0", **ROCE, "gids": LINK_LOCAL}]},
]})


def test_preflight_names_a_roce_port_without_a_v2_gid(lab_up, run_cli, tmp_path):
    lab = lab_up(ROCE_FLEET)
    # the ports' network interfaces, real (veth) ones in each host's network namespace: roce-1's at Ethernet's default
    # MTU, roce-2's at 9000 (the kernel's sysfs shows their MTU to the probe)
    for name, mtu in (("roce-1", 1500), ("roce-2", 9000)):
        lab.host(name).exec(f"ip link add ens3np0 mtu {mtu} type veth peer name ens3np0-peer")
    inv, _ = with_fabric(lab, tmp_path, {"link_layer": "roce"})
    r = run_cli("preflight", "-i", str(inv), "-o", "json", "--network-seconds", "0")
    c = checks_by_host(json.loads(r.stdout))
    assert c["roce-1"]["fabric.roce-gid"]["status"] == "pass", c["roce-1"]["fabric.roce-gid"]
    # MTU 1500: RoCE runs 1024-byte packets (the kernel's iboe_get_mtu), named; 9000 gives 4096
    assert c["roce-1"]["fabric.roce-mtu"]["status"] == "warn" and c["roce-1"]["fabric.roce-mtu"]["message"] == (
        "RoCE below 4096-byte packets on mlx5_0 port 1 (ens3np0 MTU 1500: RoCE packets of 1024 bytes)")
    assert c["roce-2"]["fabric.roce-mtu"]["message"] == "1 port(s) with RoCE packets of 4096 bytes (MTU 9000 or more)"
    bad = c["roce-2"]["fabric.roce-gid"]
    assert bad["status"] == "fail" and bad["message"] == (
        "no RoCE v2 GID with an IPv4 address on mlx5_0 port 1 (ens3np0): GIDs 0 v1 fe80:0000:0000:0000:a288:c2ff:"
        "fe5b:03ec, 1 v2 fe80:0000:0000:0000:a288:c2ff:fe5b:03ec"), bad
    assert r.returncode != 0
    # the address given to the netdev: the kernel adds its GIDs, the next preflight passes
    lab.host("roce-2").write_rdma([{"device": "mlx5_0", **ROCE, "gids": LINK_LOCAL + IPV4}])
    c = checks_by_host(json.loads(run_cli("preflight", "-i", str(inv), "-o", "json", "--network-seconds", "0").stdout))
    assert c["roce-2"]["fabric.roce-gid"]["status"] == "pass", c["roce-2"]["fabric.roce-gid"]
    assert c["roce-2"]["fabric.roce-gid"]["message"] == "1 port(s) with a RoCE v2 IPv4 GID"


def test_preflight_names_gpus_far_from_the_fabric(lab_up, run_cli, tmp_path):
    """An 8 x H100 board whose nvidia-smi topo -m is a real one (tests/fixtures/real/fabric/topo), cabled on two of
    its eight NICs only: the probe reads the topology (GK_FABRIC), preflight names the GPUs whose nearest fabric NIC
    is across the CPU; a host without fabric: is not asked."""
    lab = lab_up(yaml.safe_dump({"hosts": [
        {"name": "cp-1", "role": "control-plane"},
        {"name": "hgx-1", "gpus": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "topo": "h100x8-8nic-sglang-30401",
         "lspci_vvv": "lspci-vvv-acs-enabled-haswell-e-root-port-pciutils-cap-aer-root",
         "rdma": [{"device": "mlx5_0", **UP, "rate": NDR}, {"device": "mlx5_1", **UP, "rate": NDR}]}]}))
    inv, _ = with_fabric(lab, tmp_path, {"link_layer": "infiniband"})
    c = checks_by_host(json.loads(run_cli("preflight", "-i", str(inv), "-o", "json", "--network-seconds", "0").stdout))
    # a root port whose ACS redirects peer-to-peer traffic (a real lspci -vvv text), named
    acs = c["hgx-1"]["fabric.acs"]
    assert acs["status"] == "warn" and acs["message"].startswith(
        "1 PCIe device(s) redirect peer-to-peer traffic to the root complex (ACS ReqRedir/CmpltRedir on): 00:02.0 "
        "(PCI bridge: Intel Corporation Haswell-E PCI Express Root Port 2"), acs
    got = c["hgx-1"]["fabric.affinity"]
    assert got["status"] == "warn" and got["message"].startswith("GPU2, GPU3: nearest fabric NIC across the PCIe host "
                                                                 "bridges of its CPU (NODE: mlx5_0, mlx5_1)"), got
    assert '["nvidia-smi", "topo", "-m"]' in lab.host("hgx-1").read("/var/lib/gpuk8s-lab/commands.log")
    assert "topo" not in lab.host("cp-1").read("/var/lib/gpuk8s-lab/commands.log")  # no fabric: not asked


def test_the_workers_sshd_and_the_launchers_ssh_accept_the_runs_keys_and_nothing_else(tmp_path):
    """NCCL across nodes (gpuk8s/phases/fabric_nccl.py) as real OpenSSH runs it, on loopback: the worker's sshd
    with the run's sshd_config (checked by sshd -t, then serving), the launcher's ssh with mpirun's plm_rsh_args
    and the run's files from the Secret: in by the run's key, the workers' host key verified by its alias; another
    host key refused, another client key refused."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    assert os.path.exists(sshd) and os.geteuid() == 0, "the lab's own needs: root and openssh-server (.ci/run)"
    d = tmp_path / "ssh"
    d.mkdir()
    with socket.socket() as s:  # a free loopback port for this test's sshd
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def local(text: str) -> str:  # the Secret's paths and port, moved into this test's directory
        return (text.replace(fn.SSH_DIR, str(d)).replace(f"Port {fn.SSH_PORT}", f"Port {port}")
                .replace(f"-p {fn.SSH_PORT}", f"-p {port}").replace("/run/gpuk8s-fabric-sshd.pid", str(d / "pid")))

    keys = fn.Keys.new()
    for name, b64 in fn.secret(keys)["data"].items():
        (d / name).write_text(local(base64.b64decode(b64).decode()))
        (d / name).chmod(0o400)  # the Secret volume's defaultMode
    os.makedirs("/run/sshd", exist_ok=True)
    conf = ["-f", str(d / "sshd_config"), "-o", "ListenAddress=127.0.0.1"]
    t = subprocess.run([sshd, "-t", *conf], capture_output=True, text=True)
    assert t.returncode == 0, t.stderr
    server = subprocess.Popen([sshd, "-D", "-e", *conf], stderr=subprocess.PIPE, text=True)
    try:
        rsh = shlex.split(local(fn.RSH_ARGS))
        for _ in range(50):
            r = subprocess.run(["ssh", *rsh, "127.0.0.1", "echo", "rank-host"], capture_output=True, text=True,
                               timeout=30)
            if "Connection refused" not in r.stderr:
                break
            time.sleep(0.1)
        assert r.returncode == 0 and r.stdout == "rank-host\n", r.stderr
        # another host key under the alias: refused before any login
        other = fn.Keys.new()
        (d / "known_hosts").chmod(0o600)
        (d / "known_hosts").write_text(base64.b64decode(other.data["known_hosts"]).decode())
        r = subprocess.run(["ssh", *rsh, "127.0.0.1", "true"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 255 and "Host key verification failed" in r.stderr, r.stderr
        # another client key: the worker takes the run's only
        (d / "known_hosts").write_text(local(base64.b64decode(keys.data["known_hosts"]).decode()))
        (d / "id").chmod(0o600)
        (d / "id").write_text(base64.b64decode(other.data["id"]).decode())
        r = subprocess.run(["ssh", *rsh, "127.0.0.1", "true"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 255 and "Permission denied (publickey)" in r.stderr, r.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
