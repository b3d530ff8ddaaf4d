"""Shared GPUs without a cluster: the inventory (gpu_sharing, gpu_defaults, gpu_groups), the plan, the device
plugin's ConfigMap and DaemonSets, HAMi's manifest, preflight's warnings and verify's causes (docs/sharing.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuk8s import gpuplan, versions
from gpuk8s.facts.parse import Section, parse_compute_caps, parse_probe
from gpuk8s.inventory.loader import InventoryError, loads
from gpuk8s.kube import manifests, render, state
from gpuk8s.phases.base import Context
from gpuk8s.phases.gpu import GPUNodes, config_maps_of
from gpuk8s.preflight.host_checks import gpu_sharing
from tests.unit.fakekube import FakeKube
from tests.unit.test_render import schema_for

H200 = parse_probe((Path(__file__).parent.parent / "fixtures" / "h200" / "probe.txt").read_text())

BASE = """cluster: {kubernetes_version: "MINOR"}
gpu_defaults:
  gpu_sharing: {strategy: time-slicing, replicas: 4}
gpu_groups:
  big:
    gpu_sharing: {strategy: time-slicing, replicas: 20, rename: true}
  hami:
    gpu_sharing: {strategy: hami}
hosts:
  - {name: cp-1, address: 10.0.0.1, role: control-plane}
  - {name: w-default, address: 10.0.0.2, gpus: 2}
  - {name: w-big, address: 10.0.0.3, gpus: 1, gpu_group: big}
  - name: w-own
    address: 10.0.0.4
    gpus: 8
    gpu_group: big
    gpu_sharing: {strategy: mps, replicas: 8, fail_requests_greater_than_one: false}
  - {name: w-whole, address: 10.0.0.5, gpus: 2, gpu_sharing: {strategy: none}}
  - {name: w-hami, address: 10.0.0.6, gpus: 1, gpu_group: hami}
  - {name: cpu, address: 10.0.0.7, gpus: 0}
