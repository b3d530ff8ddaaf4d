"""MIG in the GPU plan, the device plugin's per-node config, the labels and verify's check (docs/mig.md): what a
node must expose under the single and mixed strategies, decided from the layout and the GPU models of the facts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuk8s import gpuplan, versions
from gpuk8s.facts.model import MigFacts, MigGPU
from gpuk8s.facts.parse import parse_probe
from gpuk8s.inventory.loader import loads
from gpuk8s.kube import manifests
from gpuk8s.kube.state import NodeCheck
from gpuk8s.phases.base import Context
from gpuk8s.phases.gpu import GPUNodes
from gpuk8s.phases.verify import mig_check
from tests.unit.fakekube import FakeKube
from tests.unit.test_render import schema_for

H200 = parse_probe((Path(__file__).parent.parent / "fixtures" / "h200" / "probe.txt").read_text())


def facts(n: int, name: str = "NVIDIA H200", memory: int = 143771):
    g = dataclasses.replace(H200.gpu.gpus[0], name=name, memory_mib=memory)
    gpus = tuple(dataclasses.replace(g, index=i) for i in range(n))
    return dataclasses.replace(H200, gpu=dataclasses.replace(H200.gpu, gpus=gpus, state="ok"))


A100 = facts(2, "NVIDIA A100-SXM4-80GB", 81920)
H2 = facts(2)
BASE = """cluster: {kubernetes_version: "MINOR"}
hosts:
  - {name: cp-1, address: 10.0.0.1, role: control-plane}
  - name: a100
    address: 10.0.0.2
    mig: {strategy: single, config: all-1g.10gb}
  - name: h200
    address: 10.0.0.3
    mig: {strategy: mixed, config: [{devices: all, mig-devices: {"3g.71gb": 2}}]}
  - name: part
    address: 10.0.0.4
    mig: {strategy: mixed, config: [{devices: [0], mig-devices: {"3g.40gb": 2}}]}
  - name: sliced
    address: 10.0.0.5
    gpu_sharing: {strategy: time-slicing, replicas: 2}
    mig: {strategy: mixed, config: [{devices: all, mig-devices: {"3g.71gb": 2}}]}
  - {name: whole, address: 10.0.0.6}
