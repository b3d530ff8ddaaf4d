"""Monitoring (issue 20): the inventory section, the manifests (validated offline for every minor), the
dashboard against the exporter's default counters, the phase against a fake API, and verify's verdicts."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuk8s import flows, gpuplan, versions
from gpuk8s.inventory.loader import InventoryError, loads
from gpuk8s.kube import monitoring as mon
from gpuk8s.kube.manifests import ANNOTATION
from gpuk8s.phases.base import Context, plan_phases, run_phases
from gpuk8s.phases.monitoring import EMPTYDIR_WARNING, Monitoring
from gpuk8s.phases.monitoring_verify import MonitoringVerify, device_series, devices, metrics_path, targets_path
from tests.unit.fakekube import FakeKube
from tests.unit.test_render import schema_for

ROOT = Path(__file__).resolve().parents[2]
COUNTERS = ROOT / "tests" / "fixtures" / "dcgm-exporter" / "default-counters.csv"

INV = """
cluster: {name: ml, kubernetes_version: "MINOR"}
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - {name: gpu-1, address: 10.0.0.21, gpus: 2, taints: ["team=ml:NoSchedule"]}
  - {name: gpu-2, address: 10.0.0.22, gpus: 4}
  - {name: cpu-1, address: 10.0.0.31, gpus: 0, taints: ["cpu-only=true:NoExecute"]}
