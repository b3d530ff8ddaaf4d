"""gpuk8s status and doctor on a cluster with whole, shared and MIG GPUs (issue 19): a time-sliced node (2 GPUs
x 4), an MPS node (1 GPU x 2), a node with whole GPUs, an H200 node partitioned into MIG devices; some GPU pods. The
numbers per node and the footer must be what the pods hold; a pod asking for two slices is refused by the plugin
and doctor says why; an MPS node without its control daemon is named and --fix brings the daemon back; with
monitoring, the DCGM exporter's utilisation and memory per GPU."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.labtests.gpucluster import STATUS_SCHEMA, Cluster, installed

FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: ts
    gpus: 2
    gpu_sharing: {strategy: time-slicing, replicas: 4}
  - name: mps
    gpus: 1
    gpu_sharing: {strategy: mps, replicas: 2}
  - name: whole
    gpus: 2
  - name: mig-1
    gpus: 2
    gpu_model: NVIDIA H200
    gpu_memory_mib: 143771
    driver: 570.124.06
"""
# mig-1's GPUs partitioned, two 3g.71gb devices each, exposed under the mixed strategy (docs/mig.md)
MIG = {"strategy": "mixed", "config": [{"devices": "all", "mig-devices": {"3g.71gb": 2}}]}


def with_mig(inventory: Path) -> None:
    data = yaml.safe_load(inventory.read_text())
    for h in data["hosts"]:
        if h["name"] == "mig-1":
            h["mig"] = MIG
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from installed(tmp_path_factory, "status", FLEET, configure=with_mig)


def test_status_on_whole_and_shared_gpus(cluster: Cluster) -> None:
    for i in range(5):
        cluster.pod(f"slice-{i}", {"nvidia.com/gpu": 1}, "ts")
    cluster.pod("mps-a", {"nvidia.com/gpu": 1}, "mps")
    cluster.pod("whole-a", {"nvidia.com/gpu": 2}, "whole")
    cluster.pod("mig-a", {"nvidia.com/mig-3g.71gb": 1}, "mig-1")
    t0 = time.monotonic()
    r = cluster.cli("status", "-i", cluster.inv, "-o", "json")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    jsonschema.validate(st, STATUS_SCHEMA)
    by = {n["node"]: n for n in st["nodes"]}
    assert (by["ts"]["sharing"], by["ts"]["replicas"], by["ts"]["gpus"]) == ("time-slicing", 4, 2)
    assert (by["mps"]["sharing"], by["mps"]["replicas"]) == ("mps", 2)
    assert by["whole"]["sharing"] == "none"
    assert (by["mig-1"]["mig_strategy"], by["mig-1"]["mig"]) == ("mixed", {"3g.71gb": 4})
    got = {n: [(x["resource"], x["allocatable"], x["requested"], x["free"]) for x in v["resources"]]
           for n, v in by.items()}
    assert got == {"ts": [("nvidia.com/gpu", 8, 5, 3)], "mps": [("nvidia.com/gpu", 2, 1, 1)],
                   "whole": [("nvidia.com/gpu", 2, 2, 0)], "mig-1": [("nvidia.com/mig-3g.71gb", 4, 1, 3)]}
    assert sorted(p["name"] for p in by["ts"]["resources"][0]["pods"]) == [f"slice-{i}" for i in range(5)]
    assert st["footer"] == ["Allocated/Total GPUs in cluster: 8/12 (66%)",
                            "Allocated/Total nvidia.com/mig-3g.71gb in cluster: 1/4 (25%)"]
    r = cluster.cli("status", "-i", cluster.inv)
    assert "ts\ttime-slicing x4\tnvidia.com/gpu\t8\t8\t5\t3\t" in r.stdout
    assert "mps\tmps x2\tnvidia.com/gpu\t2\t2\t1\t1\tdefault/mps-a" in r.stdout
    assert "mig-1\tmig mixed 3g.71gb:4\tnvidia.com/mig-3g.71gb\t4\t4\t1\t3\tdefault/mig-a" in r.stdout
    cluster.times["status"] = took


