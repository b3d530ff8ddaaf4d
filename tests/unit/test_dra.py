"""Dynamic Resource Allocation without a cluster (issue 33, docs/dra.md): the inventory's `allocator`, the GPU plan
per node, the DRA driver's manifests per Kubernetes minor, the device plugin kept off dra nodes, the removal of
the driver's objects when no node uses it, and DRA's devices and claims read from real ResourceSlice and
ResourceClaim objects (tests/fixtures/real/dra/, each with its source)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuk8s import gpuplan, versions
from gpuk8s.facts.model import Runtime
from gpuk8s.facts.parse import Section, parse_containerd_config, parse_probe
from gpuk8s.inventory.loader import InventoryError, loads
from gpuk8s.kube import allocation, dra, manifests, state
from gpuk8s.phases.base import Context, Options
from gpuk8s.phases.gpu import GPUNodes, as_they_are, gpu_manifests
from gpuk8s.phases.verify import Verify
from gpuk8s.preflight.dra_checks import dra_checks
from tests.unit.fakekube import FakeKube
from tests.unit.test_render import schema_for

REAL = Path(__file__).parent.parent / "fixtures" / "real" / "dra"

MIXED = """cluster: {kubernetes_version: "MINOR"}
hosts:
  - {name: cp-1, address: 10.0.0.1, role: control-plane}
  - {name: w-dra, address: 10.0.0.2, gpus: 4, allocator: dra}
  - {name: w-plugin, address: 10.0.0.3, gpus: 2}
"""


def mixed(minor: str = "1.36") -> Any:
    return loads(MIXED.replace("MINOR", minor))


def errors(text: str) -> list[str]:
    with pytest.raises(InventoryError) as e:
        loads(text)
    return [str(p) for p in e.value.problems if p.severity == "error"]


def real(name: str) -> Any:
    """The verbatim object below a fixture's header."""
    text = (REAL / name).read_text()
    head, sep, body = text.partition("\n---\n")
    assert sep and "# verbatim: yes" in head and "# source: https://github.com/" in head, name
    return yaml.safe_load(body)


# -- the inventory ----------------------------------------------------------------------------------------------

def test_allocator_per_host_group_and_default_with_the_host_winning() -> None:
    i = loads("""cluster: {kubernetes_version: "1.36"}
gpu_defaults: {allocator: dra}
gpu_groups:
  old: {allocator: device-plugin}
hosts:
  - {name: cp-1, address: 10.0.0.1, role: control-plane}
  - {name: w-1, address: 10.0.0.2}
  - {name: w-2, address: 10.0.0.3, gpu_group: old}
  - {name: w-3, address: 10.0.0.4, gpu_group: old, allocator: dra}
""")
    kinds = {h.name: h.gpu.allocator.kind for h in i.hosts}
    assert kinds == {"cp-1": "device-plugin", "w-1": "dra", "w-2": "device-plugin", "w-3": "dra"}


def test_allocator_refusals_name_the_line_the_reason_and_the_fix() -> None:
    old = errors(MIXED.replace("MINOR", "1.33"))
    assert len(old) == 1 and ":4:" in old[0] and "needs Kubernetes 1.34.2 or newer" in old[0]
    assert "the cluster is 1.33" in old[0] and "allocator: device-plugin" in old[0]
    # a patch below the floor is refused; the minor alone means its newest patch
    assert errors(MIXED.replace("MINOR", "1.34.1")) and not errors_or_none(MIXED.replace("MINOR", "1.34"))
    shared = errors(MIXED.replace("MINOR", "1.36").replace(
        "allocator: dra}", "allocator: dra, gpu_sharing: {strategy: time-slicing, replicas: 4}}"))
    assert len(shared) == 1 and "time-slicing needs the device plugin" in shared[0]
    for strategy in ("mps, replicas: 2", "hami"):
        assert errors(MIXED.replace("MINOR", "1.36").replace(
            "allocator: dra}", f"allocator: dra, gpu_sharing: {{strategy: {strategy}}}}}"))
    docker = errors(MIXED.replace("MINOR", "1.36").replace("}\nhosts", ", container_runtime: docker}\nhosts"))
    assert any("needs containerd" in e and "CDI" in e for e in docker)
    typo = errors(MIXED.replace("MINOR", "1.36").replace("allocator: dra", "allocator: dar"))
    assert typo and "did you mean 'dra'" in typo[0]


def errors_or_none(text: str) -> list[str]:
    try:
        loads(text)
    except InventoryError as e:
        return [str(p) for p in e.value.problems if p.severity == "error"]
    return []


def test_allocator_on_a_cpu_host_is_a_warning_and_ignored() -> None:
    i = loads(MIXED.replace("MINOR", "1.36").replace("role: control-plane}", "role: control-plane, allocator: dra}"))
    cp = next(h for h in i.hosts if h.name == "cp-1")
    assert cp.gpu.allocator.kind == "device-plugin" and not gpuplan.plan_for(cp).dra


# -- the GPU plan -----------------------------------------------------------------------------------------------

def test_the_plan_of_a_dra_node_has_no_plugin_and_no_extended_resource() -> None:
    plans = gpuplan.plans(mixed())
    d, p = plans["w-dra"], plans["w-plugin"]
    assert d.dra and d.plugin is None and d.resources == {} and d.dra_devices == {"gpu": 4}
    assert d.labels[gpuplan.ALLOCATOR_LABEL] == "dra" and gpuplan.CONFIG_LABEL not in d.labels
    assert d.labels[gpuplan.GPU_PRESENT] == "true" and d.labels[gpuplan.COUNT_LABEL] == "4"
    assert not p.dra and p.plugin is not None and p.resources == {"nvidia.com/gpu": 2}
    assert gpuplan.ALLOCATOR_LABEL not in p.labels and gpuplan.ALLOCATOR_LABEL in gpuplan.MANAGED_LABELS
    assert not plans["cp-1"].dra and plans["cp-1"].dra_devices == {}