monitoring: MON
"""


def inventory(mon_section: str = "{enabled: true}", minor: str | None = None):
    return loads(INV.replace("MINOR", minor or versions.default_minor()).replace("MON", mon_section), "inv.yaml")


def default_counters() -> set[str]:
    return {line.split(",")[0].strip() for line in COUNTERS.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


# -- the inventory ------------------------------------------------------------------------------------------
def test_the_monitoring_section_defaults_and_values():
    inv = loads(INV.replace("MINOR", "1.35").replace("monitoring: MON", ""), "inv.yaml")
    assert not inv.monitoring.enabled and inv.monitoring.prometheus == "auto"
    assert (inv.monitoring.namespace, inv.monitoring.retention, inv.monitoring.storage_class) == \
        ("gpu-monitoring", "15d", None)
    assert [p.name for p in flows.install_phases(inv)].count("monitoring") == 0
    assert "monitoring" in [p.name for p in flows.install_phases(inventory())]
    m = inventory("{enabled: true, namespace: metrics, prometheus: deploy, retention: 30d, storage_class: fast, "
                  "storage_size: 50Gi, grafana: true}").monitoring
    assert (m.enabled, m.namespace, m.prometheus, m.retention, m.storage_class, m.storage_size, m.grafana) == \
        (True, "metrics", "deploy", "30d", "fast", "50Gi", True)


@pytest.mark.parametrize("section, key, fix", [
    ("{prometheus: deplyo}", "monitoring.prometheus", "did you mean 'deploy'?"),
    ("{namespace: Bad_NS}", "monitoring.namespace", "namespace name"),
    ("{retention: 15 days}", "monitoring.retention", "Prometheus duration"),
    ("{storage_size: lots}", "monitoring.storage_size", "20Gi"),
    ("{grafna: true}", "monitoring.grafna", "did you mean 'grafana'?"),
    ("{enabled: maybe}", "monitoring.enabled", "true or false"),
])
def test_monitoring_mistakes_are_located_with_a_fix(section, key, fix):
    with pytest.raises(InventoryError) as e:
        inventory(section)
    [p] = e.value.problems
    assert p.key == key and fix in p.fix and p.file == "inv.yaml"
    assert p.line == INV.splitlines().index("monitoring: MON") + 1  # the section's line (an inline mapping)


# -- the manifests ------------------------------------------------------------------------------------------
def all_manifests(inv):
    plans = gpuplan.plans(inv)
    return [*mon.wanted(inv, plans, "deploy"), mon.service_monitor(inv)]


@pytest.mark.parametrize("minor", versions.supported_minors())
def test_every_monitoring_manifest_is_valid_for_every_minor(minor):
    inv = inventory("{enabled: true, grafana: true, storage_class: fast}", minor)
    kinds = []
    for m in all_manifests(inv):
        for d in yaml.safe_load_all(m.applied_text()):
            kinds.append(d["kind"])
            if d["apiVersion"] == "monitoring.coreos.com/v1":
                # a CRD: kubernetes-validate has no schema for it; its fields as prometheus-operator defines them
                assert d["kind"] == "ServiceMonitor"
                ep = d["spec"]["endpoints"][0]
                assert (ep["port"], ep["path"]) == ("metrics", "/metrics")
                assert d["spec"]["selector"]["matchLabels"] == {mon.NAME_LABEL: mon.EXPORTER}
                continue
            kubernetes_validate.validate(d, schema_for(minor), strict=True)
    assert {"Namespace", "DaemonSet", "Service", "ConfigMap", "Deployment", "Role", "RoleBinding",
            "ServiceAccount", "PersistentVolumeClaim", "ServiceMonitor"} <= set(kinds)


def test_the_validator_would_catch_a_mistake_in_the_exporter():
    bad = yaml.safe_load_all(mon.exporter(inventory(), gpuplan.plans(inventory())).text)
    ds = next(bad)
    ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9400"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, schema_for(versions.default_minor()), strict=True)


def exporter_spec(inv):
    ds = mon.exporter(inv, gpuplan.plans(inv)).objects()[0]
    return ds["spec"]["template"]["spec"]


def test_the_exporter_runs_on_gpu_nodes_only_with_their_tolerations():
    inv = inventory()
    spec = exporter_spec(inv)
    assert spec["nodeSelector"] == {gpuplan.GPU_PRESENT: "true"}
    assert {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in spec["tolerations"]
    keys = {t["key"] for t in spec["tolerations"]}
    assert "cpu-only" not in keys and "node-role.kubernetes.io/control-plane" not in keys
    # only GPU nodes carry the selector's label: the plan says which
    plans = gpuplan.plans(inv)
    assert {n for n, p in plans.items() if p.labels.get(gpuplan.GPU_PRESENT) == "true"} == {"gpu-1", "gpu-2"}


def test_the_exporter_container_as_nvidia_ships_it():
    inv = inventory()
    c = exporter_spec(inv)["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DCGM_EXPORTER_LISTEN"] == ":9400" and env["DCGM_EXPORTER_KUBERNETES"] == "true"
    assert "NODE_NAME" in env and "KUBERNETES_VIRTUAL_GPUS" not in env
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400}]
    assert c["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    tag = versions.pins(inv.cluster.kubernetes_version).dcgm_exporter
    assert c["image"] == f"nvcr.io/nvidia/k8s/dcgm-exporter:{tag}"
    assert c["volumeMounts"] == [{"name": "pod-gpu-resources", "readOnly": True,
                                  "mountPath": "/var/lib/kubelet/pod-resources"}]
    svc = mon.exporter(inv, gpuplan.plans(inv)).objects()[1]
    assert svc["spec"]["ports"][0]["name"] == "metrics" and svc["spec"]["ports"][0]["port"] == 9400


@pytest.mark.parametrize("strategy, virtual", [("time-slicing", True), ("mps", True), ("hami", False),
                                               ("none", False)])
def test_virtual_gpus_under_time_slicing_and_mps(strategy, virtual):
    inv = inventory()
    plans = gpuplan.plans(inv)
    plans["gpu-2"] = replace(plans["gpu-2"], sharing=strategy)
    c = mon.exporter(inv, plans).objects()[0]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (env.get("KUBERNETES_VIRTUAL_GPUS") == "true") is virtual


def test_prometheus_settings_reach_its_manifest():
    inv = inventory("{enabled: true, retention: 30d}")
    objs = {o["kind"]: o for o in mon.prometheus(inv).objects()}
    c = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--storage.tsdb.retention.time=30d" in c["args"]
    assert c["image"] == versions.monitoring_image("prometheus")
    assert objs["Deployment"]["spec"]["template"]["spec"]["volumes"][1] == {"name": "data", "emptyDir": {}}
    assert "PersistentVolumeClaim" not in objs
    cfg = yaml.safe_load(objs["ConfigMap"]["data"]["prometheus.yml"])
    job = cfg["scrape_configs"][0]
    assert job["kubernetes_sd_configs"] == [{"role": "endpoints", "namespaces": {"names": ["gpu-monitoring"]}}]
    assert job["relabel_configs"][0]["regex"] == "dcgm-exporter;metrics"
    stored = {o["kind"]: o for o in mon.prometheus(inventory("{enabled: true, storage_class: fast}")).objects()}
    assert stored["PersistentVolumeClaim"]["spec"]["storageClassName"] == "fast"


def test_the_mode_decides_the_manifests():
    inv = inventory()
    plans = gpuplan.plans(inv)
    names = {mode: [m.name for m in mon.wanted(inv, plans, mode)] for mode in mon.MODES}
    assert names["none"] == ["monitoring-namespace.yaml", "dcgm-exporter.yaml"]
    assert names["servicemonitor"] == names["none"] + ["dcgm-exporter-servicemonitor.yaml"]
    assert names["deploy"] == names["none"] + ["prometheus.yaml"]
    grafana = inventory("{enabled: true, grafana: true}")
    assert [m.name for m in mon.wanted(grafana, plans, "deploy")][-1] == "grafana.yaml"
    kube = FakeKube()
    assert mon.resolve_mode(inv, kube) == "deploy"
    kube.apply(yaml.safe_dump({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                               "metadata": {"name": mon.SERVICEMONITOR_CRD}}))
    assert mon.resolve_mode(inv, kube) == "servicemonitor"
    assert mon.resolve_mode(inventory("{enabled: true, prometheus: none}"), kube) == "none"


# -- the dashboard ------------------------------------------------------------------------------------------
def test_the_dashboard_is_valid_json_and_queries_only_default_counters():
    d = json.loads(mon.dashboard())
    assert d["uid"] and d["panels"]
    queries = mon.dashboard_queries()
    used = {m for q in queries for m in re.findall(r"\bDCGM_FI_[A-Z0-9_]+", q)}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"} <= used
    assert used <= default_counters(), used - default_counters()
    # every panel queries something, by node and by pod
    assert all(p["targets"] for p in d["panels"])
    assert any("by (namespace, pod)" in q for q in queries) and any("by (Hostname" in q for q in queries)


def test_the_counter_check_would_catch_a_metric_the_exporter_does_not_collect():
    d = json.loads(mon.dashboard())
    d["panels"][0]["targets"][0]["expr"] = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"  # commented out in the defaults
    used = {m for q in mon.dashboard_queries(json.dumps(d)) for m in re.findall(r"\bDCGM_FI_[A-Z0-9_]+", q)}
    assert not used <= default_counters()


def test_grafana_provisions_the_dashboard_and_prometheus():
    inv = inventory("{enabled: true, grafana: true}")
    objs = {(o["kind"], o["metadata"]["name"]): o for o in mon.grafana(inv).objects()}
    assert json.loads(objs[("ConfigMap", "grafana-dashboards")]["data"]["gpuk8s-gpus.json"]) == \
        json.loads(mon.dashboard())
    ds = yaml.safe_load(objs[("ConfigMap", "grafana-provisioning")]["data"]["datasources.yaml"])
    assert ds["datasources"][0]["url"] == "http://prometheus.gpu-monitoring.svc:9090"
    env = {e["name"]: e["value"] for e in
           objs[("Deployment", "grafana")]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GF_AUTH_DISABLE_LOGIN_FORM"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_render_writes_the_dashboard_and_the_manifests():
    assert mon.rendered(inventory("{enabled: false}"), {}) == {}
    inv = inventory("{enabled: true, grafana: true}")
    on = mon.rendered(inv, gpuplan.plans(inv))
    assert {"dcgm-exporter.yaml", "prometheus.yaml", "grafana.yaml", "prometheus-scrape-config.yaml",
            "gpu-dashboard.json"} <= set(on)
    assert json.loads(on["gpu-dashboard.json"]) == json.loads(mon.dashboard())
    assert ANNOTATION in on["dcgm-exporter.yaml"]


# -- the phase ----------------------------------------------------------------------------------------------
def ctx_for(inv, kube):
    ctx = Context(inv, kube_client=kube, plans=gpuplan.plans(inv))
    ctx.initialized_cache = True
    return ctx


def test_the_phase_applies_then_changes_nothing_then_removes_only_its_own():
    inv = inventory("{enabled: true, grafana: true}")
    kube = FakeKube()
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",  # the user's, in another namespace
                               "metadata": {"name": "prometheus-config", "namespace": "team"}}))
    first = Monitoring().run(ctx_for(inv, kube))
    assert first.status == "changed" and EMPTYDIR_WARNING in first.message
    created = set(kube.objects)
    assert ("daemonset", "gpu-monitoring", "dcgm-exporter") in created
    assert ("deployment", "gpu-monitoring", "grafana") in created
    writes = len(kube.writes)
    again = Monitoring().run(ctx_for(inv, kube))
    assert again.status == "unchanged" and len(kube.writes) == writes
    assert Monitoring().plan(ctx_for(inv, kube)).status == "unchanged"
    gone = Monitoring(remove=True).run(ctx_for(inv, kube))
    assert gone.status == "changed"
    assert set(kube.objects) == {("configmap", "team", "prometheus-config")}
    assert Monitoring(remove=True).run(ctx_for(inv, kube)).status == "unchanged"


def test_a_namespace_of_the_users_is_used_and_never_deleted():
    inv = inventory("{enabled: true, namespace: monitoring}")
    kube = FakeKube()
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}}))
    Monitoring().run(ctx_for(inv, kube))
    assert not any(c[0] == "apply" and "kind: Namespace" in c[1] for c in kube.calls[1:])
    Monitoring(remove=True).run(ctx_for(inv, kube))
    assert set(kube.objects) == {("namespace", "", "monitoring")}


def test_a_changed_setting_applies_only_what_it_changes():
    kube = FakeKube()
    Monitoring().run(ctx_for(inventory(), kube))
    r = Monitoring().run(ctx_for(inventory("{enabled: true, retention: 30d}"), kube))
    assert r.status == "changed" and r.message.startswith("applied prometheus.yaml (")


def test_none_plans_the_scrape_job():
    inv = inventory("{enabled: true, prometheus: none}")
    plan = Monitoring().plan(ctx_for(inv, FakeKube()))
    assert plan.changes[-1].manifest == mon.scrape_config(inv)
    assert not any("prometheus.yaml" in c.what for c in plan.changes)


# -- verify -------------------------------------------------------------------------------------------------
def metrics(node: str, gpus: int, pod: str = "", mig: int = 0) -> str:
    """The exporter's text for `gpus` GPUs, as dcgm-exporter writes it (HELP/TYPE from default-counters.csv)."""
    # on a MIG GPU: one series per GPU instance of the GPU-level fields, no _UTIL field, no whole-GPU series (the
    # real texts: tests/fixtures/real/dcgm/mig-*)
    field = "DCGM_FI_DEV_GPU_TEMP" if mig else "DCGM_FI_DEV_GPU_UTIL"
    lines = [f"# HELP {field} GPU {'temperature (in C)' if mig else 'utilization (in %)'}.", f"# TYPE {field} gauge"]
    for i in range(gpus):
        extra = f',pod="{pod}",namespace="default",container="main"' if pod else ""
        for gi in range(mig) or [None]:
            mig_labels = f',GPU_I_PROFILE="1g.10gb",GPU_I_ID="{gi}"' if gi is not None else ""
            lines.append(f'{field}{{gpu="{i}",UUID="GPU-{node}-{i}",device="nvidia{i}",'
                         f'modelName="NVIDIA A100-SXM4-80GB",Hostname="{node}"{mig_labels}{extra}}} 0')
    return "\n".join(lines) + "\n"


