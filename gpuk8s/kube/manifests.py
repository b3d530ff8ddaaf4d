"""The manifests gpuk8s keeps in a cluster, as (name, rendered text), and the one applier.

The applied hash is the SHA-256 of the rendered text: any change of a template, a version or a setting
changes it, and the next install applies the manifest again. It is written on every object of the
manifest as the annotation gpuk8s.io/manifest-sha256; a manifest is unchanged when its first object
carries the hash of the text gpuk8s would apply now.

The annotation is also gpuk8s's proof of ownership: an object is deleted only when it carries it, checked on
each object (`owned`), never because an object of the same name exists (HAMi's own Helm chart, for one,
uses the names of hami.yaml in kube-system).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jinja2
import yaml

from gpuk8s import mirrors, versions
from gpuk8s.errors import GpuK8sError
from gpuk8s.gpuplan import (
    ALLOCATOR_LABEL,
    CONFIG_LABEL,
    DRA,
    FABRIC_LABEL,
    LEGACY_ALLOCATOR_LABEL,
    RDMA_RESOURCE,
    RDMA_RESOURCE_NAME,
    RDMA_RESOURCE_PREFIX,
    RUNTIME_HANDLER,
    GPUPlan,
    PluginSettings,
    is_gpu_node,
)
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube.client import KubeClient
from gpuk8s.kube.dra import DRA_NAME, DRA_NAMESPACE

ANNOTATION = "gpuk8s.io/manifest-sha256"
MANAGED_BY = "app.kubernetes.io/managed-by"  # the label gpuk8s's objects carry, gpuk8s as its value
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"
MPS_DAEMON = "nvidia-device-plugin-mps-control-daemon"
PLUGIN_CONFIGS = "nvidia-device-plugin-configs"  # the ConfigMap of named configs the config-manager reads
PLUGIN_CONFIGS_MANIFEST = PLUGIN_CONFIGS + ".yaml"
PLUGIN_ACCOUNT = "nvidia-device-plugin"
MPS_ROOT = "/run/nvidia/mps"  # the helm chart's mps.root
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Manifest:
    name: str  # a file name, as `gpuk8s render` writes it
    text: str  # rendered

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def objects(self) -> list[dict[str, Any]]:
        # libyaml's safe loader where PyYAML has it: the pure-Python one took 0.6 s of CPU per install
        return [d for d in yaml.load_all(self.text, Loader=_LOADER) if isinstance(d, dict)]  # noqa: S506 (safe)

    def applied_text(self) -> str:
        """The text applied: every object annotated with the rendered text's sha256."""
        docs = self.objects()
        for d in docs:
            d.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION] = self.sha256
        return yaml.dump_all(docs, Dumper=_BlockDumper, sort_keys=False)

    def anchor(self) -> tuple[str, str, str | None]:
        """(kind, name, namespace) of the first object: where the applied hash is read back."""
        first = self.objects()[0]
        md = first.get("metadata", {})
        return str(first.get("kind", "")), str(md.get("name", "")), md.get("namespace")


def device_plugin_template() -> str:
    return _template("nvidia-device-plugin.yaml.j2")


def _template(name: str) -> str:
    return resources.files("gpuk8s").joinpath(f"data/{name}").read_text()