def test_two_slices_refused_under_fail_requests_greater_than_one(cluster: Cluster) -> None:
    cluster.pod("two-slices", {"nvidia.com/gpu": 2}, "ts")
    try:
        code, doc = cluster.doctor("default/two-slices")
        assert code == 1
        [f] = doc["findings"]
        assert f["id"] == "pod.shared-request-gt1" and "asks for 2 shared GPUs on ts" in f["message"]
        assert any("UnexpectedAdmissionError" in e and "maximum request size for shared resources is 1" in e
                   for e in f["evidence"])
        assert "fail_requests_greater_than_one: false" in f["remedy"]
    finally:
        cluster.kubectl("delete pod two-slices -n default")


def test_an_mps_node_without_its_daemon_and_the_fix(cluster: Cluster) -> None:
    cluster.kubectl("delete daemonset nvidia-device-plugin-mps-control-daemon -n kube-system")
    code, doc = cluster.doctor()
    assert code == 1
    [f] = [x for x in doc["findings"] if x["subject"] == {"kind": "node", "name": "mps"}]
    assert f["id"] == "gpu.mps-daemon-missing"
    assert "pod nvidia-device-plugin-mps-control-daemon-* on mps: none" in f["evidence"]
    code, doc = cluster.doctor("--fix", "--yes")
    assert code == 0 and doc["findings"] == [], doc
    assert doc["fixes"][-1] == {**doc["fixes"][-1], "name": "gpu", "status": "changed"}
    cluster.pod("mps-b", {"nvidia.com/gpu": 1}, "mps")
    pods = {p["metadata"]["name"]: p for p in cluster.pods()["items"]}
    assert pods["mps-b"]["status"]["phase"] == "Running"