def test_mig_instances_are_devices_in_the_real_exporters_texts():
    """Issue 41 (MIG + monitoring): a MIG GPU's series are per GPU instance, and none is DCGM_FI_DEV_GPU_UTIL (not
    published for instances): counted from the other device fields, each (gpu, GPU_I_ID) one device."""
    real = Path(__file__).parent.parent / "fixtures" / "real" / "dcgm"
    h100 = (real / "mig-h100-prof-gr-engine-active-4.2.0.txt").read_text().partition("\n---\n")[2]
    a100 = (real / "mig-a100-sm-clock-gpu-operator-23.9.2.txt").read_text().partition("\n---\n")[2]
    assert "DCGM_FI_DEV_GPU_UTIL" not in h100 + a100
    assert devices(device_series(h100)) == {("0", "7"), ("0", "8")}
    assert devices(device_series(a100)) == {("0", "0")}
    # the pod the exporter names on an instance's series counts (monitoring.no-pod-labels)
    assert [s.labels.get("pod", "") for s in device_series(h100)][0].startswith("text-embedding-predictor")


def test_the_metrics_are_parsed_by_device():
    assert len(devices(device_series(metrics("n", 4)))) == 4
    assert len(devices(device_series(metrics("n", 1, mig=7)))) == 7
    doubled = metrics("n", 2) + metrics("n", 2, pod="p").split("gauge\n", 1)[1]  # two pods' series of one GPU
    assert len(device_series(doubled)) == 4 and len(devices(device_series(doubled))) == 2