"""


def inv(minor: str = "1.36"):
    return loads(BASE.replace("MINOR", minor))


def errors(text: str) -> list[str]:
    with pytest.raises(InventoryError) as e:
        loads(text)
    return [str(p) for p in e.value.problems if p.severity == "error"]


HOST = "hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n  - name: w-1\n    address: 10.0.0.2\n"


# -- the inventory ---------------------------------------------------------------------------------------------
def test_host_then_group_then_defaults_each_key_whole() -> None:
    hosts = {h.name: h.gpu.sharing for h in inv().hosts}
    assert (hosts["w-default"].strategy, hosts["w-default"].replicas) == ("time-slicing", 4)
    assert (hosts["w-big"].replicas, hosts["w-big"].rename) == (20, True)
    # the host's own key wins over its group's, and is not merged with it (rename is not inherited)
    assert (hosts["w-own"].strategy, hosts["w-own"].replicas, hosts["w-own"].rename) == ("mps", 8, False)
    assert not hosts["w-own"].fail_requests_greater_than_one
    assert hosts["w-whole"].strategy == "none" and hosts["w-hami"].replicas == 10  # HAMi's default split
    # the defaults are for GPU nodes only
    assert hosts["cp-1"].strategy == "none" and hosts["cpu"].strategy == "none"
    assert hosts["w-default"].line == 3  # where it was written: gpu_defaults


@pytest.mark.parametrize(("sharing", "line", "message", "fix"), [
    ("{strategy: time-slicing, replicas: 21}", 5, "21 is out of range", "write replicas: 2 to 20"),
    ("{strategy: mps, replicas: 1}", 5, "1 replica per GPU is no sharing", "or strategy: none for whole GPUs"),
    ("{strategy: timeslicing, replicas: 4}", 5, "'timeslicing' is not one of none, time-slicing, mps, hami",
     "did you mean 'time-slicing'?"),
    ("{strategy: time-slicing}", 5, "strategy time-slicing needs replicas", "write replicas: 2 to 20"),
    ("{replicas: 4}", 5, "no strategy given", "add strategy: one of none, time-slicing, mps, hami"),
    ("{strategy: hami, rename: true}", 5, "HAMi has its own resource names", "remove rename"),
    ("{strategy: none, replicas: 4}", 5, "has no effect with strategy: none", "remove replicas"),
    ("{strategy: mps, replicas: 4, renamed: true}", 5, "unknown key 'renamed'", "did you mean 'rename'?"),
])
def test_inventory_mistakes_have_file_line_and_fix(sharing: str, line: int, message: str, fix: str) -> None:
    got = errors(HOST + f"    gpu_sharing: {sharing}\n")
    assert len(got) == 1, got
    assert got[0].startswith(f"<inventory>:{line}:") and message in got[0] and "(fix: " in got[0] and fix in got[0]


def test_an_unknown_group_and_errors_in_defaults_and_groups() -> None:
    got = errors("gpu_defaults:\n  gpu_sharing: {strategy: mps, replicas: 30}\n"
                 "gpu_groups:\n  inference:\n    gpu_sharing: {strategy: hamy}\n"
                 + HOST + "    gpu_group: inferense\n")
    assert any(e.startswith("<inventory>:2:") and "gpu_defaults.gpu_sharing.replicas: 30 is out of range" in e
               for e in got), got
    assert any(e.startswith("<inventory>:5:") and "gpu_groups.inference.gpu_sharing.strategy" in e
               and "did you mean 'hami'?" in e for e in got), got
    assert any(e.startswith("<inventory>:10:") and "no gpu_groups entry 'inferense'" in e
               and "did you mean 'inference'?" in e for e in got), got


def test_sharing_on_a_cpu_host_is_a_warning() -> None:
    i = loads(HOST + "    gpus: 0\n    gpu_sharing: {strategy: time-slicing, replicas: 4}\n")
    assert [w.key for w in i.warnings] == ["hosts[1].gpu_sharing"]
    assert i.host("w-1").gpu.sharing.strategy == "none"


# -- the plan ----------------------------------------------------------------------------------------------------
def test_the_plan_decides_resources_and_labels() -> None:
    p = gpuplan.plans(inv())
    assert p["w-default"].resources == {"nvidia.com/gpu": 8} and p["w-default"].expected_gpus == 8
    assert p["w-big"].resources == {"nvidia.com/gpu.shared": 20} and p["w-big"].resource_name == "nvidia.com/gpu.shared"
    assert p["w-own"].resources == {"nvidia.com/gpu": 64} and p["w-own"].sharing == "mps"
    assert p["w-whole"].resources == {"nvidia.com/gpu": 2} and p["w-whole"].replicas == 1
    assert p["w-hami"].resources == {"nvidia.com/gpu": 10} and p["w-hami"].plugin is None
    assert p["cpu"].resources == {} and p["cpu"].sharing == "none" and p["cpu"].plugin is None
    labels = {n: p[n].labels for n in p}
    assert labels["w-default"][gpuplan.CONFIG_LABEL] == "time-slicing-4"
    assert labels["w-big"][gpuplan.CONFIG_LABEL] == "time-slicing-20-renamed"
    assert labels["w-own"][gpuplan.CONFIG_LABEL] == "mps-8-allow-multiple"
    assert labels["w-own"][gpuplan.MPS_CAPABLE_LABEL] == "true" and gpuplan.MPS_CAPABLE_LABEL not in labels["w-big"]
    assert labels["w-hami"]["gpu"] == "on" and gpuplan.CONFIG_LABEL not in labels["w-hami"]
    assert [labels["w-big"][gpuplan.REPLICAS_LABEL], labels["w-big"][gpuplan.STRATEGY_LABEL]] == ["20", "time-slicing"]
    assert labels["w-whole"][gpuplan.STRATEGY_LABEL] == "none"


def test_product_label_as_gfd_writes_it() -> None:
    assert gpuplan.product_label("NVIDIA H200", shared=False) == "NVIDIA-H200"
    assert gpuplan.product_label("NVIDIA A100-SXM4-80GB", shared=True) == "NVIDIA-A100-SXM4-80GB-SHARED"
    assert gpuplan.product_label("Tesla V100 (PCIe) 32GB", shared=False) == "Tesla-V100-PCIe-32GB"
    with_facts = gpuplan.plan_for(inv().host("w-default"), H200)
    assert with_facts.labels[gpuplan.PRODUCT_LABEL] == "NVIDIA-H200-SHARED"
    assert with_facts.labels[gpuplan.MEMORY_LABEL] == "143771" and with_facts.resources == {"nvidia.com/gpu": 4}


# -- the manifests -----------------------------------------------------------------------------------------------
def test_one_named_config_per_distinct_setting_in_the_plugins_own_format() -> None:
    cm = manifests.plugin_configs(gpuplan.plans(inv())).objects()[0]
    assert sorted(cm["data"]) == ["mps-8-allow-multiple", "none", "time-slicing-20-renamed", "time-slicing-4"]
    ts = yaml.safe_load(cm["data"]["time-slicing-4"])
    assert ts == {"version": "v1", "flags": {"migStrategy": "none"}, "sharing": {"timeSlicing": {
        "renameByDefault": False, "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    mps = yaml.safe_load(cm["data"]["mps-8-allow-multiple"])["sharing"]
    assert list(mps) == ["mps"] and mps["mps"]["failRequestsGreaterThanOne"] is False
    assert yaml.safe_load(cm["data"]["none"]) == {"version": "v1", "flags": {"migStrategy": "none"}}


def test_the_plugin_runs_config_manager_and_mps_its_daemon() -> None:
    i = inv()
    ds, sa, role, binding = manifests.device_plugin(i).objects()
    spec = ds["spec"]["template"]["spec"]
    assert [c["command"] for c in spec["initContainers"]] == [["config-manager"]]
    assert [c["name"] for c in spec["containers"]] == ["nvidia-device-plugin-sidecar", "nvidia-device-plugin-ctr"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["NODE_LABEL"] == "nvidia.com/device-plugin.config" and env["DEFAULT_CONFIG"] == "none"
    assert env["PROCESS_TO_SIGNAL"] == "nvidia-device-plugin" and env["SIGNAL"] == "1"
    ctr = {e["name"]: e.get("value") for e in spec["containers"][1]["env"]}
    assert ctr["CONFIG_FILE"] == "/config/config.yaml" and ctr["MPS_ROOT"] == "/run/nvidia/mps"
    assert spec["priorityClassName"] == "system-node-critical" and spec["shareProcessNamespace"] is True
    assert {"name": "available-configs", "configMap": {"name": "nvidia-device-plugin-configs"}} in spec["volumes"]
    # never beside HAMi's plugin
    expr = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert expr == [{"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["on"]}]}]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert binding["subjects"][0]["name"] == sa["metadata"]["name"] == spec["serviceAccountName"]
    mps = manifests.mps_control_daemon(i).objects()[0]["spec"]["template"]["spec"]
    assert mps["hostPID"] is True and mps["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
    assert mps["containers"][1]["command"] == ["mps-control-daemon"]
    assert {"name": "mps-root", "hostPath": {"path": "/run/nvidia/mps", "type": "DirectoryOrCreate"}} in mps["volumes"]


def test_changing_replicas_changes_only_the_configmap() -> None:
    before = {m.name: m.sha256 for m in manifests.wanted(inv(), gpuplan.plans(inv()))}
    other = loads(BASE.replace("MINOR", "1.36").replace("replicas: 4}", "replicas: 6}"))
    after = {m.name: m.sha256 for m in manifests.wanted(other, gpuplan.plans(other))}
    assert [n for n in before if before[n] != after[n]] == ["nvidia-device-plugin-configs.yaml"]


def test_hami_is_wanted_only_with_a_hami_node_and_otherwise_removed() -> None:
    i = inv()
    names = [m.name for m in manifests.wanted(i, gpuplan.plans(i))]
    assert names[-1] == "hami.yaml"
    assert [m.name for m in manifests.unwanted(i, gpuplan.plans(i))] == ["nvidia-dra-driver.yaml",
                                                                         "rdma-device-plugin.yaml"]
    h = manifests.hami(i, gpuplan.plans(i))
    kinds = [(o["kind"], o["metadata"]["name"]) for o in h.objects()]
    assert kinds[0] == ("DaemonSet", "hami-device-plugin") and ("Deployment", "hami-scheduler") in kinds
    assert versions.hami().image in h.text and "registry.k8s.io/kube-scheduler:v1.36.0" in h.text
    ds = h.objects()[0]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"gpu": "on"}
    # issue 42: its token writes nodes and pods (its own node's, by the policy): no quarantined host gets it; the
    # scheduler, whose token patches every node, runs on a control plane only
    assert {t["key"] for t in ds["tolerations"]} == {"nvidia.com/gpu"}
    sched = next(o for o in h.objects() if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert sched["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert [o["kind"] for o in h.objects()][-2:] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    dev = yaml.safe_load(next(o for o in h.objects() if o["metadata"]["name"] == "hami-scheduler-device")["data"][
        "device-config.yaml"])
    assert dev["nvidia"]["deviceSplitCount"] == 10 and dev["nvidia"]["resourceMemoryName"] == "nvidia.com/gpumem"
    plain = loads(HOST)
    assert [m.name for m in manifests.unwanted(plain, gpuplan.plans(plain))] == ["hami.yaml",
                                                                                "nvidia-dra-driver.yaml",
                                                                                "rdma-device-plugin.yaml"]
    # the gpu phase deletes HAMi's objects when no node asks for it any more
    kube = FakeKube()
    kube.add_node("w-1")
    manifests.apply(kube, [h])
    ctx = Context(plain, plans=gpuplan.plans(plain), kube_client=kube, initialized_cache=True)
    plan = GPUNodes().plan(ctx)
    deletes = [c for c in plan.changes if c.what.startswith("delete ")]
    assert len(deletes) == len(h.objects()) == 14  # each object named, in the plan and in --dry-run
    assert deletes[-1].what == "delete daemonset/hami-device-plugin of hami.yaml (no node asks for it)"
    assert deletes[-1].commands == "kubectl -n kube-system delete daemonset hami-device-plugin"
    res = GPUNodes().run(ctx)
    assert "removed hami.yaml (14 object(s) gpuk8s applied)" in res.message
    assert not [k for k in kube.objects if k[2].startswith("hami-")]


def _helm_hami(kube: FakeKube, h: manifests.Manifest) -> None:
    """HAMi's objects as its own Helm chart makes them: the names of hami.yaml, without gpuk8s's annotation."""
    for o in h.objects():
        o["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "Helm"}
        kube.apply(yaml.safe_dump(o))


def test_the_gpu_phase_never_deletes_a_hami_it_did_not_install() -> None:
    # issue 28 item 1: HAMi's Helm chart uses hami.yaml's names in kube-system; without a node asking for HAMi,
    # install, join and doctor --fix deleted all twelve objects (cluster-scoped RBAC included) because the first
    # one existed. Only objects carrying gpuk8s's annotation go, each checked on its own.
    i, plain = inv(), loads(HOST)
    h = manifests.hami(i, gpuplan.plans(i))
    kube = FakeKube()
    kube.add_node("w-1")
    _helm_hami(kube, h)
    ctx = Context(plain, plans=gpuplan.plans(plain), kube_client=kube, initialized_cache=True)
    helm = set(kube.objects)
    assert not [c for c in GPUNodes().plan(ctx).changes if c.what.startswith("delete ")]
    res = GPUNodes().run(ctx)
    assert "hami" not in res.message and not [w for w in kube.writes if w[0] == "delete"]
    assert helm <= set(kube.objects)
    # one object gpuk8s applied among Helm's (a half-finished migration): that one alone is deleted
    ours = next(o for o in h.objects() if o["kind"] == "ClusterRole")
    kube.apply(manifests.Manifest("x.yaml", yaml.safe_dump(ours)).applied_text())
    kube.calls.clear()
    plan = GPUNodes().plan(ctx)
    name = ours["metadata"]["name"]
    assert [(c.what, c.commands) for c in plan.changes if c.what.startswith("delete ")] == [
        (f"delete clusterrole/{name} of hami.yaml (no node asks for it)",
         f"kubectl -n kube-system delete clusterrole {name}")]
    res = GPUNodes().run(ctx)
    assert [w for w in kube.writes if w[0] == "delete"] == [("delete", "clusterrole", name)]
    assert "removed hami.yaml (1 object(s) gpuk8s applied)" in res.message
    assert helm - {("clusterrole", "", name)} <= set(kube.objects)


@pytest.mark.parametrize("minor", versions.supported_minors())
def test_every_sharing_manifest_is_valid_for_every_minor(minor: str) -> None:
    text = BASE.replace("MINOR", minor)
    if versions.install_defaults(minor)["device_plugin_version"] < "v0.20":  # MPS allow-multiple needs v0.20
        text = text.replace(", fail_requests_greater_than_one: false", "")
    i = loads(text)
    checked = 0
    for m in manifests.wanted(i, gpuplan.plans(i)):
        for d in yaml.safe_load_all(m.applied_text()):
            kubernetes_validate.validate(d, schema_for(minor), strict=True)
            checked += 1
    # RuntimeClass, ConfigMap, plugin (4), MPS daemon, HAMi (12, and its own-node policy and binding from 1.30)
    assert checked == 19 + (2 if manifests.node_bound_tokens(minor) else 0)


def test_render_shows_the_configmap_daemonsets_and_labels() -> None:
    out = render.manifests(inv())
    assert {"nvidia-device-plugin-configs.yaml", "nvidia-device-plugin.yaml",
            "nvidia-device-plugin-mps-control-daemon.yaml", "hami.yaml"} <= set(out)
    labels = out["node-labels-taints.sh"]
    assert "nvidia.com/device-plugin.config=time-slicing-20-renamed" in labels and "gpu=on" in labels


def test_labels_sharing_no_longer_wants_are_removed() -> None:
    kube = FakeKube()
    i = loads(HOST + "    gpus: 1\n")
    kube.add_node("w-1", labels={"gpu": "on", "nvidia.com/mps.capable": "true", "team": "a"})
    kube.add_node("cp-1", labels={"gpu": "yes"})  # a label of the user's own: left alone
    ctx = Context(i, plans=gpuplan.plans(i), kube_client=kube, initialized_cache=True)
    GPUNodes().run(ctx)
    labels = kube.nodes["w-1"]["metadata"]["labels"]
    assert "gpu" not in labels and "nvidia.com/mps.capable" not in labels and labels["team"] == "a"
    assert kube.nodes["cp-1"]["metadata"]["labels"] == {"gpu": "yes"}


# -- preflight -----------------------------------------------------------------------------------------------------
def host_with(sharing: str):
    return loads(HOST + f"    gpu_sharing: {sharing}\n").host("w-1")


def test_time_slicing_memory_warning_with_a_stated_pod_size() -> None:
    [r, _, v] = gpu_sharing(host_with("{strategy: time-slicing, replicas: 10, pod_memory_mib: 20000}"), H200,
                            "v0.20.1")
    assert (r.id, r.status) == ("gpu.sharing-memory", "warn") and r.severity == "warning"
    assert "10 replicas x 20000 MiB = 200000 MiB > 143771 MiB" in r.message and "at most 7" in r.remedy
    assert (v.id, v.status) == ("gpu.sharing-plugin-version", "pass")
    [ok, *_] = gpu_sharing(host_with("{strategy: time-slicing, replicas: 7, pod_memory_mib: 20000}"), H200, "v0.20.1")
    assert ok.status == "pass"
    [skip, *_] = gpu_sharing(host_with("{strategy: time-slicing, replicas: 7}"), H200, "v0.20.1")
    assert skip.status == "skip" and "pod_memory_mib" in skip.remedy


def test_mps_clients_below_compute_capability_7_5() -> None:
    old = dataclasses.replace(H200, compute_caps=("7.0",))
    [r, *_] = gpu_sharing(host_with("{strategy: mps, replicas: 20}"), old, "v0.20.1")
    assert (r.id, r.status) == ("gpu.mps-clients", "warn") and "at most 16 MPS clients" in r.message
    assert "maximum allowed replicas exceeded" in r.message  # the plugin's MPS daemon: 16 below 7.5, so at 7.0 too
    [ok, *_] = gpu_sharing(host_with("{strategy: mps, replicas: 16}"), old, "v0.20.1")
    assert ok.status == "pass"
    [new, *_] = gpu_sharing(host_with("{strategy: mps, replicas: 20}"),
                            dataclasses.replace(H200, compute_caps=("9.0",)), "v0.20.1")
    assert new.status == "pass"
    [unknown, *_] = gpu_sharing(host_with("{strategy: mps, replicas: 20}"), dataclasses.replace(H200, compute_caps=()),
                               "v0.20.1")
    assert unknown.status == "skip"


def test_a_plugin_older_than_the_strategy() -> None:
    [_, _, r] = gpu_sharing(host_with("{strategy: mps, replicas: 4}"), H200, "v0.14.5")
    assert (r.id, r.status) == ("gpu.sharing-plugin-version", "warn") and "since v0.15.0" in r.message
    assert gpu_sharing(host_with("{strategy: none}"), H200, "v0.14.5") == []


def test_compute_capability_is_parsed_or_unknown() -> None:
    assert parse_compute_caps(Section("9.0\n9.0\n", 0)) == ("9.0", "9.0")
    assert parse_compute_caps(Section('Field "compute_cap" is not a valid field to query.', 2)) == ()
    assert parse_compute_caps(Section("$(reboot)\n", 0)) == ()


# -- verify's causes -------------------------------------------------------------------------------------------------
def node(labels: dict[str, str], alloc: dict[str, str]) -> dict:
    return {"metadata": {"name": "w-1", "labels": labels}, "status": {
        "allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, phase: str = "Running", waiting: str = "") -> state.PodState:
    return state.PodState(name, "w-1", phase, waiting, 3 if waiting else 0, "",
                          owners=(("DaemonSet", state.DEVICE_PLUGIN),))


PLUGIN = state.DaemonSetState("nvidia-device-plugin-daemonset", 1, 1, 1)
TS = state.Sharing("time-slicing", 4, 2, "time-slicing-4", ("none", "time-slicing-4"))


def test_whole_gpus_instead_of_slices_is_sharing_not_applied() -> None:
    c = state.check_node("w-1", 8, node({"nvidia.com/device-plugin.config": "none"}, {"nvidia.com/gpu": "2"}),
                         [pod("nvidia-device-plugin-daemonset-x")], PLUGIN, sharing=TS)
    assert (c.ok, c.cause_id, c.allocatable_gpus) == (False, "gpu.sharing-not-applied", 2)
    assert "node label nvidia.com/device-plugin.config: none (planned: time-slicing-4)" in c.evidence


def test_a_config_name_the_configmap_lacks() -> None:
    c = state.check_node("w-1", 8, node({"nvidia.com/device-plugin.config": "ts-9"}, {"nvidia.com/gpu": "0"}),
                         [pod("nvidia-device-plugin-daemonset-x", "Pending", "CrashLoopBackOff")], PLUGIN, sharing=TS)
    assert c.cause_id == "gpu.sharing-config" and "specified config ts-9 does not exist" in c.cause


def test_an_mps_node_without_its_daemon() -> None:
    sh = state.Sharing("mps", 4, 1, "mps-4", ("mps-4", "none"))
    n = node({"nvidia.com/device-plugin.config": "mps-4"}, {"nvidia.com/gpu": "0"})
    c = state.check_node("w-1", 4, n, [pod("nvidia-device-plugin-daemonset-x", waiting="CrashLoopBackOff")], PLUGIN,
                         sharing=sh)
    assert c.cause_id == "gpu.mps-daemon-missing" and "node label nvidia.com/mps.capable: missing" in c.evidence
    ok = state.check_node("w-1", 4, node({}, {"nvidia.com/gpu": "4"}), [], PLUGIN, sharing=sh)
    assert ok.ok and ok.allocatable_gpus == 4


def test_a_renamed_node_is_counted_under_its_name() -> None:
    sh = state.Sharing("time-slicing", 20, 1, "time-slicing-20-renamed", ("time-slicing-20-renamed",))
    c = state.check_node("w-1", 20, node({}, {"nvidia.com/gpu.shared": "20"}), [], PLUGIN,
                         resource="nvidia.com/gpu.shared", sharing=sh)
    assert c.ok and c.resource == "nvidia.com/gpu.shared"
    assert "20 of 20 nvidia.com/gpu.shared schedulable" in c.finding().message


def test_mps_together_with_mig_is_an_inventory_error() -> None:
    got = errors("gpu_defaults:\n  gpu_sharing: {strategy: mps, replicas: 4}\n"
                 + HOST + "    mig: {strategy: mixed, config: all-1g.10gb}\n")
    assert len(got) == 1 and got[0].startswith("<inventory>:7:") and "hosts[1].mig:" in got[0], got
    assert "MPS sharing cannot be combined with MIG" in got[0] and "(fix: use gpu_sharing.strategy: time-slicing" \
        in got[0]


def test_dry_run_shows_the_sharing_proof() -> None:
    from gpuk8s.phases.verify import Verify

    i = inv()
    ctx = Context(i, plans=gpuplan.plans(i), kube_client=FakeKube(), initialized_cache=True)
    whats = [c.what for c in Verify().plan(ctx).changes]
    assert "sharing proof on w-default: 8 + 1 one-slice pods (created, then deleted)" in whats
    assert "sharing proof on w-hami: one pod asking for GPU memory (created, then deleted)" in whats
    assert not [w for w in whats if w.startswith("sharing proof on w-whole")]
    big = next(c for c in Verify().plan(ctx).changes if c.what.startswith("sharing proof on w-big"))
    pod = yaml.safe_load(big.manifest)
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu.shared": 1}}


# -- the review's findings (issue 17 follow-up) ------------------------------------------------------------------
def test_hami_replicas_must_agree_across_nodes() -> None:
    # HAMi's deviceSplitCount is one value for the cluster (its device ConfigMap): two values cannot both hold
    got = errors("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
                 "  - {name: w-1, address: 10.0.0.2, gpu_sharing: {strategy: hami, replicas: 4}}\n"
                 "  - {name: w-2, address: 10.0.0.3, gpu_sharing: {strategy: hami}}\n")
    assert len(got) == 1, got
    assert got[0].startswith("<inventory>:4:") and "hosts[2].gpu_sharing.replicas" in got[0]
    assert "HAMi replicas 10 differ from 4 (line 3)" in got[0] and "one value for the cluster" in got[0]
    loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
          "  - {name: w-1, address: 10.0.0.2, gpu_sharing: {strategy: hami, replicas: 10}}\n"
          "  - {name: w-2, address: 10.0.0.3, gpu_sharing: {strategy: hami}}\n")  # equal: accepted


def test_hami_together_with_mig_is_an_inventory_error() -> None:
    got = errors("gpu_defaults:\n  gpu_sharing: {strategy: hami}\n"
                 + HOST + "    mig: {strategy: mixed, config: all-1g.10gb}\n")
    assert len(got) == 1 and got[0].startswith("<inventory>:7:") and "hosts[1].mig:" in got[0], got
    assert "HAMi sharing cannot be combined with MIG" in got[0]


@pytest.mark.parametrize(("minor", "plugin", "bad"), [
    ("1.31", "", True),           # the matrix pins v0.17.1 for 1.31: it forces failRequestsGreaterThanOne on
    ("1.36", "v0.19.2", True),
    ("1.36", "", False),          # v0.20.x honours an explicit false
])
def test_mps_allow_multiple_needs_plugin_0_20(minor: str, plugin: str, bad: bool) -> None:
    text = (f'cluster: {{kubernetes_version: "{minor}"}}\n'
            + (f"install: {{device_plugin_version: {plugin}}}\n" if plugin else "")
            + HOST + "    gpu_sharing: {strategy: mps, replicas: 4, fail_requests_greater_than_one: false}\n")
    if not bad:
        assert loads(text).host("w-1").gpu.sharing.fail_requests_greater_than_one is False
        return
    got = errors(text)
    assert len(got) == 1 and "fail_requests_greater_than_one: false is ignored by the device plugin" in got[0], got
    assert "before v0.20.0" in got[0] and "(fix: " in got[0]


def no_facts_inventory(extra: str = "") -> str:
    return ("gpu_defaults:\n  gpu_sharing: {strategy: time-slicing, replicas: 4}\n"
            "hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
            "  - {name: w-old, address: 10.0.0.2}\n  - {name: w-new, address: 10.0.0.3}\n" + extra)


def test_a_plan_without_facts_says_which_labels_it_cannot_decide() -> None:
    i = loads(no_facts_inventory())
    blind = gpuplan.plan_for(i.host("w-old"))
    assert {gpuplan.PRODUCT_LABEL, gpuplan.MEMORY_LABEL, gpuplan.COUNT_LABEL} <= set(blind.undecided)
    assert not any(k in blind.labels for k in blind.undecided)
    assert blind.labels[gpuplan.CONFIG_LABEL] == "time-slicing-4"  # the inventory decides this one
    seen = gpuplan.plan_for(i.host("w-old"), H200)
    assert seen.undecided == () and seen.labels[gpuplan.COUNT_LABEL] == "1"


def test_labels_a_plan_cannot_decide_are_neither_set_nor_removed() -> None:
    i = loads(no_facts_inventory())
    kube = FakeKube()
    old = {gpuplan.PRODUCT_LABEL: "NVIDIA-H200-SHARED", gpuplan.MEMORY_LABEL: "143771", gpuplan.COUNT_LABEL: "8",
           gpuplan.CONFIG_LABEL: "time-slicing-4", gpuplan.STRATEGY_LABEL: "time-slicing",
           gpuplan.REPLICAS_LABEL: "4", gpuplan.GPU_PRESENT: "true"}
    kube.add_node("w-old", labels=old)
    kube.add_node("w-new")
    ctx = Context(i, plans=gpuplan.plans(i, {"w-new": H200}), kube_client=kube, initialized_cache=True)
    GPUNodes().run(ctx)  # an install where w-old could not be reached: no facts for it
    assert kube.nodes["w-old"]["metadata"]["labels"] == old
    assert kube.nodes["w-new"]["metadata"]["labels"][gpuplan.PRODUCT_LABEL] == "NVIDIA-H200-SHARED"


def test_join_labels_only_the_nodes_it_joins() -> None:
    from gpuk8s.phases.base import Options

    i = loads(no_facts_inventory())
    kube = FakeKube()
    kube.add_node("w-old", labels={gpuplan.CONFIG_LABEL: "none", "team": "a"})  # differs from its plan: left
    kube.add_node("w-new")
    ctx = Context(i, plans=gpuplan.plans(i, {"w-new": H200}), kube_client=kube, initialized_cache=True,
                  options=Options(only=[i.host("w-new")]))
    assert [c.what for c in GPUNodes().plan(ctx).changes if c.what.startswith("label")] == ["label w-new"]
    GPUNodes().run(ctx)
    assert kube.nodes["w-old"]["metadata"]["labels"] == {gpuplan.CONFIG_LABEL: "none", "team": "a"}
    assert not [c for c in kube.writes if c[0] == "label" and c[1] == "w-old"]
    assert kube.nodes["w-new"]["metadata"]["labels"][gpuplan.CONFIG_LABEL] == "time-slicing-4"


def test_a_mig_time_slicing_node_without_facts_keeps_its_config() -> None:
    i = loads(no_facts_inventory("    mig: {strategy: mixed, config: all-1g.10gb}\n").replace(
        "  - {name: w-old, address: 10.0.0.2}\n", "").replace("  - {name: w-new, address: 10.0.0.3}\n",
                                                               "  - name: w-old\n    address: 10.0.0.2\n"))
    plan = gpuplan.plan_for(i.host("w-old"))
    assert gpuplan.CONFIG_LABEL in plan.undecided and gpuplan.CONFIG_LABEL not in plan.labels
    kube = FakeKube()
    config = "time-slicing-4-mig-mixed-1g.10gb"
    kube.add_node("w-old", labels={gpuplan.CONFIG_LABEL: config, "nvidia.com/mig-1g.10gb.count": "7"})
    body = "version: v1\nflags: {migStrategy: mixed}\n"
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": manifests.PLUGIN_CONFIGS, "namespace": "kube-system"}, "data": {config: body, "none": "x"}}))
    ctx = Context(i, plans=gpuplan.plans(i), kube_client=kube, initialized_cache=True)
    GPUNodes().run(ctx)
    labels = kube.nodes["w-old"]["metadata"]["labels"]
    assert labels[gpuplan.CONFIG_LABEL] == config and labels["nvidia.com/mig-1g.10gb.count"] == "7"
    data = kube.get("configmap", manifests.PLUGIN_CONFIGS, "kube-system")[0]["data"]
    assert data[config] == body and not [k for k in data if k.startswith("time-slicing-4-mig-mixed") and k != config]


SHARED = HOST + "    gpus: 2\n    gpu_sharing: {strategy: time-slicing, replicas: 4}\n"


def shared_cluster(kube: FakeKube, text: str = SHARED, alloc: int = 8) -> Context:
    """A cluster as install leaves it, the shared node w-1 advertising `alloc` slices."""
    from gpuk8s.phases.base import Options

    i = loads(text)
    plans = gpuplan.plans(i)
    for name, p in plans.items():
        kube.add_node(name, gpus=alloc if p.expected_gpus else 0, labels=p.labels)
    for m in manifests.wanted(i, plans):
        kube.apply(m.applied_text())
    kube.calls.clear()
    return Context(i, plans=plans, kube_client=kube, initialized_cache=True,
                   options=Options(test_pods=False, test_pod_timeout=30))


class SlowPlugin(FakeKube):
    """config-manager applies w-1's new config only after `after` reads of the node list."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.reads = after, 0

    def get(self, kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
        if kind == "nodes":
            self.reads += 1
            if self.reads > self.after:
                self.nodes["w-1"]["status"]["allocatable"]["nvidia.com/gpu"] = "8"
        return super().get(kind, name, namespace)


def test_verify_waits_for_a_relabelled_node_to_reflect_its_config(monkeypatch) -> None:
    from gpuk8s.phases import verify

    monkeypatch.setattr(verify, "POLL_S", 0.01)
    kube = SlowPlugin(after=3)
    ctx = shared_cluster(kube, alloc=2)  # still whole GPUs: the new config not applied yet
    ctx.relabelled = {"w-1"}
    verify.Verify().run(ctx)
    w1 = next(c for c in ctx.nodes if c.node == "w-1")
    assert w1.ok and w1.allocatable_gpus == 8 and kube.reads > 3
    # bounded by the test pod timeout: a node that never reflects it is reported
    kube = SlowPlugin(after=10**9)
    ctx = shared_cluster(kube, alloc=2)
    ctx.relabelled = {"w-1"}
    ctx.options.test_pod_timeout = 0.05
    verify.Verify().run(ctx)
    assert next(c for c in ctx.nodes if c.node == "w-1").cause_id == "gpu.sharing-not-applied"
    # a node whose labels did not change is judged at once
    kube = SlowPlugin(after=10**9)
    ctx = shared_cluster(kube, alloc=2)
    verify.Verify().run(ctx)
    assert kube.reads == 1 and next(c for c in ctx.nodes if c.node == "w-1").cause_id == "gpu.sharing-not-applied"


_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"


def test_proof_and_test_pod_names_are_valid_for_any_node_name() -> None:
    import re

    from gpuk8s.phases.verify import proof_pod_name, test_pod_name

    long_dotted = "x" * 39 + "." + "y" * 20  # node[:40] ended in '.': "gpuk8s-share-xxx.-0"
    other = "x" * 39 + "." + "z" * 20
    names = [proof_pod_name(n, s) for n in (long_dotted, other, "w-1", "a" * 63) for s in ("0", "19", "two", "mem")]
    names += [test_pod_name(n) for n in (long_dotted, "x" * 49 + "-" + "y" * 10, "w-1")]
    for n in names:
        assert len(n) <= 63 and re.fullmatch(_SUBDOMAIN, n), n
    assert len(set(names)) == len(names)  # two nodes alike in their first 40 characters get different pods
    assert proof_pod_name("w-1", "0") == "gpuk8s-share-w-1-0" and test_pod_name("w-1") == "gpuk8s-verify-w-1"


def test_a_proof_pod_the_api_refuses_is_reported() -> None:
    from gpuk8s.kube.client import KubeError
    from gpuk8s.phases.verify import Verify

    class Refusing(FakeKube):
        def apply(self, text: str) -> str:
            if "gpuk8s.io/proof" in text:
                raise KubeError("kubectl apply (the fake API) failed: The Pod \"x.-0\" is invalid")
            return super().apply(text)

    kube = Refusing()
    ctx = shared_cluster(kube)
    c = state.NodeCheck("w-1", True, True, 8, 8, resource="nvidia.com/gpu")
    Verify()._sharing_proofs(ctx, [c])
    assert (c.ok, c.cause_id) == (False, "gpu.sharing-proof") and "is invalid" in c.cause


class Scheduler(FakeKube):
    """Binds proof pods to w-1 while slices (and pod room) are free, else leaves them Pending as the scheduler
    says; the kubelet refuses a pod asking for 2 slices (failRequestsGreaterThanOne)."""

    def apply(self, text: str) -> str:
        out = super().apply(text)
        for (kind, _, _name), o in self.objects.items():
            if kind != "pod" or "status" in o:
                continue
            want = next(iter(o["spec"]["containers"][0]["resources"]["limits"].values()))
            if want == 2:
                o["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "Allocate failed"}
                continue
            node = self.nodes["w-1"]
            held = [p for (k, _, _n), p in self.objects.items() if k == "pod" and p.get("spec", {}).get("nodeName")
                    == "w-1" and p.get("status", {}).get("phase") == "Running"]
            used = sum(next(iter(p["spec"]["containers"][0]["resources"].get("limits", {"x": 0}).values()))
                       for p in held)
            if used < int(node["status"]["allocatable"]["nvidia.com/gpu"]):
                o["spec"]["nodeName"], o["status"] = "w-1", {"phase": "Running"}
            else:
                o["status"] = {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 1 Insufficient nvidia.com/gpu."}]}
        return out


def user_pod(name: str, slices: int) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team"},
                           "spec": {"nodeName": "w-1", "containers": [{"name": "c", "image": "i", "resources": {
                               "limits": {"nvidia.com/gpu": slices}}}]}, "status": {"phase": "Running"}})


def proof_pods_applied(kube: FakeKube) -> int:
    return sum(t.count("gpuk8s.io/proof") for c, t, *_ in [c for c in kube.calls if c[0] == "apply"])


def test_the_proof_is_sized_to_the_free_slices() -> None:
    from gpuk8s.phases.verify import Verify

    kube = Scheduler()
    ctx = shared_cluster(kube)
    kube.apply(user_pod("inference-1", 3))  # a user's pods already hold 3 of the 8 slices
    c = state.NodeCheck("w-1", True, True, 8, 8, resource="nvidia.com/gpu")
    Verify()._sharing_proofs(ctx, [c])
    assert c.ok, c.cause
    assert "5 one-slice pods bound (3 of 8 slices in use by other pods)" in c.proof
    assert proof_pods_applied(kube) == 5 + 1 + 1  # the free slices, one more, and the pod asking for 2
    assert kube.get("pods", namespace="team")  # the user's pod is left alone


def test_the_proof_is_skipped_when_no_slice_or_no_pod_room_is_free() -> None:
    from gpuk8s.phases.verify import Verify

    kube = Scheduler()
    ctx = shared_cluster(kube)
    kube.apply(user_pod("inference-1", 8))
    c = state.NodeCheck("w-1", True, True, 8, 8, resource="nvidia.com/gpu")
    Verify()._sharing_proofs(ctx, [c])
    assert c.ok and c.proof.startswith("skipped: every slice is in use (8 of 8") and proof_pods_applied(kube) == 0
    kube = Scheduler()
    ctx = shared_cluster(kube)
    kube.nodes["w-1"]["status"]["allocatable"]["pods"] = "6"  # the kubelet's maxPods: room for 6 pods only
    c = state.NodeCheck("w-1", True, True, 8, 8, resource="nvidia.com/gpu")
    Verify()._sharing_proofs(ctx, [c])
    assert c.ok and "skipped" in c.proof and "maxPods" in c.proof and proof_pods_applied(kube) == 0


def test_slices_beyond_the_kubelets_pod_limit_are_a_preflight_warning() -> None:
    eight = dataclasses.replace(H200, gpu=dataclasses.replace(H200.gpu, gpus=H200.gpu.gpus * 8))
    got = {r.id: r for r in gpu_sharing(host_with("{strategy: time-slicing, replicas: 20}"), eight, "v0.20.1")}
    r = got["gpu.sharing-max-pods"]
    assert (r.status, r.severity) == ("warn", "warning")
    assert "8 GPUs x 20 replicas = 160 slices" in r.message and "110 pods" in r.message
    ok = {r.id: r for r in gpu_sharing(host_with("{strategy: time-slicing, replicas: 10}"), eight, "v0.20.1")}
    assert ok["gpu.sharing-max-pods"].status == "pass"


def test_the_gpu_phase_names_the_nodes_whose_sharing_it_changed() -> None:
    kube = FakeKube()
    i = loads(SHARED + "  - {name: w-2, address: 10.0.0.3, gpus: 2, gpu_sharing: {strategy: none}}\n"
              "  - {name: w-3, address: 10.0.0.4, gpus: 2, gpu_sharing: {strategy: none}}\n")
    kube.add_node("w-1")  # first labels, sharing: verify waits for its slices
    kube.add_node("w-2")  # first labels, whole GPUs: nothing to wait for
    kube.add_node("w-3", labels={gpuplan.STRATEGY_LABEL: "time-slicing", gpuplan.CONFIG_LABEL: "time-slicing-4"})
    ctx = Context(i, plans=gpuplan.plans(i), kube_client=kube, initialized_cache=True)
    GPUNodes().run(ctx)
    assert ctx.relabelled == {"w-1", "w-3"}  # w-3: back to whole GPUs, its plugin restarts too


def test_a_config_name_fits_a_label_value() -> None:
    import re

    mig = ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb")
    long = gpuplan.PluginSettings("time-slicing", 20, False, False, "mixed", mig)
    other = gpuplan.PluginSettings("time-slicing", 19, False, False, "mixed", mig)
    for st in (long, other):
        assert len(st.config_name) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?",
                                                          st.config_name), st.config_name
    assert long.config_name != other.config_name and long.config_name == gpuplan.PluginSettings(
        "time-slicing", 20, False, False, "mixed", mig).config_name  # stable: the same setting, the same name
    assert long.config_name.startswith("time-slicing-20-allow-multiple-mig-mixed-")
    assert gpuplan.PluginSettings("time-slicing", 4).config_name == "time-slicing-4"  # short names unchanged


