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
from gpuk8s.report import status as report
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


def test_gpus_the_device_plugin_marked_unhealthy_are_counted_and_shown(capsys: Any) -> None:
    """Issue 32: an Xid makes the device plugin mark a GPU unhealthy: the kubelet keeps its capacity and drops it
    from allocatable. status counts it per resource (JSON `unhealthy`) and says so in the table."""
    sick = node("gpu-a", {"nvidia.com/gpu": 8}, {gpuplan.GPU_PRESENT: "true"})
    sick["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    a = al.allocation([sick], [pod("train", "gpu-a", {"nvidia.com/gpu": 2})])
    [r] = a.nodes[0].resources
    assert (r.capacity, r.allocatable, r.unhealthy, r.free) == (8, 7, 1, 5)
    assert r.to_json()["unhealthy"] == 1
    assert al.allocation(NODES, PODS).nodes[0].resources[0].unhealthy == 0
    report.render(a)
    assert "7 (1 unhealthy)" in capsys.readouterr().out
    # while the node's device plugin pod restarts the kubelet drops all its devices: no GPU's fault, not counted
    restarting = {"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "nvidia-device-plugin-daemonset-x1", "namespace": "kube-system",
                               "ownerReferences": [{"kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset"}]},
                  "spec": {"nodeName": "gpu-a", "containers": [{"name": "p"}]},
                  "status": {"phase": "Pending"}}
    sick["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    [r] = al.allocation([sick], [restarting]).nodes[0].resources
    assert (r.capacity, r.allocatable, r.unhealthy) == (8, 0, 0)
    lookalike = {**restarting, "metadata": {**restarting["metadata"], "ownerReferences": []}}
    assert al.allocation([sick], [lookalike]).nodes[0].resources[0].unhealthy == 8  # not gpuk8s's plugin pod


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


def cluster() -> FakeKube:
    """The fake API with NODES and PODS."""
    kube = FakeKube()
    for n in NODES:
        kube.nodes[n["metadata"]["name"]] = n
    for p in PODS:
        kube.objects[("pod", p["metadata"]["namespace"], p["metadata"]["name"])] = p
    return kube


def test_gather_reads_the_cluster_and_the_exporters_through_the_seam() -> None:
    kube = cluster()
    inv = loads(INV)
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
    report.render(a)
    out = capsys.readouterr().out
    assert "gpu-a\twhole\tnvidia.com/gpu\t8\t8\t6\t2\tml/infer, ml/prep x3, ml/train x2" in out
    assert "gpu-b\ttime-slicing x4\tnvidia.com/gpu.shared\t16\t16\t5\t11\t" in out
    assert "gpu-c\tmig mixed 1g.10gb:7,3g.40gb:2\tnvidia.com/mig-1g.10gb\t7\t7\t1\t6\tml/mig-small" in out
    assert out.rstrip().endswith("Allocated/Total nvidia.com/mig-3g.40gb in cluster: 2/2 (100%)")


# -- HAMi: the node's registered GPUs and what its scheduler placed on each (issue 19) -------------------------
# hami.io/node-nvidia-register as HAMi's device plugin writes it: newer versions JSON, older colon-separated
REGISTER_JSON = json.dumps([
    {"id": "GPU-aaaa", "index": 0, "count": 10, "devmem": 81920, "devcore": 100, "type": "NVIDIA-A100", "numa": 0,
     "mode": "hami-core", "health": True},
    {"id": "GPU-bbbb", "index": 1, "count": 10, "devmem": 81920, "devcore": 100, "type": "NVIDIA-A100", "numa": 1,
     "health": False}])
REGISTER_OLD = "GPU-aaaa,10,15360,100,NVIDIA-Tesla T4,0,true:GPU-bbbb,10,15360,100,NVIDIA-Tesla T4,0,false:"


def test_hami_register_in_both_formats() -> None:
    new = al.hami_devices(REGISTER_JSON)
    assert [(d.index, d.uuid, d.count, d.memory_mib, d.cores, d.type, d.numa, d.healthy) for d in new] == [
        (0, "GPU-aaaa", 10, 81920, 100, "NVIDIA-A100", 0, True), (1, "GPU-bbbb", 10, 81920, 100, "NVIDIA-A100", 1,
                                                                  False)]
    old = al.hami_devices(REGISTER_OLD)
    assert [(d.index, d.uuid, d.count, d.memory_mib, d.cores, d.type, d.numa, d.healthy) for d in old] == [
        (0, "GPU-aaaa", 10, 15360, 100, "NVIDIA-Tesla T4", 0, True),
        (1, "GPU-bbbb", 10, 15360, 100, "NVIDIA-Tesla T4", 0, False)]
    # newer text form: ,INDEX,MODE at the end (the index said, not the position); other shapes skipped
    nine = "GPU-b,10,15360,100,T4,0,true,1,hami-core:GPU-a,10,15360,100,T4,0,true,0,hami-core:GPU-c,10,1:"
    assert [(d.index, d.uuid) for d in al.hami_devices(nine)] == [(1, "GPU-b"), (0, "GPU-a")]
    # JSON as Go's omitempty writes it: index 0, numa 0 and health false left out
    omit = json.dumps([{"id": "GPU-b", "index": 1, "count": 10, "devmem": 100, "devcore": 100, "health": True},
                       {"id": "GPU-a", "count": 10, "devmem": 100, "devcore": 100}])
    assert [(d.index, d.uuid, d.healthy) for d in al.hami_devices(omit)] == [(1, "GPU-b", True), (0, "GPU-a", False)]
    # an id too long is dropped, not cut (two cut ids could merge into one GPU)
    assert al.hami_devices(json.dumps([{"id": "G" * 200, "index": 0}])) == []


def test_hami_allocations_per_container() -> None:
    one = al.hami_allocations("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;")
    assert one == [[al.HamiGrant("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", "NVIDIA", 3000, 0)]]
    # two containers, the second with two devices; empty containers (no GPU) keep their place
    two = al.hami_allocations("GPU-a,NVIDIA,1000,30:;;GPU-a,NVIDIA,2000,20:GPU-b,NVIDIA,4000,0:;")
    assert two == [[al.HamiGrant("GPU-a", "NVIDIA", 1000, 30)], [],
                   [al.HamiGrant("GPU-a", "NVIDIA", 2000, 20), al.HamiGrant("GPU-b", "NVIDIA", 4000, 0)]]
    assert al.hami_allocations("") == [] and al.hami_allocations(None) == []


@pytest.mark.parametrize("junk", [None, 5, "", "x", ":::", ",,,,", "[1, 2]", "{}", "[{}]", '[{"id": 5}]',
                                  '[{"id": "GPU-x", "devmem": "lots", "index": -1, "count": true}]',
                                  "GPU-x,ten,-5,100", "\x1b[31mGPU-x,1,1,1,T,0,true:", "[" * 5000,
                                  "GPU-x,NVIDIA,99999999999999,0:", "GPU-x,1,1,1,T,0,true:" * 100000,
                                  '[{"id": "' + "G" * 10000 + '", "devmem": 1}]'])
def test_hami_annotations_any_text_gives_a_value(junk: Any) -> None:
    """Annotations are data anyone with pod/node write access sets: odd text gives some value, never a crash,
    and nothing unbounded."""
    devs = al.hami_devices(junk)
    grants = al.hami_allocations(junk)
    assert len(devs) <= al.HAMI_MAX_DEVICES and all(len(d.uuid) <= al.HAMI_MAX_ID for d in devs)
    assert sum(len(c) for c in grants) <= al.HAMI_MAX_GRANTS
    assert all("\x1b" not in d.uuid and 0 <= d.memory_mib < 10 ** 9 for d in devs)
    assert all(0 <= g.memory_mib < 10 ** 9 and 0 <= g.cores < 10 ** 9 for c in grants for g in c)
    n = hami_node(None)
    n["metadata"]["annotations"] = {"hami.io/node-nvidia-register": junk}
    p = hami_pod("p", "", 1)
    p["metadata"]["annotations"] = junk if not isinstance(junk, str) else {"hami.io/vgpu-devices-allocated": junk}
    doc = cmd.to_json(al.allocation([n], [p]))
    jsonschema.validate(doc, SCHEMA)


def hami_pod(name: str, placed: str, mem: int, cores: int = 0, phase: str = "Running",
             on: str | None = "gpu-h") -> dict[str, Any]:
    p = pod(name, on, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem, **({"nvidia.com/gpucores": cores}
                                                                          if cores else {})}, phase=phase)
    p["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": placed, "hami.io/bind-time": "1700000000"}
    return p