def cluster(inv, *, crash_log: str = "", mounted: bool = True, pods_on: tuple[str, ...] = ("gpu-1", "gpu-2"),
            gpus: dict[str, int] | None = None, targets: dict[str, str] | None = None) -> FakeKube:
    kube = FakeKube()
    for n in ("cp-1", "gpu-1", "gpu-2", "cpu-1"):
        kube.add_node(n)
    Monitoring().run(ctx_for(inv, kube))
    if not mounted:
        ds = kube.objects[("daemonset", "gpu-monitoring", "dcgm-exporter")]
        ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = []
    kube.raw = {}
    counts = gpus or {"gpu-1": 2, "gpu-2": 4}
    for n in pods_on:
        pod = f"dcgm-exporter-{n}"
        status = {"phase": "Running"}
        if crash_log and n == "gpu-2":
            status["containerStatuses"] = [{"restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
        kube.objects[("pod", "gpu-monitoring", pod)] = {
            "kind": "Pod", "metadata": {"name": pod, "namespace": "gpu-monitoring",
                                        "labels": {mon.NAME_LABEL: mon.EXPORTER}},
            "spec": {"nodeName": n}, "status": status}
        kube.raw[metrics_path("gpu-monitoring", pod)] = metrics(n, counts.get(n, 0))
    kube.logs = lambda pod, ns, tail=50: crash_log  # type: ignore[method-assign]
    health = targets if targets is not None else {n: "up" for n in pods_on}
    kube.raw[targets_path("gpu-monitoring", "prometheus", 9090)] = json.dumps({"status": "success", "data": {
        "activeTargets": [{"discoveredLabels": {"__meta_kubernetes_pod_node_name": n}, "labels": {"node": n},
                           "scrapePool": "dcgm-exporter", "scrapeUrl": "http://10.0.0.1:9400/metrics",
                           "lastError": "" if h == "up" else "connection refused", "health": h}
                          for n, h in health.items()], "droppedTargets": []}})
    return kube


def verdicts(inv, kube):
    check = MonitoringVerify().check(ctx_for(inv, kube))
    return {(f.subject.name if f.subject else ""): f.id for f in check.findings if not f.ok}, check


def test_verify_passes_with_every_gpu_served_and_every_target_up():
    inv = inventory("{enabled: true, prometheus: deploy}")
    bad, check = verdicts(inv, cluster(inv))
    assert bad == {} and [f.id for f in check.findings] == ["monitoring.verified"] * 2
    r = MonitoringVerify().run(ctx_for(inv, cluster(inv)))
    assert r.status == "passed" and r.message == "2 exporter(s) serve every GPU"


@pytest.mark.parametrize("kw, node, cause", [
    ({"crash_log": 'time=2026-09-19T20:06:59.547Z level=ERROR msg="Cannot init NVML library; err: '
                   'ERROR_LIBRARY_NOT_FOUND"'}, "gpu-2", "monitoring.exporter-nvml"),
    ({"crash_log": "exec format error"}, "gpu-2", "monitoring.exporter-not-running"),
    ({"mounted": False}, "gpu-1", "monitoring.no-pod-labels"),
    ({"pods_on": ("gpu-1",)}, "gpu-2", "monitoring.exporter-missing"),
    ({"pods_on": ("gpu-1", "gpu-2", "cpu-1")}, "cpu-1", "monitoring.exporter-misplaced"),
    ({"gpus": {"gpu-1": 2, "gpu-2": 3}}, "gpu-2", "monitoring.series-count"),
    ({"targets": {"gpu-1": "up"}}, "gpu-2", "monitoring.target-missing"),
    ({"targets": {"gpu-1": "up", "gpu-2": "down"}}, "gpu-2", "monitoring.target-down"),
])
def test_verify_names_each_cause(kw, node, cause):
    inv = inventory("{enabled: true, prometheus: deploy}")
    inv = replace(inv, hosts=tuple(replace(h, gpus=4) if h.name == "gpu-2" else h for h in inv.hosts))
    bad, _ = verdicts(inv, cluster(inv, **kw))
    assert bad.get(node) == cause, bad


def test_verify_names_unreadable_metrics_and_a_missing_prometheus():
    inv = inventory("{enabled: true, prometheus: deploy}")
    kube = cluster(inv)
    kube.raw[metrics_path("gpu-monitoring", "dcgm-exporter-gpu-1")] = "DCGM_FI_DEV_GPU_UTIL{gpu=0} zero\n"
    del kube.raw[targets_path("gpu-monitoring", "prometheus", 9090)]
    bad, _ = verdicts(inv, kube)
    assert bad == {"gpu-1": "monitoring.metrics-unreadable", "cluster": "monitoring.prometheus-missing"}


def test_verify_with_a_service_monitor_asks_the_operators_prometheus():
    inv = inventory("{enabled: true, prometheus: servicemonitor, prometheus_namespace: obs}")
    assert inv.monitoring.prometheus_namespace == "obs"
    kube = cluster(inv)
    bad, _ = verdicts(inv, kube)
    assert bad == {"cluster": "monitoring.prometheus-missing"}
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Service",
                               "metadata": {"name": "prometheus-operated", "namespace": "obs"}}))
    kube.raw[targets_path("obs", "prometheus-operated", 9090)] = \
        kube.raw[targets_path("gpu-monitoring", "prometheus", 9090)]
    assert verdicts(inv, kube)[0] == {}


