"""The manifests gpuk8s keeps in a cluster, as (name, rendered text), and the one applier.

The applied hash is the SHA-256 of the rendered text: any change of a template, a version or a setting
changes it, and the next install applies the manifest again. It is written on every object of the
manifest as the annotation gpuk8s.io/manifest-sha256; a manifest is unchanged when its first object
carries the hash of the text gpuk8s would apply now.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jinja2
import yaml

from gpuk8s.gpuplan import RUNTIME_HANDLER, GPUPlan
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube.client import KubeClient

ANNOTATION = "gpuk8s.io/manifest-sha256"
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"


@dataclass(frozen=True)
class Manifest:
    name: str  # a file name, as `gpuk8s render` writes it
    text: str  # rendered

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def objects(self) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(self.text) if isinstance(d, dict)]

    def applied_text(self) -> str:
        """The text applied: every object annotated with the rendered text's sha256."""
        docs = self.objects()
        for d in docs:
            d.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION] = self.sha256
        return yaml.safe_dump_all(docs, sort_keys=False)

    def anchor(self) -> tuple[str, str, str | None]:
        """(kind, name, namespace) of the first object: where the applied hash is read back."""
        first = self.objects()[0]
        md = first.get("metadata", {})
        return str(first.get("kind", "")), str(md.get("name", "")), md.get("namespace")


def device_plugin_template() -> str:
    return resources.files("gpuk8s").joinpath("data/nvidia-device-plugin.yaml.j2").read_text()


def device_plugin(inv: Inventory) -> Manifest:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    return Manifest("nvidia-device-plugin.yaml", env.from_string(device_plugin_template()).render(
        version=inv.install.device_plugin_version))


def runtime_class() -> Manifest:
    """RuntimeClass nvidia: what the GPU Operator creates and what pod specs copied from NVIDIA's docs name."""
    return Manifest("runtimeclass-nvidia.yaml", yaml.safe_dump(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_HANDLER},
         "handler": RUNTIME_HANDLER}, sort_keys=False))


def wanted(inv: Inventory, plans: dict[str, GPUPlan]) -> list[Manifest]:
    """The manifests a cluster with these nodes must have: the GPU ones where there is a GPU node."""
    if not any(p.gpu_node for p in plans.values()):
        return []
    return [runtime_class(), device_plugin(inv)]


def applied_hash(kube: KubeClient, m: Manifest) -> str:
    kind, name, namespace = m.anchor()
    found = kube.get(kind.lower(), name, namespace)
    if not found:
        return ""
    ann = found[0].get("metadata", {}).get("annotations") or {}
    return str(ann.get(ANNOTATION, "")) if isinstance(ann, dict) else ""


def out_of_date(kube: KubeClient, manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if applied_hash(kube, m) != m.sha256]


def apply(kube: KubeClient, manifests: list[Manifest]) -> list[str]:
    """Apply what is out of date; the names of those applied (empty: every manifest unchanged)."""
    todo = out_of_date(kube, manifests)
    for m in todo:
        kube.apply(m.applied_text())
    return [m.name for m in todo]