def test_dra_devices_of_mig_layouts() -> None:
    assert gpuplan.dra_plan({"nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu": 1},
                            "mixed") == {"mig": 9, "gpu": 1}
    assert gpuplan.dra_plan({"nvidia.com/gpu": 14}, "single") == {"mig": 14}
    assert gpuplan.dra_plan({"nvidia.com/gpu": 8}) == {"gpu": 8}
    assert gpuplan.dra_plan({}) == {}


# -- the manifests ----------------------------------------------------------------------------------------------

def _objects(m: manifests.Manifest) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(m.text) if d]


@pytest.mark.parametrize("minor", ["1.34", "1.35", "1.36", "1.37"])
def test_the_dra_driver_manifest_per_minor_validates_and_names_nvidia_com_gpu_from_1_37(minor: str) -> None:
    i = mixed(minor)
    names = [m.name for m in manifests.wanted(i, gpuplan.plans(i))]
    assert names[-1] == "nvidia-dra-driver.yaml" and "nvidia-dra-driver.yaml" not in [
        m.name for m in manifests.unwanted(i, gpuplan.plans(i))]
    m = manifests.dra_driver(i)
    objs = _objects(m)
    assert [o["kind"] for o in objs] == ["Namespace", "ClusterRole", "ServiceAccount", "ClusterRoleBinding",
                                          "DaemonSet", "DeviceClass", "DeviceClass", "ValidatingAdmissionPolicy",
                                          "ValidatingAdmissionPolicyBinding"]
    for o in objs:
        kubernetes_validate.validate(o, schema_for(minor), strict=True)
    ds = objs[4]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {gpuplan.ALLOCATOR_LABEL: "dra"}
    # issue 42: a quarantined host never holds the plugin's token
    assert {t["key"] for t in ds["tolerations"]} == {"nvidia.com/gpu"}
    assert {c["image"] for c in ds["containers"] + ds["initContainers"]} == {versions.dra_driver().image}
    # issue 42: the least the GPU kubelet plugin calls at the pinned commit (no node writes, no pods)
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in objs[1]["rules"]}
    assert rules == {("resource.k8s.io", "resourceclaims"): ["get"], ("", "nodes"): ["get"],
                     ("resource.k8s.io", "resourceslices"): ["list", "watch", "create", "update", "delete"]}
    gpu, mig = objs[5], objs[6]
    assert (gpu["metadata"]["name"], mig["metadata"]["name"]) == ("gpu.nvidia.com", "mig.nvidia.com")
    assert ("extendedResourceName" in gpu["spec"]) == (minor == "1.37")
    assert "extendedResourceName" not in mig["spec"]
    assert gpu["spec"].get("extendedResourceName", "nvidia.com/gpu") == "nvidia.com/gpu"


