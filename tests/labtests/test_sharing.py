"""Shared GPUs on the lab's simulated cluster (docs/sharing.md): time-slicing with different replicas per node,
MPS with its control daemon, HAMi; the proof verify runs; changing a node's sharing changes only the ConfigMap
and the labels; back to whole GPUs removes what sharing added; an MPS node without its daemon is named."""

from __future__ import annotations

import json
import time

import jsonschema
import yaml

from tests.labtests.gpucluster import STATUS_SCHEMA

FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: ts-4
    gpus: 2
  - name: ts-20
    gpus: 1
  - name: whole
    gpus: 2
  - name: mps-1
    gpus: 1
  - name: hami-1
    gpus: 1
    gpu_memory_mib: 81920
"""
PHASES = ("lock", "prepare", "init", "kubeconfig", "cni", "join", "gpu", "verify")


def write_inventory(lab, small_replicas: int | None, shared: bool = True) -> str:
    """The lab inventory with a gpu_groups entry for ts-4 and per-host gpu_sharing for the others."""
    inv = yaml.safe_load(lab.inventory.read_text())
    if shared:
        inv["gpu_groups"] = {"small": {"gpu_sharing": {"strategy": "time-slicing", "replicas": small_replicas}}}
        per_host = {"ts-20": {"strategy": "time-slicing", "replicas": 20, "rename": True},
                    "mps-1": {"strategy": "mps", "replicas": 4},
                    "hami-1": {"strategy": "hami", "replicas": 10}}
        for h in inv["hosts"]:
            if h["name"] == "ts-4":
                h["gpu_group"] = "small"
            if h["name"] in per_host:
                h["gpu_sharing"] = per_host[h["name"]]
    path = lab.root / "inventory-sharing.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return str(path)


def kubectl_json(lab, *args: str) -> dict:
    out = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf " + " ".join(args) + " -o json")
    return json.loads(out.stdout)


def nodes(lab) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in kubectl_json(lab, "get nodes")["items"]}


def install(run_cli, inv: str) -> dict:
    t = time.monotonic()
    r = run_cli("install", "-i", inv, "-o", "json", "--force", timeout=600)
    rep = json.loads(r.stdout)
    rep["_rc"], rep["_s"] = r.returncode, round(time.monotonic() - t, 1)
    print(f"install took {rep['_s']} s")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return rep


def test_shared_nodes_follow_their_plan_and_the_proof_runs(lab_up, run_cli):
    lab = lab_up(FLEET)
    rep = install(run_cli, write_inventory(lab, 4))
    checks = {n["node"]: n for n in rep["nodes"]}
    # allocatable = GPUs x replicas under the planned name; whole GPUs where nothing is shared
    want = {"ts-4": ("nvidia.com/gpu", 8), "ts-20": ("nvidia.com/gpu.shared", 20), "whole": ("nvidia.com/gpu", 2),
            "mps-1": ("nvidia.com/gpu", 4), "hami-1": ("nvidia.com/gpu", 10)}
    for name, (res, n) in want.items():
        c = checks[name]
        assert c["ok"], c
        assert (c["resource"], c["expected_gpus"], c["allocatable_gpus"]) == (res, n, n)
    # the proof: that many one-slice pods bound, one more Pending, a pod asking for 2 rejected by the plugin
    assert checks["ts-4"]["proof"].startswith("8 one-slice pods bound, 1 more Pending (Insufficient nvidia.com/gpu)")
    assert "a pod asking for 2 rejected: UnexpectedAdmissionError (Pod was rejected: Allocate failed due to rpc " \
           "error: code = Unknown desc = invalid request: maximum request size for shared resources is 1; found 2, " \
           "which is unexpected)" in checks["ts-4"]["proof"]
    assert checks["ts-20"]["proof"].startswith("20 one-slice pods bound, 1 more Pending (Insufficient "
                                               "nvidia.com/gpu.shared)")
    assert checks["mps-1"]["proof"].startswith("4 one-slice pods bound")
    assert checks["hami-1"]["proof"] == "a pod asking for 4096 MiB nvidia.com/gpumem bound by hami-scheduler"
    assert checks["whole"]["proof"] == ""
    n = nodes(lab)
    assert n["ts-20"]["status"]["allocatable"].get("nvidia.com/gpu") is None
    labels = {k: n[k]["metadata"]["labels"] for k in want}
    assert labels["ts-4"]["nvidia.com/device-plugin.config"] == "time-slicing-4"
    assert labels["ts-4"]["nvidia.com/gpu.replicas"] == "4"
    assert labels["ts-4"]["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["ts-4"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-SHARED"
    assert labels["ts-20"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"  # renamed: no -SHARED
    assert labels["whole"]["nvidia.com/device-plugin.config"] == "none"
    assert labels["whole"]["nvidia.com/gpu.count"] == "2" and labels["whole"]["nvidia.com/gpu.memory"] == "81920"
    assert labels["mps-1"]["nvidia.com/mps.capable"] == "true"
    assert labels["hami-1"]["gpu"] == "on" and "nvidia.com/device-plugin.config" not in labels["hami-1"]
    # no proof pod is left behind
    assert not [p for p in kubectl_json(lab, "get pods -n default")["items"]
                if p["metadata"]["name"].startswith("gpuk8s-share-")]

    # a change of replicas changes the ConfigMap and the labels, nothing else
    rep = install(run_cli, write_inventory(lab, 2))
    phases = {p["name"]: p for p in rep["phases"]}
    # (the lock phase always takes the cluster lock: "changed")
    assert {k: phases[k]["status"] for k in PHASES if k not in ("gpu", "verify")} == {
        "lock": "changed", **{k: "unchanged" for k in PHASES if k not in ("lock", "gpu", "verify")}}
    gpu = phases["gpu"]
    assert gpu["status"] == "changed"
    assert gpu["message"] == "applied nvidia-device-plugin-configs.yaml; labels on ts-4", gpu
    ts4 = {n["node"]: n for n in rep["nodes"]}["ts-4"]
    assert ts4["ok"] and ts4["allocatable_gpus"] == 4 and ts4["proof"].startswith("4 one-slice pods bound")

    # back to whole GPUs: every node advertises its GPUs, the sharing labels and HAMi's objects are gone
    rep = install(run_cli, write_inventory(lab, None, shared=False))
    checks = {n["node"]: n for n in rep["nodes"]}
    for name, gpus in (("ts-4", 2), ("ts-20", 1), ("whole", 2), ("mps-1", 1), ("hami-1", 1)):
        assert (checks[name]["ok"], checks[name]["resource"], checks[name]["allocatable_gpus"]) == (
            True, "nvidia.com/gpu", gpus), checks[name]
    gpu = {p["name"]: p for p in rep["phases"]}["gpu"]
    assert "removed hami.yaml" in gpu["message"]
    n = nodes(lab)
    assert "nvidia.com/gpu.shared" not in n["ts-20"]["status"]["allocatable"]
    assert "gpu" not in n["hami-1"]["metadata"]["labels"]
    assert "nvidia.com/mps.capable" not in n["mps-1"]["metadata"]["labels"]
    assert n["ts-20"]["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "none"
    assert n["hami-1"]["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "none"
    names = {o["metadata"]["name"] for kind in ("deployments", "daemonsets", "configmaps")
             for o in kubectl_json(lab, f"get {kind} -n kube-system")["items"]}
    assert not names & {"hami-scheduler", "hami-device-plugin", "hami-scheduler-device"}
    assert "nvidia-device-plugin-daemonset" in names


def test_an_mps_node_without_its_daemon_is_named(lab_up, run_cli):
    lab = lab_up("hosts:\n  - {name: cp-1, role: control-plane}\n  - {name: mps-1, gpus: 2}\n")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["gpu_defaults"] = {"gpu_sharing": {"strategy": "mps", "replicas": 3}}  # every GPU node: the defaults
    path = lab.root / "inventory-mps.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    rep = install(run_cli, str(path))
    mps = {n["node"]: n for n in rep["nodes"]}["mps-1"]
    assert mps["ok"] and mps["allocatable_gpus"] == 6, mps
    # the fault: the node loses the label the MPS control daemon's DaemonSet selects, so its pod goes
    cp = lab.host("cp-1")
    cp.exec("kubectl --kubeconfig /etc/kubernetes/admin.conf label node mps-1 nvidia.com/mps.capable-")
    r = run_cli("verify", "-i", str(path), "-o", "json")
    assert r.returncode != 0
    rep = json.loads(r.stdout)
    mps = {n["node"]: n for n in rep["nodes"]}["mps-1"]
    assert not mps["ok"] and mps["cause_id"] == "gpu.mps-daemon-missing", mps
    assert "the MPS control daemon is not running on this node" in mps["cause"]
    assert "node label nvidia.com/mps.capable: missing" in mps["evidence"]
    # install puts the label back, and with it the daemon
    rep = install(run_cli, str(path))
    assert {n["node"]: n for n in rep["nodes"]}["mps-1"]["ok"]


def test_join_leaves_other_nodes_and_the_proof_spares_a_users_slices(lab_up, run_cli):
    """The review's findings 1 and 9: `join` gathers facts only for the hosts it joins, so it must not touch
    the labels of the others (their product, memory and count come from facts); and verify's proof uses only
    the slices that are free, never failing because a user's pods hold some."""
    lab = lab_up("hosts:\n  - {name: cp-1, role: control-plane}\n  - {name: ts-4, gpus: 2}\n"
                 "  - {name: late, gpus: 1}\n")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["gpu_defaults"] = {"gpu_sharing": {"strategy": "time-slicing", "replicas": 4}}
    full = lab.root / "inventory-join.yaml"
    full.write_text(yaml.safe_dump(inv, sort_keys=False))
    inv["hosts"] = [h for h in inv["hosts"] if h["name"] != "late"]
    first = lab.root / "inventory-without-late.yaml"
    first.write_text(yaml.safe_dump(inv, sort_keys=False))
    install(run_cli, str(first))
    before = nodes(lab)["ts-4"]["metadata"]["labels"]
    assert before["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-SHARED" and before["nvidia.com/gpu.count"] == "2"

    # a user's pods hold 3 of ts-4's 8 slices (one each: failRequestsGreaterThanOne): verify proves the other 5
    users = [f"infer-{i}" for i in range(3)]
    for name in users:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeName": "ts-4", "containers": [{"name": "c", "image": "cuda", "command": ["sleep", "inf"],
                                                             "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
        lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf apply -f - <<'X'\n"
                              + json.dumps(pod) + "\nX\n")
    pods = kubectl_json(lab, "get pods -n default")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running"] * 3, pods
    r = run_cli("verify", "-i", str(first), "-o", "json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ts4 = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}["ts-4"]
    assert ts4["ok"] and ts4["proof"].startswith("5 one-slice pods bound (3 of 8 slices in use by other pods), "
                                                 "1 more Pending (Insufficient nvidia.com/gpu)"), ts4
    assert sorted(p["metadata"]["name"] for p in kubectl_json(lab, "get pods -n default")["items"]) == users

    # join 'late': ts-4 keeps every label, 'late' gets its own from its facts
    r = run_cli("join", "-i", str(full), "-o", "json", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    gpu = next(p for p in json.loads(r.stdout)["phases"] if p["name"] == "gpu")
    assert "ts-4" not in gpu.get("hosts", {}), gpu
    after = nodes(lab)
    assert after["ts-4"]["metadata"]["labels"] == before
    late = after["late"]["metadata"]["labels"]
    assert late["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-SHARED" and late["nvidia.com/gpu.count"] == "1"
    assert late["nvidia.com/device-plugin.config"] == "time-slicing-4"


def test_status_shows_hami_memory_per_gpu_as_spread_places_it(lab_up, run_cli):
    """Issue 19: on a 2-GPU HAMi node HAMi's scheduler spreads the pods (least-used GPU first) and records each
    placement on the pod; status shows each GPU's allocated memory and its pods. A pod too big for any one GPU,
    though not for the node's free total, stays Pending."""
    lab = lab_up("hosts:\n  - {name: cp-1, role: control-plane}\n  - {name: hami-2, gpus: 2, gpu_memory_mib: 24576}\n")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["gpu_defaults"] = {"gpu_sharing": {"strategy": "hami", "replicas": 10}}
    path = lab.root / "inventory-hami.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    install(run_cli, str(path))
    # spread: a on GPU 0 (a tie: the lowest index), b on GPU 1 (unused), c on GPU 1 (8000 < 10000 used);
    # big (20000 MiB) then fits neither GPU (14576 and 12576 free) though the node has 27152 free
    for name, mem in (("a", 10000), ("b", 8000), ("c", 4000), ("big", 20000)):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
               "spec": {"schedulerName": "hami-scheduler", "nodeSelector": {"kubernetes.io/hostname": "hami-2"},
                        "containers": [{"name": "c", "image": "cuda", "command": ["sleep", "inf"],
                                        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem}}}]}}
        lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf apply -f - <<'X'\n"
                              + json.dumps(pod) + "\nX\n")
    pods = {p["metadata"]["name"]: p for p in kubectl_json(lab, "get pods -n default")["items"]}
    assert {k: p["status"]["phase"] for k, p in pods.items()} == {"a": "Running", "b": "Running", "c": "Running",
                                                                   "big": "Pending"}, pods
    assert "CardInsufficientMemory" in pods["big"]["status"]["conditions"][0]["message"]
    assert pods["b"]["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] == \
        "GPU-hami-2-0001-lab,NVIDIA,8000,0:;"
    t = time.monotonic()
    r = run_cli("status", "-i", str(path), "-o", "json")
    took = round(time.monotonic() - t, 1)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    jsonschema.validate(st, STATUS_SCHEMA)
    [node] = [n for n in st["nodes"] if n["node"] == "hami-2"]
    # the node's HAMi memory counted against the GPUs HAMi registered (status gathers no facts for the plan)
    assert [(x["resource"], x["allocatable"], x["requested"], x["free"]) for x in node["resources"]] == [
        ("nvidia.com/gpu", 20, 3, 17), ("nvidia.com/gpumem", 49152, 22000, 27152)]
    assert [(g["index"], g["uuid"], g["type"], g["memory_total_mib"], g["memory_mib"],
             [(p["name"], p["memory_mib"]) for p in g["pods"]]) for g in node["hami_gpus"]] == [
        (0, "GPU-hami-2-0000-lab", "NVIDIA-NVIDIA A100-SXM4-80GB", 24576, 10000, [("a", 10000)]),
        (1, "GPU-hami-2-0001-lab", "NVIDIA-NVIDIA A100-SXM4-80GB", 24576, 12000, [("b", 8000), ("c", 4000)])]
    r = run_cli("status", "-i", str(path))
    assert "# HAMi GPUs\nNODE\tGPU\tMEMORY\tCORES\tPODS\n" in r.stdout
    assert ("hami-2\t1 GPU-hami-2-0001-lab\t12000/24576 MiB\t0/100%\tdefault/b 8000MiB no core limit, "
            "default/c 4000MiB no core limit\n") in r.stdout
    print(f"status took {took} s\n{r.stdout}")