def _config_manager_env(oneshot: bool, process: str) -> str:
    """The env of a config-manager container, as the chart sets it (indented for the templates' env: key)."""
    env: list[tuple[str, str | None]] = [
        ("ONESHOT", "true" if oneshot else "false"), ("KUBECONFIG", ""), ("NODE_NAME", None),
        ("NODE_LABEL", CONFIG_LABEL), ("CONFIG_FILE_SRCDIR", "/available-configs"),
        ("CONFIG_FILE_DST", "/config/config.yaml"),
        # a GPU node without the label (joined, not yet labelled by gpuk8s) gets whole GPUs
        ("DEFAULT_CONFIG", PluginSettings().config_name), ("FALLBACK_STRATEGIES", "named,single"),
        ("SEND_SIGNAL", "false" if oneshot else "true"), ("SIGNAL", "" if oneshot else "1"),  # 1: SIGHUP
        ("PROCESS_TO_SIGNAL", process)]
    items = []
    for k, v in env:
        if v is None:
            items.append({"name": k, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
        else:
            items.append({"name": k, "value": v})
    text = yaml.safe_dump(items, sort_keys=False, default_flow_style=False)
    return "".join("\n" + " " * 12 + line for line in text.splitlines())


def _render(template: str, **values: Any) -> str:
    """Render a template's text with the values every device plugin template uses."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    return env.from_string(template).render(
        config_manager_env=_config_manager_env, config_map=PLUGIN_CONFIGS, service_account=PLUGIN_ACCOUNT,
        mps_root=MPS_ROOT, **values)


PLUGIN_MANIFEST = "nvidia-device-plugin.yaml"


def device_plugin(inv: Inventory, dra: bool | None = None) -> Manifest:
    """The plugin DaemonSet with its config-manager, and the RBAC that lets config-manager read node labels; `dra`:
    whether some node's GPUs are the DRA driver's (default: as the inventory says)."""
    # where a node uses MIG, the plugin needs SYS_ADMIN and NVIDIA_MIG_MONITOR_DEVICES, as the v0.20.0 chart gives it
    # (templates/_helpers.tpl requiresCapSysAdmin, addMigMonitorDevices: a MIG strategy other than none)
    mig = any(is_gpu_node(h) and h.gpu.mig.enabled for h in inv.hosts)
    # where a node's GPUs are DRA's (allocator: dra), the plugin keeps off it; written only then, so that a
    # cluster without DRA keeps the plugin's template (and its pods) as they were
    if dra is None:
        dra = any(is_gpu_node(h) and h.gpu.allocator.kind == DRA for h in inv.hosts)
    return Manifest(PLUGIN_MANIFEST, mirrors.rewrite_images(inv, _render(
        device_plugin_template(), version=inv.install.device_plugin_version, mig=mig, dra=dra,
        allocator_label=ALLOCATOR_LABEL, legacy_allocator_label=LEGACY_ALLOCATOR_LABEL)))


DRA_MANIFEST = "nvidia-dra-driver.yaml"


def dra_driver(inv: Inventory) -> Manifest:
    """NVIDIA's DRA driver (GPUs only): its kubelet plugin on nodes labelled gpuk8s.io/gpu-allocator=dra, and
    the DeviceClasses gpu.nvidia.com and mig.nvidia.com; from the minor that has KEP-5004 GA, gpu.nvidia.com names
    the extended resource nvidia.com/gpu (docs/dra.md)."""
    pin = versions.dra_driver()
    minor = versions.release(inv.cluster.kubernetes_version) or (1, 0)
    return Manifest(DRA_MANIFEST, mirrors.rewrite_images(inv, _render(
        _template("dra-driver.yaml.j2"), chart_version=pin.chart_version, image=pin.image, namespace=DRA_NAMESPACE,
        name=DRA_NAME, allocator_label=ALLOCATOR_LABEL,
        extended_resource=minor[1] >= pin.extended_resource_since,
        extended_resource_since=f"1.{pin.extended_resource_since}")))


RDMA_MANIFEST = "rdma-device-plugin.yaml"
RDMA_HCA_MAX = 1000  # pods per node that may share its RDMA devices (the project's README example's rdmaHcaMax)


def rdma_device_plugin(inv: Inventory) -> Manifest:
    """NVIDIA's RDMA shared device plugin on the nodes labelled gpuk8s.io/fabric (docs/fabric.md)."""
    return Manifest(RDMA_MANIFEST, mirrors.rewrite_images(inv, _render(
        _template("rdma-device-plugin.yaml.j2"), image=versions.fabric().rdma_device_plugin,
        fabric_label=FABRIC_LABEL, resource=RDMA_RESOURCE, resource_name=RDMA_RESOURCE_NAME,
        resource_prefix=RDMA_RESOURCE_PREFIX, hca_max=RDMA_HCA_MAX)))


def fabric_wanted(inv: Inventory) -> bool:
    """Whether a GPU node of the inventory sets fabric: (the RDMA device plugin is deployed)."""
    return any(h.gpu.fabric.enabled and is_gpu_node(h) for h in inv.hosts)


def node_bound_tokens(kubernetes_version: str) -> bool:
    """Whether a cluster of this version names a pod's node in its service account token and has
    ValidatingAdmissionPolicy v1 (versions.yaml node_bound_tokens_from): the node agents' own-node policies."""
    since = versions.release(versions.matrix().node_bound_tokens_from)
    have = versions.release(kubernetes_version)
    return since is not None and have is not None and have[:2] >= since[:2]


def mps_control_daemon(inv: Inventory) -> Manifest:
    """The MPS control daemon DaemonSet: pods only on nodes labelled nvidia.com/mps.capable=true."""
    return Manifest("nvidia-device-plugin-mps-control-daemon.yaml", mirrors.rewrite_images(inv, _render(
        _template("nvidia-device-plugin-mps.yaml.j2"), version=inv.install.device_plugin_version, name=MPS_DAEMON)))


def hami(inv: Inventory, plans: dict[str, GPUPlan]) -> Manifest:
    """HAMi's scheduler and device plugin (pods only on nodes labelled gpu=on); deviceSplitCount is one
    value for the cluster (HAMi's device ConfigMap): the HAMi nodes' replicas, which the loader requires to agree."""
    split = max((p.replicas for p in plans.values() if p.sharing == "hami"), default=10)
    v = inv.cluster.kubernetes_version
    pin = versions.hami()
    return Manifest("hami.yaml", mirrors.rewrite_images(inv, _render(
        _template("hami.yaml.j2"), chart_version=pin.chart_version, image=pin.image, split=split,
        # ValidatingAdmissionPolicy v1 and the node name in service account tokens (the matrix's minor)
        own_node_policy=node_bound_tokens(v),
        # the cluster's own scheduler version, as kubeadm init runs it (kube/render.full_version)
        kube_scheduler_image=f"registry.k8s.io/kube-scheduler:v{v}" + ("" if v.count(".") == 2 else ".0"))))


def plugin_config(settings: PluginSettings) -> dict[str, Any]:
    """The device plugin's config file (version v1, api/config/v1) for one per-node setting: the ONE function
    that renders it. flags.migStrategy is the node's MIG strategy (docs/mig.md); under the mixed strategy
    time-slicing names each nvidia.com/mig-<profile> it replicates (api/config/v1 ReplicatedResource)."""
    config: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": settings.mig_strategy}}
    if settings.strategy in ("time-slicing", "mps"):
        key = "timeSlicing" if settings.strategy == "time-slicing" else "mps"
        names = list(settings.mig_resources) if settings.mig_strategy == "mixed" else ["nvidia.com/gpu"]
        config["sharing"] = {key: {
            "renameByDefault": settings.rename,
            "failRequestsGreaterThanOne": settings.fail_requests_greater_than_one,
            "resources": [{"name": n, "replicas": settings.replicas} for n in names]}}
    return config


def plugin_settings(plans: dict[str, GPUPlan]) -> list[PluginSettings]:
    """Every distinct per-node setting the plans use, and the default (whole GPUs), by config name."""
    found = {PluginSettings().config_name: PluginSettings()}
    for p in plans.values():
        if p.plugin is not None:
            found[p.plugin.config_name] = p.plugin
    return [found[k] for k in sorted(found)]


def plugin_configs(plans: dict[str, GPUPlan], keep: dict[str, str] | None = None) -> Manifest:
    """ConfigMap nvidia-device-plugin-configs: one named config per distinct per-node setting, and `keep`: the
    configs (name -> text, as the cluster has them) of nodes whose plan cannot decide theirs (no facts)."""
    data = {k: _Block(v) for k, v in (keep or {}).items()}
    data.update({st.config_name: _Block(yaml.safe_dump(plugin_config(st), sort_keys=False))
                 for st in plugin_settings(plans)})
    data = {k: data[k] for k in sorted(data)}
    return Manifest(PLUGIN_CONFIGS_MANIFEST, yaml.dump(
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": PLUGIN_CONFIGS, "namespace": "kube-system",
                      "labels": {"app.kubernetes.io/managed-by": "gpuk8s"}},
         "data": data}, Dumper=_BlockDumper, sort_keys=False))


