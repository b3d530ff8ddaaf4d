"""A Kubernetes API in memory behind gpuk8s's KubeClient interface, for unit tests of the phases.

It keeps nodes (labels, taints, allocatable GPUs, Ready) and applied objects, records every call, and
answers `get` the way kubectl's JSON does. It is not a simulator of the cluster: the lab's simulated
Kubernetes (tests/lab/fakes/kube.py) and the kind tests are.
"""

from __future__ import annotations

from typing import Any

import yaml


class FakeKube:
    where = "the fake API"

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind lower, namespace, name)
        self.calls: list[tuple[str, ...]] = []

    def add_node(self, name: str, gpus: int = 0, labels: dict[str, str] | None = None,
                 taints: list[dict[str, str]] | None = None, ready: bool = True) -> None:
        self.nodes[name] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"taints": list(taints or [])},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)} if gpus else {},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    @property
    def writes(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] in ("apply", "label", "taint", "delete")]

    def get(self, kind: str, name: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        self.calls.append(("get", kind, name or "", namespace or ""))
        k = {"nodes": "node", "pods": "pod", "daemonsets": "daemonset", "ds": "daemonset"}.get(kind, kind)
        if k == "node":
            items = list(self.nodes.values())
        else:
            items = [o for (ok, ns, _), o in self.objects.items()
                     if ok == k and (namespace in (None, "*") or ns in (namespace, ""))]
        if name is not None:
            return [o for o in items if o["metadata"]["name"] == name]
        return items

    def apply(self, text: str) -> str:
        self.calls.append(("apply", text))
        for d in yaml.safe_load_all(text):
            if isinstance(d, dict):
                md = d["metadata"]
                self.objects[(d["kind"].lower(), md.get("namespace", ""), md["name"])] = d
        return ""

    def label(self, node: str, labels: dict[str, str]) -> None:
        self.calls.append(("label", node, *sorted(f"{k}={v}" for k, v in labels.items())))
        self.nodes[node]["metadata"]["labels"].update(labels)

    def taint(self, node: str, taints: list[str]) -> None:
        self.calls.append(("taint", node, *taints))
        for t in taints:
            kv, _, effect = t.rpartition(":")
            key, _, value = kv.partition("=")
            self.nodes[node]["spec"]["taints"].append({"key": key, "value": value, "effect": effect})

    def delete(self, kind: str, names: list[str], namespace: str) -> None:
        self.calls.append(("delete", kind, *names))
        for n in names:
            self.objects.pop((kind.lower(), namespace, n), None)

    def logs(self, pod: str, namespace: str, tail: int = 50) -> str:
        return ""

    def events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return []