def test_verify_asks_only_the_prometheus_the_inventory_names():
    # issue 28 item 7: verify asked the first Service prometheus-operated in any namespace, so a tenant's Service
    # (its pods answering the targets API) could make every target look up
    for section, where in (("{enabled: true, prometheus: servicemonitor}", "gpu-monitoring"),
                           ("{enabled: true, prometheus: servicemonitor, prometheus_namespace: obs}", "obs")):
        inv = inventory(section)
        kube = cluster(inv, targets={"gpu-1": "up"})  # the real Prometheus: no target for gpu-2
        kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Service",
                                   "metadata": {"name": "prometheus-operated", "namespace": "team-a"}}))
        fake = cluster(inventory("{enabled: true, prometheus: deploy}"))  # every target up
        kube.raw[targets_path("team-a", "prometheus-operated", 9090)] = \
            fake.raw[targets_path("gpu-monitoring", "prometheus", 9090)]
        bad, check = verdicts(inv, kube)
        assert bad == {"cluster": "monitoring.prometheus-missing"}, bad
        assert not any(c[0] == "raw_get" and "team-a" in c[1] for c in kube.calls)
        [f] = [f for f in check.findings if not f.ok]
        assert f"in namespace {where}" in f.message and "team-a; not asked" in f.message
        assert "monitoring.prometheus_namespace" in f.remedy
        # the Operator's Service in the namespace the inventory names is the one asked
        kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Service",
                                   "metadata": {"name": "prometheus-operated", "namespace": where}}))
        kube.raw[targets_path(where, "prometheus-operated", 9090)] = \
            kube.raw[targets_path("gpu-monitoring", "prometheus", 9090)]
        assert verdicts(inv, kube)[0] == {"gpu-2": "monitoring.target-missing"}


