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
# two nodes of 8 x H100 over 8 x 400G InfiniBand, 16 ranks (448.90 GB/s at 1 GiB): what a launcher prints, with
# NCCL's connection lines of a real run where GPUDirect RDMA carried them (NCCL_DEBUG=INFO)
GDR_LINES = (REAL / "nccl" / "channels-gdrdma-2node-8nic-nccl2.29.3-slurmv4.txt").read_text()
HOST_MEMORY = (REAL / "nccl" / "channels-no-gdr-ib-a100-nccl-1412.txt").read_text()
ACROSS = GDR_LINES + (REAL / "nccl" / "allreduce-h100-2node-ib-ndr-nccl2.26.2-nccl-tests-309.txt").read_text()
NODES = ("a", "b", "c")
INV_TEXT = ("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n" + "".join(
    f"  - {{name: {n}, address: 10.0.0.{i + 2}, gpus: 8}}\n" for i, n in enumerate(NODES))
    + "gpu_defaults: {fabric: {link_layer: roce}}\n")
INV = loads(INV_TEXT, "inventory.yaml")


class Cluster(FakeKube):
    """Pods as a cluster runs them: a perftest server and an sshd worker Running (Pending where its node cannot take
    it), a client, an NCCL pod and a launcher Succeeded; the clients' logs a real ib_write_bw text (98 Gb/s), the
    launchers' a real two-node all_reduce_perf text, the NCCL pods' none."""

    def __init__(self, unschedulable: tuple[str, ...] = (), no_worker: tuple[str, ...] = (),
                 across: str = ACROSS) -> None:
        super().__init__()
        self.unschedulable, self.no_worker, self.across = unschedulable, no_worker, across
        self.worker_said = "0/4 nodes are available: 1 Insufficient nvidia.com/gpu."  # a worker not scheduled
        for i, n in enumerate(NODES):
            self.add_node(n, 8)
            self.nodes[n]["status"]["addresses"] = [{"type": "InternalIP", "address": f"10.0.0.{i + 2}"}]

    def apply(self, text: str) -> str:
        out = super().apply(text)
        for doc in yaml.safe_load_all(text):
            if doc["kind"] != "Pod":
                continue
            d = self.objects[("pod", doc["metadata"]["namespace"], doc["metadata"]["name"])]  # as stored
            name, node = d["metadata"]["name"], self._node(d)
            d["spec"]["nodeName"] = node
            if "-worker-" in name:
                d["status"] = {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": self.worker_said}]} if node in self.no_worker \
                    else {"phase": "Running"}
            elif "-mpi-" in name and "ORTE" in self.across:
                d["status"] = {"phase": "Failed"}
            elif "-srv-" in name and node in self.unschedulable:
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
        return PERFTEST if "-cli-" in pod else self.across if "-mpi-" in pod else ""


def context(kube: Cluster, quarantine: bool = False, inv: Any = INV) -> Context:
    port = RdmaPort("mlx5_0", 1, "Active", "LinkUp", 100.0, "Ethernet")
    f = {n: facts(rdma=(port,)) for n in NODES}
    ctx = Context(inv, options=Options(fabric=True, fabric_timeout=30, fabric_quarantine=quarantine),
                  kube_client=kube)
    ctx.facts = f
    ctx.plans = gpuplan.plans(inv, f)
    return ctx


def verified(ctx: Context) -> dict[tuple[str, str], Any]:
    """verify --fabric run on the context: its findings by (node, id)."""
    FabricVerify().run(ctx)
    return {(f.subject.name, f.id): f for f in ctx.findings if f.subject}


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
    assert r.status == "failed" and r.message.startswith("3 node(s), 3 link(s), 3 of 3 pair(s) measured in ")
    applied = [yaml.safe_load_all(c[1]) for c in kube.calls if c[0] == "apply"]
    clients = {d["metadata"]["name"] for docs in applied for d in docs if "-cli-" in d["metadata"]["name"]}
    assert clients == {"gpuk8s-fabric-cli-a-0", "gpuk8s-fabric-cli-c-0"}  # b's client waits for c's server: never
    # the run did not wait out its timeout for the server that cannot be placed: a poll or two, not thirty (then
    # one for the workers and one per round of NCCL across nodes: a ring of three, three rounds)
    assert len([c for c in kube.calls if c[:2] == ("get", "pods")]) <= 3 + 4
    # every test pod deleted at the end, and none left behind
    assert not [k for k in kube.objects if k[0] == "pod"]
    # the NCCL pods printed no table: failed, named with why, not quarantined (nothing was measured)
    assert got[("a", "fabric.nccl")].status == "fail" and "printed no result" in got[("a", "fabric.nccl")].message


def test_quarantine_taints_no_node_for_a_test_that_did_not_run() -> None:
    kube = Cluster(unschedulable=("c",))
    ctx = context(kube, quarantine=True)
    r = FabricVerify().run(ctx)
    assert not [c for c in kube.calls if c[0] == "taint"], r.hosts


def test_nccl_across_nodes_runs_each_ring_pair_in_rounds_and_leaves_nothing() -> None:
    kube = Cluster()
    ctx = context(kube)
    got = verified(ctx)
    # the ring a + b, b + c, c + a: three rounds (each node's GPUs in one test at a time); the real two-node text
    # read at 1 GiB (no published floor for the lab's GPUs), its floor from the NICs: 1 x 100 Gb/s at 0.12 GB/s
    assert got[("a", "fabric.nccl-pairs")].status == "pass", got[("a", "fabric.nccl-pairs")]
    assert got[("a", "fabric.nccl-pairs")].message == (
        "448.9 GB/s all-reduce a + b at 1024 MiB, floor 9.6 GB/s, GPUDirect RDMA on all 4 connections; 448.9 GB/s "
        "all-reduce c + a at 1024 MiB, floor 9.6 GB/s, GPUDirect RDMA on all 4 connections")
    applied = [list(yaml.safe_load_all(c[1])) for c in kube.calls if c[0] == "apply"]
    kinds = [[(d["kind"], d["metadata"]["name"]) for d in docs] for docs in applied]
    secret_at = kinds.index([("Secret", "gpuk8s-fabric-ssh")])
    workers = kinds[secret_at + 1]
    assert workers == [("Pod", f"gpuk8s-fabric-worker-{n}") for n in NODES]
    assert kinds[secret_at + 2:] == [[("Pod", "gpuk8s-fabric-mpi-a")], [("Pod", "gpuk8s-fabric-mpi-b")],
                                     [("Pod", "gpuk8s-fabric-mpi-c")]]
    # the stage-one pods were gone before a worker asked for the GPUs
    first_worker = next(i for i, c in enumerate(kube.calls) if c[0] == "apply" and "fabric-worker" in c[1])
    assert any(c[0] == "delete" and "gpuk8s-fabric-nccl-a" in c for c in kube.calls[:first_worker])
    # the launcher's mpirun: every GPU of both workers, the workers' sshd by the run's key and known host key
    launcher = applied[secret_at + 2][0]["spec"]["containers"][0]["command"]
    assert launcher[:10] == ["sh", "-c", 'exec "$(command -v mpirun)" "$@"', "mpirun", "--allow-run-as-root", "-np",
                             "16", "-H", "10.0.0.2:8,10.0.0.3:8", "--bind-to"]
    assert "StrictHostKeyChecking=yes" in launcher[launcher.index("plm_rsh_args") + 1]
    assert "NCCL_IB_HCA==mlx5_0:1" in launcher
    worker = applied[secret_at + 1][0]["spec"]
    assert worker["hostNetwork"] and worker["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": 8, "rdma/fabric": 1}
    assert worker["containers"][0]["command"][2].endswith("-o ListenAddress=10.0.0.2")
    # each pod mounts only its end of the SSH material: a worker never holds the client's key, a launcher never the
    # workers' host key
    def mounted(spec: dict) -> set[str]:
        return {i["key"] for v in spec["volumes"] if "secret" in v for i in v["secret"]["items"]}

    assert mounted(worker) == {"authorized_keys", "host_key", "sshd_config"}
    assert mounted(applied[secret_at + 2][0]["spec"]) == {"id", "known_hosts"}
    # nothing left: pods and the Secret deleted; the keys never in a call's text but the Secret's own apply
    assert not [k for k in kube.objects if k[0] in ("pod", "secret")]
    key = [d for docs in applied for d in docs if d["kind"] == "Secret"][0]["data"]["id"]
    assert [c for c in kube.calls if key in str(c)] == [("apply", kube.calls[
        [i for i, c in enumerate(kube.calls) if c[0] == "apply"][secret_at]][1])]


def test_a_node_slow_in_both_its_pairs_is_named_and_a_worker_that_cannot_run_is_named_on_its_node() -> None:
    slow = ACROSS.replace("448.90", "  8.00")  # the 1 GiB row's bus bandwidth, below the 9.6 GB/s floor
    kube = Cluster(across=slow)
    ctx = context(kube, quarantine=True)
    r = FabricVerify().run(ctx)
    got = {(f.subject.name, f.id): f for f in ctx.findings if f.subject}
    # every pair slow: each node slow in both of its pairs, so each is named (and quarantined: measured)
    assert got[("b", "fabric.nccl-pairs")].message.startswith("this node: slow in every pair: 8 GB/s all-reduce a + b")
    assert r.hosts == {n: "quarantined (fabric.nccl-pairs)" for n in NODES}, r.hosts
    # a worker the scheduler cannot place for want of GPUs (other pods hold them): its node's pairs not tested, as
    # its own NCCL test is skipped then; the pair without it runs
    kube = Cluster(no_worker=("c",))
    ctx = context(kube, quarantine=True)
    r = FabricVerify().run(ctx)
    got = {(f.subject.name, f.id): f for f in ctx.findings if f.subject}
    assert got[("c", "fabric.nccl-pairs")].status == "skip"
    assert got[("c", "fabric.nccl-pairs")].message == (
        "all-reduce b + c not run: its GPUs are held by other pods (the worker not scheduled: 0/4 nodes are "
        "available: 1 Insufficient nvidia.com/gpu.); all-reduce c + a not run: its GPUs are held by other pods (the "
        "worker not scheduled: 0/4 nodes are available: 1 Insufficient nvidia.com/gpu.)")
    assert got[("a", "fabric.nccl-pairs")].status == "pass"
    # never a silent gap: the partners name the pair that did not run beside the one they passed
    assert got[("a", "fabric.nccl-pairs")].message.endswith("all-reduce c + a not run: the worker on c did not run")
    assert "all-reduce b + c not run: the worker on c did not run" in got[("b", "fabric.nccl-pairs")].message
    assert [c[1] for c in kube.calls if c[0] == "apply" and "fabric-mpi" in c[1]].__len__() == 1
    assert "c" not in r.hosts  # a test that did not run quarantines nothing
    assert ", 1 of 3 pair(s) measured in " in r.message  # the pairs that did not run are not counted as tested
    # for want of its RDMA device (the RDMA plugin offers none): a failure, named on the node
    kube = Cluster(no_worker=("c",))
    kube.worker_said = "0/4 nodes are available: 1 Insufficient rdma/fabric."
    ctx = context(kube)
    got = verified(ctx)
    assert got[("c", "fabric.nccl-pairs")].status == "fail"
    assert got[("c", "fabric.nccl-pairs")].message.startswith(
        "all-reduce b + c did not run: the worker here not scheduled (0/4 nodes are available: 1 Insufficient "
        "rdma/fabric.)")
    # a launcher whose ranks ran on one host only is not read as a pair's result
    kube = Cluster(across=(REAL / "nccl" / "allreduce-h100-8gpu-single-node-nvls-nccl-tests-290.txt").read_text())
    ctx = context(kube)
    got = verified(ctx)
    assert "its ranks ran on 1 host(s), not on both nodes" in got[("a", "fabric.nccl-pairs")].message


def test_the_dry_run_shows_the_secret_without_keys() -> None:
    kube = Cluster()
    ctx = context(kube)
    plan = FabricVerify().plan(ctx)
    shown = "\n".join(c.manifest for c in plan.changes)
    assert "kind: Secret" in shown and "(made at run time, never shown)" in shown and "PRIVATE KEY" not in shown
    assert [c.what for c in plan.changes if "round" in c.what] == [
        "round 1: NCCL all-reduce across a and b (a launcher pod, then deleted)",
        "round 2: NCCL all-reduce across b and c (a launcher pod, then deleted)",
        "round 3: NCCL all-reduce across c and a (a launcher pod, then deleted)"]
    assert not [c for c in kube.calls if c[0] == "apply"]


def test_a_launcher_that_cannot_reach_a_worker_is_named_with_ssh_and_open_mpis_words() -> None:
    orte = (REAL / "mpi" / "mpirun-ssh-refused-orte-failed-daemon-launch.txt").read_text()
    kube = Cluster(across=orte)
    ctx = context(kube, quarantine=True)
    r = FabricVerify().run(ctx)
    got = {(f.subject.name, f.id): f for f in ctx.findings if f.subject}
    assert got[("a", "fabric.nccl-pairs")].message.startswith(
        "all-reduce a + b printed no result: the launcher Failed: ssh: connect to host 192.168.43.57 port 22: "
        "Connection refused / ORTE was unable to reliably start one or more daemons.; ")
    assert not r.hosts  # nothing measured: nothing quarantined
    # ssh names the worker it could not reach (b's address, 10.0.0.3): the pair a + b is b's failure, not a's
    kube = Cluster(across=orte.replace("192.168.43.57", "10.0.0.3"))
    ctx = context(kube)
    FabricVerify().run(ctx)
    said = {n: f.message for f in ctx.findings if f.subject and f.id == "fabric.nccl-pairs" for n in [f.subject.name]}
    assert "all-reduce a + b printed no result: the launcher Failed: ssh: connect to host 10.0.0.3" in said["b"]
    assert "all-reduce a + b printed no result" not in said["a"], said["a"]
    assert "all-reduce a + b not run: ssh could not reach the worker on b" in said["a"]


def test_a_users_secret_of_the_runs_name_is_left_alone_and_the_pairs_are_not_run() -> None:
    kube = Cluster()
    users = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gpuk8s-fabric-ssh", "namespace": "default"},
             "data": {"id": "dXNlcg=="}}
    kube.objects[("secret", "default", "gpuk8s-fabric-ssh")] = users
    ctx = context(kube)
    got = verified(ctx)
    assert got[("a", "fabric.nccl-pairs")].message == (
        "NCCL across nodes not tested: gpuk8s-fabric-ssh in namespace default exist(s) and gpuk8s did not create it: "
        "delete or rename it")
    assert kube.objects[("secret", "default", "gpuk8s-fabric-ssh")] is users  # not overwritten, not deleted
    assert not [c for c in kube.calls if c[0] == "delete" and c[1] == "secret"]
    assert not [c for c in kube.calls if c[0] == "apply" and "fabric-worker" in c[1]]


