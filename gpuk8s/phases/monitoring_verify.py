"""Phase monitoring-verify (`gpuk8s verify` with monitoring enabled): every GPU node's DCGM exporter pod
Running, its /metrics with series of every GPU of the node's plan (per MIG device: the exporter publishes a MIG
GPU's fields per GPU instance and none for the GPU itself, and no _UTIL field for an instance; per physical GPU
under sharing), read through the API server's pod proxy so that no port must be open; pods
attributed (the pod-resources mount); and Prometheus reporting every exporter target up.

The Prometheus asked is one the inventory names: gpuk8s's own in `monitoring.namespace` (deploy), or the
Prometheus Operator's Service prometheus-operated in `monitoring.prometheus_namespace` (servicemonitor), never a
Service of that name found elsewhere (anyone who may create a Service could answer for it). Its answer is
bounded (MAX_TARGETS_BODY), and any JSON, however nested, is a finding, never an exception.

Every verdict is a finding (gpuk8s/findings.py, ids monitoring.*), about its node or the cluster. The
metrics are parsed with prometheus-client's parser of the text exposition format, not by hand, after
gpuk8s/kube/allocation.dcgm_text has kept only the bounded lines of the series read (the parser is quadratic
on hostile text, and the exporter runs on a node that may be compromised).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuk8s import findings
from gpuk8s.errors import MetricsError
from gpuk8s.findings import Finding
from gpuk8s.gpuplan import GPU_RESOURCE, GPUPlan
from gpuk8s.kube import monitoring as mon
from gpuk8s.kube import state
from gpuk8s.kube.allocation import METRICS_MAX_BYTES, dcgm_text
from gpuk8s.kube.client import KubeError
from gpuk8s.kube.state import DNS1123_LABEL, DNS1123_SUBDOMAIN
from gpuk8s.phases.base import Context, Phase, PhasePlan, PhaseResult
from gpuk8s.phases.poll import until
from gpuk8s.text import clean

UTIL = "DCGM_FI_DEV_GPU_UTIL"
# The fields whose series name a device: GPU_UTIL for whole GPUs; for a MIG GPU's instances, which get no _UTIL field
# (NVIDIA/dcgm-exporter #430, #50) nor FB_USED/FB_FREE on an H100 (#512, #380), the GPU-level GPU_TEMP and SM_CLOCK the
# exporter repeats per instance (its commit 0770e7c; NVIDIA/gpu-operator#313, #687) and GR_ENGINE_ACTIVE where the
# profiling counters are on (tests/fixtures/real/dcgm/mig-*). Four, not every field: each pod on a shared GPU repeats
# a device's series, and the read is bounded (allocation.METRICS_MAX_SERIES; 8 GPUs x 22 pods x 3 default fields is
# 528 lines).
DEVICE_FIELDS = (UTIL, "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
NVML_MARKERS = ("NVML", "libnvidia-ml")  # the exporter's log when the container has no NVML
MIG_PREFIX = "nvidia.com/mig-"
MAX_TARGETS_BODY = 16 << 20  # Prometheus's /api/v1/targets: a few KiB per target; more is not a targets list


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    value: float


def device_series(text: str) -> list[Series]:
    """The samples of DEVICE_FIELDS in an exporter's /metrics text (prometheus-client's parser, on the bounded lines
    of those series only: allocation.dcgm_text; the text is a node's, maybe hostile)."""
    text = dcgm_text(text, DEVICE_FIELDS)  # a MetricsError when the body is too large or too many series
    try:
        return [Series(dict(s.labels), float(s.value)) for fam in text_string_to_metric_families(text)
                for s in fam.samples if s.name in DEVICE_FIELDS]
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise MetricsError(f"not the Prometheus text format: {clean(str(e))[:200]}") from None


def devices(series: list[Series]) -> set[tuple[str, str]]:
    """The distinct devices the series are about: (gpu, GPU_I_ID) - a MIG instance is its own device, and
    under sharing several pods' series of one GPU are one device."""
    return {(s.labels.get("gpu", ""), s.labels.get("GPU_I_ID", "")) for s in series}