def hami_node(register: str | None) -> dict[str, Any]:
    n = node("gpu-h", {"nvidia.com/gpu": 20}, {"gpu": "on"})
    if register is not None:
        n["metadata"]["annotations"] = {"hami.io/node-nvidia-register": register}
    return n


HAMI_PODS = [
    hami_pod("v1", "GPU-aaaa,NVIDIA,4096,30:;", 4096, 30),
    hami_pod("v2", "GPU-bbbb,NVIDIA,10000,0:;", 10000),
    hami_pod("v3", "GPU-aaaa,NVIDIA,2000,20:;", 2000, 20),
    hami_pod("done", "GPU-aaaa,NVIDIA,50000,0:;", 50000, phase="Succeeded"),  # finished: holds nothing
    hami_pod("waiting", "GPU-bbbb,NVIDIA,50000,0:;", 50000, phase="Pending", on=None),  # not bound
]
HAMI_PLAN = gpuplan.GPUPlan("gpu-h", True, 2, {"nvidia.com/gpu": 20}, sharing="hami", replicas=10,
                            gpu_memory_mib=40960)


def test_hami_memory_and_cores_per_gpu_and_who_holds_them() -> None:
    a = al.allocation([hami_node(REGISTER_JSON)], HAMI_PODS, {"gpu-h": HAMI_PLAN})
    g0, g1 = a.nodes[0].hami_gpus
    assert (g0.index, g0.uuid, g0.memory_total_mib, g0.memory_mib, g0.cores) == (0, "GPU-aaaa", 81920, 6096, 50)
    assert [(p.namespace, p.name, p.memory_mib, p.cores) for p in g0.pods] == [("ml", "v1", 4096, 30),
                                                                              ("ml", "v3", 2000, 20)]
    assert (g1.index, g1.uuid, g1.memory_total_mib, g1.memory_mib, g1.cores) == (1, "GPU-bbbb", 81920, 10000, 0)
    assert [p.name for p in g1.pods] == ["v2"]
    assert g0.memory_mib + g1.memory_mib == next(r.requested for r in a.nodes[0].resources
                                                 if r.resource == "nvidia.com/gpumem")