def test_gpudirect_planned_and_not_used_fails_the_pair_in_nccls_words() -> None:
    """gpudirect: peermem on every node, and NCCL's real connection lines without /GDRDMA: the pairs fail, their
    bandwidth whatever it is; the same lines with GPUDirect off are a note, not a failure."""
    peermem = loads(INV_TEXT.replace("{link_layer: roce}", "{link_layer: roce, gpudirect: peermem}"), "inventory.yaml")
    across = HOST_MEMORY + ACROSS.replace(GDR_LINES, "")
    ctx = context(Cluster(across=across), inv=peermem)
    got = verified(ctx)
    assert got[("a", "fabric.nccl-pairs")].status == "fail"
    assert got[("a", "fabric.nccl-pairs")].message.startswith(
        "all-reduce a + b: GPUDirect RDMA (peermem) planned, but 1 of 1 NCCL receive connections went through "
        "host memory")
    ctx = context(Cluster(across=across))
    got = verified(ctx)
    assert got[("a", "fabric.nccl-pairs")].status == "pass" and "2 of 2 connections through host memory" in got[
        ("a", "fabric.nccl-pairs")].message


def test_a_killed_runs_workers_of_another_ring_are_deleted_and_a_users_pod_is_not() -> None:
    """A run killed midway left the worker of a node no longer in the ring (it holds all that node's GPUs): the next
    run deletes every fabric pod gpuk8s made (its proof and managed-by labels), whatever its name; a pod of a
    look-alike name without them is left alone."""
    kube = Cluster()
    old = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "gpuk8s-fabric-worker-gone", "namespace": "default",
        "labels": {"app.kubernetes.io/managed-by": "gpuk8s", "gpuk8s.io/proof": "fabric"}}, "spec": {}}
    users = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpuk8s-fabric-notes", "namespace": "default"},
             "spec": {}}
    kube.objects[("pod", "default", "gpuk8s-fabric-worker-gone")] = old
    kube.objects[("pod", "default", "gpuk8s-fabric-notes")] = users
    FabricVerify().run(context(kube))
    assert ("pod", "default", "gpuk8s-fabric-worker-gone") not in kube.objects
    assert ("pod", "default", "gpuk8s-fabric-notes") in kube.objects
    assert not [c for c in kube.calls if c[0] == "delete" and "gpuk8s-fabric-notes" in c]