def expected_devices(plan: GPUPlan) -> int:
    """How many devices the exporter must report: the MIG devices of the plan, else its physical GPUs."""
    mig = sum(n for r, n in plan.resources.items() if r.startswith(MIG_PREFIX))
    return mig or (plan.gpus or 0)


def mounts_pod_resources(ds: dict[str, Any]) -> bool:
    """Whether the exporter DaemonSet mounts the kubelet's pod-resources directory in its container."""
    spec = ds.get("spec", {}).get("template", {}).get("spec", {})
    vols = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    for c in spec.get("containers") or []:
        for m in c.get("volumeMounts") or []:
            v = vols.get(m.get("name"), {})
            if (v.get("hostPath") or {}).get("path", "").rstrip("/") == POD_RESOURCES:
                return True
    return False


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def gpu_pods_running(pods: list[dict[str, Any]]) -> dict[str, list[str]]:
    """node -> the Running pods there that asked for GPUs."""
    out: dict[str, list[str]] = {}
    for p in pods:  # every namespace's: a field not shaped as the API shapes it counts as absent
        spec, st, md = _obj(p.get("spec")), _obj(p.get("status")), _obj(p.get("metadata"))
        containers = spec.get("containers")
        limits = [_obj(_obj(_obj(c).get("resources")).get("limits")).get(GPU_RESOURCE)
                  for c in (containers if isinstance(containers, list) else [])]
        wants = any(isinstance(n, (str, int)) and str(n) not in ("0", "") for n in limits)
        node, name = spec.get("nodeName"), md.get("name")
        if wants and st.get("phase") == "Running" and isinstance(node, str) and node and isinstance(name, str):
            out.setdefault(node, []).append(name)
    return out


# a name read from the API goes into an API server path only when it is a Kubernetes name (state.DNS1123_*), so it
# cannot climb out of the proxy path


def _name(value: str, what: str, pattern: re.Pattern[str]) -> str:
    if not pattern.match(value):
        raise KubeError(f"the API named a {what} {clean(value)[:80]!r}: not a Kubernetes name, not used in a path",
                        "check who changes objects in the monitoring namespace")
    return value


def targets_path(ns: str, service: str, port: int) -> str:
    return (f"/api/v1/namespaces/{_name(ns, 'namespace', DNS1123_LABEL)}/services/"
            f"{_name(service, 'service', DNS1123_LABEL)}:{int(port)}/proxy/api/v1/targets")


def metrics_path(ns: str, pod: str) -> str:
    return (f"/api/v1/namespaces/{_name(ns, 'namespace', DNS1123_LABEL)}/pods/"
            f"{_name(pod, 'pod', DNS1123_SUBDOMAIN)}:{mon.METRICS_PORT}/proxy/metrics")


def exporter_targets(body: str) -> list[dict[str, Any]]:
    """The active targets of /api/v1/targets that scrape the DCGM exporter. ValueError for anything else: a body
    over MAX_TARGETS_BODY, text that is not JSON, JSON nested deeper than the parser recurses, another shape."""
    if len(body) > MAX_TARGETS_BODY:
        raise ValueError(f"the targets API answered more than {MAX_TARGETS_BODY >> 20} MiB")
    try:
        data = json.loads(body)
    except RecursionError:
        raise ValueError("the targets API answered JSON nested too deep") from None
    if not isinstance(data, dict) or data.get("status") != "success":
        raise ValueError("the targets API did not answer status success")
    inner = data.get("data")
    active = inner.get("activeTargets", []) if isinstance(inner, dict) else None
    if active is None and isinstance(inner, dict):
        active = []  # none yet (null): no target, as an empty list
    if not isinstance(active, list):
        raise ValueError("the targets API's answer has no list of active targets")
    return [t for t in active if isinstance(t, dict) and mon.EXPORTER in _text(t.get("scrapePool"))]


