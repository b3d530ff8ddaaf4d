"""The invariants every scenario checks after every step (issue 41, docs/testing.md): read from the lab's cluster
and hosts as a user would (kubectl on the first control plane, gpuk8s's own JSON), never from gpuk8s's internals.

- offered once: every GPU, slice and MIG device of a node's plan is offered by exactly one allocator: the device
  plugin's resources on a node on the plugin (and no ResourceSlice of NVIDIA's DRA driver there), the devices of
  its ResourceSlice on a dra node (and no nvidia.com/ extended resource allocatable there);
- status's totals equal the plan (quarantined GPUs named);
- no node is left cordoned by gpuk8s (its cordon mark) or cordoned at all where the scenario cordoned none;
- the cluster lock is free after the run;
- doctor finds nothing on a healthy cluster (`doctor --all` exit 0).
"""

from __future__ import annotations

import json
from typing import Any

KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf "
CORDON_MARK = "gpuk8s.io.node-restriction.kubernetes.io/cordoned-by"


def kubectl_json(lab: Any, args: str) -> Any:
    r = lab.hosts["cp-1"].exec(KUBECTL + args + " -o json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def images_of(lab: Any) -> set[str]:
    """Every image the cluster's objects run (their containers and init containers, in the simulated API's state)."""
    state = json.loads((lab.root / "cluster" / "state.json").read_text())
    images: set[str] = set()
    for o in state["objects"].values():
        spec = o.get("spec", {})
        spec = spec.get("template", {}).get("spec", spec)
        images |= {c["image"] for k in ("containers", "initContainers") for c in spec.get(k) or []}
    return images


def offered_once(lab: Any, planned: dict[str, dict[str, int]], dra_nodes: set[str]) -> None:
    """planned: node -> {resource: count} the plan offers there (device-plugin nodes: nvidia.com/...; dra nodes:
    {"gpu": n} or {"mig": n}, the devices of its ResourceSlice)."""
    nodes = {n["metadata"]["name"]: n for n in kubectl_json(lab, "get nodes")["items"]}
    slices = kubectl_json(lab, "get resourceslices")["items"] if dra_nodes else []
    published: dict[str, list[dict[str, Any]]] = {}
    for s in slices:
        if s.get("spec", {}).get("driver") == "gpu.nvidia.com":
            published.setdefault(s["spec"]["nodeName"], []).extend(s["spec"].get("devices", []))
    for name, want in planned.items():
        alloc = nodes[name].get("status", {}).get("allocatable", {})
        extended = {k: int(v) for k, v in alloc.items() if k.startswith("nvidia.com/") and int(v)}
        if name in dra_nodes:
            kinds: dict[str, int] = {}
            for d in published.get(name, []):
                t = (d.get("attributes", {}).get("type") or {}).get("string", "")
                kinds[t] = kinds.get(t, 0) + 1
            assert kinds == want, f"{name}: DRA publishes {kinds}, the plan {want}"
            assert not extended, f"{name} is on DRA and the device plugin offers {extended} too"
        else:
            assert extended == want, f"{name}: allocatable {extended}, the plan {want}"
            assert name not in published, f"{name} is on the device plugin and DRA publishes it too"


def none_cordoned(lab: Any) -> None:
    for n in kubectl_json(lab, "get nodes")["items"]:
        labels = n["metadata"].get("labels", {})
        assert not n.get("spec", {}).get("unschedulable"), f"{n['metadata']['name']} left cordoned"
        assert CORDON_MARK not in labels, f"{n['metadata']['name']} keeps gpuk8s's cordon mark"


def lock_free(lab: Any) -> None:
    r = lab.hosts["cp-1"].exec("flock -n /var/lib/gpuk8s/cluster.lock true && echo free")
    assert r.stdout.strip() == "free", f"the cluster lock is held after the run: {r.stdout} {r.stderr}"


def doctor_silent(run_cli: Any, inventory: str) -> None:
    r = run_cli("doctor", "-i", inventory, "--all", "-o", "json")
    assert r.returncode == 0, f"doctor found something on a healthy cluster: {r.stdout[-3000:]}"


def status_matches(run_cli: Any, inventory: str, totals: dict[str, int]) -> dict[str, Any]:
    """status's totals (resource -> allocatable) equal the plan's."""
    r = run_cli("status", "-i", inventory, "-o", "json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    got = {t["resource"]: t["allocatable"] for t in doc["totals"]}
    assert got == totals, f"status's totals {got}, the plan's {totals}; footer: {doc['footer']}"
    return dict(doc)


def all_hold(lab: Any, run_cli: Any, inventory: str, planned: dict[str, dict[str, int]], dra_nodes: set[str],
             totals: dict[str, int]) -> None:
    """Every invariant, after a step."""
    offered_once(lab, planned, dra_nodes)
    none_cordoned(lab)
    lock_free(lab)
    status_matches(run_cli, inventory, totals)
    doctor_silent(run_cli, inventory)
