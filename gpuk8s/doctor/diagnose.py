"""A doctor run: read the cluster through the kube client seam and each node concerned over SSH (one round trip:
the fact probe, gpuk8s/facts/probe.sh, plus the kubelet's device-plugin sockets and the /dev/char links of the
NVIDIA devices, framed the same way), choose what to look at, and classify (gpuk8s/doctor/classify.py)."""

from __future__ import annotations

from typing import Any

from gpuk8s import findings, gpuplan
from gpuk8s.doctor import classify
from gpuk8s.doctor.evidence import (
    DEVICE_PLUGINS,
    ENVVAR_UNPRIVILEGED,
    HAMI_SCHEDULER,
    TOOLKIT_CONFIG,
    ClusterEvidence,
    HostEvidence,
    parse_host,
)
from gpuk8s.facts.health import KERNEL_SECTION
from gpuk8s.findings import Finding
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube import dra, manifests, state
from gpuk8s.kube.client import KubeClient, KubeError
from gpuk8s.kube.state import StateError
from gpuk8s.logs import mask
from gpuk8s.preflight.runner import PROBE
from gpuk8s.remote import RemoteError, Session, for_each_host, in_one_piece
from gpuk8s.text import clean

# After the probe, in the probe's framing: the kubelet's device-plugin sockets, the /dev/char links that point at
# NVIDIA device nodes (`nvidia-ctk system create-dev-char-symlinks` makes them), the NVIDIA device nodes.
EXTRA = f"""
sockets() {{ ls -1A {DEVICE_PLUGINS} 2>/dev/null; true; }}
quick doctor-sockets sockets
devchar() {{ ls -l /dev/char 2>/dev/null | grep -c -- '-> \\.\\./nvidia'; true; }}
quick doctor-devchar devchar
devnodes() {{ ls -1 /dev 2>/dev/null | grep '^nvidia' ; true; }}
quick doctor-devnodes devnodes
toolkitcfg() {{ grep -E '^[[:space:]]*"?{ENVVAR_UNPRIVILEGED}"?[[:space:]]*=' {TOOLKIT_CONFIG} 2>/dev/null; true; }}
quick doctor-toolkit toolkitcfg
"""
SCRIPT = PROBE + EXTRA + KERNEL_SECTION  # and the kernel's Xid lines since boot, as gpuk8s health reads them


def read_host(session: Session, runtime: str) -> HostEvidence:
    """One round trip: the probe and doctor's extra sections, as root."""
    try:
        session.connect()
        res = session.run(in_one_piece(SCRIPT), sudo=True, timeout=120, display="gpuk8s doctor probe (read-only)")
    except RemoteError as e:
        return HostEvidence(unreachable=e.message, runtime=runtime)
    return parse_host(res.stdout, runtime)


# What doctor reads of a busy cluster, narrowed by the API server (issue 27: a list is the cost of a run at scale):
# pods that are not done (a Succeeded pod holds no GPU and has nothing wrong; a Failed one, e.g. rejected at
# admission, stays), and only the pods' warning events: what doctor judges by is Warning (the scheduler's
# FailedScheduling, the kubelet's FailedCreatePodSandBox, Failed, BackOff restarting a container, ...); the kubelet's
# "Back-off pulling image" is Normal, and left out: its Warning "Failed to pull image" events say why.
PODS_NOT_DONE = "status.phase!=Succeeded"
POD_WARNINGS = "involvedObject.kind=Pod,type=Warning"


def read_cluster(kube: KubeClient, every_pod: bool = False) -> ClusterEvidence:
    """The nodes, the pods that are not done (every pod with `every_pod`: a pod named by the user may have
    succeeded), the pods' warning events, the device plugin DaemonSet and its config names, HAMi's scheduler."""
    nodes = state.by_name(kube.get("nodes"))
    pods = kube.get("pods", namespace="*", field_selector=None if every_pod else PODS_NOT_DONE)
    try:
        events = kube.events(field_selector=POD_WARNINGS)
    except KubeError:
        events = []
    plugin = None
    found = kube.get("daemonset", state.DEVICE_PLUGIN, "kube-system")
    if found:
        try:
            plugin = state.daemonset_state(found[0])
        except StateError:
            plugin = None
    cm = kube.get("configmap", manifests.PLUGIN_CONFIGS, "kube-system")
    configs = tuple(sorted((cm[0].get("data") or {}).keys())) if cm else None
    hami = bool(kube.get("deployment", HAMI_SCHEDULER, "kube-system"))
    ev = ClusterEvidence(nodes, pods, events, plugin=plugin, configs=configs, hami_scheduler=hami)
    if any(dra.labelled(n) for n in nodes.values()) or any(
            isinstance(p, dict) and isinstance(p.get("spec"), dict) and p["spec"].get("resourceClaims") for p in pods):
        # DRA in use (docs/dra.md): the slices, the claims and their templates, three reads, only then
        ev.dra = dra.by_node(kube.get("resourceslices"), kube.get("resourceclaims", namespace="*"))
        for t in kube.get("resourceclaimtemplates", namespace="*"):
            md = t.get("metadata") if isinstance(t, dict) else None
            if isinstance(md, dict) and isinstance(md.get("name"), str):
                ev.claim_templates[(str(md.get("namespace") or "default"), md["name"])] = t
    return ev