@pytest.mark.parametrize("body", [
    "[" * 200_000,  # a RecursionError in json.loads
    '{"status": "success", "data": ' + "[" * 200_000 + "]" * 200_000 + "}",
    '{"status": "success", "data": []}', '{"status": "success", "data": {"activeTargets": 7}}',
    '{"status": "success", "data": {"activeTargets": [{"scrapePool": [[[["dcgm-exporter"]]]], "health": "up"}]}}',
    " " * (17 << 20),  # over MAX_TARGETS_BODY
])
def test_a_hostile_targets_answer_is_a_finding(body, monkeypatch):
    # issue 28 item 7: deep JSON from the targets API raised a RecursionError out of verify
    import time

    inv = inventory("{enabled: true, prometheus: deploy}")
    kube = cluster(inv)
    kube.raw[targets_path("gpu-monitoring", "prometheus", 9090)] = body
    monkeypatch.setattr(MonitoringVerify, "target_wait", 0.0)
    t0 = time.monotonic()
    bad, _ = verdicts(inv, kube)
    assert time.monotonic() - t0 < 1.0
    # not a targets list: Prometheus named as not answering; a list without a usable target: none for the nodes
    assert bad in ({"cluster": "monitoring.prometheus-missing"},
                   {"gpu-1": "monitoring.target-missing", "gpu-2": "monitoring.target-missing"}), bad


def test_targets_of_any_shape_are_read_without_an_exception():
    from gpuk8s.phases.monitoring_verify import exporter_targets, target_node

    body = json.dumps({"status": "success", "data": {"activeTargets": [
        {"scrapePool": "serviceMonitor/gpu-monitoring/dcgm-exporter/0", "discoveredLabels": ["x"],
         "labels": {"node": {"a": 1}}, "health": ["up"]},
        {"scrapePool": "dcgm-exporter", "discoveredLabels": {"__meta_kubernetes_pod_node_name": "gpu-1"}}]}})
    got = exporter_targets(body)
    assert [target_node(t) for t in got] == ["", "gpu-1"]


