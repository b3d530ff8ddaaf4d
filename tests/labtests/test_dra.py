"""Dynamic Resource Allocation on the lab (issue 33, docs/dra.md): a mixed cluster, one node whose GPUs NVIDIA's DRA
driver serves and one the device plugin serves. install deploys the driver's kubelet plugin on the dra node only
(and the device plugin off it), verify finds every GPU in the node's ResourceSlice and runs its test pod through a
claim; the driver's own quickstart claims run there, a claim no device satisfies waits with the scheduler's
message; status counts the claimed GPUs with the others; a node moved back to the device plugin loses the driver's
objects and gets the plugin, and back again. On 1.37 a pod asking nvidia.com/gpu is served on the dra node through
the DeviceClass (KEP-5004)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jsonschema

from gpuk8s.gpuplan import ALLOCATOR_LABEL
from tests.labtests import interrupt, invariants
from tests.labtests.gpucluster import KUBECTL, STATUS_SCHEMA

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "dra"

FLEET = """
cluster:
  kubernetes_version: MINOR
hosts:
  - name: cp-1
    role: control-plane
  - name: w-dra
    gpus: 4
    allocator: dra
    driver: "580.95.05"   # the DRA driver needs branch 565 or newer (preflight dra.driver)
  - name: w-plugin
    gpus: 2
"""


def kubectl(lab, args: str, stdin: str | None = None) -> str:
    cmd = KUBECTL + args
    if stdin is not None:
        cmd = f"cat <<'EOF' | {cmd}\n{stdin}\nEOF"
    return str(lab.hosts["cp-1"].exec(cmd).stdout)


def real_spec(name: str) -> str:
    return (REAL / name).read_text().partition("\n---\n")[2]


def claim_pod(pod: str, template: str, count: int) -> str:
    """A pod in default that sleeps holding `count` GPUs through a claim made from its own ResourceClaimTemplate."""
    return f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {template}, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {pod}, namespace: default}}
spec:
  containers:
  - name: c
    image: ubuntu:22.04
    command: [sleep, "9999"]
    resources: {{claims: [{{name: gpus}}]}}
  resourceClaims: [{{name: gpus, resourceClaimTemplateName: {template}}}]"""


def pods(lab, ns: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in json.loads(kubectl(lab, f"get pods -n {ns} -o json"))["items"]
            if p["metadata"].get("namespace", "default") == ns}


def phases(run_cli, *args: str) -> tuple[int, dict, dict]:
    r = run_cli(*args, "-o", "json")
    assert "Traceback" not in r.stderr, r.stderr
    rep = json.loads(r.stdout)
    return r.returncode, {p["name"]: p for p in rep["phases"]}, {n["node"]: n for n in rep.get("nodes", [])}