def test_the_device_plugin_keeps_off_dra_nodes_only_where_there_is_one() -> None:
    def terms(i: Any) -> list[dict[str, Any]]:
        ds = _objects(manifests.device_plugin(i))[0]
        aff = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        return list(aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"])

    with_dra = terms(mixed())
    assert {"key": gpuplan.ALLOCATOR_LABEL, "operator": "NotIn", "values": ["dra"]} in with_dra
    plain = loads(MIXED.replace("MINOR", "1.36").replace(", allocator: dra", ""))
    assert [e["key"] for e in terms(plain)] == ["gpu"]
    # a cluster without DRA keeps the plugin's template as it was before DRA (its sha256 rendered by gpuk8s at
    # a69bce9, the commit before issue 33): no rolling restart of its pods
    assert manifests.device_plugin(plain).sha256 == "a5b737c692db62e72b652269446088ad040669e2bffde69f23d16631f9ccc0c0"
    assert manifests.DRA_MANIFEST in [m.name for m in manifests.unwanted(plain, gpuplan.plans(plain))]


def test_the_driver_is_removed_when_no_node_uses_it_and_only_what_gpuk8s_applied() -> None:
    i = mixed()
    m = manifests.dra_driver(i)
    kube = FakeKube()
    kube.add_node("w-dra")
    manifests.apply(kube, [m])
    # a DeviceClass of the same name made by another tool (the driver's own Helm chart) is not gpuk8s's
    kube.objects[("deviceclass", "", "mig.nvidia.com")]["metadata"].pop("annotations")
    plain = loads(MIXED.replace("MINOR", "1.36").replace(", allocator: dra", ""))
    ctx = Context(plain, plans=gpuplan.plans(plain), kube_client=kube, initialized_cache=True)
    kube.calls.clear()
    plan = GPUNodes().plan(ctx)
    deletes = [c.what for c in plan.changes if c.what.startswith("delete ")]
    assert len(deletes) == len(_objects(m)) - 1 and not any("mig.nvidia.com" in d for d in deletes)
    assert "delete deviceclass/gpu.nvidia.com of nvidia-dra-driver.yaml (no node asks for it)" in deletes
    # HAMi's and the DRA driver's objects are read in one call, not one per manifest
    reads = [c for c in kube.calls if c[0] == "get_refs" and "deviceclass/gpu.nvidia.com" in c]
    assert len(reads) == 1 and any("hami" in x for x in reads[0])
    res = GPUNodes().run(ctx)
    assert f"removed nvidia-dra-driver.yaml ({len(_objects(m)) - 1} object(s) gpuk8s applied)" in res.message
    assert ("deviceclass", "", "mig.nvidia.com") in kube.objects
    assert ("deviceclass", "", "gpu.nvidia.com") not in kube.objects
    assert ("daemonset", dra.DRA_NAMESPACE, dra.DRA_PLUGIN) not in kube.objects


# -- DRA's devices and claims, read from real objects ----------------------------------------------------------

def test_published_devices_of_eight_h100_on_25_12() -> None:
    nodes = dra.published(real("resourceslices-8xh100-25.12.0-eks-1.34.yaml"))
    assert list(nodes) == ["ip-100-64-171-120.ec2.internal"]  # the compute-domain slice is another driver's
    nd = nodes["ip-100-64-171-120.ec2.internal"]
    assert sorted(d.name for d in nd.devices) == [f"gpu-{i}" for i in range(8)]
    assert nd.count("gpu") == 8 and nd.count("mig") == 0
    assert {d.product for d in nd.devices} == {"NVIDIA H100 80GB HBM3"}
    assert {d.memory for d in nd.devices} == {"81559Mi"}
    g6 = next(d for d in nd.devices if d.name == "gpu-6")
    assert g6.uuid == "GPU-ca1b8386-093b-60cc-349d-c4a38b9124c0"


def test_published_devices_of_three_vgpu_nodes_on_25_3_2() -> None:
    nodes = dra.published(real("resourceslices-3x-vgpu-a100-25.3.2-vks-1.34.yaml"))
    assert len(nodes) == 3 and all(nd.count("gpu") == 1 for nd in nodes.values())
    assert {d.product for nd in nodes.values() for d in nd.devices} == {"GRID A100-8C"}
    trimmed = dra.published(real("resourceslices-2x-vgpu-a100-25.12.0-vks-1.36-trimmed.yaml"))
    assert sorted(trimmed) == ["conformance-test-np1-qcqc8-bpdtl-rcj8j", "conformance-test-np1-qcqc8-bpdtl-wv2gs"]
    assert {d.product for nd in trimmed.values() for d in nd.devices} == {"GRID A100-10C"}


def test_an_allocated_claim_names_its_node_device_and_pod() -> None:
    claims = real("resourceclaims-allocated-25.12.0-vks-1.36.yaml")
    assert dra.allocations(claims) == [dra.Allocation(
        "gpu-test1/dra-gpu-example-798fccd4d-sfl2p-single-gpu-d2jzk", "conformance-test-np1-qcqc8-bpdtl-wv2gs",
        "gpu-0", ("gpu-test1/dra-gpu-example-798fccd4d-sfl2p",))]
    nodes = dra.by_node(real("resourceslices-2x-vgpu-a100-25.12.0-vks-1.36-trimmed.yaml"), claims)
    assert nodes["conformance-test-np1-qcqc8-bpdtl-wv2gs"].in_use == 1
    assert nodes["conformance-test-np1-qcqc8-bpdtl-rcj8j"].in_use == 0


def test_hostile_or_mistyped_objects_are_left_out_not_trusted() -> None:
    bad: list[Any] = [None, 1, "x", {"spec": []}, {"spec": {"driver": "gpu.nvidia.com", "nodeName": 7}},
                      {"spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "devices": {"a": 1}}},
                      {"spec": {"driver": "gpu.nvidia.com", "nodeName": "n",
                                "devices": [None, {"name": 3}, {"name": "gpu-0", "attributes": {"type": "gpu"},
                                                                "capacity": {"memory": 5}}]}}]
    nodes = dra.published({"items": bad})
    assert list(nodes) == ["n"] and nodes["n"].devices == [dra.Device("gpu-0", "")]
    assert dra.published({"items": "no"}) == {} and dra.published([1, 2]) == {} and dra.published("x") == {}
    # KubeClient.get's list of objects reads as the List does
    doc = real("resourceslices-8xh100-25.12.0-eks-1.34.yaml")
    assert dra.published(doc["items"]) == dra.published(doc)
    assert dra.allocations({"items": [{"status": {"allocation": {"devices": {"results": [
        {"driver": "gpu.nvidia.com", "pool": "n"}, {"driver": "other", "pool": "n", "device": "d"}, 5]}},
        "reservedFor": "x"}}]}) == []
    # bounded: a huge list is cut, in linear time
    huge = {"items": [{"spec": {"driver": "gpu.nvidia.com", "nodeName": "n",
                                "devices": [{"name": f"gpu-{i}"} for i in range(5000)]}}] * 50}
    start = time.process_time()
    nd = dra.published(json.loads(json.dumps(huge)))["n"]
    assert len(nd.devices) == dra.MAX_DEVICES and time.process_time() - start < 5  # each name once


def test_only_the_newest_generation_of_a_pool_counts_and_a_shared_claim_holds_its_device_once() -> None:
    def sl(gen: int, names: list[str]) -> dict[str, Any]:
        return {"spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n", "generation": gen},
                         "devices": [{"name": x, "attributes": {"type": {"string": "gpu"}}} for x in names]}}
    nd = dra.published([sl(1, ["gpu-0", "gpu-1", "gpu-2"]), sl(2, ["gpu-0", "gpu-1"])])["n"]
    assert [d.name for d in nd.devices] == ["gpu-0", "gpu-1"]  # gpu-2 went with the old generation
    shared = {"items": [{"metadata": {"name": "c", "namespace": "ml"}, "status": {
        "allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]}},
        "reservedFor": [{"resource": "pods", "name": "b"}, {"resource": "pods", "name": "a"}]}}]}
    uses = allocation.dra_resources(dra.by_node([sl(1, ["gpu-0", "gpu-1"])], shared)["n"], None)
    assert [(u.resource, u.allocatable, u.requested, [(p.name, p.count) for p in u.pods]) for u in uses] == [
        ("gpu.nvidia.com/gpu", 2, 1, [("a", 1)])]


# -- preflight: the driver's floor and CDI ---------------------------------------------------------------------

H200 = parse_probe((Path(__file__).parent.parent / "fixtures" / "h200" / "probe.txt").read_text())


def _with(facts: Any, containerd: str | None, config: str = "") -> Any:
    rt = None if containerd is None else Runtime("containerd", containerd, versions.release(containerd), True)
    return dataclasses.replace(facts, containerd=rt, containerd_config=parse_containerd_config(Section(config, 0)))