def _text(value: Any) -> str:
    """A string field of a target; '' for any other JSON value (never the str() of a nested one)."""
    return value if isinstance(value, str) else ""


def _labels(t: dict[str, Any], key: str) -> dict[str, Any]:
    value = t.get(key)
    return value if isinstance(value, dict) else {}


def target_node(t: dict[str, Any]) -> str:
    return (_text(_labels(t, "discoveredLabels").get("__meta_kubernetes_pod_node_name"))
            or _text(_labels(t, "labels").get("node")))


@dataclass
class MonitoringCheck:
    """What verify found about monitoring: one finding per GPU node (and per misplaced exporter), and the
    Prometheus findings."""

    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)


class MonitoringVerify(Phase):
    name = "monitoring-verify"
    title = "verify the DCGM exporter and Prometheus"
    fatal = False
    target_wait = 30.0  # seconds to wait for targets Prometheus has not scraped yet (health "unknown")

    def plan(self, ctx: Context) -> PhasePlan:
        return self.planned("unchanged", "read every GPU node's exporter /metrics through the API server's pod proxy "
                            "and Prometheus's targets (changes nothing)")

    def run(self, ctx: Context) -> PhaseResult:
        check = self.check(ctx)
        r = self.result("passed" if check.ok else "failed")
        bad = [f for f in check.findings if not f.ok]
        for f in check.findings:
            subject = f.subject.name if f.subject else "cluster"
            r.hosts[subject] = (r.hosts.get(subject, "") + "; " if subject in r.hosts else "") + \
                (f"{f.id}: {f.message}" if not f.ok else f.message)
        if bad:
            r.message = f"{len(bad)} problem(s): " + "; ".join(f"{f.subject}: {f.id}" for f in bad)
            r.remedy = "; ".join(dict.fromkeys(f.remedy for f in bad if f.remedy))
        else:
            r.message = f"{sum(1 for f in check.findings if f.id == 'monitoring.verified')} exporter(s) serve every GPU"
        return r

    def check(self, ctx: Context) -> MonitoringCheck:
        ns = ctx.inv.monitoring.namespace
        out = MonitoringCheck()
        ds = ctx.kube.get("daemonset", mon.EXPORTER, ns)
        raw_pods = [p for p in ctx.kube.get("pods", namespace=ns)
                    if (p.get("metadata", {}).get("labels") or {}).get(mon.NAME_LABEL) == mon.EXPORTER]
        pods = {p.node: p for p in state.pod_states(raw_pods)}
        nodes = set(state.by_name(ctx.kube.get("nodes")))
        gpu_nodes = {p.node: p for p in ctx.plans.values() if p.gpu_node and p.node in nodes}
        for node, pod in sorted(pods.items()):
            if node and node not in gpu_nodes and node in ctx.plans:
                out.findings.append(findings.failed(
                    "monitoring.exporter-misplaced", f"the exporter pod {pod.name} runs on {node}, not a GPU node",
                    "re-run gpuk8s monitoring (its nodeSelector is nvidia.com/gpu.present=true); remove that label "
                    "from CPU nodes", subject=findings.node(node)))
        mounted = bool(ds) and mounts_pod_resources(ds[0])
        gpu_pods = gpu_pods_running(ctx.kube.get("pods", namespace="*")) if gpu_nodes else {}
        healthy: list[str] = []
        for node, plan in sorted(gpu_nodes.items()):
            f = self._node(ctx, ns, plan, pods.get(node), bool(ds), mounted, gpu_pods.get(node, []))
            out.findings.append(f)
            if f.id not in ("monitoring.exporter-missing", "monitoring.exporter-not-running",
                            "monitoring.exporter-nvml"):
                healthy.append(node)
        out.findings += self._targets(ctx, ns, healthy)  # a node without a running exporter is named above
        return out

    def _node(self, ctx: Context, ns: str, plan: GPUPlan, pod: state.PodState | None, ds: bool, mounted: bool,
              gpu_pods: list[str]) -> Finding:
        subject = findings.node(plan.node)
        if pod is None:
            why = "the DaemonSet dcgm-exporter does not exist" if not ds else \
                "the node lacks the label nvidia.com/gpu.present=true or has a taint the exporter does not tolerate"
            return findings.failed("monitoring.exporter-missing", f"no DCGM exporter pod on {plan.node}: {why}",
                                   "run gpuk8s monitoring (it applies the DaemonSet with the GPU plan's labels and "
                                   "tolerations)", subject=subject)
        evidence: tuple[str, ...] = (
            f"pod {pod.name}: phase {pod.phase or '?'}" + (f", waiting {pod.waiting}" if pod.waiting else "")
            + (f", restarts {pod.restarts}" if pod.restarts else ""),)
        if pod.phase != "Running" or pod.waiting:
            log = ctx.kube.logs(pod.name, ns, tail=20)
            lines = tuple(clean(x)[:300] for x in log.splitlines() if x.strip())[-6:]
            if any(m in log for m in NVML_MARKERS):
                return findings.failed(
                    "monitoring.exporter-nvml",
                    f"the DCGM exporter on {plan.node} cannot load NVML: the container runtime's default on the node "
                    "is not nvidia, so the container gets no driver libraries",
                    "make nvidia the default runtime on the node (gpuk8s install does; see gpuk8s preflight's "
                    "toolkit.default-runtime), then delete the exporter pod", subject=subject,
                    evidence=evidence + lines)
            return findings.failed("monitoring.exporter-not-running",
                                   f"the DCGM exporter pod {pod.name} on {plan.node} is not running",
                                   f"kubectl -n {ns} describe pod {pod.name}", subject=subject,
                                   evidence=evidence + lines)
        try:
            series = device_series(ctx.kube.raw_get(metrics_path(ns, pod.name), cap=METRICS_MAX_BYTES))
        except (KubeError, MetricsError) as e:
            msg = e.message if isinstance(e, KubeError) else str(e)
            return findings.failed("monitoring.metrics-unreadable",
                                   f"the exporter's /metrics on {plan.node} could not be read: {msg}",
                                   f"kubectl -n {ns} logs {pod.name}", subject=subject, evidence=evidence)
        want, got = expected_devices(plan), devices(series)
        evidence += (f"{len(series)} device series, {len(got)} device(s), {want} planned",)
        if len(got) < want:
            return findings.failed("monitoring.series-count",
                                   f"the exporter on {plan.node} reports {len(got)} GPU(s), the plan has {want}",
                                   "check the GPUs with nvidia-smi on the node and the exporter's log",
                                   subject=subject, evidence=evidence)
        if not mounted:
            return findings.failed("monitoring.no-pod-labels",
                                   f"the exporter on {plan.node} cannot name the pods using GPUs: "
                                   f"{POD_RESOURCES} is not mounted in it",
                                   "re-run gpuk8s monitoring (its DaemonSet mounts the kubelet's pod-resources "
                                   "directory read-only)", subject=subject, evidence=evidence)
        if gpu_pods and not any(s.labels.get("pod") for s in series):
            return findings.failed("monitoring.no-pod-labels",
                                   f"GPU pods run on {plan.node} ({', '.join(gpu_pods[:3])}) but no series names a "
                                   "pod", "check that the kubelet's pod-resources socket exists "
                                   f"({POD_RESOURCES}/kubelet.sock) and the exporter's log", subject=subject,
                                   evidence=evidence)
        return findings.passed("monitoring.verified",
                               f"exporter {pod.name}: {len(got)} GPU(s) reported, as planned", subject=subject,
                               evidence=evidence)

    def _prometheus(self, ctx: Context, ns: str) -> tuple[str, str] | None:
        """(namespace, targets API path) of the Prometheus to ask, None when monitoring.prometheus is none; the
        path is '' when the Operator's Service is not in the namespace the inventory names."""
        mode = mon.resolve_mode(ctx.inv, ctx.kube)
        if mode == "none":
            return None
        if mode == "deploy":
            return ns, targets_path(ns, mon.PROMETHEUS, mon.PROMETHEUS_PORT)
        # the namespace comes from the inventory: a tenant's Service prometheus-operated in a namespace of theirs
        # would otherwise answer for Prometheus (every target up)
        prom_ns = ctx.inv.monitoring.prometheus_namespace or ns
        if not ctx.kube.get("service", mon.OPERATOR_SERVICE, prom_ns):
            return prom_ns, ""
        return prom_ns, targets_path(prom_ns, mon.OPERATOR_SERVICE, mon.PROMETHEUS_PORT)

    def _elsewhere(self, ctx: Context) -> list[str]:
        """The namespaces where a Service prometheus-operated exists (at most 5, Kubernetes names only): named
        in the remedy, never asked."""
        try:
            found = ctx.kube.get("service", namespace="*")
        except KubeError:
            return []
        out: list[str] = []
        for svc in found:
            md = svc.get("metadata") if isinstance(svc, dict) else None
            svc_ns = md.get("namespace") if isinstance(md, dict) else None
            if md and md.get("name") == mon.OPERATOR_SERVICE and isinstance(svc_ns, str) \
                    and DNS1123_LABEL.match(svc_ns) and svc_ns not in out:
                out.append(svc_ns)
        return out[:5]

    def _targets(self, ctx: Context, ns: str, nodes: list[str]) -> list[Finding]:
        where = self._prometheus(ctx, ns)
        if where is None or not nodes:
            return []
        prom_ns, path = where
        if not path:
            seen = self._elsewhere(ctx)
            hint = f" (Services prometheus-operated exist in: {', '.join(seen)}; not asked)" if seen else ""
            return [findings.failed("monitoring.prometheus-missing",
                                    f"no Prometheus Operator Service (prometheus-operated) in namespace {prom_ns}"
                                    + hint,
                                    "set monitoring.prometheus_namespace to the namespace of your Prometheus resource "
                                    "(kubectl get prometheus -A), or set monitoring.prometheus: deploy",
                                    subject=findings.cluster())]
        def scraped() -> tuple[bool, dict[str, Any] | str]:
            """Every target scraped at least once (no health "unknown"), by node; or why the API did not answer."""
            try:
                targets = exporter_targets(ctx.kube.raw_get(path))
            except (KubeError, ValueError) as e:
                return True, e.message if isinstance(e, KubeError) else str(e)
            by_node = {target_node(t): t for t in targets}
            return not any(_text(by_node[n].get("health")) == "unknown" for n in nodes if n in by_node), by_node

        by_node = until(scraped, self.target_wait, 3)[1]
        if isinstance(by_node, str):
            return [findings.failed("monitoring.prometheus-missing",
                                    f"Prometheus in {prom_ns} did not answer its targets API: {by_node}",
                                    f"kubectl -n {prom_ns} get pods; re-run gpuk8s monitoring",
                                    subject=findings.cluster())]
        out = []
        for n in nodes:
            t = by_node.get(n)
            if t is None:
                out.append(findings.failed(
                    "monitoring.target-missing", f"Prometheus has no target for the exporter on {n}",
                    "with a ServiceMonitor: make the Prometheus resource's serviceMonitorSelector and "
                    "serviceMonitorNamespaceSelector select it (docs/monitoring.md); else re-run gpuk8s monitoring",
                    subject=findings.node(n)))
            elif _text(t.get("health")) != "up":
                out.append(findings.failed(
                    "monitoring.target-down", f"Prometheus cannot scrape the exporter on {n}",
                    "see the exporter pod's state and log", subject=findings.node(n),
                    evidence=(clean(_text(t.get("scrapeUrl"))[:200]), clean(_text(t.get("lastError"))[:300]))))
        return out