class _Block(str):
    """A multi-line string written as a YAML literal block (|), as the chart writes the configs."""


class _BlockDumper(yaml.SafeDumper):
    pass


def _str(d: yaml.SafeDumper, v: str) -> yaml.Node:
    return d.represent_scalar("tag:yaml.org,2002:str", str(v), style="|" if "\n" in v else None)


_BlockDumper.add_representer(_Block, _str)
_BlockDumper.add_representer(str, _str)


def runtime_class() -> Manifest:
    """RuntimeClass nvidia: what the GPU Operator creates and what pod specs copied from NVIDIA's docs name."""
    return Manifest("runtimeclass-nvidia.yaml", yaml.safe_dump(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_HANDLER},
         "handler": RUNTIME_HANDLER}, sort_keys=False))


def wanted(inv: Inventory, plans: dict[str, GPUPlan], keep: dict[str, str] | None = None) -> list[Manifest]:
    """The manifests a cluster with these nodes must have: the GPU ones where there is a GPU node (`keep`: as
    plugin_configs)."""
    if not any(p.gpu_node for p in plans.values()):
        return []
    # the ConfigMap before the DaemonSets that mount it; the MPS daemon always (no pod without an MPS node),
    # so that turning MPS on or off on a node changes only the ConfigMap and the node's labels
    dra = any(p.dra for p in plans.values())
    out = [runtime_class(), plugin_configs(plans, keep), device_plugin(inv, dra), mps_control_daemon(inv)]
    if any(p.sharing == "hami" for p in plans.values()):
        out.append(hami(inv, plans))
    if dra:
        out.append(dra_driver(inv))
    if fabric_wanted(inv):
        out.append(rdma_device_plugin(inv))
    return out