def test_hami_node_totals_from_the_register_when_the_plan_has_no_memory() -> None:
    # `gpuk8s status` gathers no facts: the plan may know neither the GPUs' memory nor their count
    bare = gpuplan.GPUPlan("gpu-h", True, None, {"nvidia.com/gpu": 20}, sharing="hami", replicas=10)
    a = al.allocation([hami_node(REGISTER_JSON)], HAMI_PODS, {"gpu-h": bare})
    res = {r.resource: (r.allocatable, r.requested, r.free) for r in a.nodes[0].resources}
    assert res["nvidia.com/gpumem"] == (163840, 16096, 147744) and res["nvidia.com/gpucores"] == (200, 50, 150)
    # the register wins over the plan (it is what HAMi's scheduler counts against)
    a = al.allocation([hami_node(REGISTER_OLD)], HAMI_PODS, {"gpu-h": HAMI_PLAN})
    assert {r.resource: r.allocatable for r in a.nodes[0].resources}["nvidia.com/gpumem"] == 30720


def test_hami_per_gpu_without_the_register_or_with_a_pod_on_an_unknown_gpu() -> None:
    # no register annotation: the GPUs the pods name, their size from the plan, no index
    a = al.allocation([hami_node(None)], HAMI_PODS, {"gpu-h": HAMI_PLAN})
    assert [(g.index, g.uuid, g.memory_total_mib, g.memory_mib) for g in a.nodes[0].hami_gpus] == [
        (None, "GPU-aaaa", 40960, 6096), (None, "GPU-bbbb", 40960, 10000)]
    # no plan either: the total is unknown
    a = al.allocation([hami_node(None)], HAMI_PODS)
    assert [g.memory_total_mib for g in a.nodes[0].hami_gpus] == [None, None]
    # the register's devmem missing: the plan's; one container on two GPUs, one on a GPU not registered
    reg = json.dumps([{"id": "GPU-aaaa", "index": 0}])
    two = hami_pod("two", "GPU-aaaa,NVIDIA,100,10:GPU-cccc,NVIDIA,200,10:;GPU-aaaa,NVIDIA,1,0:;", 301)
    a = al.allocation([hami_node(reg)], [two], {"gpu-h": HAMI_PLAN})
    assert [(g.index, g.uuid, g.memory_total_mib, g.memory_mib, g.cores, [(p.name, p.memory_mib) for p in g.pods])
            for g in a.nodes[0].hami_gpus] == [(0, "GPU-aaaa", 40960, 101, 10, [("two", 101)]),
                                               (None, "GPU-cccc", None, 200, 10, [("two", 200)])]
    # (a GPU the register does not list has no known size: not the plan's, which could make a made-up GPU look real)
    # a node without HAMi: no list
    assert al.allocation(NODES, PODS).nodes[0].hami_gpus == []