def _checks(i: Any, host: str, facts: Any) -> dict[str, Any]:
    h = next(x for x in i.hosts if x.name == host)
    return {r.id: r for r in dra_checks(h, facts, i.cluster, i.install)}


def test_preflight_checks_the_driver_floor_on_dra_hosts_only() -> None:
    i = mixed("1.34")
    ok = _checks(i, "w-dra", _with(H200, "2.2.6"))  # the project's H200 capture: driver 580.159.04
    assert ok["dra.driver"].status == "pass" and "580.159.04" in ok["dra.driver"].message
    old = dataclasses.replace(H200, gpu=dataclasses.replace(H200.gpu, driver="560.35.03", driver_release=(560, 35, 3)))
    bad = _checks(i, "w-dra", _with(old, "2.2.6"))["dra.driver"]
    assert bad.status == "fail" and "older than the DRA driver's floor (565)" in bad.message
    assert "allocator: device-plugin" in bad.remedy
    assert _checks(i, "w-plugin", _with(old, "1.7.28")) == {}
    # issue 41: the managed driver install brings (the remedy's own inventory) is what counts, not the one running
    managed = loads(MIXED.replace("MINOR", "1.34").replace("allocator: dra",
                                                          'allocator: dra, driver: {manage: true, branch: "580"}'))
    got = _checks(managed, "w-dra", _with(old, "2.2.6"))["dra.driver"]
    assert got.status == "pass" and "driver 560.35.03 now; install brings branch 580" in got.message


@pytest.mark.parametrize(("minor", "os", "containerd", "config", "status", "says"), [
    ("1.34", "24.04", "2.2.6", "", "pass", "containerd 2.x enables CDI by default"),
    # a 1.x without enable_cdi = true: install brings containerd 2.x where it upgrades containerd (issue 41: the
    # scenarios' DRA node on 1.35 was blocked, with a remedy to edit what gpuk8s manages)
    ("1.34", "22.04", "1.7.28", "", "pass", "containerd 1.7.28 has CDI off: install brings containerd 2."),
    ("1.35", "22.04", "1.6.20", "", "pass", "containerd 1.6.20 has CDI off: install brings containerd 2."),
    ("1.34", "24.04", "1.7.28", "", "fail", "does not enable CDI unless its config says so"),
    ("1.34", "24.04", "1.6.20", "", "fail", "has no CDI (1.7 or newer has)"),
    ("1.34", "24.04", "1.7.28", 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n', "pass",
     "enable_cdi = true"),
    ("1.34", "22.04", "2.2.6", "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = false\n", "fail",
     "sets enable_cdi = false"),
    ("1.36", "22.04", "1.7.28", "", "pass", "install brings containerd 2."),  # 1.36's floor is 2.0 anyway
    # a false written by hand stays false through containerd 2.x's config migration: said, not upgraded around
    ("1.35", "22.04", "1.7.28", 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = false\n', "fail",
     "sets enable_cdi = false"),
])
def test_preflight_checks_cdi_in_containerd(minor: str, os: str, containerd: str, config: str, status: str,
                                            says: str) -> None:
    facts = _with(dataclasses.replace(H200, os=dataclasses.replace(H200.os, version_id=os)), containerd, config)
    r = _checks(mixed(minor), "w-dra", facts)["dra.cdi"]
    assert r.status == status and says in r.message, r


def test_install_brings_containerd_2_to_a_dra_node_whose_containerd_has_cdi_off() -> None:
    """The playbook's containerd plan and preflight's dra.cdi ask the same place (versions.containerd_floor)."""
    from gpuk8s.playbook.render import containerd_plan

    i = mixed("1.34")
    jammy = dataclasses.replace(H200, os=dataclasses.replace(H200.os, version_id="22.04"))
    assert containerd_plan(i, _with(jammy, "1.7.28"), dra=True)["upgrade"] is True
    assert containerd_plan(i, _with(jammy, "1.7.28"), dra=False)["upgrade"] is False
    on = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n'
    assert containerd_plan(i, _with(jammy, "1.7.28", on), dra=True)["upgrade"] is False
    assert containerd_plan(i, _with(jammy, "1.6.20", on), dra=True)["upgrade"] is True  # 1.6 has no CDI at all


def test_preflight_promises_the_containerd_the_inventory_pins_not_the_matrixs() -> None:
    """With install.containerd_version at a 1.7 release, install does not upgrade a 1.7 without CDI on a DRA node
    (runtimeplan): preflight's dra.cdi says so instead of promising the matrix's containerd 2.x. A host without
    containerd gets none from install: dra.cdi leaves it to runtime.installed."""
    from gpuk8s.playbook.render import containerd_plan

    i = mixed("1.34")
    jammy = dataclasses.replace(H200, os=dataclasses.replace(H200.os, version_id="22.04"))
    assert _checks(i, "w-dra", _with(jammy, "1.7.28"))["dra.cdi"].status == "pass"  # the matrix's 2.x pin
    pinned = dataclasses.replace(i, install=dataclasses.replace(i.install, containerd_version="1.7.29-1"))
    assert containerd_plan(pinned, _with(jammy, "1.7.28"), dra=True)["upgrade"] is False
    r = _checks(pinned, "w-dra", _with(jammy, "1.7.28"))["dra.cdi"]
    assert r.status == "fail" and "install.containerd_version 1.7.29-1 (containerd 1.7.29) would not turn CDI on" \
        in r.message, r
    none = _checks(i, "w-dra", _with(jammy, None))["dra.cdi"]
    assert none.status == "skip" and "runtime.installed" in none.message, none
    assert containerd_plan(i, _with(jammy, None), dra=True)["upgrade"] is False