def unwanted(inv: Inventory, plans: dict[str, GPUPlan]) -> list[Manifest]:
    """Manifests gpuk8s deploys only on demand, not wanted now: their objects are deleted where present."""
    out = [] if any(p.sharing == "hami" for p in plans.values()) else [hami(inv, plans)]
    if not any(p.dra for p in plans.values()):
        out.append(dra_driver(inv))
    if not fabric_wanted(inv):
        out.append(rdma_device_plugin(inv))
    return out




Ref = tuple[str, str, str]  # (kind, name, namespace) of an object; kubectl ignores -n for a cluster-scoped kind


def applied_by_gpuk8s(obj: Any) -> bool:
    """Whether gpuk8s applied the object, as the cluster returned it: it carries the manifest annotation
    (`Manifest.applied_text` writes it on every object). The one test of ownership before a deletion."""
    md = obj.get("metadata") if isinstance(obj, dict) else None
    ann = md.get("annotations") if isinstance(md, dict) else None
    return isinstance(ann, dict) and ANNOTATION in ann


def owned(kube: KubeClient, objs: Iterable[Ref]) -> list[Ref]:
    """Those of `objs` that exist in the cluster and carry gpuk8s's annotation, each object judged on its own, in
    the order given, once each: what gpuk8s may delete. Read in one call (KubeClient.get_refs); a kind the
    cluster does not serve has none there."""
    wanted = list(dict.fromkeys(objs))
    found = kube.get_refs(wanted)
    return [ref for ref in wanted if ref in found and applied_by_gpuk8s(found[ref])]


def refs(m: Manifest) -> list[Ref]:
    """(kind, name, namespace) of every object of the manifest, last first (the order of deletion); gpuk8s's
    GPU manifests live in kube-system."""
    return [_ref(d) for d in reversed(m.objects())]


def removable(kube: KubeClient, ms: list[Manifest]) -> list[tuple[Manifest, list[Ref]]]:
    """Per manifest, the objects of it in the cluster that gpuk8s applied: an object of the same name that another
    tool made (HAMi's Helm chart) is not among them, whatever the manifest's other objects are. Every manifest's
    objects read in one call."""
    mine = set(owned(kube, [r for m in ms for r in refs(m)]))
    # a namespace of gpuk8s's that holds workloads gpuk8s did not create stays (deleting it deletes them): a
    # release Helm installed into it afterwards, for one
    for ref in [r for r in mine if r[0] == "Namespace"]:
        if any(not created_by_gpuk8s(o) for kind in WORKLOADS for o in kube.get(kind, namespace=ref[1])):
            mine.discard(ref)
    return [(m, [r for r in refs(m) if r in mine]) for m in ms]


WORKLOADS = ("daemonset", "deployment", "statefulset")  # what another tool installs into a namespace


def delete_command(ref: Ref) -> str:
    """The kubectl command that deletes the object, as --dry-run shows it."""
    kind, name, namespace = ref
    return "kubectl " + shlex.join(["-n", namespace, "delete", kind.lower(), name])


def remove(kube: KubeClient, ms: list[Manifest]) -> list[tuple[Manifest, list[Ref]]]:
    """Delete the objects of each manifest that gpuk8s applied (`removable`); those deleted, per manifest."""
    found = removable(kube, ms)
    for _m, gone in found:
        for kind, name, namespace in gone:
            kube.delete(kind.lower(), [name], namespace)
    return found


def out_of_date(kube: KubeClient, manifests: list[Manifest]) -> list[Manifest]:
    """The manifests whose anchor object does not carry their hash: every anchor read in one call."""
    found = kube.get_refs([m.anchor() for m in manifests])
    return [m for m in manifests if _hash_of(found.get(m.anchor())) != m.sha256]


