"""The fabric plan and verify --fabric's judgements (issue 43, gpuk8s/fabricplan.py): each node's fabric from real
hosts' ports (tests/fixtures/real/fabric/ibstat), the floors table checked against the real nccl-tests texts it
cites, a node's all-reduce judged against its floor or its peers, and the bad port or link named from the ring's
readings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuk8s import fabricplan
from gpuk8s.fabricplan import FabricPlan, LinkReading
from gpuk8s.facts import fabric
from gpuk8s.facts.model import GPU, GPUInfo, PciDevice
from gpuk8s.inventory import loads
from gpuk8s.phases.fabric_verify import pairs
from tests.unit.test_checks import READY_DRIVER, facts
from tests.unit.test_fabric import ports

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "fabric" / "nccl"
BASE = "cluster: {kubernetes_version: \"1.33\"}\nhosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"


def host(fabric_yaml: str, gpus: int = 8):
    return loads(BASE + f"  - {{name: gpu-1, address: 10.0.0.2, gpus: {gpus}, fabric: {fabric_yaml}}}\n",
                 "inventory.yaml").host("gpu-1")


def h100(n: int = 8, switches: int = 4, name: str = "NVIDIA H100 80GB HBM3"):
    return facts(gpu=GPUInfo("ok", "550.54.15", (550, 54, 15), "12.4",
                             tuple(GPU(i, name, f"GPU-{i}", 81559, "Disabled") for i in range(n))),
                 driver=dataclasses.replace(READY_DRIVER, nvswitches=tuple(
                     PciDevice(f"0000:0{i}:00.0", 0x0680, 0x22A3, "NVSwitch") for i in range(switches))),
                 rdma=ports("ibstat-h100-cx7-8x400-ib-cx6dx-disabled-gpud"))


def test_the_plan_of_an_hgx_node_takes_its_infiniband_ports_only() -> None:
    # 8 x ConnectX-7 NDR InfiniBand and a disabled Ethernet adapter (a real H100 host's ibstat)
    p = fabricplan.plan(host("{link_layer: auto}"), h100())
    assert p is not None and p.link_layer == "InfiniBand" and len(p.ports) == 8 and p.rate == 400
    assert p.shape == "8 x NVIDIA H100 80GB HBM3 (NVSwitch)"
    env = p.nccl_env()["NCCL_IB_HCA"]
    assert env.startswith("=") and env.count(":1") == 8  # exact names (NCCL: mlx5_1 would match mlx5_10 too)
    assert p.labels() == {"gpuk8s.io/fabric": "infiniband", "gpuk8s.io/fabric-ports": "8",
                          "gpuk8s.io/fabric-rate": "400", "gpuk8s.io/fabric-nccl": p.nccl_config()}
    # nodes alike share one ConfigMap; another set of HCAs, another
    assert p.nccl_config() == dataclasses.replace(p, node="gpu-9").nccl_config()
    assert p.nccl_config() != dataclasses.replace(p, ports=p.ports[:4]).nccl_config()
    assert p.nccl_config().startswith("gpuk8s-nccl-") and len(p.nccl_config()) <= 63
    # nics: named devices only; none: no plan; not read: no plan
    two = fabricplan.plan(host("{link_layer: infiniband, nics: [mlx5_0, mlx5_3]}"), h100())
    assert two is not None and [x.device for x in two.ports] == ["mlx5_0", "mlx5_3"]
    assert fabricplan.plan(host("{link_layer: none}"), h100()) is None
    assert fabricplan.plan(host("{link_layer: auto}"), dataclasses.replace(h100(), rdma=None)) is None


def _largest(name: str) -> tuple[int, float]:
    r = fabric.parse_all_reduce((NCCL / name).read_text())
    assert r is not None
    return r.rows[-1][0], r.rows[-1][1]


@pytest.mark.parametrize("pub", fabricplan.PUBLISHED, ids=lambda p: p.name)
def test_each_published_figure_is_its_real_texts_largest_size(pub: fabricplan.Published) -> None:
    """The floors table holds what the cited text says, not a number typed in."""
    assert (NCCL / pub.fixture).is_file()
    assert _largest(pub.fixture) == (pub.size, pub.busbw)


def test_floors_by_shape() -> None:
    sxm = fabricplan.plan(host("{link_layer: auto}"), h100())
    assert sxm is not None
    f = fabricplan.node_floor(sxm)
    assert f is not None and f.busbw == round(473.60 * 0.8, 2) and f.size == 4 << 30 and "issue 290" in f.why
    # the same GPUs without NVSwitch (a PCIe or NVL board), or four of them: no published figure
    assert fabricplan.node_floor(dataclasses.replace(sxm, nvswitch=False)) is None
    assert fabricplan.node_floor(dataclasses.replace(sxm, gpus=4)) is None
    assert fabricplan.node_floor(dataclasses.replace(sxm, gpu_model="NVIDIA H100 PCIe")) is None
    h200 = fabricplan.node_floor(dataclasses.replace(sxm, gpu_model="NVIDIA H200"))
    assert h200 is not None and "H100's figure" in h200.why
    a100 = fabricplan.node_floor(dataclasses.replace(sxm, gpu_model="NVIDIA A100-SXM4-40GB"))
    assert a100 is not None and a100.busbw == round(231.72 * 0.8, 2) and a100.size == 1 << 30


def _run(busbw_at_top: float, size: int = 4 << 30, wrong: int = 0) -> fabric.AllReduce:
    return fabric.AllReduce(((size // 2, busbw_at_top * 0.95, busbw_at_top * 0.95), (size, busbw_at_top, busbw_at_top)),
                            wrong, busbw_at_top, "2.26.2")


def test_a_node_is_judged_against_its_shapes_floor_or_its_peers() -> None:
    sxm = fabricplan.plan(host("{link_layer: auto}"), h100())
    assert sxm is not None
    plans = {"a": dataclasses.replace(sxm, node="a"), "b": dataclasses.replace(sxm, node="b")}
    ok = fabricplan.judge(plans["a"], _run(470.1), {}, plans, "Succeeded", [])[0]
    assert ok.status == "pass" and ok.message.startswith("470.1 GB/s bus bandwidth across 8 x NVIDIA H100 80GB HBM3 "
                                                          "(NVSwitch) at 4096 MiB, floor 378.88 GB/s")
    slow = fabricplan.judge(plans["a"], _run(300.0), {}, plans, "Succeeded", [])[0]
    assert slow.status == "fail" and "nvlink" in slow.remedy.lower()
    assert fabricplan.judge(plans["a"], _run(470.0, wrong=3), {}, plans, "Succeeded", [])[0].message.endswith(
        "3 wrong result(s)")
    # a shape with no published figure: against the best node of it in the run; alone, no verdict
    odd = {n: dataclasses.replace(p, gpus=4) for n, p in plans.items()}
    measured = {"a": 100.0, "b": 40.0}
    assert fabricplan.judge(odd["b"], _run(40.0), measured, odd, "Succeeded", [])[0].status == "fail"
    assert fabricplan.judge(odd["a"], _run(100.0), measured, odd, "Succeeded", [])[0].status == "pass"
    alone = fabricplan.judge(odd["a"], _run(100.0), {"a": 100.0}, odd, "Succeeded", [])[0]
    assert alone.status == "pass" and "no floor" in alone.message
    # no result: the pod's own NCCL failure is the message, with its remedy (the real text's words)
    log = (NCCL / "err-ib-no-device-found-socket-fallback-h100-nccl-1519.txt").read_text()
    none = fabricplan.judge(plans["a"], None, {}, plans, "Failed", fabric.classify_nccl(log))[0]
    assert none.status == "fail" and "found no RDMA device" in none.message and "device plugin" in none.remedy
    timeout = fabricplan.judge(plans["a"], None, {}, plans, "Pending", [])[0]
    assert "did not finish (Pending)" in timeout.message


def _reading(a: str, b: str, dev: str, gbps: float | None, port: int = 1) -> LinkReading:
    return LinkReading(a, b, dev, port, gbps, 320.0)


def test_the_ring_pairs_each_node_with_the_next() -> None:
    assert fabricplan.ring(["a"]) == []
    assert fabricplan.ring(["a", "b"]) == [("a", "b")]
    assert fabricplan.ring(["a", "b", "c", "d"]) == [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]


def test_a_port_slow_in_both_its_pairs_is_named_on_its_node() -> None:
    rs = [_reading(a, b, dev, 97.0 if "c" in (a, b) and dev == "mlx5_1" else 388.0)
          for a, b in fabricplan.ring(["a", "b", "c", "d"]) for dev in ("mlx5_0", "mlx5_1")]
    assert set(fabricplan.blame(rs)) == {("c", "mlx5_1", 1)}
    assert fabricplan.culprits(rs) == {"c"}  # what --quarantine taints
    found = {f.subject.name: f for f in fabricplan.judge_links(rs, {}, ["a", "b", "c", "d"]) if f.subject}
    assert found["c"].status == "fail" and found["c"].message.startswith("mlx5_1 (its port: slow in every pair): ")
    assert "97 Gb/s RDMA write b -> c, floor 320 Gb/s" in found["c"].message
    assert found["a"].message == "4 RDMA write test(s) with its ring neighbours at 388 Gb/s"
    assert found["b"].message.endswith("1 slow, named on c") and found["b"].status == "pass"


def test_a_slow_pair_whose_ends_are_fine_elsewhere_names_the_link() -> None:
    rs = [_reading(a, b, "mlx5_0", 97.0 if (a, b) == ("b", "c") else 388.0)
          for a, b in fabricplan.ring(["a", "b", "c", "d"])]
    assert set(fabricplan.blame(rs)) == {("b", "mlx5_0", 1), ("c", "mlx5_0", 1)}
    assert fabricplan.culprits(rs) == set()  # either end, or the cable: neither is quarantined alone
    found = {f.subject.name: f for f in fabricplan.judge_links(rs, {}, ["a", "b", "c", "d"]) if f.subject}
    assert found["b"].status == found["c"].status == "fail"
    assert found["b"].message.startswith("mlx5_0 (the link): 97 Gb/s")
    # two nodes: one pair, its ends cannot be told apart
    two = [_reading("a", "b", "mlx5_0", 50.0)]
    assert set(fabricplan.blame(two)) == {("a", "mlx5_0", 1), ("b", "mlx5_0", 1)}


def test_a_test_that_did_not_run_is_named_and_not_read_as_slow() -> None:
    rs = [_reading("a", "b", "mlx5_0", None), _reading("b", "a", "mlx5_0", 388.0)]
    assert fabricplan.blame(rs) == {}
    found = {f.subject.name: f for f in fabricplan.judge_links(
        rs, {"a": ["RDMA write to b on mlx5_0 did not run (Failed: Port number 1 state is Down)"]},
        ["a", "b"]) if f.subject}
    assert found["a"].status == "fail" and "state is Down" in found["a"].message
    assert found["b"].status == "pass"
    assert fabricplan.link_floor(400, 200) == 160.0 and fabricplan.link_floor(None, None) is None


def test_the_two_ports_of_a_dual_port_adapter_are_told_apart() -> None:
    """mlx5_0 ports 1 and 2 both in the fabric: port 2 of c slow in both its pairs is c's, port 1 is fine."""
    rs = [_reading(a, b, "mlx5_0", 97.0 if "c" in (a, b) and port == 2 else 388.0, port)
          for a, b in fabricplan.ring(["a", "b", "c", "d"]) for port in (1, 2)]
    assert set(fabricplan.blame(rs)) == {("c", "mlx5_0", 2)} and fabricplan.culprits(rs) == {"c"}
    found = {f.subject.name: f for f in fabricplan.judge_links(rs, {}, ["a", "b", "c", "d"]) if f.subject}
    assert found["c"].message.startswith("mlx5_0 port 2 (its port: slow in every pair): 97 Gb/s RDMA write b -> c")