def test_the_loader_refuses_a_managed_driver_branch_below_the_floor() -> None:
    bad = errors(MIXED.replace("MINOR", "1.36").replace(
        "allocator: dra}", 'allocator: dra, driver: {manage: true, branch: "535"}}'))
    assert len(bad) == 1 and "needs driver branch 565 or newer; driver.branch is 535" in bad[0]
    assert not errors_or_none(MIXED.replace("MINOR", "1.36").replace(
        "allocator: dra}", "allocator: dra, driver: {manage: true}}"))  # the default branch (580)


# -- verify and status from the cluster's objects ----------------------------------------------------------------

def _node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": {"capacity": {}, "allocatable": {},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def test_status_counts_real_published_devices_and_real_claims() -> None:
    slices = real("resourceslices-2x-vgpu-a100-25.12.0-vks-1.36-trimmed.yaml")
    claims = real("resourceclaims-allocated-25.12.0-vks-1.36.yaml")
    names = sorted(dra.published(slices))
    nodes = [_node(n, {gpuplan.ALLOCATOR_LABEL: "dra", gpuplan.GPU_PRESENT: "true"}) for n in names]
    a = allocation.allocation(nodes, [], None, None, dra.by_node(slices, claims))
    by = {n.node: n for n in a.nodes}
    held = by["conformance-test-np1-qcqc8-bpdtl-wv2gs"]
    assert held.allocator == "dra"
    assert [(r.resource, r.kind, r.allocatable, r.requested) for r in held.resources] == [
        ("gpu.nvidia.com/gpu", "dra", 1, 1)]
    assert [(p.namespace, p.name, p.count) for p in held.resources[0].pods] == [
        ("gpu-test1", "dra-gpu-example-798fccd4d-sfl2p", 1)]
    assert by["conformance-test-np1-qcqc8-bpdtl-rcj8j"].resources[0].requested == 0
    assert a.footer() == ["Allocated/Total GPUs in cluster: 1/2 (50%)"]  # DRA's GPUs counted as GPUs


def test_status_on_a_dra_node_does_not_count_a_pods_nvidia_com_gpu_twice() -> None:
    i = mixed("1.37")
    plans = gpuplan.plans(i)
    node = _node("w-dra", plans["w-dra"].labels)
    pod = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"nodeName": "w-dra", "containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}}
    devices = {"w-dra": dra.NodeDevices([dra.Device(f"gpu-{k}", "gpu") for k in range(4)],
                                        [dra.Allocation("ml/p-extended-resources-x", "w-dra", "gpu-0", ("ml/p",))])}
    a = allocation.allocation([node], [pod], plans, None, devices)
    (n,) = a.nodes
    assert [(r.resource, r.allocatable, r.requested, r.planned) for r in n.resources] == [
        ("gpu.nvidia.com/gpu", 4, 1, 4)]
    assert a.footer() == ["Allocated/Total GPUs in cluster: 1/4 (25%)"]


def test_verify_names_a_dra_node_whose_devices_are_not_published() -> None:
    nd = dra.NodeDevices([dra.Device("gpu-0", "gpu"), dra.Device("gpu-1", "gpu")])
    assert dra.verdict("w", {"gpu": 2}, nd)[:2] == (2, "")
    n, cause_id, cause, evidence = dra.verdict("w", {"gpu": 4}, nd)
    assert (n, cause_id) == (2, "dra.devices-missing") and "publishes 2 of 4 gpu device(s)" in cause
    assert evidence == ["ResourceSlice devices: gpu-0 (gpu), gpu-1 (gpu)"]
    n, cause_id, cause, evidence = dra.verdict("w", {"gpu": 4}, None)
    assert (n, cause_id) == (0, "dra.no-devices") and "(4 expected)" in cause


def test_verify_plans_claim_test_pods_and_reads_the_slices_once() -> None:
    i = mixed("1.37")
    kube = FakeKube()
    for name, plan in gpuplan.plans(i).items():
        kube.add_node(name, gpus=plan.expected_gpus, labels=plan.labels)
    ctx = Context(i, plans=gpuplan.plans(i), kube_client=kube, initialized_cache=True)
    plan = Verify().plan(ctx)
    whats = [c.what for c in plan.changes]
    assert "ResourceClaimTemplate gpuk8s-verify-gpu for the dra nodes' test pods (created, then deleted)" in whats
    assert "test pod asking nvidia.com/gpu on the dra node w-dra (created, then deleted)" in whats
    pod = yaml.safe_load(next(c.manifest for c in plan.changes
                              if c.what == "test pod on w-dra (created, then deleted)"))
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpuk8s-verify-gpu"}]
    assert pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
    tmpl = yaml.safe_load(next(c.manifest for c in plan.changes if c.what.startswith("ResourceClaimTemplate")))
    kubernetes_validate.validate(tmpl, schema_for("1.37"), strict=True)
    kubernetes_validate.validate(pod, schema_for("1.37"), strict=True)
    # 1.36: no extended-resource pod (gpuk8s writes no extendedResourceName there)
    i36 = mixed("1.36")
    ctx36 = Context(i36, plans=gpuplan.plans(i36), kube_client=kube, initialized_cache=True)
    assert not [c for c in Verify().plan(ctx36).changes if "asking nvidia.com/gpu" in c.what]