def test_a_mixed_cluster_serves_gpus_through_each_allocator_and_moves_a_node_between_them(lab_up, run_cli,
                                                                                           tmp_path):
    lab = lab_up(FLEET.replace("MINOR", "default"))  # the matrix's default minor (1.36)
    inv, kc = str(lab.inventory), str(tmp_path / "kc")
    # preflight: the DRA host's driver floor and CDI (containerd 2.x, which install brings); a host whose driver is
    # below the floor is named, with what to do
    old = tmp_path / "old.yaml"
    old.write_text(Path(inv).read_text().replace("  allocator: dra\n", "").replace(
        "- name: w-plugin\n", "- name: w-plugin\n  allocator: dra\n"))
    for path, host, status in ((inv, "w-dra", "pass"), (str(old), "w-plugin", "fail")):
        pre = json.loads(run_cli("preflight", "-i", path, "-o", "json").stdout)
        checks = {c["id"]: c for h in pre["hosts"] if h["name"] == host for c in h["checks"]}
        assert checks["dra.driver"]["status"] == status, checks["dra.driver"]
        assert checks["dra.cdi"]["message"].startswith("containerd 1.6.20 has CDI off: install brings containerd 2.")
    assert "driver 535.104.05 is older than the DRA driver's floor (565)" in checks["dra.driver"]["message"]
    rc, ph, nodes = phases(run_cli, "install", "-i", inv, "--kubeconfig-out", kc)
    assert rc == 0, ph
    assert "applied nvidia-dra-driver.yaml" in ph["gpu"]["message"]
    assert ph["verify"]["message"] == "3/3 nodes ok, 6 GPU(s) schedulable"
    d = nodes["w-dra"]
    assert d["ok"] and d["resource"] == "gpu.nvidia.com (DRA)" and (d["expected_gpus"], d["allocatable_gpus"]) == (4, 4)
    assert d["pod"] == "gpuk8s-verify-w-dra" and nodes["w-plugin"]["resource"] == "nvidia.com/gpu"

    # the kubelet plugin on the dra node only, the device plugin off it; the dra node advertises no nvidia.com/gpu
    ds_pods = set(pods(lab, "kube-system")) | set(pods(lab, "nvidia-dra-driver-gpu"))
    assert "dra-driver-nvidia-gpu-kubelet-plugin-w-dra" in ds_pods
    assert "dra-driver-nvidia-gpu-kubelet-plugin-w-plugin" not in ds_pods
    assert "nvidia-device-plugin-daemonset-w-plugin" in ds_pods
    assert "nvidia-device-plugin-daemonset-w-dra" not in ds_pods
    node = json.loads(kubectl(lab, "get node w-dra -o json"))
    assert node["metadata"]["labels"][ALLOCATOR_LABEL] == "dra"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    slices = json.loads(kubectl(lab, "get resourceslices -o json"))["items"]
    assert [s["spec"]["nodeName"] for s in slices] == ["w-dra"]
    assert [dv["name"] for dv in slices[0]["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    # the verify test pods and their template are gone
    assert not [p for p in pods(lab, "default") if p.startswith("gpuk8s-verify")]
    assert "gpuk8s-verify-gpu" not in kubectl(lab, "get resourceclaimtemplates -n default -o name")

    # the driver's own quickstart: two pods, one GPU each, through a ResourceClaimTemplate; they land on the dra node
    kubectl(lab, "apply -f -", real_spec("demo-gpu-test1-v0.4.0.yaml"))
    demo = pods(lab, "gpu-test1")
    assert {p["spec"]["nodeName"] for p in demo.values()} == {"w-dra"}
    assert {p["status"]["phase"] for p in demo.values()} == {"Succeeded"}
    # a claim whose CEL selector no device satisfies waits, with kube-scheduler's words (the driver's own test spec)
    kubectl(lab, "apply -f -", real_spec("test-gpu-cel-nomatch-v0.4.0.yaml"))
    waiting = pods(lab, "default")["pod-cel-nomatch"]
    assert waiting["status"]["phase"] == "Pending"
    msg = next(c["message"] for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled")
    assert msg == ("0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 cannot allocate all claims. still "
                   "not schedulable, preemption: 0/3 nodes are available: 3 Preemption is not helpful for "
                   "scheduling.")
    # doctor: the value the claim asks and the values the devices have
    doc = json.loads(run_cli("doctor", "-i", inv, "-o", "json", "default/pod-cel-nomatch").stdout)
    [f] = doc["findings"]
    assert f["id"] == "pod.dra-no-matching-device", f
    assert "productName == 'NONEXISTENT-GPU-XYZ' (the devices have: NVIDIA A100-SXM4-80GB)" in f["message"]
    assert "w-dra: 4 device(s) published, 0 held" in f["evidence"]

    # status: a pod holding two GPUs through a claim, counted on the dra node and in the cluster's GPUs
    kubectl(lab, "apply -f -", claim_pod("holder", "two-gpus", 2))
    claims = json.loads(kubectl(lab, "get resourceclaims -n default -o json"))["items"]
    held = next(c for c in claims if c["metadata"]["name"].startswith("holder-gpus-"))
    assert [r["pool"] for r in held["status"]["allocation"]["devices"]["results"]] == ["w-dra", "w-dra"]
    assert held["status"]["reservedFor"][0]["name"] == "holder"
    st = json.loads(run_cli("status", "-i", inv, "-o", "json").stdout)
    jsonschema.validate(st, STATUS_SCHEMA)
    by = {n["node"]: n for n in st["nodes"]}
    assert by["w-dra"]["allocator"] == "dra" and by["w-plugin"]["allocator"] == "device-plugin"
    res = by["w-dra"]["resources"]
    assert [(r["resource"], r["kind"], r["allocatable"], r["requested"]) for r in res] == [
        ("gpu.nvidia.com/gpu", "dra", 4, 2)]
    assert res[0]["pods"] == [{"namespace": "default", "name": "holder", "count": 2, "phase": ""}]
    assert st["footer"] == ["Allocated/Total GPUs in cluster: 2/6 (33%)"]
    table = run_cli("status", "-i", inv).stdout
    assert "dra whole" in table and "default/holder x2" in table
    # a claim of three more GPUs: two are free; doctor names who holds the others
    kubectl(lab, "apply -f -", claim_pod("greedy", "three-gpus", 3))
    doc = json.loads(run_cli("doctor", "-i", inv, "-o", "json", "default/greedy").stdout)
    [f] = doc["findings"]
    assert f["id"] == "pod.dra-unallocatable" and "held by other pods" in f["message"], f
    assert "w-dra: 4 device(s) published, 2 held by default/holder" in f["evidence"]
    assert "claim gpus, request gpus: 3 x gpu.nvidia.com" in f["evidence"]
    kubectl(lab, "delete pod greedy -n default")
    kubectl(lab, "delete pod holder pod-cel-nomatch -n default")
    doc = json.loads(run_cli("doctor", "-i", inv, "-o", "json").stdout)  # nothing wrong: no finding, none of DRA
    assert doc["findings"] == [], doc["findings"]

    # the dra node moved to the device plugin: the driver's objects go (those gpuk8s applied), the plugin comes
    plain = tmp_path / "plain.yaml"
    plain.write_text(Path(inv).read_text().replace("  allocator: dra\n", ""))
    rc, ph, nodes = phases(run_cli, "install", "-i", str(plain), "--kubeconfig-out", kc)
    assert rc == 0 and "removed nvidia-dra-driver.yaml (9 object(s) gpuk8s applied)" in ph["gpu"]["message"], ph
    assert nodes["w-dra"]["resource"] == "nvidia.com/gpu" and nodes["w-dra"]["allocatable_gpus"] == 4
    assert kubectl(lab, "get resourceslices -o name").strip() == ""
    assert ALLOCATOR_LABEL not in json.loads(kubectl(lab, "get node w-dra -o json"))["metadata"]["labels"]
    # and back: a re-run of the first inventory converges to it again, then changes nothing
    rc, ph, nodes = phases(run_cli, "install", "-i", inv, "--kubeconfig-out", kc)
    assert rc == 0 and nodes["w-dra"]["resource"] == "gpu.nvidia.com (DRA)", ph
    rc, ph, _ = phases(run_cli, "install", "-i", inv, "--kubeconfig-out", kc)
    assert rc == 0 and ph["gpu"]["status"] == "unchanged", ph["gpu"]


def test_on_1_37_a_plain_gpu_pod_is_served_on_the_dra_node(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET.replace("MINOR", '"1.37"'))
    inv = str(lab.inventory)
    rc, ph, nodes = phases(run_cli, "install", "-i", inv, "--kubeconfig-out", str(tmp_path / "kc"))
    assert rc == 0 and nodes["w-dra"]["ok"], ph
    # verify's second pod on the dra node asks nvidia.com/gpu: 1, no claim
    plan = run_cli("install", "-i", inv, "--dry-run").stdout
    assert "test pod asking nvidia.com/gpu on the dra node w-dra" in plan and "ResourceClaimTemplate" in plan
    classes = {c["metadata"]["name"]: c for c in json.loads(kubectl(lab, "get deviceclasses -o json"))["items"]}
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["mig.nvidia.com"]["spec"]
    # three GPUs: more than the plugin node has; the scheduler serves them from the dra node's devices
    kubectl(lab, "apply -f -", """apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: default}
spec:
  containers:
  - name: c
    image: nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04
    command: [sleep, "9999"]
    resources: {limits: {nvidia.com/gpu: 3}}""")
    p = pods(lab, "default")["plain"]
    assert p["spec"]["nodeName"] == "w-dra" and p["status"]["phase"] == "Running"
    claim = next(c for c in json.loads(kubectl(lab, "get resourceclaims -n default -o json"))["items"]
                 if c["metadata"]["name"].startswith("plain-"))
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    st = json.loads(run_cli("status", "-i", inv, "-o", "json").stdout)
    jsonschema.validate(st, STATUS_SCHEMA)
    by = {n["node"]: n for n in st["nodes"]}
    assert [(r["resource"], r["requested"]) for r in by["w-dra"]["resources"]] == [("gpu.nvidia.com/gpu", 3)]
    assert st["footer"] == ["Allocated/Total GPUs in cluster: 3/6 (50%)"]


MOVE_FLEET = """
cluster:
  kubernetes_version: default
hosts:
  - name: cp-1
    role: control-plane
  - name: w-a
    gpus: 2
    driver: "580.95.05"
  - name: w-b
    gpus: 2
    driver: "580.95.05"
"""
NO_CDI = "sed -i 's/enable_cdi = true/enable_cdi = false/' /etc/containerd/config.toml /etc/containerd/conf.d/*.toml"


def test_allocator_moves_a_running_node_after_its_gpu_job_and_puts_back_one_that_fails(lab_up, run_cli, tmp_path):
    lab = lab_up(MOVE_FLEET)
    inv, kc = str(lab.inventory), str(tmp_path / "kc")
    rc, ph, _ = phases(run_cli, "install", "-i", inv, "--kubeconfig-out", kc)
    assert rc == 0, ph
    # the job runs 30 s: still running when the move starts after the steps below, on a loaded machine too (12 s
    # ended before the move once, under make test's three workers)
    job = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "train-0", "namespace": "ml",
                        "annotations": {"lab.gpuk8s.io/runs-seconds": "30", "lab.gpuk8s.io/created": str(time.time())},
                        "ownerReferences": [{"kind": "Job", "name": "train"}]},
           "spec": {"nodeName": "w-a", "containers": [{"name": "c", "image": "cuda",
                                                        "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    kubectl(lab, "apply -f -", json.dumps(job))
    moved = tmp_path / "dra.yaml"
    moved.write_text(Path(inv).read_text().replace("- name: w-a\n", "- name: w-a\n  allocator: dra\n"))

    # install does not switch a node whose GPUs a pod holds: it names the command that drains it first
    rc, ph, _ = phases(run_cli, "install", "-i", str(moved), "--kubeconfig-out", kc)
    assert rc != 0 and ph["gpu"]["status"] == "failed"
    assert "w-a: left on device-plugin: GPU pods hold its GPUs (ml/train-0)" in ph["gpu"]["message"]
    assert "gpuk8s allocator w-a --to dra" in ph["gpu"]["remedy"]
    assert ALLOCATOR_LABEL not in json.loads(kubectl(lab, "get node w-a -o json"))["metadata"]["labels"]
    assert "dra-driver-nvidia-gpu-kubelet-plugin-w-a" not in pods(lab, "nvidia-dra-driver-gpu")
    # the command refuses a target the inventory does not say (exit 2, before any host is contacted)
    r = run_cli("allocator", "w-b", "--to", "dra", "-i", str(moved), "--yes")
    assert r.returncode == 2 and "the inventory says allocator: device-plugin for w-b" in r.stderr

    plan = run_cli("allocator", "w-a", "--to", "dra", "-i", str(moved), "--dry-run")
    assert plan.returncode == 0 and "ml/train-0" in plan.stdout and "kubectl drain w-a" in plan.stdout
    t0 = time.monotonic()
    rc, ph, nodes = phases(run_cli, "allocator", "w-a", "--to", "dra", "-i", str(moved), "--yes",
                           "--gpu-pod-timeout", "120")
    wall = time.monotonic() - t0
    assert rc == 0, ph
    moved_msg = ph["allocator"]["hosts"]["w-a"]
    assert "waited for GPU pods ml/train-0" in moved_msg and "device-plugin -> dra (2 of 2 device(s)" in moved_msg
    assert "test pod gpuk8s-verify-w-a passed" in moved_msg and "uncordoned" in moved_msg
    unavailable = float(moved_msg.split("GPUs unavailable ")[1].split(" s")[0])
    print(f"allocator move of w-a (device plugin -> DRA, 2 GPUs): {wall:.1f} s wall, GPUs unavailable "
          f"{unavailable:.1f} s (the job's wait included)")
    node = json.loads(kubectl(lab, "get node w-a -o json"))
    assert node["metadata"]["labels"][ALLOCATOR_LABEL] == "dra" and not node["spec"].get("unschedulable")
    assert "nvidia-device-plugin-daemonset-w-a" not in pods(lab, "kube-system")
    # resumable: a re-run finds it there; install agrees
    rc, ph, _ = phases(run_cli, "allocator", "w-a", "--to", "dra", "-i", str(moved), "--yes")
    assert rc == 0 and ph["allocator"]["hosts"]["w-a"] == "already on dra", ph
    rc, ph, nodes = phases(run_cli, "install", "-i", str(moved), "--kubeconfig-out", kc)
    assert rc == 0 and ph["gpu"]["status"] == "unchanged" and nodes["w-a"]["resource"] == "gpu.nvidia.com (DRA)"

    # a node whose containerd has CDI off cannot serve DRA: the move is refused before anything changes (issue 41:
    # it was drained, failed its proof and put back)
    lab.host("w-b").exec(NO_CDI)
    both = tmp_path / "both.yaml"
    both.write_text(moved.read_text().replace("- name: w-b\n", "- name: w-b\n  allocator: dra\n"))
    rc, ph, _ = phases(run_cli, "allocator", "w-b", "--to", "dra", "-i", str(both), "--yes")
    assert rc == 1 and "w-b: not moved to dra: its containerd 2.2.6 does not hand CDI devices" in \
        ph["allocator"]["hosts"]["w-b"], ph
    node = json.loads(kubectl(lab, "get node w-b -o json"))
    assert not node["spec"].get("unschedulable") and invariants.CORDON_MARK not in node["metadata"]["labels"]
    # a move whose test pod fails is put back: CDI turned off under the run (a config tool's push), once the node is
    # relabelled: the claimed GPU never reaches the container
    lab.host("w-b").exec(NO_CDI.replace("true/enable_cdi = false", "false/enable_cdi = true"))
    relabel = re.compile(r"gpuk8s\.remote: cp-1: \$ .*label node w-b .*gpu-allocator=dra")
    run = interrupt.run_killed(tmp_path, ("allocator", "w-b", "--to", "dra", "-i", str(both), "--yes", "-o", "json"),
                               line=relabel, act=lambda: lab.host("w-b").exec(NO_CDI))
    assert run.rc == 1 and not run.killed, run
    ph = {p["name"]: p for p in json.loads(run.stdout)["phases"]}
    assert ph["allocator"]["status"] == "failed"
    why = ph["allocator"]["hosts"]["w-b"]
    assert "dra failed: the test pod gpuk8s-verify-w-b failed" in why and "put back on device-plugin" in why, why
    node = json.loads(kubectl(lab, "get node w-b -o json"))
    assert ALLOCATOR_LABEL not in node["metadata"]["labels"] and not node["spec"].get("unschedulable")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    rep = json.loads(run_cli("allocator", "w-b", "--to", "dra", "-i", str(both), "--yes", "-o", "json").stdout)
    assert [f["id"] for f in rep["findings"]] == ["allocator.failed"]
