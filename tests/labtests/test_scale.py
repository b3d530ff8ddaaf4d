"""A loaded cluster (issue 27): the demo cluster with 300 ordinary pods of real size (gpucluster.real_pods, built
from the real objects of tests/fixtures/real/objects), whose `kubectl get pods -A -o json` is several MiB, as a real
cluster of that many pods gives. gpuk8s status, doctor and verify must answer it, and correctly: the GPUs, nothing
held, no finding, every GPU node verified. And the lab itself: its Node and Pod objects have the shape and the size
of the real ones, and its simulated API server costs in proportion to what a call touches (the lab's CPU for a call,
measured with LabHost.cpu_of, under a bound far above what it takes: 11 minutes of CPU for one `kubectl delete pod`
naming 127 pods, and 24 s to list 300 pods, before issue 27)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.labtests.gpucluster import KUBECTL, REAL, ROOT, STATUS_SCHEMA, Cluster, installed

FLEET = (ROOT / "tests" / "lab" / "fleets" / "demo.yaml").read_text()  # cp-1; gpu-1, gpu-2 (8 A100), gpu-3 (4 L4)
PODS = 300
GPU_NODES = ["gpu-1", "gpu-2", "gpu-3"]
MIB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    gen = installed(tmp_path_factory, "scale", FLEET)
    c = next(gen)
    try:
        c.load(PODS, GPU_NODES)
        yield c
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)


def _served(cluster: Cluster, what: str) -> tuple[float, str]:
    """(the lab's CPU seconds, stdout) of one kubectl call on the control plane."""
    _wall, cpu, r = cluster.lab.host("cp-1").cpu_of(KUBECTL + what)
    assert r.returncode == 0, r.stderr
    return cpu, r.stdout


def test_the_loaded_cluster_is_served_as_a_real_one_and_cheaply(cluster: Cluster) -> None:
    cpu, text = _served(cluster, "get pods -A -o json")
    assert len(text) > 2 * MIB  # far past the 1 MiB gpuk8s used to cut kubectl's output at
    pods = [p for p in json.loads(text)["items"] if p["metadata"]["namespace"] == "apps"]
    assert len(pods) == PODS and {p["status"]["phase"] for p in pods} == {"Running"}
    assert {p["spec"]["nodeName"] for p in pods} == set(GPU_NODES)
    p = pods[0]
    assert [c["name"] for c in p["status"]["containerStatuses"]] == ["queue", "frac-1"]
    assert p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet" and p["metadata"]["uid"]
    assert any(v["name"].startswith("kube-api-access-") for v in p["spec"]["volumes"])
    assert p["status"]["podIP"] and p["status"]["qosClass"] == "Burstable"
    assert cpu < 5, f"listing {PODS} pods cost the lab {cpu:.1f} s of CPU"
    # a pod's and a node's size against the real ones they are built from (kubectl's format: 4-space indent)
    kuard = json.loads((REAL / "pods-kuard-minikube.json").read_text())["items"][0]
    runai = yaml.safe_load((REAL / "pod-gpu-runai-fraction.yaml").read_text())
    size = lambda o: len(json.dumps(o, indent=4, sort_keys=True))  # noqa: E731
    ballast = len(p["metadata"]["annotations"]["lab.gpuk8s.io/ballast"])
    assert 0.7 * (size(kuard) + size(runai["spec"]["containers"][0])) < size(p) - ballast < 2 * size(runai)
    _cpu, text = _served(cluster, "get node gpu-1 -o json")
    node = json.loads(text)
    a100 = yaml.safe_load((REAL / "node-gpu-a100-mig.yaml").read_text())
    assert node["status"]["images"] == a100["status"]["images"] and len(node["status"]["images"]) == 50
    # the real node carries ~7 KB of NFD and GFD labels and annotations, which gpuk8s (no GFD) does not add
    bare = {**a100, "metadata": {**a100["metadata"], "labels": {}, "annotations": {}}}
    assert 0.9 * size(bare) < size(node) < 1.5 * size(a100)
    assert {a["type"] for a in node["status"]["addresses"]} == {"InternalIP", "Hostname"}
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "MemoryPressure", "DiskPressure",
                                                                 "PIDPressure"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8" and node["status"]["nodeInfo"]["osImage"]


def test_the_lab_costs_what_a_call_touches(cluster: Cluster) -> None:
    # the verify phase's first delete: 127 test pods that do not exist (the worst case before issue 27)
    names = " ".join(f"gpuk8s-verify-w-{i:03d}" for i in range(127))
    cpu, _ = _served(cluster, f"delete pod {names} -n default --ignore-not-found")
    assert cpu < 3, f"deleting 127 pods cost the lab {cpu:.1f} s of CPU"
    cpu, text = _served(cluster, "get pods -A --field-selector spec.nodeName=gpu-3 -o json")
    mine = json.loads(text)["items"]
    assert mine and {p["spec"]["nodeName"] for p in mine} == {"gpu-3"} and cpu < 3
    cpu, text = _served(cluster, "get pod queue-00007 -n apps -o jsonpath={.spec.nodeName}")
    assert text == GPU_NODES[7 % 3] and cpu < 2


def test_status_answers_on_the_loaded_cluster(cluster: Cluster) -> None:
    r = cluster.cli("status", "-i", cluster.inv, "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads(r.stdout)
    jsonschema.validate(st, STATUS_SCHEMA)
    got = {n["node"]: [(x["resource"], x["allocatable"], x["requested"], x["free"]) for x in n["resources"]]
           for n in st["nodes"]}
    assert got == {"gpu-1": [("nvidia.com/gpu", 8, 0, 8)], "gpu-2": [("nvidia.com/gpu", 8, 0, 8)],
                   "gpu-3": [("nvidia.com/gpu", 4, 0, 4)]}
    assert st["footer"] == ["Allocated/Total GPUs in cluster: 0/20 (0%)"]


def test_doctor_answers_on_the_loaded_cluster(cluster: Cluster) -> None:
    code, doc = cluster.doctor()
    assert code == 0 and doc["findings"] == [], doc


def test_verify_answers_on_the_loaded_cluster(cluster: Cluster) -> None:
    r = cluster.cli("verify", "-i", cluster.inv, "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    nodes = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}
    assert {n: (v["ok"], v["allocatable_gpus"]) for n, v in nodes.items()} == {
        "cp-1": (True, 0), "gpu-1": (True, 8), "gpu-2": (True, 8), "gpu-3": (True, 4)}
    # its test pods are gone, the 300 stay
    left = json.loads(cluster.kubectl("get pods -A -o json"))["items"]
    assert sum(p["metadata"]["namespace"] == "apps" for p in left) == PODS
    assert not [p for p in left if p["metadata"]["name"].startswith("gpuk8s-verify")]


def test_the_real_objects_are_kept_with_their_source() -> None:
    note = (REAL / "SOURCE.md").read_text()
    for f in sorted(Path(REAL).iterdir()):
        if f.name != "SOURCE.md":
            assert f"`{f.name}`" in note, f"{f.name} is not in SOURCE.md"