def test_a_node_of_a_group_not_moved_yet_keeps_the_driver_and_the_plugin_off_it() -> None:
    """The group flips to the device plugin in the inventory; w-b is still on DRA (labelled, claims running): the
    manifests the gpu phase and a move apply keep the DRA driver and the plugin's exclusion while it is."""
    flipped = loads(MIXED.replace("MINOR", "1.36").replace(", allocator: dra", ""))  # no dra node in the inventory
    kube = FakeKube()
    plans = gpuplan.plans(flipped)
    kube.add_node("w-dra", labels={**plans["w-dra"].labels, gpuplan.ALLOCATOR_LABEL: "dra"})
    kube.add_node("w-plugin", labels=plans["w-plugin"].labels)
    ctx = Context(flipped, plans=plans, kube_client=kube, initialized_cache=True)
    nodes = state.by_name(kube.get("nodes"))
    still = as_they_are(ctx, nodes, set())
    assert still["w-dra"].dra and not still["w-plugin"].dra
    names = [m.name for m in gpu_manifests(ctx, still)]
    assert manifests.DRA_MANIFEST in names and manifests.DRA_MANIFEST not in [
        m.name for m in manifests.unwanted(flipped, still)]
    ds = _objects(next(m for m in gpu_manifests(ctx, still) if m.name == manifests.PLUGIN_MANIFEST))[0]
    assert "gpuk8s.io/gpu-allocator" in json.dumps(ds)
    # switching it (the move of w-dra): the inventory's plan, and the driver may go
    moved = as_they_are(ctx, nodes, {"w-dra"})
    assert not moved["w-dra"].dra and manifests.DRA_MANIFEST in [m.name for m in manifests.unwanted(flipped, moved)]


def test_install_holds_a_node_whose_gpus_pods_hold_on_its_allocator() -> None:
    i = mixed()
    plans = gpuplan.plans(i)
    kube = FakeKube()
    labels = {k: v for k, v in plans["w-dra"].labels.items() if k != gpuplan.ALLOCATOR_LABEL}
    kube.add_node("w-dra", labels={**labels, gpuplan.CONFIG_LABEL: "none"})  # on the device plugin today
    kube.add_node("w-plugin", labels=plans["w-plugin"].labels)
    kube.objects[("pod", "ml", "train")] = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {
        "nodeName": "w-dra", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}}
    ctx = Context(i, plans=plans, kube_client=kube, initialized_cache=True)
    res = GPUNodes().run(ctx)
    assert res.status == "failed" and "w-dra: left on device-plugin: GPU pods hold its GPUs (ml/train)" in res.message
    assert "gpuk8s allocator w-dra --to dra" in res.remedy
    assert gpuplan.ALLOCATOR_LABEL not in kube.nodes["w-dra"]["metadata"]["labels"]
    assert manifests.DRA_MANIFEST not in [m.name for m in gpu_manifests(ctx, as_they_are(
        ctx, state.by_name(kube.get("nodes")), set()))]
    # the pod gone: the next run switches it
    del kube.objects[("pod", "ml", "train")]
    assert GPUNodes().run(ctx).status == "changed"
    assert kube.nodes["w-dra"]["metadata"]["labels"][gpuplan.ALLOCATOR_LABEL] == "dra"


def test_offers_decides_whether_one_allocator_serves_a_node() -> None:
    plans = gpuplan.plans(mixed())
    d, p = plans["w-dra"], plans["w-plugin"]
    four = dra.NodeDevices([dra.Device(f"gpu-{k}", "gpu") for k in range(4)])
    bare = _node("w-dra", {})
    assert dra.offers(d, bare, four) == (True, "4 of 4 device(s) in its ResourceSlice")
    stale = {**bare, "status": {**bare["status"], "allocatable": {"nvidia.com/gpu": "4"}}}
    ok, what = dra.offers(d, stale, four)
    assert not ok and "still 4 nvidia.com/gpu allocatable" in what
    plug = {**_node("w-plugin", {}), "status": {"allocatable": {"nvidia.com/gpu": "2"}, "conditions": []}}
    assert dra.offers(p, plug, None) == (True, "2 of 2 nvidia.com/gpu allocatable")
    ok, what = dra.offers(p, plug, four)
    assert not ok and "still 4 device(s) in a ResourceSlice" in what
    assert dra.offers(p, "garbage", None)[0] is False


def test_verify_names_a_node_on_another_allocator_than_its_inventory_says() -> None:
    i = mixed()
    plans = gpuplan.plans(i)
    kube = FakeKube()
    kube.add_node("cp-1")
    kube.add_node("w-dra", gpus=4, labels={k: v for k, v in plans["w-dra"].labels.items()
                                           if k != gpuplan.ALLOCATOR_LABEL})  # still the device plugin's
    kube.add_node("w-plugin", gpus=2, labels=plans["w-plugin"].labels)
    ctx = Context(i, plans=plans, kube_client=kube, initialized_cache=True, options=Options(test_pods=False))
    Verify().run(ctx)
    c = next(c for c in ctx.nodes if c.node == "w-dra")
    assert (c.ok, c.cause_id) == (False, "node.allocator-differs")
    assert c.cause == "on device-plugin, where the inventory says allocator: dra"
    assert c.remedy.startswith("gpuk8s allocator w-dra --to dra")
    assert next(c for c in ctx.nodes if c.node == "w-plugin").ok


# -- issue 42: what gpuk8s did not create is neither taken over nor deleted ----------------------------------------

def _helm(kind: str, name: str, namespace: str = "") -> dict[str, Any]:
    """An object another tool made (NVIDIA's install guide Helm-installs the driver into nvidia-dra-driver-gpu)."""
    return {"kind": kind, "metadata": {"name": name, "namespace": namespace,
                                       "labels": {"app.kubernetes.io/managed-by": "Helm"}}}


