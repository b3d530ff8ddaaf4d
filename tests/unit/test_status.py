"""gpuk8s status: the allocation computed from the API's JSON (gpuk8s/kube/allocation.py), the DCGM metrics it
reads, the footer, the JSON against docs/status.schema.json, and the command over the kube client seam."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuk8s import gpuplan
from gpuk8s.commands import status as cmd
from gpuk8s.inventory.loader import loads
from gpuk8s.kube import allocation as al
from tests.unit.fakekube import FakeKube

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "status.schema.json").read_text())


def node(name: str, resources: dict[str, int], labels: dict[str, str] | None = None,
         ready: bool = True) -> dict[str, Any]:
    amounts = {"cpu": "16", **{k: str(v) for k, v in resources.items()}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "spec": {}, "status": {"capacity": dict(amounts), "allocatable": dict(amounts),
                                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name: str, on: str | None, limits: dict[str, int], phase: str = "Running", ns: str = "ml",
        init: dict[str, int] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {k: str(v) for k, v in
                                                                                   limits.items()}}}]}
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {k: str(v) for k, v in init.items()},
                                                              "limits": {k: str(v) for k, v in init.items()}}}]
    if on:
        spec["nodeName"] = on
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec,
            "status": {"phase": phase}}


NODES = [
    node("cp-1", {}),
    node("gpu-a", {"nvidia.com/gpu": 8}, {gpuplan.GPU_PRESENT: "true"}),
    node("gpu-b", {"nvidia.com/gpu.shared": 16},
         {gpuplan.GPU_PRESENT: "true", gpuplan.STRATEGY_LABEL: "time-slicing", gpuplan.REPLICAS_LABEL: "4",
          gpuplan.COUNT_LABEL: "4"}),
    node("gpu-c", {"nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2}, {gpuplan.GPU_PRESENT: "true"}),
    node("gpu-d", {"nvidia.com/gpu": 6}, {gpuplan.GPU_PRESENT: "true"}),
]
PODS = [
    pod("train", "gpu-a", {"nvidia.com/gpu": 2}),
    pod("infer", "gpu-a", {"nvidia.com/gpu": 1, "cpu": 1}),
    pod("done", "gpu-a", {"nvidia.com/gpu": 4}, phase="Succeeded"),  # finished: holds nothing
    pod("failed", "gpu-a", {"nvidia.com/gpu": 4}, phase="Failed"),
    pod("waiting", None, {"nvidia.com/gpu": 1}, phase="Pending"),  # not bound: holds nothing
    pod("prep", "gpu-a", {"nvidia.com/gpu": 1}, init={"nvidia.com/gpu": 3}),  # init container's 3 > 1
    *[pod(f"slice-{i}", "gpu-b", {"nvidia.com/gpu.shared": 1}, ns="team") for i in range(5)],
    pod("mig-small", "gpu-c", {"nvidia.com/mig-1g.10gb": 1}),
    pod("mig-big", "gpu-c", {"nvidia.com/mig-3g.40gb": 2}),
    pod("cpu-only", "gpu-d", {"cpu": 2}),
]


def test_each_node_each_resource_and_who_holds_it() -> None:
    a = al.allocation(NODES, PODS)
    by = {n.node: n for n in a.nodes}
    assert set(by) == {"gpu-a", "gpu-b", "gpu-c", "gpu-d"}  # cp-1 has no GPU resource and no GPU label
    [whole] = by["gpu-a"].resources
    assert (whole.resource, whole.kind, whole.capacity, whole.allocatable, whole.requested, whole.free) == \
        ("nvidia.com/gpu", "gpu", 8, 8, 6, 2)
    assert [(p.namespace, p.name, p.count) for p in whole.pods] == [("ml", "infer", 1), ("ml", "prep", 3),
                                                                    ("ml", "train", 2)]
    [shared] = by["gpu-b"].resources
    assert (shared.kind, shared.allocatable, shared.requested, shared.free) == ("shared", 16, 5, 11)
    assert (by["gpu-b"].sharing, by["gpu-b"].replicas, by["gpu-b"].gpus) == ("time-slicing", 4, 4)  # the labels
    mig = {r.resource: (r.kind, r.allocatable, r.requested, r.free) for r in by["gpu-c"].resources}
    assert mig == {"nvidia.com/mig-1g.10gb": ("mig", 7, 1, 6), "nvidia.com/mig-3g.40gb": ("mig", 2, 2, 0)}
    assert by["gpu-c"].mig == {"1g.10gb": 7, "3g.40gb": 2} and by["gpu-c"].mig_strategy == "mixed"
    assert by["gpu-a"].mig_strategy == "none"
    assert by["gpu-d"].resources[0].requested == 0 and by["gpu-d"].resources[0].free == 6


def test_the_footer_counts_every_gpu_resource_of_the_cluster() -> None:
    a = al.allocation(NODES, PODS)
    assert a.footer() == ["Allocated/Total GPUs in cluster: 6/14 (42%)",
                          "Allocated/Total nvidia.com/gpu.shared in cluster: 5/16 (31%)",
                          "Allocated/Total nvidia.com/mig-1g.10gb in cluster: 1/7 (14%)",
                          "Allocated/Total nvidia.com/mig-3g.40gb in cluster: 2/2 (100%)"]
    # the example: 9 of 30 GPUs
    nodes = [node(f"n{i}", {"nvidia.com/gpu": 10}) for i in range(3)]
    pods = [pod(f"p{i}", f"n{i % 3}", {"nvidia.com/gpu": 1}) for i in range(9)]
    assert al.allocation(nodes, pods).footer() == ["Allocated/Total GPUs in cluster: 9/30 (30%)"]
    # only some nodes: the footer counts them alone
    assert al.allocation(nodes, pods, only=["n0"]).footer() == ["Allocated/Total GPUs in cluster: 3/10 (30%)"]


def test_the_plan_says_the_sharing_and_what_the_node_must_expose() -> None:
    plan = gpuplan.GPUPlan("gpu-a", True, 8, {"nvidia.com/gpu.shared": 32}, sharing="time-slicing", replicas=4)
    a = al.allocation(NODES, PODS, {"gpu-a": plan})
    n = next(n for n in a.nodes if n.node == "gpu-a")
    assert (n.sharing, n.replicas, n.gpus) == ("time-slicing", 4, 8)
    res = {r.resource: (r.allocatable, r.planned) for r in n.resources}
    # the node still advertises whole GPUs: the planned resource shows 0 of 32
    assert res == {"nvidia.com/gpu": (8, None), "nvidia.com/gpu.shared": (0, 32)}


def test_hami_memory_and_cores_are_counted_against_the_plan() -> None:
    plan = gpuplan.GPUPlan("gpu-h", True, 2, {"nvidia.com/gpu": 20}, sharing="hami", replicas=10,
                           gpu_memory_mib=81920)
    nodes = [node("gpu-h", {"nvidia.com/gpu": 20}, {"gpu": "on"})]
    pods = [pod("v1", "gpu-h", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 30}),
            pod("v2", "gpu-h", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000})]
    a = al.allocation(nodes, pods, {"gpu-h": plan})
    res = {r.resource: (r.kind, r.allocatable, r.requested) for r in a.nodes[0].resources}
    assert res == {"nvidia.com/gpu": ("gpu", 20, 2), "nvidia.com/gpumem": ("hami", 163840, 14096),
                   "nvidia.com/gpucores": ("hami", 200, 30)}
    assert a.footer() == ["Allocated/Total GPUs in cluster: 2/20 (10%)"]  # memory and cores are not GPUs


def test_odd_input_gives_a_value() -> None:
    weird = [{"metadata": {}}, node("ok", {"nvidia.com/gpu": 1}), "x",  # type: ignore[list-item]
             {"metadata": {"name": "bad"}, "status": {"allocatable": {"nvidia.com/gpu": "1e3"}}}]
    pods = [{"spec": {"nodeName": "ok", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "-1"}}}]}},
            {"spec": "nope"}, pod("p", "ok", {"nvidia.com/gpu": 1})]
    a = al.allocation([w for w in weird if isinstance(w, dict)], pods)
    ok = next(n for n in a.nodes if n.node == "ok")
    assert ok.resources[0].requested == 1
    bad = [n for n in a.nodes if n.node == "bad"]
    assert bad == [] or bad[0].resources[0].allocatable == 0


# dcgm-exporter's /metrics as it serves it (etc/default-counters.csv names and help texts; labels as in its
# README's example output)
METRICS = (ROOT / "tests" / "fixtures" / "doctor" / "dcgm-metrics.txt").read_text()


def test_gpu_metrics_from_the_exporter() -> None:
    m = al.gpu_metrics(METRICS)
    assert [(x.gpu, x.util, x.memory_used_mib, x.memory_free_mib, x.pods) for x in m] == [
        ("0", 87.0, 41000.0, 40000.0, ("ml/train",)), ("1", 0.0, 920.0, 81000.0, ())]
    with pytest.raises(al.MetricsError):
        al.gpu_metrics('DCGM_FI_DEV_GPU_UTIL{gpu="0" 1\n')


INV = """\
hosts:
  - {name: cp-1, address: 10.0.0.1, role: control-plane}
  - {name: gpu-a, address: 10.0.0.2, gpus: 8}
  - {name: gpu-d, address: 10.0.0.5, gpus: 6}
