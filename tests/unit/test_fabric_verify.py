"""verify --fabric's orchestration without a cluster (gpuk8s/phases/fabric_verify.py, issue 43): the pods made, a
server the scheduler cannot place named on its own node without holding the run or the other links, the pods
deleted, --quarantine tainting only the node of a measured shortfall. The whole flow against the lab's kubelet is
tests/labtests/test_fabric.py; here the API answers what each test needs (tests/unit/fakekube.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuk8s import gpuplan
from gpuk8s.facts.fabric import RdmaPort
from gpuk8s.inventory import loads
from gpuk8s.phases.base import Context, Options
from gpuk8s.phases.fabric_verify import FabricVerify
from tests.unit.fakekube import FakeKube
from tests.unit.test_checks import facts

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "fabric"
PERFTEST = (REAL / "perftest" / "ib_write_bw-roce-4qp-oci-oke.txt").read_text()  # 98.01 Gb/sec
NODES = ("a", "b", "c")
INV = loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n" + "".join(
    f"  - {{name: {n}, address: 10.0.0.{i + 2}, gpus: 8}}\n" for i, n in enumerate(NODES))
    + "gpu_defaults: {fabric: {link_layer: roce}}\n", "inventory.yaml")


class Cluster(FakeKube):
    """Pods as a cluster runs them: a perftest server Running (Pending where its node cannot take it), a client and
    an NCCL pod Succeeded; the clients' logs a real ib_write_bw text (98 Gb/s), the NCCL pods' none."""

    def __init__(self, unschedulable: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.unschedulable = unschedulable
        for i, n in enumerate(NODES):
            self.add_node(n, 8)
            self.nodes[n]["status"]["addresses"] = [{"type": "InternalIP", "address": f"10.0.0.{i + 2}"}]

    def apply(self, text: str) -> str:
        out = super().apply(text)
        for doc in yaml.safe_load_all(text):
            d = self.objects[("pod", doc["metadata"]["namespace"], doc["metadata"]["name"])]  # as stored
            name, node = d["metadata"]["name"], self._node(d)
            d["spec"]["nodeName"] = node
            if "-srv-" in name and node in self.unschedulable:
                d["spec"].pop("nodeName")
                d["status"] = {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 1 Insufficient rdma/fabric."}]}
            else:
                d["status"] = {"phase": "Running" if "-srv-" in name else "Succeeded"}
        return out

    @staticmethod
    def _node(d: dict[str, Any]) -> str:
        terms = d["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        return str(terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0])

    def logs(self, pod: str, namespace: str, tail: int = 50) -> str:
        return PERFTEST if "-cli-" in pod else ""


def context(kube: Cluster, quarantine: bool = False) -> Context:
    port = RdmaPort("mlx5_0", 1, "Active", "LinkUp", 100.0, "Ethernet")
    f = {n: facts(rdma=(port,)) for n in NODES}
    ctx = Context(INV, options=Options(fabric=True, fabric_timeout=30, fabric_quarantine=quarantine),
                  kube_client=kube)
    ctx.facts = f
    ctx.plans = gpuplan.plans(INV, f)
    return ctx


def test_a_server_that_cannot_be_placed_is_named_on_its_node_and_holds_nothing() -> None:
    kube = Cluster(unschedulable=("c",))
    ctx = context(kube)
    r = FabricVerify().run(ctx)
    got = {(f.subject.name, f.id): f for f in ctx.findings if f.subject}
    # the ring a -> b -> c -> a: c's server (for b -> c) never placed; the other two links measured
    assert got[("c", "fabric.rdma")].status == "fail"
    assert got[("c", "fabric.rdma")].message == (
        "RDMA write from b on mlx5_0 did not run: the server here not scheduled (0/4 nodes are available: 1 "
        "Insufficient rdma/fabric.)")
    assert got[("a", "fabric.rdma")].message == "2 RDMA write test(s) with its ring neighbours at 98.01 Gb/s"
    assert got[("b", "fabric.rdma")].message == "1 RDMA write test(s) with its ring neighbours at 98.01 Gb/s"
    assert r.status == "failed" and r.message.startswith("3 node(s), 3 link(s) tested in ")
    applied = [yaml.safe_load_all(c[1]) for c in kube.calls if c[0] == "apply"]
    clients = {d["metadata"]["name"] for docs in applied for d in docs if "-cli-" in d["metadata"]["name"]}
    assert clients == {"gpuk8s-fabric-cli-a-0", "gpuk8s-fabric-cli-c-0"}  # b's client waits for c's server: never
    # the run did not wait out its timeout for the server that cannot be placed: a poll or two, not thirty
    assert len([c for c in kube.calls if c[:2] == ("get", "pods")]) <= 3
    # every test pod deleted at the end, and none left behind
    assert not [k for k in kube.objects if k[0] == "pod"]
    # the NCCL pods printed no table: failed, named with why, not quarantined (nothing was measured)
    assert got[("a", "fabric.nccl")].status == "fail" and "printed no result" in got[("a", "fabric.nccl")].message


def test_quarantine_taints_no_node_for_a_test_that_did_not_run() -> None:
    kube = Cluster(unschedulable=("c",))
    ctx = context(kube, quarantine=True)
    r = FabricVerify().run(ctx)
    assert not [c for c in kube.calls if c[0] == "taint"], r.hosts