def test_an_existing_dra_namespace_is_used_never_annotated_and_never_deleted() -> None:
    i = mixed()
    kube = FakeKube()
    for name, plan in gpuplan.plans(i).items():
        kube.add_node(name, gpus=plan.expected_gpus, labels=plan.labels)
    ns = ("namespace", "", dra.DRA_NAMESPACE)
    kube.objects[ns] = _helm("Namespace", dra.DRA_NAMESPACE)
    ctx = Context(i, plans=gpuplan.plans(i), kube_client=kube, initialized_cache=True)
    assert GPUNodes().run(ctx).status == "changed"
    assert "annotations" not in kube.objects[ns]["metadata"]  # not adopted
    assert ("daemonset", dra.DRA_NAMESPACE, dra.DRA_PLUGIN) in kube.objects
    assert GPUNodes().plan(ctx).status == "unchanged"  # and a re-run changes nothing
    # a Helm release installed into it later; then no node on DRA any more: gpuk8s's objects go, the rest stays
    kube.objects[("deployment", dra.DRA_NAMESPACE, "nvidia-dra-driver-gpu-controller")] = _helm(
        "Deployment", "nvidia-dra-driver-gpu-controller", dra.DRA_NAMESPACE)
    plain = loads(MIXED.replace("MINOR", "1.36").replace(", allocator: dra", ""))
    kube.label("w-dra", {gpuplan.ALLOCATOR_LABEL: None})
    ctx = Context(plain, plans=gpuplan.plans(plain), kube_client=kube, initialized_cache=True)
    GPUNodes().run(ctx)
    assert ns in kube.objects and ("deployment", dra.DRA_NAMESPACE, "nvidia-dra-driver-gpu-controller") in kube.objects
    assert ("daemonset", dra.DRA_NAMESPACE, dra.DRA_PLUGIN) not in kube.objects


def test_gpuk8s_own_dra_namespace_holding_a_foreign_release_is_kept() -> None:
    i = mixed()
    kube = FakeKube()
    manifests.apply(kube, [manifests.dra_driver(i)])
    kube.objects[("deployment", dra.DRA_NAMESPACE, "ctl")] = _helm("Deployment", "ctl", dra.DRA_NAMESPACE)
    gone = dict(manifests.removable(kube, [manifests.dra_driver(i)]))[manifests.dra_driver(i)]
    assert ("Namespace", dra.DRA_NAMESPACE, "kube-system") not in gone and gone
    del kube.objects[("deployment", dra.DRA_NAMESPACE, "ctl")]
    gone = dict(manifests.removable(kube, [manifests.dra_driver(i)]))[manifests.dra_driver(i)]
    assert ("Namespace", dra.DRA_NAMESPACE, "kube-system") in gone


def test_a_dra_object_another_tool_made_is_named_and_nothing_of_the_driver_applied() -> None:
    i = mixed()
    kube = FakeKube()
    for name, plan in gpuplan.plans(i).items():
        kube.add_node(name, gpus=plan.expected_gpus, labels=plan.labels)
    role = f"{dra.DRA_NAME}-clusterrole-kubeletplugin"
    kube.objects[("clusterrole", "", role)] = _helm("ClusterRole", role)
    ctx = Context(i, plans=gpuplan.plans(i), kube_client=kube, initialized_cache=True)
    plan = GPUNodes().plan(ctx)
    assert not any(c.what.startswith(f"apply {manifests.DRA_MANIFEST}") for c in plan.changes)
    assert any(f"{manifests.DRA_MANIFEST}: ClusterRole/{role}" in c.what for c in plan.changes)
    r = GPUNodes().run(ctx)
    assert r.status == "failed" and f"ClusterRole/{role}" in r.message and "helm uninstall" in r.remedy
    assert "annotations" not in kube.objects[("clusterrole", "", role)]["metadata"]
    assert ("daemonset", dra.DRA_NAMESPACE, dra.DRA_PLUGIN) not in kube.objects
    assert ("daemonset", "kube-system", manifests.DEVICE_PLUGIN) in kube.objects  # the rest applied


def test_verify_leaves_a_test_object_of_another_alone_and_names_it() -> None:
    from gpuk8s.phases.verify import TEST_NAMESPACE, claim_template_name, test_pod_name
    i = mixed()
    kube = FakeKube()
    for name, plan in gpuplan.plans(i).items():
        kube.add_node(name, gpus=plan.expected_gpus, labels=plan.labels)
    mine = claim_template_name("gpu")
    kube.objects[("resourceclaimtemplate", TEST_NAMESPACE, mine)] = _helm("ResourceClaimTemplate", mine,
                                                                          TEST_NAMESPACE)
    pod = test_pod_name("w-plugin")
    kube.objects[("pod", TEST_NAMESPACE, pod)] = _helm("Pod", pod, TEST_NAMESPACE)
    ctx = Context(i, plans=gpuplan.plans(i), kube_client=kube, initialized_cache=True)
    checks = [state.NodeCheck(n, True, True, 1, 1) for n in ("w-dra", "w-plugin")]
    Verify().test_pods(ctx, checks)
    assert kube.writes == []
    assert [(c.ok, c.cause_id) for c in checks] == [(False, "gpu.test-name-taken")] * 2
    assert f"{mine} in namespace default" in checks[0].cause and pod in checks[1].cause