# lines of a pod's log read: an NCCL failure is followed by the framework's traceback (PyTorch's: 30 lines and more)
LOG_TAIL = 200


def read_logs(kube: KubeClient, ev: ClusterEvidence, pods: list[tuple[str, str]], tail: int = LOG_TAIL) -> None:
    for ns, name in pods:
        if (ns, name) not in ev.logs:
            try:
                ev.logs[(ns, name)] = kube.logs(name, ns, tail=tail)
            except KubeError as e:
                ev.logs[(ns, name)] = e.message


SCHEMA_VERSION = 1


class Diagnosis:
    """One doctor run: the evidence read, what was looked at, and the causes found."""

    def __init__(self, ev: ClusterEvidence, pods: list[tuple[str, str]], nodes: list[str],
                 found: list[Finding]) -> None:
        self.ev, self.pods, self.nodes, self.findings = ev, pods, nodes, found

    def to_json(self, fixes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "ok": not self.findings,
                "checked": {"pods": [f"{ns}/{n}" for ns, n in self.pods], "nodes": list(self.nodes)},
                **findings.to_json(self.findings), "fixes": fixes or []}


def find_pod(ev: ClusterEvidence, target: str) -> tuple[str, str] | None:
    if "/" in target:
        ns, _, name = target.partition("/")
        return (ns, name) if ev.pod(ns, name) is not None else None
    hits = [classify.pod_key(p) for p in ev.pods if (p.get("metadata") or {}).get("name") == target]
    return hits[0] if len(hits) == 1 else None


def diagnose(inv: Inventory, kube: KubeClient, target: str | None, every: bool, ssh: bool,
             sudo: dict[str, str]) -> Diagnosis:
    """Read, select what to look at, read its hosts and logs, classify. LookupError: no such pod or node."""
    ev = read_cluster(kube, every_pod=bool(target) and not str(target).startswith("node/"))
    ev.plans = gpuplan.plans(inv)
    hosts = {h.name: h for h in inv.hosts}
    pods: list[tuple[str, str]] = []
    nodes: list[str] = []
    if target and target.startswith("node/"):
        nodes = [target[len("node/"):]]
        if nodes[0] not in ev.nodes and nodes[0] not in ev.plans:
            raise LookupError(f"no node {nodes[0]} in the cluster or the inventory")
    elif target:
        key = find_pod(ev, target)
        if key is None:
            raise LookupError(f"no pod {target} (give NAMESPACE/NAME when the name is in several namespaces)")
        pods = [key]
    else:
        gpu_pods = [p for p in ev.pods if classify.is_gpu_pod(p)]
        pods = [classify.pod_key(p) for p in gpu_pods if every or classify.troubled(p)]
        nodes = [n for n, p in ev.plans.items() if p.gpu_node and (every or classify.node_problem(n, ev))]
    # the hosts concerned: the nodes, and the nodes the pods are bound to
    concern = set(nodes)
    for ns, name in pods:
        p = ev.pod(ns, name)
        if p is not None and (p.get("spec") or {}).get("nodeName"):
            concern.add(str(p["spec"]["nodeName"]))
    if ssh:
        def read(h: Host) -> HostEvidence:
            with Session(h, sudo.get(h.name)) as s:
                return read_host(s, inv.cluster.container_runtime)

        got = for_each_host([hosts[n] for n in sorted(concern) if n in hosts], read, 16)
        for n, v in got.items():
            ev.hosts[n] = v if isinstance(v, HostEvidence) else HostEvidence(
                unreachable=f"reading the host failed: {mask(clean(str(v)))[:300]}",
                runtime=inv.cluster.container_runtime)
        facts = {n: h.facts for n, h in ev.hosts.items() if h.facts is not None}
        ev.plans = gpuplan.plans(inv, facts)
    logs = [k for k in pods if (ev.pod(*k) or {}).get("spec", {}).get("nodeName")]
    for n in concern:
        plugin = classify.plugin_pod(ev, n)
        if plugin is not None:
            logs.append(classify.pod_key(plugin))
    read_logs(kube, ev, logs)
    found: list[Finding] = []
    for n in nodes:
        h = ev.hosts.get(n)
        if h is not None and h.unreachable and n not in ev.nodes:
            continue
        found += classify.node_causes(n, ev)
    for ns, name in pods:
        p = ev.pod(ns, name)
        if p is not None:
            found += classify.pod_causes(p, ev)
    return Diagnosis(ev, pods, sorted(nodes), found)
