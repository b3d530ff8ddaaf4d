"""gpuk8s reset on the lab: a worker drains (a PodDisruptionBudget blocks it until the workload has a second
replica), leaves the cluster while the others stay Ready with their GPUs, passes preflight as a fresh host
and joins again; --purge restores what gpuk8s changed; reset --all then install converges again; the last
control plane and etcd's quorum are protected; --dry-run changes nothing. Prints the reset time per node."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import yaml

from tests.labtests.test_install import snapshot

FLEET = "hosts:\n  - name: cp-1\n    role: control-plane\n  - name: gpu-1\n    gpus: 2\n  - name: gpu-2\n    gpus: 2\n"
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf "


def kube_fake():
    """The lab's simulated cluster (tests/lab/fakes/kube.py), for its etcd bookkeeping."""
    path = Path(__file__).resolve().parents[1] / "lab" / "fakes" / "kube.py"
    spec = importlib.util.spec_from_file_location("gpuk8s_lab_kube", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cluster_state(lab) -> dict:
    return json.loads((lab.root / "cluster" / "state.json").read_text())


def change_state(lab, change) -> None:
    """Change the simulated cluster's state (a powered-off node, an etcd that refuses a removal), locked as the
    fakes lock it."""
    import fcntl

    with open(lab.root / "cluster" / "state.json", "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        s = json.loads(f.read() or "{}")
        change(s)
        f.seek(0)
        f.truncate()
        f.write(json.dumps(s, indent=1))


def nodes(lab) -> dict[str, dict]:
    out = lab.host("cp-1").exec(KUBECTL + "get nodes -o json").stdout
    return {n["metadata"]["name"]: n for n in json.loads(out)["items"]}


def ready_gpus(node: dict) -> tuple[bool, int]:
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    return ready, int(node["status"]["allocatable"].get("nvidia.com/gpu", 0))


def install(lab, run_cli, tmp_path) -> None:
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--no-test-pods", "--kubeconfig-out",
                str(tmp_path / "kc"), "--force")
    assert r.returncode == 0, r.stdout + r.stderr


def apply(lab, doc: dict) -> None:
    cp = lab.host("cp-1")
    cp.write("/root/apply.yaml", yaml.safe_dump(doc))
    r = cp.exec(KUBECTL + "apply -f /root/apply.yaml", check=False)
    assert r.returncode == 0, r.stderr


def web_pod(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4"}]},
            "spec": {"nodeName": node, "containers": [{"name": "web", "image": "nginx"}]}}


def reset(run_cli, lab, *args: str):
    t0 = time.monotonic()
    r = run_cli("reset", *args, "-i", str(lab.inventory), "-o", "json", timeout=600)
    return r, time.monotonic() - t0


def preflight_checks(run_cli, lab, host: str) -> dict[str, dict]:
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "0")
    rep = json.loads(r.stdout)
    return {c["id"]: c for h in rep["hosts"] if h["name"] == host for c in h["checks"]}


def fresh_and_joins_again(run_cli, lab, name: str) -> None:
    """After a reset: preflight passes the host as a fresh one, and it joins again with its GPUs."""
    checks = preflight_checks(run_cli, lab, name)
    assert checks and all(c["status"] != "fail" for c in checks.values()), checks
    r = run_cli("join", name, "-i", str(lab.inventory), "-o", "json", "--no-test-pods")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ready_gpus(nodes(lab)[name]) == (True, 2)


