"""Where a `gpuk8s allocator` move keeps the node as it was until the move ends: the ConfigMap gpuk8s-allocator-moves
in kube-system, one key per node, the former allocator and its gpuk8s labels as JSON.

In the cluster, not in the client's memory: a move stopped after the relabel (Ctrl-C, a lost connection) and failing
on the re-run must put the node back where it really was, and by then its labels name the target. In kube-system,
not on the node: a node's kubelet may write its own object, and no host may decide where its node is put back. The
record is read as hostile data all the same (bounded, typed, only gpuk8s's label keys).
"""

from __future__ import annotations

import json

import yaml

from gpuk8s.gpuplan import DRA, MANAGED_LABELS, MANAGED_PREFIXES
from gpuk8s.kube.client import KubeClient
from gpuk8s.kube.manifests import MANAGED_BY, created_by_gpuk8s

NAME = "gpuk8s-allocator-moves"
NAMESPACE = "kube-system"
MAX_RECORD = 64 << 10  # one node's record: a few hundred bytes


def _data(kube: KubeClient) -> dict[str, str]:
    found = kube.get("configmap", NAME, NAMESPACE)
    if not found or not created_by_gpuk8s(found[0]):
        return {}
    data = found[0].get("data")
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _parse(text: str, target: str) -> tuple[str, dict[str, str]] | None:
    """(was, labels) of a record of a move to `target`; None for another target's (a stale record: that move
    ended some other way, install moved the node, say) or one that cannot be read."""
    if len(text) > MAX_RECORD:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("was") not in (DRA, "device-plugin") or not isinstance(
            doc.get("labels"), dict) or doc.get("to") != target:
        return None
    labels = {k: v for k, v in doc["labels"].items() if isinstance(k, str) and isinstance(v, str)
              and (k in MANAGED_LABELS or k.startswith(MANAGED_PREFIXES))}
    return doc["was"], labels


def _write(kube: KubeClient, data: dict[str, str]) -> None:
    kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": NAME, "namespace": NAMESPACE,
                                            "labels": {MANAGED_BY: "gpuk8s"}},
                               "data": dict(sorted(data.items()))}, sort_keys=False))


def record(kube: KubeClient, node: str, was: str, labels: dict[str, str], target: str) -> tuple[str, dict[str, str]]:
    """The node as it was before its move to `target`: the record an earlier, stopped move to the same target left,
    else (`was`, `labels`), recorded now."""
    data = _data(kube)
    earlier = _parse(data[node], target) if node in data else None
    if earlier is not None:
        return earlier
    data[node] = json.dumps({"was": was, "labels": labels, "to": target}, sort_keys=True)
    _write(kube, data)
    return was, labels


def forget(kube: KubeClient, node: str) -> None:
    """The node's move ended (moved, or put back): its record goes; the ConfigMap with the last one."""
    data = _data(kube)
    if node not in data:
        return
    del data[node]
    if data:
        _write(kube, data)
    else:
        kube.delete("configmap", [NAME], NAMESPACE)

