"""The monitoring manifests: the DCGM exporter on GPU nodes, and how Prometheus (and Grafana) get its metrics.

Each is a `Manifest` (gpuk8s/kube/manifests.py: applied by content hash) rendered from a template in
gpuk8s/data/. Which nodes the exporter runs on, and which taints it tolerates, come from the GPU plan
(gpuk8s/gpuplan.py); the images from the version matrix (gpuk8s/data/versions.yaml). `monitoring.prometheus`
decides the rest: `servicemonitor` (a ServiceMonitor for the Prometheus Operator), `deploy` (a small
Prometheus with a scrape job), `auto` (servicemonitor when the Operator's CRD exists, else deploy), `none`
(nothing: `scrape_config` is printed for the user's own Prometheus). docs/monitoring.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

import jinja2
import yaml

from gpuk8s import mirrors, versions
from gpuk8s.gpuplan import GPU_PRESENT, GPU_RESOURCE, QUARANTINE_KEY, GPUPlan
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube.client import KubeClient
from gpuk8s.kube.manifests import MANAGED_BY, Manifest, created_by_gpuk8s

EXPORTER = "dcgm-exporter"  # the DaemonSet, its Service, its ServiceMonitor, and the scrape job
NAME_LABEL = "app.kubernetes.io/name"
METRICS_PORT = 9400
PROMETHEUS = "prometheus"
PROMETHEUS_PORT = 9090
GRAFANA = "grafana"
GRAFANA_PORT = 3000
SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"
OPERATOR_SERVICE = "prometheus-operated"  # the Service the Prometheus Operator creates for its Prometheus pods
DASHBOARD = "gpu-dashboard.json"
MODES = ("deploy", "servicemonitor", "none")
SHARED = ("time-slicing", "mps")  # sharing strategies under which the exporter must map virtual GPUs to pods


def _template(name: str) -> str:
    return resources.files("gpuk8s").joinpath(f"data/{name}").read_text(encoding="utf-8")


def _render(name: str, **values: Any) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    return env.from_string(_template(name)).render(**values)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def namespace(inv: Inventory) -> Manifest:
    return Manifest("monitoring-namespace.yaml", yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": inv.monitoring.namespace, "labels": {MANAGED_BY: "gpuk8s"}}}, sort_keys=False))


def gpu_plans(plans: Mapping[str, GPUPlan]) -> list[GPUPlan]:
    return [p for p in plans.values() if p.gpu_node]


def tolerations(plans: Mapping[str, GPUPlan]) -> list[dict[str, str]]:
    """The device plugin's tolerations (its GPUs' and the quarantine's: a quarantined node's GPUs are still watched),
    and one per taint the GPU plan puts on any GPU node."""
    out: list[dict[str, str]] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
                                 {"key": QUARANTINE_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    for p in gpu_plans(plans):
        for t in p.taints:
            tol = ({"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect} if t.value
                   else {"key": t.key, "operator": "Exists", "effect": t.effect})
            if tol not in out:
                out.append(tol)
    return out


def sharing(plan: GPUPlan) -> str:
    """The plan's sharing strategy ("none" where the GPU plan does not say)."""
    return str(getattr(plan, "sharing", "none") or "none")


def virtual_gpus(plans: Mapping[str, GPUPlan]) -> bool:
    """Whether some GPU node shares its GPUs by time-slicing or MPS: KUBERNETES_VIRTUAL_GPUS then."""
    return any(sharing(p) in SHARED for p in gpu_plans(plans))


def exporter(inv: Inventory, plans: Mapping[str, GPUPlan]) -> Manifest:
    return Manifest(f"{EXPORTER}.yaml", _render(
        "dcgm-exporter.yaml.j2", namespace=inv.monitoring.namespace, gpu_label=GPU_PRESENT,
        tolerations=tolerations(plans),
        image=mirrors.image(inv, versions.dcgm_exporter_image(inv.cluster.kubernetes_version)),
        virtual_gpus=virtual_gpus(plans)))


def service_monitor(inv: Inventory) -> Manifest:
    return Manifest(f"{EXPORTER}-servicemonitor.yaml",
                    _render("dcgm-exporter-servicemonitor.yaml.j2", namespace=inv.monitoring.namespace))


def scrape_config(inv: Inventory) -> str:
    """prometheus.yml: one job that finds the exporter's endpoints in the monitoring namespace."""
    cfg = {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "scrape_configs": [{
            "job_name": EXPORTER,
            # the exporter's pod/namespace/container labels name the GPU workload: keep them as they are
            "honor_labels": True,
            "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": [inv.monitoring.namespace]}}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_service_name", "__meta_kubernetes_endpoint_port_name"],
                 "regex": f"{EXPORTER};metrics", "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
            ],
        }],
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def prometheus(inv: Inventory) -> Manifest:
    m = inv.monitoring
    config = scrape_config(inv)
    return Manifest("prometheus.yaml", _render(
        "prometheus.yaml.j2", namespace=m.namespace, scrape_config=config, config_sha256=_sha(config),
        storage_class=m.storage_class or "", storage_size=m.storage_size, retention=m.retention,
        image=mirrors.image(inv, versions.monitoring_image(PROMETHEUS))))