def test_a_nodes_own_run_that_ended_early_does_not_bound_its_pairs() -> None:
    """The pairs' floor takes each node's own all-reduce in the run as a bound: one that ended before its size read
    a smaller size's (lower) bandwidth and made the floor lenient. It bounds nothing now; a whole run does."""
    text = (REAL / "nccl" / "allreduce-a100-80gb-8gpu-single-node-gcm-nccl2.16.2.txt").read_text()
    cut = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("1073741824"))  # ended at 512 MiB
    ctx = context(Cluster())
    fps = FabricVerify()._targets(ctx)
    logs = {"gpuk8s-fabric-nccl-a": text, "gpuk8s-fabric-nccl-b": cut}
    nccl = {n: {} for n in fps}
    alone = FabricVerify._judge(ctx, fps, nccl, [], {}, {}, logs)[3]
    assert alone["a"] == 231.72 and alone["b"] is None and alone["c"] is None


def test_gpus_held_is_read_from_real_kube_scheduler_messages() -> None:
    """What verify --fabric skips (a worker's GPUs held by other pods) and what it fails, on kube-scheduler's own
    words (tests/fixtures/real/kubernetes/scheduler, sources in each file): GPUs short, beside reasons about the other
    nodes (a cordoned node, a selector), is a skip; another resource short is not. And OpenSSH's words name the worker
    ssh could not reach (the real mpirun text)."""
    import re

    from gpuk8s.doctor.classify import parse_fit_error
    from gpuk8s.phases.fabric_nccl import _SSH_TO, gpus_held

    sched = REAL.parent / "kubernetes" / "scheduler"

    def message(name: str) -> str:
        body = (sched / name).read_text().split("\n---\n", 1)[1]
        m = re.search(r"(\d+/\d+ nodes are available: .*?)(?:\"|$)", body, re.M)
        assert m, name
        return m.group(1)

    held = {name: gpus_held(fit.reasons) for name in (
        "insufficient-gpu-cordoned-node-2019.txt", "insufficient-gpu-old-selector-openshift311.txt",
        "hami-insufficient-gpu-memory.log") if (fit := parse_fit_error(message(name))) is not None}
    assert held == {"insufficient-gpu-cordoned-node-2019.txt": True,
                    "insufficient-gpu-old-selector-openshift311.txt": True,
                    "hami-insufficient-gpu-memory.log": False}
    orte = (REAL / "mpi" / "mpirun-ssh-refused-orte-failed-daemon-launch.txt").read_text()
    m = _SSH_TO.search(orte)
    assert m and m.group(1) == "192.168.43.57"
