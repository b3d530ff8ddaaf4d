"""Issue 42: what a GPU host can do with the tokens of the components gpuk8s runs on it (docs/security.md).

The DRA kubelet plugin and HAMi's device plugin run privileged on GPU hosts: root there reads their service account
tokens. gpuk8s gives each the least its code calls, and a ValidatingAdmissionPolicy (rendered in their manifests)
binds what they may write to the node the token names (authentication.kubernetes.io/node-name). The policies' CEL is
evaluated here, as the API server would, with cel-python (an independent CEL implementation), against the requests a
host holding the token could send: its own node's writes pass, every other is refused; a validation that errors
counts as refused (failurePolicy: Fail).
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
import yaml

from gpuk8s import gpuplan
from gpuk8s.inventory.loader import loads
from gpuk8s.kube import dra, manifests

DRA_SA = f"system:serviceaccount:{dra.DRA_NAMESPACE}:{dra.DRA_NAME}-service-account-kubeletplugin"
HAMI_SA = "system:serviceaccount:kube-system:hami-device-plugin"
INV = loads("""cluster: {kubernetes_version: "1.36"}
hosts:
  - {name: cp-1, address: 10.0.0.1, role: control-plane}
  - {name: w-dra, address: 10.0.0.2, gpus: 4, allocator: dra}
  - {name: w-hami, address: 10.0.0.3, gpus: 2, gpu_sharing: {strategy: hami}}