def _fp(node: str, ports: list[tuple[str, str]]) -> FabricPlan:
    """A node's fabric plan from (device, state) pairs, NDR InfiniBand."""
    return FabricPlan(node, "InfiniBand", tuple(fabric.RdmaPort(d, 1, st, "LinkUp" if st == "Active" else "Polling",
                                                                400.0, "InfiniBand") for d, st in ports),
                      2, "NVIDIA A100-SXM4-80GB", False)


def test_rails_pair_ports_of_one_name_and_a_port_down_is_named_where_it_is() -> None:
    """Rail by name, not by position: mlx5_1 down on b does not shift b's mlx5_2 onto a's mlx5_1; the rail that
    cannot be tested is named on the node where the port is down."""
    fps = {"a": _fp("a", [("mlx5_0", "Active"), ("mlx5_1", "Active"), ("mlx5_2", "Active")]),
           "b": _fp("b", [("mlx5_0", "Active"), ("mlx5_1", "Down"), ("mlx5_2", "Active")])}
    prs, missing = pairs(fps)
    assert [(p.client.node, p.server.node, p.port.device, p.server_port.device) for p in prs] == [
        ("a", "b", "mlx5_0", "mlx5_0"), ("a", "b", "mlx5_2", "mlx5_2")]
    assert missing == {"b": ["mlx5_1 is not active here: its rail to a was not tested"]}
    # the plan keeps the port down (labels and NCCL's environment stay as cabled)
    assert fps["b"].labels()["gpuk8s.io/fabric-ports"] == "3" and len(fps["b"].active) == 2
    assert fps["b"].nccl_env()["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1"


def test_a_node_with_every_port_down_keeps_its_fabric() -> None:
    """A subnet manager restarting (every port Initializing), link_layer auto: the node is still an InfiniBand
    node with its ports, so that a re-run does not drop its labels or its NCCL ConfigMap."""
    down = tuple(dataclasses.replace(x, state="Initializing") for x in ports(
        "ibstat-h100-cx7-8x400-ib-cx6dx-disabled-gpud") if x.link_layer == "InfiniBand")
    up = fabricplan.plan(host("{link_layer: auto, expect: {rate: 400}}"), h100())
    during = fabricplan.plan(host("{link_layer: auto, expect: {rate: 400}}"), dataclasses.replace(h100(), rdma=down))
    assert up is not None and during is not None and during.link_layer == "InfiniBand" and not during.active
    assert during.labels() == up.labels() and during.nccl_config() == up.nccl_config()


def test_a_run_that_stopped_before_the_floors_size_fails() -> None:
    sxm = fabricplan.plan(host("{link_layer: auto}"), h100())
    assert sxm is not None
    part = fabric.AllReduce(((1 << 30, 460.0, 460.0),), 0, 460.0, "")
    f = fabricplan.judge(sxm, part, {}, {"gpu-1": sxm}, "Failed", [])[0]
    assert f.status == "fail" and "ended before 4096 MiB" in f.message and "largest: 1024 MiB" in f.message


def test_auto_keeps_an_infiniband_node_while_its_subnet_manager_restarts() -> None:
    """An HGX host's InfiniBand ports Initializing and its Ethernet storage adapter Active (the corpus's H100 host
    with a RoCE adapter): auto stays InfiniBand, with the same labels and NCCL environment as when all is up."""
    real = ports("ibstat-h100-cx7-8x400-ib-cx6dx-disabled-gpud")
    eth_up = tuple(dataclasses.replace(x, state="Active", physical_state="LinkUp") if x.link_layer == "Ethernet"
                   else dataclasses.replace(x, state="Initializing") for x in real)
    up = fabricplan.plan(host("{link_layer: auto, expect: {rate: 400}}"), h100())
    during = fabricplan.plan(host("{link_layer: auto, expect: {rate: 400}}"), dataclasses.replace(h100(), rdma=eth_up))
    assert up is not None and during is not None and during.link_layer == "InfiniBand"
    assert during.labels() == up.labels()


def test_only_a_measured_shortfall_counts_for_quarantine() -> None:
    sxm = fabricplan.plan(host("{link_layer: auto}"), h100())
    assert sxm is not None
    plans = {"gpu-1": sxm}
    assert fabricplan.judge(sxm, _run(300.0), {}, plans, "Succeeded", [])[1] is True  # below the floor
    assert fabricplan.judge(sxm, _run(470.0, wrong=2), {}, plans, "Succeeded", [])[1] is True  # wrong results
    part = fabric.AllReduce(((1 << 30, 460.0, 460.0),), 0, 460.0, "")
    assert fabricplan.judge(sxm, part, {}, plans, "Failed", [])[1] is False  # ended early: not measured
    assert fabricplan.judge(sxm, None, {}, plans, "Pending", [])[1] is False  # did not run
    assert fabricplan.judge(sxm, _run(470.0), {}, plans, "Succeeded", [])[1] is False


# -- NCCL across nodes --------------------------------------------------------------------------------------------

def test_the_rounds_hold_each_node_in_one_pair_at_a_time() -> None:
    for n in range(2, 9):
        nodes = [f"n{i}" for i in range(n)]
        rs = fabricplan.rounds(fabricplan.ring(nodes))
        assert sorted(p for r in rs for p in r) == sorted(fabricplan.ring(nodes))  # every pair, once
        assert all(len({x for p in r for x in p}) == 2 * len(r) for r in rs)  # no node twice in a round
        assert len(rs) == (1 if n == 2 else 2 if n % 2 == 0 else 3)


def test_the_pair_floor_from_the_nics_passes_the_real_healthy_pair_and_fails_the_degraded_one() -> None:
    """Two nodes of 8 x H100 with 8 x 400G InfiniBand (nccl-tests issues 309 and 319, their .meta say so): NCCL's
    maintainer's 0.12 GB/s per Gb/s (nccl-tests issue 119) makes 384 GB/s, the floor 307.2; the healthy run reads
    466.52 at 4 GiB, the degraded one 88.85."""
    p = fabricplan.plan(host("{link_layer: infiniband}"), h100())
    assert p is not None and fabricplan.nic_target(p) == 384.0
    a, b = dataclasses.replace(p, node="a"), dataclasses.replace(p, node="b")
    floor = fabricplan.pair_floor(a, b, 4 << 30, {})
    assert floor is not None and floor.busbw == 307.2 and "8 x 400 Gb/s NICs of a" in floor.why
    for name, ok in (("allreduce-h100-2node-ib-ndr-nccl2.26.2-nccl-tests-309.txt", True),
                     ("allreduce-h100-2node-ib-degraded-doca-nccl-tests-319.txt", False)):
        r = fabric.parse_all_reduce((NCCL / name).read_text())
        assert r is not None and dict(r.hosts) and sorted(dict(r.hosts).values()) == [8, 8]
        got = fabricplan.busbw_at(r, floor)
        assert got is not None and (got >= floor.busbw) is ok, (name, got)
    # a node's own GPUs bound its pairs too: alone at 21 GB/s (GPUs over PCIe), the NICs do not set the floor
    low = fabricplan.pair_floor(a, b, 1 << 30, {"a": 21.0, "b": 400.0})
    assert low is not None and low.busbw == 16.8 and "a's GPUs alone" in low.why
    # no active port and nothing measured: no floor
    down = dataclasses.replace(a, ports=tuple(dataclasses.replace(x, state="Down") for x in a.ports))
    assert fabricplan.pair_floor(down, down, 1 << 30, {}) is None


def test_a_node_slow_in_both_its_pairs_is_named_a_slow_pair_alone_names_the_path() -> None:
    ring = fabricplan.ring(["a", "b", "c", "d"])
    size = {pr: 4 << 30 for pr in ring}
    rs = [fabricplan.PairReading(x, y, 80.0 if "c" in (x, y) else 380.0, 307.2) for x, y in ring]
    assert fabricplan.culprits(rs) == {"c"}
    found = {f.subject.name: f for f in fabricplan.judge_pairs(rs, {}, ["a", "b", "c", "d"], size) if f.subject}
    assert found["c"].status == "fail" and found["c"].message == (
        "this node: slow in every pair: 80 GB/s all-reduce b + c at 4096 MiB, floor 307.2 GB/s; 80 GB/s all-reduce "
        "c + d at 4096 MiB, floor 307.2 GB/s")
    assert found["b"].status == "pass" and found["b"].message.endswith("floor 307.2 GB/s: slow, named on c")
    rs = [fabricplan.PairReading(x, y, 80.0 if (x, y) == ("b", "c") else 380.0, 307.2) for x, y in ring]
    assert fabricplan.culprits(rs) == set()
    found = {f.subject.name: f for f in fabricplan.judge_pairs(rs, {}, ["a", "b", "c", "d"], size) if f.subject}
    assert found["b"].status == found["c"].status == "fail"
    assert found["b"].message.startswith("the path between the pair")
    assert found["a"].status == "pass"
    # a run that did not happen: named, not slow
    found = {f.subject.name: f for f in fabricplan.judge_pairs(
        [fabricplan.PairReading("a", "b", None, 307.2)], {"a": ["all-reduce a + b printed no result: x"]},
        ["a", "b"], size) if f.subject}
    assert found["a"].status == "fail" and "b" not in found


def test_how_nccl_moved_a_pairs_data_from_its_real_connection_lines() -> None:
    def read(name: str) -> fabric.NetChannels:
        return fabric.parse_nccl_channels((NCCL / f"{name}.txt").read_text())

    gdr, host_mem, sockets = (read("channels-gdrdma-2node-8nic-nccl2.29.3-slurmv4"),
                              read("channels-no-gdr-ib-a100-nccl-1412"), read("channels-socket-2node-nccl-tests-166"))
    assert fabricplan.gpudirect_used(("dmabuf", "dmabuf"), gdr) == ("GPUDirect RDMA on all 4 connections", None)
    note, bad = fabricplan.gpudirect_used(("peermem", "peermem"), host_mem)
    assert bad is not None and bad.startswith("GPUDirect RDMA (peermem) planned, but 1 of 1 NCCL receive "
                                              "connections went through host memory")
    # sends without /GDRDMA (NCCL_NET_GDR_READ off, as on PCIe platforms) and every receive with it: used
    mixed = fabric.NetChannels(4, 2, ("IB",), 2, 2)
    note, bad = fabricplan.gpudirect_used(("dmabuf", "dmabuf"), mixed)
    assert bad is None and note.startswith("GPUDirect RDMA on all 2 receive connections (2 of 4 in all")
    # no GPUDirect path planned on a node: said, not failed
    note, bad = fabricplan.gpudirect_used(("none", "dmabuf"), host_mem)
    assert bad is None and note.startswith("2 of 2 connections through host memory")
    note, bad = fabricplan.gpudirect_used(("none", "none"), sockets)
    assert bad is not None and bad.startswith("NCCL went over TCP sockets (NET/Socket)")
    assert fabricplan.gpudirect_used(("dmabuf", "dmabuf"), fabric.NetChannels(0, 0, ())) == (
        "NCCL printed no connection line", None)
