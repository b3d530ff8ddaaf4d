"""The GPU plan of a node, the one place that says what Kubernetes must see on it; and every reader agrees."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from gpuk8s import gpuplan
from gpuk8s.facts.parse import parse_probe
from gpuk8s.inventory.loader import loads
from gpuk8s.kube import render
from gpuk8s.phases.base import Context
from gpuk8s.phases.gpu import GPUNodes
from gpuk8s.playbook.render import context
from tests.unit.fakekube import FakeKube

H200 = parse_probe((Path(__file__).parent.parent / "fixtures" / "h200" / "probe.txt").read_text())


def facts_with(n: int):
    gpu = H200.gpu
    gpus = tuple(dataclasses.replace(gpu.gpus[0], index=i) for i in range(n))
    return dataclasses.replace(H200, gpu=dataclasses.replace(gpu, gpus=gpus, state="ok" if n else "absent"))


def inventory(role: str, gpus: str) -> object:
    extra = f"\n    gpus: {gpus}" if gpus != "unset" else ""
    cp = "" if role == "control-plane" else "  - {name: cp-0, address: 10.0.0.9, role: control-plane}\n"
    return loads(f"hosts:\n{cp}  - name: node-1\n    address: 10.0.0.10\n    role: {role}{extra}\n"
                 "    labels: {example.com/team: ml}\n    taints: [\"dedicated=gpu:NoSchedule\"]\n")


# (role, gpus in the inventory, GPUs the facts show or None) -> (GPU node?, nvidia.com/gpu wanted)
ROWS = [
    ("worker", "unset", None, True, 0), ("worker", "unset", 0, True, 0), ("worker", "unset", 4, True, 4),
    ("worker", "unset", 8, True, 8), ("worker", "8", None, True, 8), ("worker", "8", 4, True, 4),
    ("worker", "0", None, False, 0), ("worker", "0", 8, False, 0),
    ("control-plane", "unset", None, False, 0), ("control-plane", "unset", 8, False, 0),
    ("control-plane", "4", None, True, 4), ("control-plane", "4", 8, True, 8), ("control-plane", "0", 4, False, 0),
]


@pytest.mark.parametrize(("role", "gpus", "found", "gpu_node", "want"), ROWS)
def test_the_plan_of_a_node(role, gpus, found, gpu_node, want) -> None:
    inv = inventory(role, gpus)
    host = inv.host("node-1")
    plan = gpuplan.plan_for(host, facts_with(found) if found is not None else None)
    assert plan.gpu_node is gpu_node
    assert plan.resources == ({"nvidia.com/gpu": want} if want else {})
    assert plan.expected_gpus == want
    want_labels = {"example.com/team": "ml"}
    if gpu_node:  # whole GPUs: the plugin's default config, and GFD's labels from what gpuk8s knows
        want_labels |= {"nvidia.com/gpu.present": "true", "nvidia.com/device-plugin.config": "none",
                        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none"}
        if want:
            want_labels["nvidia.com/gpu.count"] = str(want)
        if found:
            want_labels |= {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771"}
    assert plan.labels == want_labels
    assert [str(t) for t in plan.taints] == ["dedicated=gpu:NoSchedule"]
    assert plan.runtime_handler == ("nvidia" if gpu_node else "")


@pytest.mark.parametrize(("role", "gpus", "found", "gpu_node", "want"), ROWS)
def test_render_and_install_and_the_playbooks_agree(role, gpus, found, gpu_node, want) -> None:
    """The labels `gpuk8s render` writes are the labels the install phase sets, whatever the facts say, and
    the playbooks install the GPU parts exactly on GPU nodes (a worker without gpus: is one)."""
    inv = inventory(role, gpus)
    f = facts_with(found) if found is not None else facts_with(0)
    rendered = {}
    for line in render.node_commands(inv).splitlines():
        if line.startswith("#"):
            continue
        words = shlex.split(line)
        if words[:3] == ["kubectl", "label", "node"] and words[3] == "node-1":
            rendered = dict(w.split("=", 1) for w in words[4:] if "=" in w)
    kube = FakeKube()
    kube.add_node("node-1")
    ctx = Context(inv, facts={"node-1": f}, plans=gpuplan.plans(inv, {"node-1": f}), kube_client=kube,
                  initialized_cache=True)
    GPUNodes().run(ctx)
    # render has no facts: install adds (or corrects) exactly the labels read from nvidia-smi
    from_facts = {k: v for k, v in ctx.plans["node-1"].labels.items()
                  if k in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.count")}
    assert kube.nodes["node-1"]["metadata"]["labels"] == {**rendered, **from_facts}
    assert ({"nvidia.com/gpu.product", "nvidia.com/gpu.memory"} <= set(from_facts)) is bool(found and gpu_node)
    assert context(inv, inv.host("node-1"), f)["gpu"] is gpu_node


def test_a_worker_without_gpus_in_the_inventory_renders_the_gpu_label() -> None:
    """The bug this module fixed: render wrote no nvidia.com/gpu.present for such a worker, install did."""
    inv = inventory("worker", "unset")
    assert "nvidia.com/gpu.present=true" in render.node_commands(inv)