def test_hami_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    a = al.allocation([hami_node(REGISTER_JSON), *NODES], [*HAMI_PODS, *PODS], {"gpu-h": HAMI_PLAN})
    report.render(a)
    out = capsys.readouterr().out
    assert "# HAMi GPUs\nNODE\tGPU\tMEMORY\tCORES\tPODS\n" in out
    assert "gpu-h\t0 GPU-aaaa\t6096/81920 MiB\t50/100%\tml/v1 4096MiB 30%, ml/v3 2000MiB 20%\n" in out
    assert "gpu-h\t1 GPU-bbbb (unhealthy)\t10000/81920 MiB\t0/100%\tml/v2 10000MiB no core limit\n" in out
    assert out.index("# GPU allocation") < out.index("# HAMi GPUs")
    doc = cmd.to_json(a)
    jsonschema.validate(doc, SCHEMA)
    h = next(n for n in doc["nodes"] if n["node"] == "gpu-h")
    assert h["hami_gpus"][0] == {"index": 0, "uuid": "GPU-aaaa", "type": "NVIDIA-A100", "healthy": True,
                                 "memory_total_mib": 81920, "memory_mib": 6096, "cores_percent": 50,
                                 "cores_total_percent": 100,
                                 "pods": [{"namespace": "ml", "name": "v1", "memory_mib": 4096, "cores_percent": 30},
                                          {"namespace": "ml", "name": "v3", "memory_mib": 2000,
                                           "cores_percent": 20}]}
    assert all(n["hami_gpus"] == [] for n in doc["nodes"] if n["node"] != "gpu-h")
    # no HAMi anywhere: no such table
    report.render(al.allocation(NODES, PODS))
    assert "HAMi" not in capsys.readouterr().out