""")


def policy(m: manifests.Manifest) -> dict[str, Any]:
    return next(o for o in yaml.safe_load_all(m.text) if o and o["kind"] == "ValidatingAdmissionPolicy")


def admitted(pol: dict[str, Any], user: str, op: str, resource: str, obj: Any, old: Any,
             node: str | None) -> bool:
    """Whether the API server lets the request through this policy (validationActions Deny)."""
    env = celpy.Environment()
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    request = {"userInfo": {"username": user, "extra": extra}, "operation": op,
               "resource": {"group": "", "version": "v1", "resource": resource}}
    act: dict[str, Any] = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
                           "oldObject": celpy.json_to_cel(old)}
    spec = pol["spec"]
    rule = spec["matchConstraints"]["resourceRules"][0]
    if op not in rule["operations"] or resource not in rule["resources"]:
        return True

    def run(expr: str) -> Any:
        return env.program(env.compile(expr)).evaluate(act)

    if not all(run(c["expression"]) for c in spec.get("matchConditions", [])):
        return True
    variables: dict[str, Any] = {}
    for v in spec.get("variables", []):
        act["variables"] = celpy.json_to_cel(variables)
        try:
            variables[v["name"]] = run(v["expression"])
        except Exception:  # an error: the validations that use it fail
            variables[v["name"]] = None
        act["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): x for k, x in variables.items()
                                                   if x is not None})
    for val in spec["validations"]:
        try:
            ok = run(val["expression"])
        except Exception:
            return False
        if not isinstance(ok, celpy.celtypes.BoolType) or not ok:
            return False
    return True


def slice_of(node: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1},
                     "devices": [{"name": "gpu-0"}]}}


DRA_POLICY = policy(manifests.dra_driver(INV))


@pytest.mark.parametrize(("op", "obj", "old", "node", "ok"), [
    ("CREATE", slice_of("w-dra"), None, "w-dra", True),
    ("UPDATE", slice_of("w-dra"), slice_of("w-dra"), "w-dra", True),
    ("DELETE", None, slice_of("w-dra"), "w-dra", True),
    ("CREATE", slice_of("w-other"), None, "w-dra", False),  # fake devices on another node
    ("UPDATE", slice_of("w-other"), slice_of("w-other"), "w-dra", False),
    ("UPDATE", slice_of("w-dra"), slice_of("w-other"), "w-dra", False),  # taking another node's slice over
    ("DELETE", None, slice_of("w-other"), "w-dra", False),  # another node's devices gone
    ("CREATE", slice_of("w-dra"), None, None, False),  # a token without the node's name
])
def test_the_dra_kubelet_plugins_token_writes_its_own_nodes_slices_only(
        op: str, obj: Any, old: Any, node: str | None, ok: bool) -> None:
    assert admitted(DRA_POLICY, DRA_SA, op, "resourceslices", obj, old, node) is ok
    # the policy is the plugin's alone: the kubelet and the scheduler's writes are not its business
    assert admitted(DRA_POLICY, "system:node:w-other", op, "resourceslices", obj, old, None)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels},
                         "annotations": {"hami.io/node-handshake": "Requesting_2026.12.04 05:00:00"}},
            "spec": {"taints": [{"key": gpuplan.QUARANTINE_KEY, "value": "health.xid", "effect": "NoSchedule"}]}}


def pod(on: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "ml", "annotations": {}},
            "spec": {"nodeName": on, "containers": [{"name": "c", "image": "x"}]}}


HAMI_POLICY = policy(manifests.hami(INV, gpuplan.plans(INV)))


def changed(obj: dict[str, Any], how: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    how(new)
    return new


@pytest.mark.parametrize(("what", "resource", "old", "how", "ok"), [
    ("its node's register annotation", "nodes", node("w-hami"),
     lambda n: n["metadata"]["annotations"].update({"hami.io/node-nvidia-register": "[]"}), True),
    ("another node's annotation", "nodes", node("w-other"),
     lambda n: n["metadata"]["annotations"].update({"x": "y"}), False),
    ("its own quarantine lifted", "nodes", node("w-hami"), lambda n: n["spec"].update({"taints": []}), False),
    ("its node cordoned", "nodes", node("w-hami"), lambda n: n["spec"].update({"unschedulable": True}), False),
    ("itself put on DRA", "nodes", node("w-hami"),
     lambda n: n["metadata"]["labels"].update({gpuplan.ALLOCATOR_LABEL: "dra"}), False),
    ("a protected label removed", "nodes", node("w-hami", **{gpuplan.ALLOCATOR_LABEL: "dra"}),
     lambda n: n["metadata"]["labels"].pop(gpuplan.ALLOCATOR_LABEL), False),
    ("a label of its own node (the HAMi scheduler's placement)", "nodes", node("w-hami"),
     lambda n: n["metadata"]["labels"].update({"node-role.kubernetes.io/control-plane": ""}), False),
    ("a plain label of its own node", "nodes", node("w-hami"),
     lambda n: n["metadata"]["labels"].update({"gpu": "on"}), False),
    ("a label of a pod on its node (a Service's selector)", "pods", pod("w-hami"),
     lambda p: p["metadata"].update({"labels": {"app": "billing"}}), False),
    ("a pod bound to its node", "pods", pod("w-hami"),
     lambda p: p["metadata"]["annotations"].update({"hami.io/bind-phase": "success"}), True),
    ("a pod on another node", "pods", pod("w-other"),
     lambda p: p["metadata"]["annotations"].update({"hami.io/bind-phase": "success"}), False),
    ("a pod moved onto its node", "pods", pod("w-other"), lambda p: p["spec"].update({"nodeName": "w-hami"}), False),
    ("a pod's image on its node", "pods", pod("w-hami"),
     lambda p: p["spec"]["containers"][0].update({"image": "evil"}), False),
])
def test_hamis_device_plugin_token_changes_its_own_node_and_pods_only(
        what: str, resource: str, old: dict[str, Any], how: Any, ok: bool) -> None:
    assert admitted(HAMI_POLICY, HAMI_SA, "UPDATE", resource, changed(old, how), old, "w-hami") is ok, what
    assert not admitted(HAMI_POLICY, HAMI_SA, "UPDATE", resource, changed(old, how), old, None), what


def test_hamis_policy_is_rendered_where_the_api_has_it() -> None:
    old = loads("""cluster: {kubernetes_version: "1.29"}
hosts:
  - {name: cp-1, address: 10.0.0.1, role: control-plane}
  - {name: w-hami, address: 10.0.0.3, gpus: 2, gpu_sharing: {strategy: hami}}
""")
    kinds = [o["kind"] for o in manifests.hami(old, gpuplan.plans(old)).objects()]
    assert "ValidatingAdmissionPolicy" not in kinds  # admissionregistration.k8s.io/v1's policy is 1.30's