def test_verify_with_prometheus_none_checks_the_exporters_only():
    inv = inventory("{enabled: true, prometheus: none}")
    kube = cluster(inv, targets={})
    assert verdicts(inv, kube)[0] == {}
    assert not any(c[0] == "raw_get" and c[1].endswith("/targets") for c in kube.calls)


def test_an_object_deleted_by_hand_is_applied_again():
    inv = inventory()
    kube = FakeKube()
    Monitoring().run(ctx_for(inv, kube))
    kube.delete("service", ["dcgm-exporter"], "gpu-monitoring")  # the DaemonSet, which carries the hash, stays
    r = Monitoring().run(ctx_for(inv, kube))
    assert r.status == "changed" and r.message.startswith("applied dcgm-exporter.yaml (")
    assert ("service", "gpu-monitoring", "dcgm-exporter") in kube.objects


def test_names_from_the_api_are_checked_before_they_reach_a_proxy_path():
    # review finding 20: a pod (or namespace) name read from the API goes into an API server path
    from gpuk8s.kube.client import KubeError

    with pytest.raises(KubeError):
        metrics_path("gpu-monitoring", "x:1/proxy/../../../../api/v1/secrets")
    with pytest.raises(KubeError):
        targets_path("ns/../kube-system", "prometheus-operated", 9090)
    assert metrics_path("gpu-monitoring", "dcgm-exporter-abc.1") == \
        "/api/v1/namespaces/gpu-monitoring/pods/dcgm-exporter-abc.1:9400/proxy/metrics"
    inv = inventory("{enabled: true, prometheus: deploy}")
    kube = cluster(inv)
    pod = kube.objects.pop(("pod", "gpu-monitoring", "dcgm-exporter-gpu-1"))
    hostile = "a:1/proxy/../../../../secrets"
    pod["metadata"]["name"] = hostile
    kube.objects[("pod", "gpu-monitoring", hostile)] = pod
    bad, _ = verdicts(inv, kube)
    assert bad.get("gpu-1") == "monitoring.metrics-unreadable"
    assert not any(c[0] == "raw_get" and hostile in c[1] for c in kube.calls)
    # a prometheus-operated Service in a namespace with a hostile name is not asked (nor named)
    inv = inventory("{enabled: true, prometheus: servicemonitor}")
    kube = cluster(inv)
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Service",
                               "metadata": {"name": "prometheus-operated", "namespace": "obs/../x"}}))
    bad, _ = verdicts(inv, kube)
    assert bad == {"cluster": "monitoring.prometheus-missing"}
    assert not any(c[0] == "raw_get" and "obs/../x" in c[1] for c in kube.calls)


def _users(kind: str, name: str, ns: str, **md: object) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": ns, **md}})


def test_remove_keeps_the_namespace_while_an_object_of_the_users_is_in_it():
    # review finding 9: an Alertmanager the user installed in gpuk8s's namespace must survive --remove
    inv = inventory("{enabled: true, grafana: true}")
    kube = FakeKube()
    Monitoring().run(ctx_for(inv, kube))
    ns = "gpu-monitoring"
    # what Kubernetes adds itself, and the pods of gpuk8s's own DaemonSet: none of them keeps the namespace
    kube.apply(_users("ConfigMap", "kube-root-ca.crt", ns) + "---\n" + _users("ServiceAccount", "default", ns)
               + "---\n" + _users("Pod", "dcgm-exporter-x1", ns,
                                  ownerReferences=[{"kind": "DaemonSet", "name": "dcgm-exporter"}]))
    kube.apply(_users("Deployment", "alertmanager", ns, labels={"app.kubernetes.io/managed-by": "Helm"}))
    plan = Monitoring(remove=True).plan(ctx_for(inv, kube))
    assert not any(c.what == f"delete Namespace/{ns}" for c in plan.changes)
    assert "deployment/alertmanager" in plan.reason
    r = Monitoring(remove=True).run(ctx_for(inv, kube))
    assert r.status == "changed" and f"kept namespace {ns}" in r.message and "deployment/alertmanager" in r.message
    assert ("namespace", "", ns) in kube.objects and ("deployment", ns, "alertmanager") in kube.objects
    assert ("daemonset", ns, "dcgm-exporter") not in kube.objects
    assert not any(c[:2] == ("delete", "namespace") for c in kube.calls)
    # once the user's object is gone (and the garbage collector took the DaemonSet's pod), the next --remove
    # deletes the namespace gpuk8s created
    kube.delete("deployment", ["alertmanager"], ns)
    kube.delete("pod", ["dcgm-exporter-x1"], ns)
    r = Monitoring(remove=True).run(ctx_for(inv, kube))
    assert r.status == "changed" and ("namespace", "", ns) not in kube.objects