def test_hami_requested_is_what_the_scheduler_placed() -> None:
    # a 2-GPU pod gets its gpumem on each GPU; a pod without gpumem gets a whole GPU's memory; HAMi's MIG mode
    # names a slot of a GPU as GPU-xxx[template-position]
    big = hami_pod("big", "GPU-aaaa,NVIDIA,10000,0:GPU-bbbb,NVIDIA,10000,0:;", 10000)
    big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 2
    whole = pod("whole", "gpu-h", {"nvidia.com/gpu": 1}, phase="Running")
    whole["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": "GPU-aaaa,NVIDIA,81920,100:;"}
    mig = hami_pod("mig", "GPU-bbbb[1-0],NVIDIA,20000,0:;", 20000)
    a = al.allocation([hami_node(REGISTER_JSON)], [big, whole, mig], {"gpu-h": HAMI_PLAN})
    g0, g1 = a.nodes[0].hami_gpus
    assert (g0.memory_mib, g1.memory_mib) == (91920, 30000) and [p.name for p in g1.pods] == ["big", "mig"]
    mem = next(r for r in a.nodes[0].resources if r.resource == "nvidia.com/gpumem")
    assert {p.name: p.count for p in mem.pods} == {"big": 20000, "whole": 81920, "mig": 20000}
    assert mem.requested == g0.memory_mib + g1.memory_mib == 121920 and mem.free == 163840 - 121920
    # without HAMi's annotation (not placed yet by HAMi): what the pod asks for, as before
    bare = hami_pod("bare", "", 3000)
    bare["metadata"]["annotations"] = {}
    a = al.allocation([hami_node(REGISTER_JSON)], [bare], {"gpu-h": HAMI_PLAN})
    assert next(r for r in a.nodes[0].resources if r.resource == "nvidia.com/gpumem").requested == 3000


def test_hami_table_shows_markup_in_annotations_as_text(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from gpuk8s import ui

    monkeypatch.setattr(ui, "is_terminal", lambda: True)
    monkeypatch.setenv("COLUMNS", "250")  # no wrapping inside the strings looked for
    reg = json.dumps([{"id": "GPU-[bold red]x[/]", "index": 0, "devmem": 100}])
    p = hami_pod("[link=http://evil]p[/link]", "GPU-[bold red]x[/],NVIDIA,10,0:;", 10)
    report.render_hami(al.allocation([hami_node(reg)], [p], {"gpu-h": HAMI_PLAN}))
    out = capsys.readouterr().out
    assert "GPU-[bold red]x[/]" in out and "[link=http://evil]p[/link]" in out


def test_gather_reads_only_what_the_answer_needs() -> None:
    """Pods that are done are left out by the API server (a field selector), and with NODE names only those nodes
    and the pods bound to them are read: the same answer from far less JSON at scale."""
    kube = cluster()
    inv = loads(INV)
    whole = cmd.gather(kube, inv)  # type: ignore[arg-type]
    assert ("get", "pods", "", "*", "status.phase!=Succeeded,status.phase!=Failed") in kube.calls
    assert whole.footer()[0] == "Allocated/Total GPUs in cluster: 6/14 (42%)"  # done pods never counted
    kube.calls.clear()
    one = cmd.gather(kube, inv, ["gpu-a", "no,such=node"])  # type: ignore[arg-type]
    gets = [c for c in kube.calls if c[0] == "get"]
    assert gets == [("get", "nodes", "gpu-a", ""),
                    ("get", "pods", "", "*", "spec.nodeName=gpu-a,status.phase!=Succeeded,status.phase!=Failed")]
    [a] = one.nodes
    assert (a.node, a.resources[0].requested) == ("gpu-a", 6)
    assert one.footer() == ["Allocated/Total GPUs in cluster: 6/8 (75%)"]


def test_the_driver_the_exporter_reads_is_shown_per_gpu_from_a_real_line() -> None:
    """The DCGM exporter labels its series with the driver (DCGM_FI_DRIVER_VERSION): status shows it per GPU
    (tests/fixtures/real/dcgm, NVIDIA/dcgm-exporter#568); a label that is no version is not shown."""
    from pathlib import Path

    from gpuk8s.kube import allocation as al

    path = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "dcgm" / "gpu-util-driver-label-580-mps.txt"
    head, _, body = path.read_text().partition("\n---\n")
    assert "source: https://github.com/NVIDIA/dcgm-exporter/issues/568" in head
    [m] = al.gpu_metrics("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + body)
    assert (m.gpu, m.model, m.util, m.driver, m.pods) == ("0", "NVIDIA RTX A4000", 38.0, "580.82.07", ("xxxx/xxxxx",))
    assert m.to_json()["driver"] == "580.82.07"
    [bad] = al.gpu_metrics("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
                           + body.replace('"580.82.07"', '"[red]580[/red]"'))
    assert bad.driver == ""
