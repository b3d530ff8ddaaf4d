"""A Kubernetes API in memory behind gpuk8s's KubeClient interface, for unit tests of the phases.

It keeps nodes (labels, taints, allocatable GPUs, Ready) and applied objects, records every call, and
answers `get` the way kubectl's JSON does. It is not a simulator of the cluster: the lab's simulated
Kubernetes (tests/lab/fakes/kube.py) and the kind tests are.
"""

from __future__ import annotations

from typing import Any

import yaml


def _field(obj: dict[str, Any], path: str) -> str:
    v: Any = obj
    for part in path.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return "" if v is None else str(v)


def selected(obj: dict[str, Any], field_selector: str | None) -> bool:
    """Whether the API server's field selector (a=b, a==b, a!=b, comma-separated: all must hold) selects obj."""
    for term in filter(None, (field_selector or "").split(",")):
        if "!=" in term:
            f, v = term.split("!=", 1)
            if _field(obj, f) == v:
                return False
        else:
            f, v = term.replace("==", "=").split("=", 1)
            if _field(obj, f) != v:
                return False
    return True


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
        return [c for c in self.calls if c[0] in ("apply", "label", "taint", "delete", "drain")]

    def get(self, kind: str, name: str | None = None, namespace: str | None = None,
            field_selector: str | None = None) -> list[dict[str, Any]]:
        self.calls.append(("get", kind, name or "", namespace or "") + ((field_selector,) if field_selector else ()))
        k = {"nodes": "node", "pods": "pod", "daemonsets": "daemonset", "ds": "daemonset"}.get(kind, kind)
        if k == "node":
            items = list(self.nodes.values())
        else:
            # as kubectl: no namespace is the namespace "default", '*' is -A; cluster-scoped objects have ""
            items = [o for (ok, ns, _), o in self.objects.items()
                     if ok == k and (namespace == "*" or ns in (namespace or "default", ""))]
        if name is not None:
            items = [o for o in items if o["metadata"]["name"] == name]
        return [o for o in items if selected(o, field_selector)]

    def get_refs(self, refs: Any) -> dict[Any, dict[str, Any]]:
        """One call for many objects, as KubeClient.get_refs (a real kubectl call per namespace)."""
        self.calls.append(("get_refs", *(f"{k.lower()}/{n}" for k, n, _ in refs)))
        found = {}
        for ref in refs:
            kind, name, namespace = ref
            items = [o for (ok, ns, n), o in self.objects.items()
                     if ok == kind.lower() and n == name and ns in (namespace or "default", "")]
            if items:
                found[ref] = items[0]
        return found

    def apply(self, text: str) -> str:
        self.calls.append(("apply", text))
        for d in yaml.safe_load_all(text):
            if isinstance(d, dict):
                md = d["metadata"]
                self.objects[(d["kind"].lower(), md.get("namespace", ""), md["name"])] = d
        return ""

    def label(self, node: str, labels: dict[str, str | None]) -> None:
        self.calls.append(("label", node, *sorted(f"{k}-" if v is None else f"{k}={v}" for k, v in labels.items())))
        for k, v in labels.items():
            if v is None:
                self.nodes[node]["metadata"]["labels"].pop(k, None)
            else:
                self.nodes[node]["metadata"]["labels"][k] = v

    def taint(self, node: str, taints: list[str]) -> None:
        self.calls.append(("taint", node, *taints))
        for t in taints:
            kv, _, effect = t.rpartition(":")
            key, _, value = kv.partition("=")
            self.nodes[node]["spec"]["taints"].append({"key": key, "value": value, "effect": effect})

    def delete(self, kind: str, names: list[str], namespace: str) -> None:
        self.calls.append(("delete", kind, *names))
        for n in names:  # kubectl ignores -n for a cluster-scoped object
            if self.objects.pop((kind.lower(), namespace, n), None) is None:
                self.objects.pop((kind.lower(), "", n), None)
            self.objects.pop((kind.lower(), "", n), None)  # a cluster-scoped object (a Namespace)

    def logs(self, pod: str, namespace: str, tail: int = 50) -> str:
        return ""

    def events(self, namespace: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        self.calls.append(("events", namespace or "*") + ((field_selector,) if field_selector else ()))
        return [e for e in getattr(self, "event_list", []) if selected(e, field_selector)]

    # raw_get: the API server's paths (a pod's or a service's proxy) answered from `self.raw`; a path
    # without an entry fails as the API server does when the pod does not answer
    raw: dict[str, str]

    def raw_get(self, path: str, cap: int = 16 << 20) -> str:
        from gpuk8s.kube.client import KubeError

        self.calls.append(("raw_get", path))
        answers = getattr(self, "raw", {})
        if path not in answers:
            raise KubeError(f"kubectl get --raw {path} (the fake API) failed: Error from server "
                            "(ServiceUnavailable): the server is currently unable to handle the request")
        if len(answers[path].encode()) > cap:
            raise KubeError(f"kubectl get --raw {path} (the fake API) printed {len(answers[path].encode())} bytes, "
                            f"more than the {cap >> 20} MiB gpuk8s reads of it")
        return answers[path]

    # drain and delete_node: a drain cordons (spec.unschedulable); `self.drain_error` makes it fail as
    # kubectl does when a PodDisruptionBudget blocks an eviction
    drain_error: str = ""

    def drain(self, node: str, timeout_s: int) -> str:
        from gpuk8s.kube.client import KubeError

        self.calls.append(("drain", node, str(timeout_s)))
        if node in self.nodes:
            self.nodes[node]["spec"]["unschedulable"] = True
        if self.drain_error:
            raise KubeError(f"kubectl drain {node} (the fake API) failed: {self.drain_error}")
        return f"node/{node} drained\n"

    def delete_node(self, node: str) -> None:
        self.calls.append(("delete", "node", node))
        self.nodes.pop(node, None)

    def uncordon(self, node: str) -> None:
        self.calls.append(("uncordon", node))
        if node in self.nodes:
            self.nodes[node]["spec"].pop("unschedulable", None)

    def cordon(self, node: str) -> None:
        self.calls.append(("cordon", node))
        if node in self.nodes:
            self.nodes[node]["spec"]["unschedulable"] = True