def test_status_shows_the_dcgm_metrics_with_monitoring(cluster: Cluster) -> None:
    inv = Path(cluster.inv)
    inv.write_text(inv.read_text() + "\nmonitoring:\n  enabled: true\n")
    r = cluster.cli("monitoring", "-i", cluster.inv, "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    r = cluster.cli("status", "-i", cluster.inv, "-o", "json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    jsonschema.validate(st, STATUS_SCHEMA)
    by = {n["node"]: n for n in st["nodes"]}
    # one device per physical GPU, each with utilisation and memory, read through the API server's pod proxy; on the
    # MIG node one per GPU instance, without utilisation: the exporter publishes a MIG GPU per instance and no _UTIL
    # field for an instance (tests/fixtures/real/dcgm/mig-*, NVIDIA/dcgm-exporter#430)
    assert {n: len(v["metrics"]) for n, v in by.items()} == {"ts": 2, "mps": 1, "whole": 2, "mig-1": 4}
    assert all(m["util_percent"] is not None and m["memory_free_mib"] is not None and m["model"]
               for n, v in by.items() if n != "mig-1" for m in v["metrics"])
    assert all(m["util_percent"] is None and m["memory_free_mib"] is not None and m["instance"]
               for m in by["mig-1"]["metrics"])
    assert all(v["metrics_note"] == "" for v in by.values())
    # the exporter names the pods on the GPUs (pinned pods: slice-0.. on ts, whole-a on whole)
    assert any("default/whole-a" in m["pods"] for m in by["whole"]["metrics"])
    r = cluster.cli("status", "-i", cluster.inv)
    assert "# GPU utilisation (DCGM exporter)" in r.stdout


def test_a_shared_node_selecting_a_config_the_plugin_lacks_and_the_fix(cluster: Cluster) -> None:
    cluster.kubectl("label node ts nvidia.com/device-plugin.config=time-slicing-8 --overwrite")
    code, doc = cluster.doctor("node/ts")
    assert code == 1
    [f] = doc["findings"]
    assert f["id"] == "gpu.sharing-config" and "time-slicing-8" in f["message"]
    assert any(e.startswith("node label nvidia.com/device-plugin.config: time-slicing-8 (planned: time-slicing-4")
               for e in f["evidence"])
    code, doc = cluster.doctor("node/ts", "--fix", "--yes")
    assert code == 0 and doc["findings"] == [], doc
    node = json.loads(cluster.kubectl("get node ts -o json"))
    assert node["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "time-slicing-4"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_out_of_gpu_memory_on_the_time_sliced_node(cluster: Cluster) -> None:
    # PyTorch's error when the other replicas on the GPU hold its memory (time-slicing isolates none)
    oom = ("Traceback (most recent call last):\n  File \"/app/train.py\", line 42, in <module>\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
           "79.25 GiB of which 3.12 GiB is free.\n")
    cluster.pod("hungry", {"nvidia.com/gpu": 1}, "ts", log=oom)
    try:
        code, doc = cluster.doctor("hungry")
        assert code == 1
        [f] = doc["findings"]
        assert f["id"] == "pod.gpu-oom" and "time-slicing node, where 4 pods share each GPU's memory" in f["message"]
        assert any("CUDA out of memory" in e for e in f["evidence"])
        assert "node ts: sharing time-slicing, 4 replica(s) per GPU, GPU memory 81920 MiB" in f["evidence"]
        assert any(e.startswith("other GPU pods on ts: default/slice-") for e in f["evidence"])
        assert "gpu_sharing.replicas" in f["remedy"]
    finally:
        cluster.kubectl("delete pod hungry -n default")


def test_a_gpu_marked_unhealthy_after_an_xid_in_status_doctor_and_health(cluster: Cluster) -> None:
    """Issue 32: an Xid 79 on one of 'whole''s GPUs after install: the device plugin marks it unhealthy (its real
    log lines), the kubelet keeps it in capacity and drops it from allocatable; status counts it, doctor names it from
    the plugin's line and the kernel's with NVIDIA's meaning, gpuk8s health fails the host with the kernel's line."""
    host = cluster.lab.hosts["whole"]
    host.update_state(health={"xid": [{"gpu": 1, "xid": 79}]})
    try:
        st = json.loads(cluster.cli("status", "whole", "-i", cluster.inv, "-o", "json").stdout)
        jsonschema.validate(st, STATUS_SCHEMA)
        [res] = st["nodes"][0]["resources"]
        assert (res["capacity"], res["allocatable"], res["unhealthy"]) == (2, 1, 1)
        assert "\t2\t1 (1 unhealthy) (plan 2)\t" in cluster.cli("status", "whole", "-i", cluster.inv).stdout
        rc, doc = cluster.doctor("node/whole")
        [f] = [f for f in doc["findings"] if f["id"] == "gpu.fewer-registered"]
        assert rc == 1 and "marked a GPU unhealthy (Xid 79)" in f["message"] and \
            "GPU has fallen off the bus" in f["message"]
        assert any("XidCriticalError: Xid=79 on Device=GPU-whole-0001-lab" in e for e in f["evidence"])
        assert "kernel: NVRM: Xid (PCI:0000:11:00): 79, GPU has fallen off the bus." in f["evidence"]
        assert "reboot" in f["remedy"] and "gpuk8s health whole" in f["remedy"]
        r = cluster.cli("health", "whole", "-i", cluster.inv, "-o", "json")
        [h] = json.loads(r.stdout)["hosts"]
        assert r.returncode == 1 and {f["id"]: f["status"] for f in h["findings"]}["health.xid"] == "fail"
    finally:
        host.update_state(health={})
    [res] = json.loads(cluster.cli("status", "whole", "-i", cluster.inv, "-o", "json").stdout)["nodes"][0]["resources"]
    assert res["unhealthy"] == 0