def dashboard() -> str:
    """The Grafana dashboard (JSON text), as shipped."""
    return _template(DASHBOARD)


def dashboard_queries(text: str | None = None) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its template variables."""
    d = json.loads(text if text is not None else dashboard())
    out = [str(t["expr"]) for p in d.get("panels", []) for t in p.get("targets", []) if "expr" in t]
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        out.append(str(q.get("query", "") if isinstance(q, dict) else q or ""))
    return [q for q in out if q]


def grafana(inv: Inventory) -> Manifest:
    ns = inv.monitoring.namespace
    datasources = yaml.safe_dump({"apiVersion": 1, "datasources": [{
        "name": "Prometheus", "uid": "prometheus", "type": "prometheus", "access": "proxy", "isDefault": True,
        "url": f"http://{PROMETHEUS}.{ns}.svc:{PROMETHEUS_PORT}"}]}, sort_keys=False)
    providers = yaml.safe_dump({"apiVersion": 1, "providers": [{
        "name": "gpuk8s", "type": "file", "disableDeletion": True, "allowUiUpdates": False,
        "options": {"path": "/var/lib/grafana/dashboards"}}]}, sort_keys=False)
    board = dashboard()
    return Manifest("grafana.yaml", _render(
        "grafana.yaml.j2", namespace=ns, datasources=datasources, providers=providers, dashboard=board,
        config_sha256=_sha(datasources + providers + board),
        image=mirrors.image(inv, versions.monitoring_image(GRAFANA))))


def resolve_mode(inv: Inventory, kube: KubeClient | None) -> str:
    """deploy | servicemonitor | none. `auto` asks the cluster whether the ServiceMonitor CRD exists
    (without a cluster, `auto` means deploy: what a cluster without the Prometheus Operator gets)."""
    mode = inv.monitoring.prometheus
    if mode != "auto":
        return mode
    if kube is not None and kube.get("customresourcedefinition", SERVICEMONITOR_CRD):
        return "servicemonitor"
    return "deploy"


def wanted(inv: Inventory, plans: Mapping[str, GPUPlan], mode: str, *, own_namespace: bool = True) -> list[Manifest]:
    """The monitoring manifests, in the order they are applied. `own_namespace`: gpuk8s creates the namespace
    (False when it existed before gpuk8s: it is the user's, and `--remove` leaves it)."""
    if mode not in MODES:
        raise ValueError(f"unknown monitoring mode {mode!r}")
    out = [namespace(inv)] if own_namespace else []
    out.append(exporter(inv, plans))
    if mode == "servicemonitor":
        out.append(service_monitor(inv))
    elif mode == "deploy":
        out.append(prometheus(inv))
        if inv.monitoring.grafana:
            out.append(grafana(inv))
    return out


def owns_namespace(inv: Inventory, kube: KubeClient) -> bool:
    """Whether the namespace is gpuk8s's: absent (gpuk8s will create it) or created by gpuk8s."""
    found = kube.get("namespace", inv.monitoring.namespace)
    if not found:
        return True
    return created_by_gpuk8s(found[0])


def objects(ms: list[Manifest]) -> list[tuple[str, str, str | None]]:
    """(kind, name, namespace) of every object of the manifests, in order."""
    out = []
    for m in ms:
        for o in m.objects():
            md = o.get("metadata", {})
            out.append((str(o.get("kind", "")), str(md.get("name", "")), md.get("namespace")))
    return out


def every_manifest(inv: Inventory, plans: Mapping[str, GPUPlan]) -> list[Manifest]:
    """Everything gpuk8s may have applied in any mode (what --remove looks for)."""
    ms = [exporter(inv, plans), service_monitor(inv), prometheus(inv), grafana(inv)]
    if inv.monitoring.storage_class is None:  # a claim made when a storage class was set before
        ms.append(Manifest("prometheus-data.yaml", yaml.safe_dump(
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "prometheus-data", "namespace": inv.monitoring.namespace}})))
    return ms


def rendered(inv: Inventory, plans: dict[str, GPUPlan]) -> dict[str, str]:
    """What `gpuk8s render` writes when monitoring is enabled: the manifests (with `auto` as deploy), the
    scrape configuration and the dashboard (to import into any Grafana)."""
    if not inv.monitoring.enabled:
        return {}
    out = {m.name: m.applied_text() for m in wanted(inv, plans, resolve_mode(inv, None))}
    out["prometheus-scrape-config.yaml"] = scrape_config(inv)
    out["gpu-dashboard.json"] = dashboard()
    return out