monitoring: {enabled: true}
"""


def test_gather_reads_the_cluster_and_the_exporters_through_the_seam() -> None:
    kube = FakeKube()
    inv = loads(INV)
    for n in NODES:
        kube.nodes[n["metadata"]["name"]] = n
    for p in PODS:
        kube.objects[("pod", p["metadata"]["namespace"], p["metadata"]["name"])] = p
    exporter = {"metadata": {"name": "dcgm-exporter-x", "namespace": "gpu-monitoring",
                             "labels": {"app.kubernetes.io/name": "dcgm-exporter"}},
                "spec": {"nodeName": "gpu-a"}, "status": {"phase": "Running"}}
    kube.objects[("pod", "gpu-monitoring", "dcgm-exporter-x")] = exporter
    kube.raw = {"/api/v1/namespaces/gpu-monitoring/pods/dcgm-exporter-x:9400/proxy/metrics": METRICS}
    a = cmd.gather(kube, inv)  # type: ignore[arg-type]
    by = {n.node: n for n in a.nodes}
    assert [m.util for m in by["gpu-a"].metrics] == [87.0, 0.0]
    assert by["gpu-d"].metrics == [] and "no DCGM exporter pod on gpu-d" in by["gpu-d"].metrics_note
    assert by["gpu-a"].resources[0].planned == 8  # the inventory's plan
    assert not [c for c in kube.calls if c[0] not in ("get", "raw_get")]  # status only reads
    doc = cmd.to_json(a)
    jsonschema.validate(doc, SCHEMA)
    assert doc["footer"][0] == "Allocated/Total GPUs in cluster: 6/14 (42%)"
    assert json.loads(json.dumps(doc)) == doc


def test_the_table_plain_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    a = al.allocation(NODES, PODS)
    cmd.render(a)
    out = capsys.readouterr().out
    assert "gpu-a\twhole\tnvidia.com/gpu\t8\t8\t6\t2\tml/infer, ml/prep x3, ml/train x2" in out
    assert "gpu-b\ttime-slicing x4\tnvidia.com/gpu.shared\t16\t16\t5\t11\t" in out
    assert "gpu-c\tmig mixed 1g.10gb:7,3g.40gb:2\tnvidia.com/mig-1g.10gb\t7\t7\t1\t6\tml/mig-small" in out
    assert out.rstrip().endswith("Allocated/Total nvidia.com/mig-3g.40gb in cluster: 2/2 (100%)")