def test_a_host_cannot_put_itself_on_dra_with_a_label_it_may_set() -> None:
    """Issue 42: any kubelet may set gpuk8s.io/ labels on its own node (NodeRestriction guards kubernetes.io/ and
    k8s.io/ only). A device-plugin node that labels itself with the old allocator label, its GPUs held by a pod:
    neither kept "on dra" nor given the DRA driver (whose kubelet plugin's token would land on it)."""
    assert gpuplan.ALLOCATOR_LABEL.startswith("node-restriction.kubernetes.io/")
    plain = loads(MIXED.replace("MINOR", "1.36").replace(", allocator: dra", ""))
    plans = gpuplan.plans(plain)
    kube = FakeKube()
    kube.add_node("w-dra", gpus=4, labels={**plans["w-dra"].labels, gpuplan.LEGACY_ALLOCATOR_LABEL: "dra"})
    kube.add_node("w-plugin", gpus=2, labels=plans["w-plugin"].labels)
    kube.objects[("pod", "ml", "train")] = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {
        "nodeName": "w-dra", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}}
    ctx = Context(plain, plans=plans, kube_client=kube, initialized_cache=True)
    still = as_they_are(ctx, state.by_name(kube.get("nodes")), set())
    assert not still["w-dra"].dra and manifests.DRA_MANIFEST not in [m.name for m in gpu_manifests(ctx, still)]
    r = GPUNodes().run(ctx)
    assert r.status == "changed" and ("daemonset", dra.DRA_NAMESPACE, dra.DRA_PLUGIN) not in kube.objects
    assert gpuplan.LEGACY_ALLOCATOR_LABEL not in kube.nodes["w-dra"]["metadata"]["labels"]  # gpuk8s's: removed
    # the DRA driver's kubelet plugin is placed by the protected label only
    ds = next(d for d in _objects(manifests.dra_driver(mixed())) if d["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {gpuplan.ALLOCATOR_LABEL: "dra"}


def test_a_dra_node_of_gpuk8s_before_the_protected_label_moves_to_it_unchanged() -> None:
    i = mixed()
    plans = gpuplan.plans(i)
    kube = FakeKube()
    old = {k: v for k, v in plans["w-dra"].labels.items() if k != gpuplan.ALLOCATOR_LABEL}
    kube.add_node("w-dra", labels={**old, gpuplan.LEGACY_ALLOCATOR_LABEL: "dra"})
    kube.add_node("w-plugin", labels=plans["w-plugin"].labels)
    kube.objects[("pod", "ml", "train")] = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {
        "nodeName": "w-dra", "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}, "status": {"phase": "Running"}}
    ctx = Context(i, plans=plans, kube_client=kube, initialized_cache=True)
    assert dra.allocator_of(kube.nodes["w-dra"], "dra") == "dra" and dra.allocator_of(kube.nodes["w-dra"]) != "dra"
    r = GPUNodes().run(ctx)
    assert r.status == "changed", r.message  # not held: it is on DRA already, as the inventory says
    # the protected label before the DRA driver's manifest that selects by it: never a node served by neither
    writes = [c[:3] for c in kube.writes]
    first_label = writes.index(("label", "w-dra", f"{gpuplan.ALLOCATOR_LABEL}=dra"))
    dra_apply = next(i for i, c in enumerate(kube.writes) if c[0] == "apply" and dra.DRA_PLUGIN in c[1])
    assert first_label < dra_apply
    labels = kube.nodes["w-dra"]["metadata"]["labels"]
    assert labels[gpuplan.ALLOCATOR_LABEL] == "dra" and gpuplan.LEGACY_ALLOCATOR_LABEL not in labels
    plugin = next(d for d in _objects(manifests.device_plugin(i)) if d["kind"] == "DaemonSet")
    keys = {e["key"] for t in plugin["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] for e in t["matchExpressions"]}
    assert {gpuplan.ALLOCATOR_LABEL, gpuplan.LEGACY_ALLOCATOR_LABEL} <= keys  # never served twice meanwhile


def test_allocator_moves_a_node_to_dra_only_where_it_serves_dra_as_it_is_now() -> None:
    """`gpuk8s allocator` installs nothing: what install would bring (containerd 2.x, the managed driver) does not
    count; the move is refused before the drain (issue 41: it drained, failed its proof and put the node back)."""
    from gpuk8s.preflight.dra_checks import not_ready_now

    cluster = mixed("1.35").cluster
    jammy = dataclasses.replace(H200, os=dataclasses.replace(H200.os, version_id="22.04"))
    assert not_ready_now(_with(jammy, "2.2.6"), cluster) == ""
    assert "containerd 1.6.20 does not hand CDI devices" in not_ready_now(_with(jammy, "1.6.20"), cluster)
    on = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n'
    assert not_ready_now(_with(jammy, "1.7.28", on), cluster) == ""
    assert "1.7.28 does not hand CDI" in not_ready_now(_with(jammy, "1.7.28"), cluster)
    old = dataclasses.replace(jammy, gpu=dataclasses.replace(jammy.gpu, driver="560.35.03",
                                                             driver_release=(560, 35, 3)))
    assert "driver 560.35.03 is below the DRA driver's floor (565)" in not_ready_now(_with(old, "2.2.6"), cluster)


def test_the_gpu_phase_applies_exactly_what_its_dry_run_showed() -> None:
    """Issue 45: the gpu phase decides once (GPUNodes.decide); --dry-run renders the decision, a run applies it. On the
    same cluster, the manifests applied, the objects deleted and the labels set are those the plan listed, and a re-run
    plans nothing."""
    import shlex

    i = mixed()
    kube = FakeKube()
    manifests.apply(kube, [manifests.dra_driver(i)])  # the DRA driver of an earlier install: no node uses it now
    plain = loads(MIXED.replace("MINOR", "1.36").replace(", allocator: dra", ""))
    for name in gpuplan.plans(plain):
        kube.add_node(name, gpus=1)  # none of the labels the plans want yet
    ctx = Context(plain, plans=gpuplan.plans(plain), kube_client=kube, initialized_cache=True)
    kube.calls.clear()
    planned = GPUNodes().plan(ctx)
    assert planned.status == "would-change"
    kube.calls.clear()
    assert GPUNodes().run(ctx).status == "changed"
    applied = [c[1] for c in kube.calls if c[0] == "apply"]
    assert applied == [c.manifest for c in planned.changes if c.manifest]
    deleted = {(c[1], c[2]) for c in kube.calls if c[0] == "delete"}
    shown = {(w[w.index("delete") + 1], w[w.index("delete") + 2]) for c in planned.changes if c.commands
             if "delete" in (w := shlex.split(c.commands))}
    assert deleted == shown and deleted
    labelled = {c[1]: set(c[2:]) for c in kube.calls if c[0] == "label"}
    shown_labels = {w[3]: set(w[4:-1]) for c in planned.changes if c.what.startswith("label ")
                    for w in [shlex.split(c.commands)]}
    assert labelled == shown_labels and labelled
    assert GPUNodes().plan(ctx).status == "unchanged"