def test_an_object_of_the_users_with_the_same_name_is_never_overwritten():
    # review finding 10: the Grafana Helm chart's Deployment/Service `grafana` in the user's namespace
    inv = inventory("{enabled: true, namespace: monitoring, grafana: true}")
    kube = FakeKube()
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}}))
    helm = {"labels": {"app.kubernetes.io/managed-by": "Helm"}, "annotations": {"meta.helm.sh/release-name": "g"}}
    kube.apply(_users("Deployment", "grafana", "monitoring", **helm) + "---\n"
               + _users("Service", "grafana", "monitoring", **helm))
    before = dict(kube.objects)
    writes = len(kube.writes)
    [plan] = plan_phases([Monitoring()], ctx_for(inv, kube))
    assert plan.status == "unknown" and "monitoring.name-taken" in plan.reason and "Deployment/grafana" in plan.reason
    r = run_phases_one(Monitoring(), ctx_for(inv, kube))
    assert r.status == "failed" and r.message.startswith("monitoring.name-taken: ")
    assert "Deployment/grafana" in r.message and "Service/grafana" in r.message and "namespace" in r.remedy
    assert len(kube.writes) == writes and kube.objects == before  # nothing applied at all
    # --remove leaves them too (they never got gpuk8s's annotation)
    Monitoring(remove=True).run(ctx_for(inv, kube))
    assert {("deployment", "monitoring", "grafana"), ("service", "monitoring", "grafana")} <= set(kube.objects)
    # an object gpuk8s applied whose annotation was edited away (labels kept) is still gpuk8s's: repaired
    inv = inventory("{enabled: true}")
    kube = FakeKube()
    Monitoring().run(ctx_for(inv, kube))
    kube.objects[("daemonset", "gpu-monitoring", "dcgm-exporter")]["metadata"]["annotations"] = {}
    r = Monitoring().run(ctx_for(inv, kube))
    assert r.status == "changed" and r.message.startswith("applied dcgm-exporter.yaml")


def run_phases_one(phase, ctx):
    results: list = []
    run_phases([phase], ctx, results)
    return results[0]


def test_gpuk8s_monitoring_over_ssh_takes_the_cluster_lock_first(monkeypatch):
    # as install, reset and upgrade: never beside another run that changes the cluster
    from gpuk8s.phases.base import PhaseError
    from gpuk8s.phases.lock import Lock

    inv = inventory()
    kube = FakeKube()
    order: list[str] = []

    def locked(self, ctx):
        order.append("lock")
        ctx.kube_client = kube  # (what the SSH session to the first control plane would give)
        return self.result("changed", "held")

    monkeypatch.setattr(Lock, "run", locked)
    ctx = Context(inv, plans=gpuplan.plans(inv))
    ctx.initialized_cache = True
    rep = flows.monitoring(ctx, remove=False, dry_run=False)
    assert order == ["lock"] and [p.name for p in rep.phases] == ["lock", "monitoring"]
    assert rep.phases[1].status == "changed" and rep.ok

    def busy(self, ctx):
        raise PhaseError("another gpuk8s run is changing this cluster: alice (lock on cp-1)", "wait")

    monkeypatch.setattr(Lock, "run", busy)
    ctx = Context(inv, plans=gpuplan.plans(inv))
    ctx.initialized_cache = True
    rep = flows.monitoring(ctx, remove=True, dry_run=False)
    assert [(p.name, p.status) for p in rep.phases] == [("lock", "failed")] and not rep.ok  # monitoring not run
    # with a local kubeconfig no host is contacted over SSH: no lock
    ctx = Context(inv, kube_client=FakeKube(), plans=gpuplan.plans(inv))
    ctx.initialized_cache = True
    assert [p.name for p in flows.monitoring(ctx, remove=False, dry_run=False).phases] == ["monitoring"]


def test_eight_shared_gpus_with_22_pods_each_fit_the_bounded_read():
    """Each pod on a shared GPU repeats the device's series: the fields counted must fit the read's bound."""
    lines = []
    for g in range(8):
        for p in range(22):
            for field in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK",
                          "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
                lines.append(f'{field}{{gpu="{g}",UUID="GPU-{g}",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",'
                             f'Hostname="n",pod="p{p}",namespace="ml",container="c"}} 1')
    assert len(devices(device_series("\n".join(lines) + "\n"))) == 8