def test_reset_a_worker_drains_leaves_passes_preflight_and_joins_again(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    install(lab, run_cli, tmp_path)
    gpu1 = lab.host("gpu-1")
    apply(lab, web_pod("web-1", "gpu-1"))
    apply(lab, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})

    # --dry-run: the plan with the exact commands, and not one change on a host or in the cluster
    before, state_before = snapshot(lab), cluster_state(lab)
    r, _ = reset(run_cli, lab, "gpu-1", "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    plan = json.loads(r.stdout)
    assert plan["dry_run"] and plan["order"] == ["gpu-1"]
    cmds = "\n".join(c.get("commands", "") for p in plan["plans"] for c in p["changes"])
    assert "drain gpu-1 --ignore-daemonsets --delete-emptydir-data --timeout=300s" in cmds
    assert "kubeadm reset -f" in cmds and "delete node gpu-1" in cmds
    assert snapshot(lab) == before and cluster_state(lab) == state_before
    assert not any(a[:2] in (["kubeadm", "reset"], ["kubectl", "drain"]) or "drain" in a
                   for h in lab.hosts.values() for a in h.commands())

    # a PodDisruptionBudget that allows no eviction: the drain times out, the node stays, cordoned, untouched
    r, _ = reset(run_cli, lab, "gpu-1", "--yes", "--drain-timeout", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    [node] = out["nodes"]
    assert node["id"] == "reset.drain-blocked" and node["finding"]["status"] == "fail"
    assert "Cannot evict pod as it would violate the pod's disruption budget." in node["message"]
    assert "uncordon gpu-1" in node["remedy"]
    n = nodes(lab)
    assert "gpu-1" in n and {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"} in \
        n["gpu-1"]["spec"]["taints"]
    assert gpu1.read("/etc/kubernetes/kubelet.conf") is not None

    # a second replica elsewhere: the budget allows one eviction; what the CNI and a user left on the host
    apply(lab, web_pod("web-2", "gpu-2"))
    gpu1.write("/etc/cni/net.d/10-calico.conflist", '{"name": "k8s-pod-network"}\n')
    gpu1.write("/var/lib/cni/networks/k8s-pod-network/10.244.1.2", "abc\n")
    endpoint = cluster_state(lab)["endpoint"]
    gpu1.write("/root/.kube/config", f"clusters:\n- cluster:\n    server: https://{endpoint}\n")
    gpu1.write("/home/gpuk8s/.kube/config", "clusters:\n- cluster:\n    server: https://other.example:6443\n")
    gpu1.exec("ip link add cni0 type bridge")
    r, seconds = reset(run_cli, lab, "gpu-1", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    [node] = json.loads(r.stdout)["nodes"]
    assert node["status"] == "reset" and node["id"] == "reset.node-reset", node
    print(f"\nreset of one worker (drain, kubeadm reset, cleanup, delete): {node['seconds']:.2f} s "
          f"(command {seconds:.2f} s)")

    # the cluster forgot it; the others are Ready and their GPUs schedulable; the pod was evicted
    n = nodes(lab)
    assert set(n) == {"cp-1", "gpu-2"}
    assert ready_gpus(n["gpu-2"]) == (True, 2) and ready_gpus(n["cp-1"])[0]
    assert "Pod/default/web-1" not in cluster_state(lab)["objects"]
    # the host: kubeadm's files, the CNI's leftovers and the cluster's kubeconfig gone, the kubelet off
    for gone in ("/etc/kubernetes/kubelet.conf", "/etc/cni/net.d/10-calico.conflist",
                 "/var/lib/cni/networks/k8s-pod-network/10.244.1.2", "/root/.kube/config"):
        assert gpu1.read(gone) is None, gone
    assert gpu1.read("/home/gpuk8s/.kube/config") is not None  # another cluster's kubeconfig stays
    assert gpu1.exec("ip link show cni0", check=False).returncode != 0
    assert gpu1.state()["services"].get("kubelet") != "active" and "kubelet" not in gpu1.state().get("enabled", [])
    assert any(a[:3] == ["kubeadm", "reset", "-f"] for a in gpu1.commands()), \
        [a for a in gpu1.commands() if a[:1] == ["kubeadm"]]
    fresh_and_joins_again(run_cli, lab, "gpu-1")


def test_purge_restores_what_gpuk8s_changed(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    gpu1 = lab.host("gpu-1")
    watched = ("/etc/containerd/config.toml", "/etc/apt/sources.list.d/kubernetes.list",
               "/etc/apt/sources.list.d/nvidia-container-toolkit.list", "/etc/sysctl.d/99-gpuk8s-kubernetes.conf",
               "/etc/modules-load.d/gpuk8s-kubernetes.conf", "/etc/fstab")
    before = {p: gpu1.read(p) for p in watched}
    install(lab, run_cli, tmp_path)
    assert gpu1.read("/etc/containerd/config.toml") != before["/etc/containerd/config.toml"]
    assert {"kubelet", "kubeadm", "kubectl", "nvidia-container-toolkit"} <= set(gpu1.state()["packages"])
    r, _ = reset(run_cli, lab, "gpu-1", "--yes", "--purge")
    assert r.returncode == 0, r.stdout + r.stderr
    [node] = json.loads(r.stdout)["nodes"]
    assert node["status"] == "reset" and any(s.startswith("purged") for s in node["steps"])
    after = {p: gpu1.read(p) for p in watched}
    assert after == before
    assert not {"kubelet", "kubeadm", "kubectl", "nvidia-container-toolkit"} & set(gpu1.state()["packages"])
    assert gpu1.read("/etc/apt/keyrings/kubernetes-apt-keyring.gpg") is None
    assert gpu1.exec("ls /var/lib/gpuk8s/backup", check=False).returncode != 0
    assert gpu1.exec("command -v kubeadm", check=False).returncode != 0
    assert gpu1.state()["services"].get("containerd") == "active"
    fresh_and_joins_again(run_cli, lab, "gpu-1")


def test_reset_all_then_install_again_converges(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    install(lab, run_cli, tmp_path)
    r, seconds = reset(run_cli, lab, "--all", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["order"] == ["gpu-1", "gpu-2", "cp-1"]
    assert [n["status"] for n in out["nodes"]] == ["reset"] * 3
    per_node = ", ".join(f"{n['name']} {n['seconds']:.2f} s" for n in out["nodes"])
    print(f"\nreset --all of 3 hosts: {seconds:.2f} s ({per_node})")
    cp = lab.host("cp-1")
    assert cp.read("/etc/kubernetes/admin.conf") is None
    listening = cp.exec("ss -ltn")
    assert ":22 " in listening.stdout and ":6443 " not in listening.stdout  # the API server is gone
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "0")
    assert r.returncode == 0, r.stdout
    install(lab, run_cli, tmp_path)
    n = nodes(lab)
    assert set(n) == {"cp-1", "gpu-1", "gpu-2"}
    assert ready_gpus(n["gpu-1"]) == (True, 2) and ready_gpus(n["gpu-2"]) == (True, 2)


def test_control_planes_and_etcd_quorum_are_protected(lab_up, run_cli, tmp_path):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: cp-2\n    role: control-plane\n"
                 "  - name: cp-3\n    role: control-plane\n  - name: gpu-1\n    gpus: 1\n")
    install(lab, run_cli, tmp_path)
    etcd = kube_fake().etcd_members
    assert etcd(cluster_state(lab)) == ["cp-1", "cp-2", "cp-3"]
    before = cluster_state(lab)
    # the first control plane only with --all; two of three at once would lose etcd's quorum
    for args, refusal in ((("cp-1",), "reset.first-control-plane"), (("cp-2", "cp-3"), "reset.etcd-quorum")):
        r, _ = reset(run_cli, lab, *args, "--yes")
        assert r.returncode == 2, r.stdout + r.stderr
        assert json.loads(r.stdout)["refused"]["id"] == refusal
    assert cluster_state(lab) == before
    # cp-2 is powered off (its Node stays, not Ready): resetting cp-3 would leave cp-1 the only working member of
    # two, no quorum: refused, though three control-plane Nodes exist
    change_state(lab, lambda s: s["nodes"]["cp-2"].__setitem__("down", True))
    r, _ = reset(run_cli, lab, "cp-3", "--yes")
    assert r.returncode == 2, r.stdout + r.stderr
    refused = json.loads(r.stdout)["refused"]
    assert refused["id"] == "reset.etcd-quorum" and "cp-2 not Ready" in refused["message"], refused
    change_state(lab, lambda s: s["nodes"]["cp-2"].pop("down"))
    # etcd refuses the removal: kubeadm reset only warns; cp-3 keeps its Node, its member and its etcd data
    cp3 = lab.host("cp-3")
    assert cp3.read("/var/lib/etcd/member/db") is not None
    change_state(lab, lambda s: s.__setitem__("etcd_remove_fails", ["cp-3"]))
    r, _ = reset(run_cli, lab, "cp-3", "--yes")
    assert r.returncode == 1, r.stdout + r.stderr
    [node] = json.loads(r.stdout)["nodes"]
    assert node["id"] == "reset.etcd-member-kept" and "please manually remove this etcd member" in node["message"]
    assert "etcdctl" in node["remedy"] and "/var/lib/gpuk8s/etcd-member-kept" in node["remedy"]
    assert "cp-3" in cluster_state(lab)["nodes"] and etcd(cluster_state(lab)) == ["cp-1", "cp-2", "cp-3"]
    assert cp3.read("/var/lib/etcd/member/db") is not None
    # a second run still refuses: the marker says the member may still be there
    r, _ = reset(run_cli, lab, "cp-3", "--yes")
    assert r.returncode == 1 and json.loads(r.stdout)["nodes"][0]["id"] == "reset.etcd-member-kept"
    # the operator removed the member with etcdctl (here: etcd accepts the removal), then the marker
    change_state(lab, lambda s: s.pop("etcd_remove_fails"))
    cp3.exec("rm /var/lib/gpuk8s/etcd-member-kept")
    # one of three: its etcd member leaves with it (kubeadm reset's remove-etcd-member), the others stay Ready
    r, _ = reset(run_cli, lab, "cp-3", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    [node] = json.loads(r.stdout)["nodes"]
    assert node["status"] == "reset" and "etcd member" in node["message"]
    st = cluster_state(lab)
    assert etcd(st) == ["cp-1", "cp-2"] and "cp-3" not in st["nodes"]
    assert cp3.read("/var/lib/etcd/member/db") is None
    assert all(ready_gpus(n)[0] for n in nodes(lab).values())
    # now 1 of 2 would break the quorum: refused with the reason
    r, _ = reset(run_cli, lab, "cp-2", "--yes")
    assert r.returncode == 2
    refused = json.loads(r.stdout)["refused"]
    assert refused["id"] == "reset.etcd-quorum" and "quorum of 2" in refused["message"]
    assert etcd(cluster_state(lab)) == ["cp-1", "cp-2"]
    # the inventory without cp-3 still validates and verifies
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["hosts"] = [h for h in inv["hosts"] if h["name"] != "cp-3"]
    path = tmp_path / "without-cp-3.yaml"
    path.write_text(yaml.safe_dump(inv))
    r = run_cli("verify", "-i", str(path), "-o", "json", "--no-test-pods")
    assert r.returncode == 0, r.stdout + r.stderr


def test_reset_of_a_host_leaves_what_is_not_kubernetes_alone(lab_up, run_cli):
    """A host reset where kubeadm is not there (nothing unmounts the pod volumes before gpuk8s): a volume still
    mounted under /var/lib/kubelet is unmounted, its data untouched; podman's CNI network, another etcd's data on
    a worker and a kubeconfig naming other clusters stay; a kubeconfig of this cluster only is kept aside, 0600."""
    lab = lab_up(FLEET)
    gpu1 = lab.host("gpu-1")
    assert gpu1.exec("command -v kubeadm", check=False).returncode != 0  # never installed: kubeadm absent
    vol = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~nfs/data"
    gpu1.write("/home/nfs-export/results.csv", "epoch,loss\n1,0.5\n")
    gpu1.exec(f"mkdir -p {vol} && mount --bind /home/nfs-export {vol}")
    gpu1.write("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\n")
    gpu1.write("/etc/cni/net.d/87-podman-bridge.conflist", '{"name": "podman"}\n')
    gpu1.write("/var/lib/cni/networks/podman/10.88.0.2", "c0ffee\n")
    gpu1.write("/etc/cni/net.d/10-flannel.conflist", '{"name": "cbr0"}\n')
    gpu1.write("/var/lib/cni/networks/cbr0/10.244.1.2", "abc\n")
    gpu1.write("/var/lib/etcd/default/member/snap/db", "ubuntu etcd-server data\n")  # Ubuntu's etcd-server
    endpoint = f"{lab.host('cp-1').address}:6443"
    gpu1.write("/root/.kube/config", f"clusters:\n- cluster:\n    server: https://{endpoint}\n  name: ml\n")
    gpu1.write("/home/gpuk8s/.kube/config", f"clusters:\n- cluster:\n    server: https://{endpoint}\n  name: ml\n"
               "- cluster:\n    server: https://other.example:6443\n  name: other\n")
    r, seconds = reset(run_cli, lab, "gpu-1", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    [node] = json.loads(r.stdout)["nodes"]
    assert node["status"] == "reset", node
    print(f"\nreset of a host that is no node (kubeadm absent): {node['seconds']:.2f} s")
    assert gpu1.exec(f"grep -q ' {vol} ' /proc/mounts", check=False).returncode != 0  # unmounted
    assert gpu1.read("/home/nfs-export/results.csv") == "epoch,loss\n1,0.5\n"  # the volume's data untouched
    assert gpu1.read("/var/lib/kubelet/config.yaml") is None
    for stays in ("/etc/cni/net.d/87-podman-bridge.conflist", "/var/lib/cni/networks/podman/10.88.0.2",
                  "/var/lib/etcd/default/member/snap/db", "/home/gpuk8s/.kube/config"):
        assert gpu1.read(stays) is not None, stays
    for gone in ("/etc/cni/net.d/10-flannel.conflist", "/var/lib/cni/networks/cbr0/10.244.1.2",
                 "/root/.kube/config"):
        assert gpu1.read(gone) is None, gone
    assert "server: https://" in (gpu1.read("/root/.kube/config.gpuk8s-reset.bak") or "")
    assert gpu1.exec("stat -c %a /root/.kube/config.gpuk8s-reset.bak").stdout.strip() == "600"


def test_a_volume_still_mounted_under_the_kubelet_is_never_deleted_through(lab_up, run_cli):
    lab = lab_up(FLEET)
    gpu1 = lab.host("gpu-1")
    vol = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~nfs/data"
    gpu1.write("/home/nfs-export/results.csv", "epoch,loss\n1,0.5\n")
    # a busy mount: a process holds the volume as its working directory, umount fails (EBUSY)
    gpu1.exec(f"mkdir -p {vol} && mount --bind /home/nfs-export {vol}")
    holder = gpu1.exec(f"cd {vol} && (setsid sleep 300 >/dev/null 2>&1 & echo $!)").stdout.strip()
    try:
        r, _ = reset(run_cli, lab, "gpu-1", "--yes")
        assert r.returncode == 1, r.stdout + r.stderr
        [node] = json.loads(r.stdout)["nodes"]
        assert node["id"] == "reset.host-failed" and "still mounted under /var/lib/kubelet" in node["message"]
        assert gpu1.read("/home/nfs-export/results.csv") == "epoch,loss\n1,0.5\n"
    finally:
        gpu1.exec(f"kill {holder}", check=False)


def test_purge_keeping_containerd_io_leaves_a_runtime_that_starts_containers(lab_up, run_cli, tmp_path):
    """Where gpuk8s installed containerd.io (kept by --purge) and the NVIDIA toolkit (purged), nvidia stops being
    containerd's default runtime; a file changed after the install is kept beside the restored original."""
    from tests.labtests.test_runtimes import DEFAULT, fleet

    lab = lab_up(fleet(DEFAULT))
    gpu1 = lab.host("gpu-1")
    fstab_before = gpu1.read("/etc/fstab")
    install(lab, run_cli, tmp_path)
    assert gpu1.read("/etc/containerd/conf.d/99-nvidia.toml") is not None
    assert "default_runtime_name = 'nvidia'" in gpu1.exec("containerd config dump").stdout
    gpu1.exec("echo 'nas:/export /mnt/nas nfs defaults 0 0' >> /etc/fstab")  # the operator's line, after install
    fstab_now = gpu1.read("/etc/fstab")
    r, _ = reset(run_cli, lab, "gpu-1", "--yes", "--purge")
    assert r.returncode == 0, r.stdout + r.stderr
    [node] = json.loads(r.stdout)["nodes"]
    assert node["status"] == "reset", node
    assert "containerd.io" in gpu1.state()["packages"] and "nvidia-container-toolkit" not in gpu1.state()["packages"]
    assert gpu1.read("/etc/containerd/conf.d/99-nvidia.toml") is None
    assert "default_runtime_name = 'nvidia'" not in gpu1.exec("containerd config dump").stdout
    assert gpu1.state()["services"].get("containerd") == "active"
    assert gpu1.read("/etc/fstab") == fstab_before
    assert gpu1.read("/etc/fstab.gpuk8s-purge.bak") == fstab_now