def test_the_plugin_gets_sys_admin_only_where_a_node_uses_mig() -> None:
    def plugin_ctr(text: str) -> dict:
        ds = manifests.device_plugin(loads(text)).objects()[0]
        return ds["spec"]["template"]["spec"]["containers"][1]

    plain = plugin_ctr(HOST + "    gpus: 1\n")
    assert plain["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in {e["name"] for e in plain["env"]}
    # as the v0.20.0 chart (requiresCapSysAdmin when a MIG strategy is not none; addMigMonitorDevices)
    mig = plugin_ctr(HOST + "    mig: {strategy: mixed, config: all-1g.10gb}\n")
    assert mig["securityContext"] == {"capabilities": {"add": ["SYS_ADMIN"]}}
    assert {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"} in mig["env"]


def test_the_sharing_proof_leaves_a_pod_of_another_alone_and_names_it() -> None:
    """Issue 42 (8): the proof pods are deleted and created by name in default; one of that name gpuk8s did not create
    is neither deleted nor overwritten, and the node's verdict names it."""
    from gpuk8s.kube.state import NodeCheck
    from gpuk8s.phases.verify import TEST_NAMESPACE, Verify, proof_pod_name

    i = inv()
    plans = gpuplan.plans(i)
    kube = FakeKube()
    for name, plan in plans.items():
        kube.add_node(name, labels=plan.labels)
    taken = proof_pod_name("w-default", "two")
    kube.objects[("pod", TEST_NAMESPACE, taken)] = {"kind": "Pod", "metadata": {"name": taken,
                                                                                "namespace": TEST_NAMESPACE}}
    ctx = Context(i, plans=plans, kube_client=kube, initialized_cache=True)
    c = NodeCheck("w-default", True, True, plans["w-default"].expected_gpus, plans["w-default"].expected_gpus)
    Verify()._sharing_proofs(ctx, [c])
    assert kube.writes == [] and (c.ok, c.cause_id) == (False, "gpu.test-name-taken") and taken in c.cause


def test_a_pods_config_maps_are_found_wherever_it_names_them() -> None:
    """What keeps a stale NCCL ConfigMap (gpu phase): a pod that takes its environment from it or mounts it."""
    pod = {"spec": {"containers": [
        {"envFrom": [{"configMapRef": {"name": "a"}}], "env": [{"valueFrom": {"configMapKeyRef": {"name": "b"}}}]}],
        "initContainers": [{"envFrom": [{"configMapRef": {"name": "c"}}]}],
        "volumes": [{"configMap": {"name": "d"}}, {"projected": {"sources": [{"configMap": {"name": "e"}}]}}]}}
    assert config_maps_of(pod) == {"a", "b", "c", "d", "e"}
    assert config_maps_of({"spec": "x"}) == set() and config_maps_of(None) == set()