def _hash_of(obj: dict[str, Any] | None) -> str:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    ann = md.get("annotations") if isinstance(md, dict) else None
    return str(ann.get(ANNOTATION, "")) if isinstance(ann, dict) else ""


# The manifests gpuk8s applies only while some node asks for them, and deletes afterwards (`unwanted`): their objects
# must be gpuk8s's own, or the deletion would take another tool's with them
ON_DEMAND = ("hami.yaml", DRA_MANIFEST, RDMA_MANIFEST)


class NameTaken(GpuK8sError):
    """Objects of a manifest exist and gpuk8s did not create them: nothing of that manifest is applied."""

    kind = "name-taken"

    def __init__(self, message: str, remedy: str, applied: list[str]) -> None:
        super().__init__(message, remedy)
        self.applied = applied  # the manifests applied all the same


def created_by_gpuk8s(obj: Any) -> bool:
    """Whether gpuk8s created the object: its manifest annotation, or (an annotation edited away by hand) the
    managed-by label gpuk8s writes on its objects. A Helm chart's object says managed-by: Helm."""
    md = obj.get("metadata") if isinstance(obj, dict) else None
    labels = md.get("labels") if isinstance(md, dict) else None
    return applied_by_gpuk8s(obj) or (isinstance(labels, dict) and labels.get(MANAGED_BY) == "gpuk8s")


def claimable(kube: KubeClient, ms: list[Manifest]) -> tuple[list[Manifest], dict[str, list[str]]]:
    """The on-demand manifests among `ms` made safe to apply, every object read in one call: a Namespace that exists
    and that gpuk8s did not create is left out of its manifest (create-only: used as it is, never annotated, so
    never deleted with what is inside, a Helm-installed release for one); any other object that exists and is not
    gpuk8s's leaves its whole manifest out, named (manifest -> KIND/NAME) for the caller to report. Other
    manifests as they are."""
    check = [m for m in ms if m.name in ON_DEMAND]
    if not check:
        return ms, {}
    found = kube.get_refs([r for m in check for r in refs(m)])
    out: list[Manifest] = []
    taken: dict[str, list[str]] = {}
    for m in ms:
        if m not in check:
            out.append(m)
            continue
        keep: list[dict[str, Any]] = []
        for d in m.objects():
            ref = _ref(d)
            obj = found.get(ref)
            if obj is None or created_by_gpuk8s(obj):
                keep.append(d)
            elif ref[0] == "Namespace":
                continue  # the user's namespace: used, not taken over
            else:
                taken.setdefault(m.name, []).append(f"{ref[0]}/{ref[1]}" + ("" if ref[0] in CLUSTER_KINDS
                                                                             else f" in {ref[2]}"))
        if m.name in taken:
            continue
        out.append(m if len(keep) == len(m.objects()) else Manifest(m.name, yaml.dump_all(
            keep, Dumper=_BlockDumper, sort_keys=False)))
    return out, taken


CLUSTER_KINDS = ("Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass", "RuntimeClass",
                 "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def _ref(d: dict[str, Any]) -> Ref:
    md = d.get("metadata") or {}
    return str(d.get("kind", "")), str(md.get("name", "")), str(md.get("namespace") or "kube-system")


def apply(kube: KubeClient, manifests: list[Manifest]) -> list[str]:
    """Apply what is out of date; the names of those applied (empty: every manifest unchanged). An on-demand
    manifest whose objects another tool made is not applied: NameTaken names them, after the others are applied."""
    # claimable first: an on-demand manifest without the user's namespace has another anchor (its next object)
    ready, taken = claimable(kube, manifests)
    todo = out_of_date(kube, ready)
    for m in todo:
        kube.apply(m.applied_text())
    if taken:
        raise NameTaken(taken_message(taken), TAKEN_REMEDY, [m.name for m in todo])
    return [m.name for m in todo]


TAKEN_REMEDY = ("remove them (e.g. helm uninstall the release that made them) to let gpuk8s deploy its own, or keep "
                "yours and set the nodes' allocator / gpu_sharing so that gpuk8s does not need it")


def taken_message(taken: dict[str, list[str]]) -> str:
    return ("objects exist that gpuk8s did not create: " + "; ".join(f"{n}: {', '.join(t[:8])}"
                                                                    for n, t in taken.items())
            + " (applied over, they would become gpuk8s's and be deleted when no node needs them): not applied")