"""
FACTS = {"a100": A100, "h200": H2, "part": A100, "sliced": H2, "whole": H2}


def inv(minor: str = "1.36"):
    return loads(BASE.replace("MINOR", minor))


def plans(minor: str = "1.36"):
    return gpuplan.plans(inv(minor), FACTS)


def test_single_advertises_the_mig_devices_as_gpus_with_gfds_mig_labels() -> None:
    p = plans()["a100"]
    assert p.resources == {"nvidia.com/gpu": 14} and p.resource_name == "nvidia.com/gpu" and p.expected_gpus == 14
    assert p.mig_strategy == "single" and p.plugin is not None and p.plugin.mig_strategy == "single"
    ours = ("nvidia.com/mig", "nvidia.com/gpu.", "nvidia.com/dev")
    assert {k: v for k, v in p.labels.items() if k.startswith(ours)} == {
        "nvidia.com/mig.strategy": "single", "nvidia.com/device-plugin.config": "mig-single",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "nvidia.com/gpu.count": "14",
        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.memory": str(round(9.50 * 1024)),  # -lgip's 9.50 GiB
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.sharing-strategy": "none"}


def test_mixed_advertises_one_resource_per_profile_and_whole_gpus_left() -> None:
    ps = plans()
    h = ps["h200"]
    assert h.resources == {"nvidia.com/mig-3g.71gb": 4}
    assert h.resource_name == "nvidia.com/mig-3g.71gb" and h.expected_gpus == 4
    assert h.labels["nvidia.com/mig-3g.71gb.count"] == "4"
    assert h.labels["nvidia.com/mig-3g.71gb.product"] == "NVIDIA-H200-MIG-3g.71gb"
    assert h.labels["nvidia.com/mig.strategy"] == "mixed" and h.labels["nvidia.com/device-plugin.config"] == "mig-mixed"
    assert h.labels["nvidia.com/gpu.count"] == "2"  # the whole GPUs' own labels stay (GFD's full-GPU labeler)
    part = ps["part"]  # GPU 0 cut in 2 x 3g.40gb, GPU 1 whole
    assert part.resources == {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu": 1}
    assert ps["whole"].resources == {"nvidia.com/gpu": 2} and "nvidia.com/mig.strategy" not in ps["whole"].labels


def test_time_slicing_replicates_mixed_mig_resources_by_name() -> None:
    p = plans()["sliced"]
    assert p.resources == {"nvidia.com/mig-3g.71gb": 8} and p.resource_name == "nvidia.com/mig-3g.71gb"
    assert p.labels["nvidia.com/mig-3g.71gb.replicas"] == "2"
    assert p.labels["nvidia.com/mig-3g.71gb.product"] == "NVIDIA-H200-MIG-3g.71gb-SHARED"
    assert p.plugin is not None and p.plugin.config_name == "time-slicing-2-mig-mixed-3g.71gb"
    cfg = manifests.plugin_config(p.plugin)
    assert cfg["flags"] == {"migStrategy": "mixed"}
    assert cfg["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/mig-3g.71gb", "replicas": 2}]
    # a GPU left whole is replicated too, and the config's name stays a valid label value
    i = loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n  - name: w\n    address: 10.0.0.2\n"
              "    gpu_sharing: {strategy: time-slicing, replicas: 3}\n"
              "    mig: {strategy: mixed, config: [{devices: [0], mig-devices: {\"3g.40gb\": 2}}]}\n")
    w = gpuplan.plan_for(i.host("w"), A100)
    assert w.resources == {"nvidia.com/mig-3g.40gb": 6, "nvidia.com/gpu": 3}
    assert w.labels["nvidia.com/device-plugin.config"] == "time-slicing-3-mig-mixed-gpu-3g.40gb"
    assert w.plugin is not None and [r["name"] for r in manifests.plugin_config(w.plugin)["sharing"]["timeSlicing"][
        "resources"]] == ["nvidia.com/gpu", "nvidia.com/mig-3g.40gb"]
    # single: the MIG devices are nvidia.com/gpu, replicated as such
    s = gpuplan.plan_for(loads(BASE.replace("MINOR", "1.36").replace(
        "mig: {strategy: single", "gpu_sharing: {strategy: time-slicing, replicas: 2}\n    mig: {strategy: single"))
        .host("a100"), A100)
    assert s.resources == {"nvidia.com/gpu": 28} and s.labels["nvidia.com/gpu.replicas"] == "2"
    assert manifests.plugin_config(s.plugin)["sharing"]["timeSlicing"]["resources"] == [  # type: ignore[arg-type]
        {"name": "nvidia.com/gpu", "replicas": 2}]


def test_a_layout_the_model_lacks_or_no_facts_plans_no_mig_resources() -> None:
    p = gpuplan.plan_for(inv().host("a100"), H2)  # all-1g.10gb on an H200: the mig phase reports it too
    assert p.resources == {} and p.mig_error.startswith("profile 1g.10gb does not exist on NVIDIA H200")
    assert gpuplan.plan_for(inv().host("a100"), None).resources == {}  # no facts: the models are unknown


def test_one_named_config_per_mig_strategy_and_none_stays_the_default() -> None:
    names = {s.config_name: manifests.plugin_config(s)["flags"]["migStrategy"]
             for s in manifests.plugin_settings(plans())}
    assert names == {"none": "none", "mig-single": "single", "mig-mixed": "mixed",
                     "time-slicing-2-mig-mixed-3g.71gb": "mixed"}
    cm = yaml.safe_load(manifests.plugin_configs(plans()).text)
    assert yaml.safe_load(cm["data"]["mig-single"]) == {"version": "v1", "flags": {"migStrategy": "single"}}
    plugin = manifests.device_plugin(inv()).text
    assert "DEFAULT_CONFIG" in plugin and "value: none" in plugin


@pytest.mark.parametrize("minor", versions.supported_minors())
def test_every_mig_manifest_is_valid_for_every_minor(minor: str) -> None:
    checked = 0
    for m in manifests.wanted(inv(minor), plans(minor)):
        for d in yaml.safe_load_all(m.applied_text()):
            kubernetes_validate.validate(d, schema_for(minor), strict=True)
            checked += 1
    assert checked == 7  # RuntimeClass, ConfigMap, plugin (4), MPS daemon


def test_back_to_none_removes_the_mig_labels() -> None:
    kube = FakeKube()
    i = loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n  - {name: w, address: 10.0.0.2}\n")
    kube.add_node("w", labels={"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-3g.71gb.count": "4",
                               "nvidia.com/mig-3g.71gb.product": "NVIDIA-H200-MIG-3g.71gb", "team": "a"})
    kube.add_node("cp-1")
    ctx = Context(i, plans=gpuplan.plans(i, {"w": H2}), kube_client=kube, initialized_cache=True)
    GPUNodes().run(ctx)
    labels = kube.nodes["w"]["metadata"]["labels"]
    assert not [k for k in labels if "mig" in k] and labels["team"] == "a"
    assert labels["nvidia.com/device-plugin.config"] == "none"


def node(alloc: dict[str, str]) -> dict:
    return {"metadata": {"name": "h200", "labels": {}}, "status": {
        "allocatable": alloc, "capacity": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_verify_checks_every_mig_resource_and_names_the_lost_layout() -> None:
    i = loads(BASE.replace("MINOR", "1.36"))
    off = MigFacts("ok", tuple(MigGPU(n, f"GPU-{n}", "Enabled", "Enabled") for n in range(2)))
    ctx = Context(i, facts={"part": dataclasses.replace(A100, mig=off)}, plans=plans())
    plan = ctx.plans["part"]
    ok = NodeCheck("part", True, True, 2, 2, resource="nvidia.com/mig-3g.40gb")
    mig_check(ctx, plan, ok, node({"nvidia.com/mig-3g.40gb": "2", "nvidia.com/gpu": "1"}))
    assert ok.ok and "MIG mixed: 1 nvidia.com/gpu, 2 nvidia.com/mig-3g.40gb" in ok.proof
    # the primary resource is right, the whole GPU is missing: still a failure, with the MIG cause
    short = NodeCheck("part", True, True, 2, 2, resource="nvidia.com/mig-3g.40gb")
    mig_check(ctx, plan, short, node({"nvidia.com/mig-3g.40gb": "2"}))
    assert not short.ok and short.cause_id == "gpu.mig-resources"
    assert short.cause.startswith("0 of 1 nvidia.com/gpu schedulable (MIG mixed") and "no MIG devices" in short.cause
    # a crashing plugin keeps its own cause
    crash = NodeCheck("part", False, True, 2, 0, "plugin crashing", cause_id="gpu.plugin-crashing")
    mig_check(ctx, plan, crash, node({}))
    assert crash.cause_id == "gpu.plugin-crashing"


def test_doctor_judges_a_mig_node_as_verify_does() -> None:
    """Issue 45: gpu.mig-resources was verify's alone; doctor asks the same verdict (state.mig_verdict) with the MIG
    devices of the host it read, and stays silent where the layout is served."""
    from gpuk8s.doctor import classify
    from gpuk8s.doctor.evidence import ClusterEvidence, HostEvidence

    off = MigFacts("ok", tuple(MigGPU(n, f"GPU-{n}", "Enabled", "Enabled") for n in range(2)))
    facts = dataclasses.replace(A100, mig=off)
    p = plans()
    served = node({"nvidia.com/mig-3g.40gb": "2", "nvidia.com/gpu": "1"})
    served["metadata"]["name"] = "part"
    ev = ClusterEvidence({"part": served}, [], plans={"part": p["part"]}, hosts={"part": HostEvidence(facts=facts)})
    assert [f.id for f in classify.node_causes("part", ev) if f.status == "failed"] == []
    short = node({"nvidia.com/mig-3g.40gb": "2"})
    short["metadata"]["name"] = "part"
    ev.nodes["part"] = short
    got = classify.node_causes("part", ev)
    assert [f.id for f in got] == ["gpu.mig-resources"] and "no MIG devices" in got[0].message
