"""THE answer to "what is this node's RDMA fabric, and what must it achieve?" (issue 43, docs/fabric.md).

For a GPU node whose inventory sets `fabric:`: the link layer and the ports of its fabric (preflight's checks,
verify --fabric, the labels and NCCL's environment all read them from here), the all-reduce bus bandwidth floor
of its shape from published nccl-tests results, and the RDMA write floor of a link. Pure: host, facts and test
readings in, decisions out.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuk8s.driver import rules as driver_rules
from gpuk8s.driver.rules import DriverRuleError
from gpuk8s.errors import GpuK8sError
from gpuk8s.facts.fabric import AllReduce, Gid, NcclFailure, NetChannels, RdmaPort
from gpuk8s.facts.model import HostFacts
from gpuk8s.findings import Finding, failed, passed, skipped
from gpuk8s.findings import node as finding_node
from gpuk8s.gpuplan import FABRIC_LABEL, NCCL_CONFIG_PREFIX, NCCL_LABEL, RDMA_RESOURCE, is_gpu_node
from gpuk8s.inventory.model import FabricSettings, Host
from gpuk8s.versions import at_least, fmt, release

LAYERS = {"infiniband": "InfiniBand", "roce": "Ethernet"}  # the inventory's word -> the port's link_layer
NAMES = {"InfiniBand": "InfiniBand", "Ethernet": "RoCE (Ethernet)"}
LABEL_WORDS = {"InfiniBand": "infiniband", "Ethernet": "roce"}

# A node's all-reduce below this share of the published result for its shape fails: runs of one shape differ by a
# few per cent (the corpus's 8 x H100 texts: 468-476 GB/s at 2-4 GiB), a node with an NVLink down or a GPU held
# at a lower clock loses far more.
NODE_SHARE = 0.8
# A link's RDMA write bandwidth below this share of its ports' rate fails: perftest reaches 98% of a 100 Gb/s
# RoCE port (tests/fixtures/real/fabric/perftest/ib_write_bw-roce-4qp-oci-oke.txt: 98.01 Gb/sec); a link with
# symbol errors retransmits and loses far more, while its rate still reads 400.
LINK_SHARE = 0.8
# Where no published result exists for a shape, nodes of that shape are compared with each other: one below this
# share of the best of its shape fails.
PEER_SHARE = 0.8
# Across nodes an all-reduce is bounded by the nodes' NICs: NCCL's maintainer "usually consider[s] 24GB/s is the
# peak performance per 200G NIC (12 GB/s for 100G NICs)" (nccl-tests issue 119, tests/fixtures/real/fabric/nccl/
# nic-target-nccl-tests-119.txt): 0.12 GB/s of bus bandwidth per Gb/s of line rate. The corpus's healthy two-node
# runs reach it or more (NVLS trees go beyond it): 8 x 400G InfiniBand 469 GB/s against 384, OCI's 16 x 100G RoCE
# A100s 190 against 192; the degraded run of nccl-tests issue 319 reaches 89.
NIC_BUSBW = 0.12
# A pair's all-reduce below this share of what its NICs (or its nodes' own GPUs) allow fails.
PAIR_SHARE = 0.8


def link_layer(s: FabricSettings, ports: list[RdmaPort] | tuple[RdmaPort, ...]) -> str:
    """The link layer of a node's fabric: the inventory's, or with auto InfiniBand where the node (fabric.nics) has
    an InfiniBand port, else Ethernet where it has an Ethernet one, whatever their state; "" where it has none."""
    if s.link_layer in LAYERS:
        return LAYERS[s.link_layer]
    # by what the node has, not by what is up now: an InfiniBand port Initializing while a subnet manager restarts
    # must not turn a node with Ethernet storage adapters into a RoCE node (its labels and NCCL's HCAs would change)
    have = {p.link_layer for p in ports}
    return "InfiniBand" if "InfiniBand" in have else "Ethernet" if "Ethernet" in have else ""


# GPUDirect RDMA (NVIDIA GPU Operator, "GPUDirect RDMA", Common Prerequisites: DMA-BUF needs the open kernel modules,
# CUDA 11.7 and Linux 5.12 or newer, and no MLNX_OFED/DOCA-OFED; the legacy nvidia-peermem needs MLNX_OFED or
# DOCA-OFED (the kernel's peer memory API) and ships with the driver from R470 / CUDA 11.4)
DMABUF_KERNEL = (5, 12)
PEERMEM_DRIVER = 470


def module_flavor(host: Host, facts: HostFacts) -> str | None:
    """The kernel modules the node's driver has once install ran: a managed driver's as gpuk8s chooses them, else
    the loaded module's (open, proprietary; None unknown)."""
    if host.gpu.driver.manage:
        try:
            return driver_rules.plan_for(host.gpu.driver, facts).flavor
        except (DriverRuleError, GpuK8sError):
            return None
    return facts.driver.module_flavor


def gpudirect(host: Host, facts: HostFacts) -> tuple[str, str]:
    """How GPU memory reaches the NICs: "dmabuf", "peermem" or "none", and why. auto takes dma-buf where the open
    modules and the kernel allow it, else none (nvidia-peermem needs NVIDIA's OFED stack, which gpuk8s cannot
    tell from the distribution's: `gpudirect: peermem` says it is there)."""
    want = host.gpu.fabric.gpudirect
    if want == "off":
        return "none", "gpudirect: off"
    if want == "peermem":
        return "peermem", "gpudirect: peermem (nvidia-peermem loaded, kept across reboots)"
    flavor = module_flavor(host, facts)
    kernel = release(facts.kernel) or (0,)
    missing = [w for w, bad in (("the open kernel modules", flavor != "open"),
                                (f"Linux {fmt(DMABUF_KERNEL)} or newer (this is {facts.kernel})",
                                 not at_least(kernel, DMABUF_KERNEL))) if bad]
    if not missing:
        return "dmabuf", f"dma-buf: the open kernel modules on Linux {fmt(kernel[:2])}"
    return "none", "dma-buf needs " + " and ".join(missing)


def roce_v2(gids: tuple[Gid, ...] | None, p: RdmaPort) -> Gid | None:
    """The port's first RoCE v2 GID with an IPv4 address: the one NCCL chooses by default (NCCL_IB_ADDR_FAMILY
    AF_INET) and the one its peers must reach."""
    return next((g for g in gids or () if (g.device, g.port) == (p.device, p.port) and g.version == "v2" and g.ipv4),
                None)


def chosen(s: FabricSettings, rdma: tuple[RdmaPort, ...]) -> list[RdmaPort]:
    """The ports fabric.nics names (every port where it names none)."""
    return [p for p in rdma if not s.nics or p.device in s.nics]


@dataclass(frozen=True)
class FabricPlan:
    """One node's fabric as install and verify --fabric use it."""

    node: str
    link_layer: str  # InfiniBand | Ethernet
    # the fabric's ports (fabric.nics, of its link layer) whatever their state, in device order: what the labels and
    # NCCL's environment name stays as cabled while a port is down; the tests use the active ones
    ports: tuple[RdmaPort, ...]
    gpus: int
    gpu_model: str  # nvidia-smi's name of the node's first GPU ("NVIDIA H100 80GB HBM3"), "" unknown
    nvswitch: bool  # lspci shows NVSwitches: every GPU reaches every other at full NVLink bandwidth
    gid_index: int | None = None  # RoCE: the index of every port's RoCE v2 IPv4 GID, where it is one for all
    expect_rate: int | None = None  # fabric.expect.rate

    @property
    def shape(self) -> str:
        return f"{self.gpus} x {self.gpu_model or 'unknown GPU'}{' (NVSwitch)' if self.nvswitch else ''}"

    @property
    def active(self) -> tuple[RdmaPort, ...]:
        return tuple(p for p in self.ports if p.active)

    @property
    def rate(self) -> float | None:
        """The rate most of the active ports run at (Gb/s); with none active, the inventory's expect.rate (a port
        down reads a rate of its own, 40 Gb/s on the corpus's)."""
        rates = sorted(p.rate for p in self.active if p.rate is not None)
        return max(set(rates), key=rates.count) if rates else self.expect_rate

    def labels(self) -> dict[str, str]:
        """What the node's labels say of its fabric (a job's nodeSelector picks nodes by them), and the ConfigMap of
        NCCL's environment for it."""
        out = {FABRIC_LABEL: LABEL_WORDS[self.link_layer], f"{FABRIC_LABEL}-ports": str(len(self.ports)),
               NCCL_LABEL: self.nccl_config()}
        if self.rate is not None:
            out[f"{FABRIC_LABEL}-rate"] = f"{self.rate:g}"
        return out

    def nccl_config(self) -> str:
        """The name of the ConfigMap holding nccl_env(): one per distinct environment (nodes alike share it)."""
        text = "\n".join(f"{k}={v}" for k, v in sorted(self.nccl_env().items()))
        return f"{NCCL_CONFIG_PREFIX}{hashlib.sha256(text.encode()).hexdigest()[:10]}"

    def nccl_env(self) -> dict[str, str]:
        """NCCL's environment for this node's fabric: the HCAs by exact name (NCCL_IB_HCA's '=' prefix), each with
        its port."""
        env = {"NCCL_IB_HCA": "=" + ",".join(f"{p.device}:{p.port}" for p in self.ports)}
        if self.gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(self.gid_index)
        return env


def plan(host: Host, facts: HostFacts | None) -> FabricPlan | None:
    """None for a host without `fabric:`, not a GPU node, or whose RDMA ports were not read."""
    s = host.gpu.fabric
    if not is_gpu_node(host) or not s.enabled or facts is None or facts.rdma is None:
        return None
    ports = chosen(s, facts.rdma)
    layer = link_layer(s, ports)
    if not layer:
        return None
    mine = tuple(sorted((p for p in ports if p.link_layer == layer), key=lambda p: (p.device, p.port)))
    if not mine:
        return None
    gpus = facts.gpu.gpus
    indexes = {g.index for g in (roce_v2(facts.gids, p) for p in mine) if g is not None}
    gid = next(iter(indexes)) if layer == "Ethernet" and len(indexes) == 1 else None
    return FabricPlan(host.name, layer, mine, len(gpus) or host.gpus or 0, gpus[0].name if gpus else "",
                      bool(facts.driver.nvswitches), gid, s.rate)


def plans(hosts: list[Host] | tuple[Host, ...], facts: Mapping[str, HostFacts]) -> dict[str, FabricPlan]:
    out = {}
    for h in hosts:
        p = plan(h, facts.get(h.name))
        if p is not None:
            out[h.name] = p
    return out


# -- floors ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Published:
    """One published single-node all_reduce_perf result: the bus bandwidth at its largest size."""

    name: str  # for a person
    family: str  # a pattern of nvidia-smi's GPU name
    gpus: int
    nvswitch: bool
    busbw: float  # GB/s, out of place, at `size`
    size: int  # bytes
    source: str
    fixture: str  # tests/fixtures/real/fabric/nccl/...: the text itself
    note: str = ""


PUBLISHED: tuple[Published, ...] = (
    Published("H100 SXM", r"H100 80GB HBM3|H100-SXM", 8, True, 473.60, 4 << 30,
              "NVIDIA/nccl-tests issue 290 (single node, 8 x H100 80GB HBM3, NVLink SHARP)",
              "allreduce-h100-8gpu-single-node-nvls-nccl-tests-290.txt"),
    Published("H200 SXM", r"^NVIDIA H200$|H200 141GB|H200-SXM", 8, True, 473.60, 4 << 30,
              "H100's figure (NVIDIA/nccl-tests issue 290): the H200 SXM has the H100's NVLink 4 and NVSwitch; no "
              "single-node H200 text was found",
              "allreduce-h100-8gpu-single-node-nvls-nccl-tests-290.txt", "by H100's figure"),
    Published("A100 SXM4", r"A100-SXM4-(80|40)GB", 8, True, 231.72, 1 << 30,
              "facebookresearch/gcm (single node, 8 x A100-SXM4-80GB, NCCL 2.16.2)",
              "allreduce-a100-80gb-8gpu-single-node-gcm-nccl2.16.2.txt"),
)


@dataclass(frozen=True)
class Floor:
    busbw: float  # GB/s the node must reach at `size`
    size: int
    why: str  # where the floor comes from, for a person


def published(p: FabricPlan) -> Published | None:
    for pub in PUBLISHED:
        if pub.gpus == p.gpus and pub.nvswitch == p.nvswitch and re.search(pub.family, p.gpu_model):
            return pub
    return None


def node_floor(p: FabricPlan) -> Floor | None:
    """The floor of a node's all-reduce across its own GPUs, from the published result for its shape (None: no
    result was published for it; verify then compares the nodes of one shape with each other)."""
    pub = published(p)
    if pub is None:
        return None
    return Floor(round(pub.busbw * NODE_SHARE, 2), pub.size,
                 f"{NODE_SHARE:.0%} of {pub.busbw:g} GB/s, published for {pub.gpus} x {pub.name}: "
                 f"{pub.source}")


def link_floor(a: float | None, b: float | None) -> float | None:
    """The RDMA write floor of a link between two ports (Gb/s): a share of the slower one's rate."""
    rates = [r for r in (a, b) if r is not None]
    return round(min(rates) * LINK_SHARE, 2) if rates else None


# -- naming the bad link ---------------------------------------------------------------------------------------

def port_name(device: str, port: int) -> str:
    """mlx5_0, or mlx5_0 port 2 for a dual-port adapter's second port."""
    return device if port == 1 else f"{device} port {port}"


@dataclass(frozen=True)
class LinkReading:
    """One RDMA write test between the same rail of two nodes (a port of one name on both): client -> server, Gb/s
    (None: it did not run)."""

    client: str
    server: str
    device: str
    port: int
    gbps: float | None
    floor: float | None

    @property
    def ends(self) -> tuple[tuple[str, str, int], tuple[str, str, int]]:
        return (self.client, self.device, self.port), (self.server, self.device, self.port)

    @property
    def value(self) -> float | None:
        return self.gbps


@dataclass(frozen=True)
class PairReading:
    """One NCCL all-reduce across a pair of nodes (all the GPUs of both): its bus bandwidth (GB/s; None: it did not
    run) against the pair's floor. Named as blame() names links: each end's key is (node, "", 0)."""

    a: str
    b: str
    busbw: float | None
    floor: float | None
    note: str = ""  # how NCCL moved the data (gpudirect_used)

    @property
    def ends(self) -> tuple[tuple[str, str, int], tuple[str, str, int]]:
        return (self.a, "", 0), (self.b, "", 0)

    @property
    def value(self) -> float | None:
        return self.busbw


Reading = LinkReading | PairReading


def ring(nodes: list[str]) -> list[tuple[str, str]]:
    """The pairs verify --fabric tests: each node with the next (and the last with the first), so that every node
    is in two pairs; two nodes make one pair."""
    if len(nodes) < 2:
        return []
    if len(nodes) == 2:
        return [(nodes[0], nodes[1])]
    return [(a, nodes[(i + 1) % len(nodes)]) for i, a in enumerate(nodes)]


def rounds(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The pairs in rounds where no node is in two pairs (a test holding all a node's GPUs runs one at a time):
    a ring of an even count in two rounds, of an odd count in three."""
    out: list[list[tuple[str, str]]] = []
    for pr in pairs:
        for rnd in out:
            if not {pr[0], pr[1]} & {n for p in rnd for n in p}:
                rnd.append(pr)
                break
        else:
            out.append([pr])
    return out


def slow(r: Reading) -> bool:
    return r.value is not None and r.floor is not None and r.value < r.floor


Port = tuple[str, str, int]  # (node, device, port)


def by_port(readings: Sequence[Reading]) -> dict[Port, list[Reading]]:
    """Each port's readings that ran (a port is in two pairs of a ring)."""
    out: dict[Port, list[Reading]] = {}
    for r in readings:
        if r.value is not None:
            for e in r.ends:
                out.setdefault(e, []).append(r)
    return out


def culprit(ports: dict[Port, list[Reading]], key: Port) -> bool:
    """Whether the port (of by_port) is slow in every pair it is in, and in two or more."""
    mine = ports.get(key, [])
    return len(mine) > 1 and all(slow(x) for x in mine)


def blame(readings: Sequence[Reading]) -> dict[Port, list[Reading]]:
    """Which node's port each slow reading points at: a port slow in every pair it is in (two or more) is the
    culprit; a slow pair whose ends are each fine elsewhere (or in no other pair) is named as the link between them,
    under both ends' keys. Keys: (node, device, port) -> the slow readings that name it."""
    ports = by_port(readings)
    out: dict[Port, list[Reading]] = {}
    for r in (r for r in readings if slow(r)):
        for e in [e for e in r.ends if culprit(ports, e)] or list(r.ends):
            out.setdefault(e, []).append(r)
    return out


# -- judging what the tests printed ---------------------------------------------------------------------------

def busbw_at(r: AllReduce | None, floor: Floor | None) -> float | None:
    """A run's bus bandwidth (out of place) at the floor's size, else at its largest size."""
    if r is None or not r.rows:
        return None
    rows = {size: busbw for size, busbw, _ in r.rows}
    if floor is not None and floor.size in rows:
        return rows[floor.size]
    return r.rows[-1][1]


def judge(p: FabricPlan, r: AllReduce | None, measured: dict[str, float | None],
          plans: dict[str, FabricPlan], phase: str, failures: list[NcclFailure]) -> tuple[Finding, bool]:
    """fabric.nccl of one node: its all-reduce against the floor of its shape; where none was published, against
    the best node of its shape in this run (PEER_SHARE); alone of its shape, its number without a verdict. With it,
    whether the run measured a shortfall (below the floor, or wrong results): what --quarantine may taint."""
    if r is None:
        why = "; ".join(f.detail for f in failures[:2]) or (
            f"the pod ended {phase}" if phase in ("Succeeded", "Failed") else
            f"the pod did not finish ({phase or 'not created'})")
        remedy = "; ".join(f.remedy for f in failures[:2]) or (
            f"kubectl describe pod and kubectl logs of the test pod on {p.node} (gpuk8s verify --fabric again keeps "
            "it no longer than the run)")
        return failed("fabric.nccl", f"NCCL all-reduce across {p.shape} printed no result: {why}", remedy), False
    floor = node_floor(p)
    got = busbw_at(r, floor)
    if floor is not None and floor.size not in {size for size, _, _ in r.rows}:
        return failed("fabric.nccl", f"NCCL all-reduce across {p.shape} ended before {floor.size >> 20} MiB, the size "
                      f"its floor is for (largest: {r.rows[-1][0] >> 20} MiB; the pod {phase})",
                      "kubectl logs of the test pod (GPU memory held by other processes, a crash): gpuk8s verify "
                      "--fabric again"), False
    if r.wrong:
        return failed("fabric.nccl", f"NCCL all-reduce across {p.shape}: {r.wrong} wrong result(s)",
                      "a GPU or NVLink corrupts data: gpuk8s health --level long on the node, then NVIDIA "
                      "support"), True
    if got is None:
        return failed("fabric.nccl", "no bus bandwidth read", "see the log file"), False
    if floor is None:
        peers = [v for n, v in measured.items() if v is not None and plans[n].shape == p.shape]
        if len(peers) < 2:
            return passed("fabric.nccl", f"{got:g} GB/s bus bandwidth across {p.shape}; no result is published for "
                          "this shape and no other node of it was tested: no floor"), False
        best = max(peers)
        floor = Floor(round(best * PEER_SHARE, 2), 0, f"{PEER_SHARE:.0%} of the best node of its shape ({best:g} "
                      "GB/s): no result is published for this shape")
    size = f" at {floor.size >> 20} MiB" if floor.size else ""
    text = f"{got:g} GB/s bus bandwidth across {p.shape}{size}, floor {floor.busbw:g} GB/s ({floor.why})"
    if got < floor.busbw:
        return failed("fabric.nccl", text, "a GPU held at lower clocks, an NVLink down or a GPU on a degraded PCIe "
                      "link: gpuk8s health on the node (nvidia-smi nvlink -s, clocks), then reseat or replace"), True
    return passed("fabric.nccl", text), False


def culprits(readings: Sequence[Reading]) -> set[str]:
    """The nodes with a port slow in every pair it is in (two or more): what verify --fabric --quarantine taints. A
    slow link whose ends are fine elsewhere names no node alone (either end, or the cable, may be at fault)."""
    ports = by_port(readings)
    return {key[0] for key in blame(readings) if culprit(ports, key)}


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def judge_links(readings: list[LinkReading], failed_runs: dict[str, list[str]], nodes: list[str]) -> list[Finding]:
    """fabric.rdma per node: each port blame() names, with the readings that name it; the tests of it that did not
    run (`failed_runs`: node -> why); or the node's links as measured."""
    named = blame(readings)
    ports = by_port(readings)
    out = []
    for node in nodes:
        mine = {key: rs for key, rs in named.items() if key[0] == node}
        runs = failed_runs.get(node, [])
        seen = [r for r in readings if node in (r.client, r.server) and r.gbps is not None]
        if mine:
            parts = []
            for key, rs in sorted(mine.items()):
                where = "its port: slow in every pair" if culprit(ports, key) else "the link"
                parts.append(f"{port_name(key[1], key[2])} ({where}): " + "; ".join(
                    f"{r.gbps:g} Gb/s RDMA write {r.client} -> {r.server}, floor {r.floor:g} Gb/s" for r in rs
                    if isinstance(r, LinkReading)))
            out.append(failed("fabric.rdma", "; ".join(parts + runs),
                              "a link below its rate while its ports read Active at full rate retransmits: check the "
                              "cable, transceiver and switch port named (mlxlink -d DEV -m: BER and FEC counters), "
                              "reseat or replace it; the node takes jobs at the slow link's speed until then",
                              subject=finding_node(node)))
        elif runs:
            out.append(failed("fabric.rdma", "; ".join(runs),
                              "kubectl describe pod of the test pods on the node (the RDMA device plugin's resource "
                              f"{RDMA_RESOURCE} allocatable, the image pulled); a port not active: gpuk8s preflight",
                              subject=finding_node(node)))
        elif seen:
            fine = [r.gbps or 0.0 for r in seen if not slow(r)]
            others = sorted({key[0] for key, rs in named.items() for r in rs if r in seen and key[0] != node})
            text = f"{len(fine)} RDMA write test(s) with its ring neighbours at " + (
                _span(fine) + " Gb/s" if fine else "none")
            if len(fine) < len(seen):
                text += f"; {len(seen) - len(fine)} slow, named on {', '.join(others)}"
            out.append(passed("fabric.rdma", text, subject=finding_node(node)))
    return out


# -- NCCL across nodes -----------------------------------------------------------------------------------------

def nic_target(p: FabricPlan) -> float | None:
    """What an all-reduce across nodes can reach through this node's active ports (GB/s, NIC_BUSBW); None: none
    active, or no rate read."""
    rates = [x.rate for x in p.active if x.rate is not None]
    return round(sum(rates) * NIC_BUSBW, 2) if rates else None


def pair_floor(a: FabricPlan, b: FabricPlan, size: int, alone: dict[str, float | None]) -> Floor | None:
    """The floor of an all-reduce across two nodes: PAIR_SHARE of the least of what each node's NICs allow and what
    each node's own GPUs reached alone in this run (`alone`: a node's all-reduce across its own GPUs; its GPUs bound
    the pair's too). None: no bound is known."""
    bounds: list[tuple[float, str]] = []
    for p in (a, b):
        nic = nic_target(p)
        if nic is not None:
            bounds.append((nic, f"{len(p.active)} x {p.rate:g} Gb/s NICs of {p.node} at {NIC_BUSBW:g} GB/s per Gb/s "
                                f"(nccl-tests issue 119)"))
        own = alone.get(p.node)
        if own is not None:
            bounds.append((own, f"{p.node}'s GPUs alone in this run"))
    if not bounds:
        return None
    best, why = min(bounds)
    return Floor(round(best * PAIR_SHARE, 2), size, f"{PAIR_SHARE:.0%} of {best:g} GB/s: {why}")


def judge_pairs(readings: list[PairReading], failed_runs: dict[str, list[str]], nodes: list[str],
                size: dict[tuple[str, str], int], skipped_runs: dict[str, list[str]] | None = None) -> list[Finding]:
    """fabric.nccl-pairs per node: a node slow in every pair it is in (two or more: the node's NICs, its GPU-to-NIC
    path or its GPUs) is named; a slow pair whose ends are fine in their other pairs is named as the path between
    them (either node's NICs, the cables, the switches); the runs of it that did not happen (`failed_runs`); or its
    pairs as measured. `size`: each pair's size the bandwidth is read at; `skipped_runs`: a node's pairs not run for
    want of its GPUs (held by other pods): said beside its other pairs, a skip where it has none."""
    readings = sorted(readings, key=lambda r: (r.a, r.b))  # as the ring lists them, whatever round ran them
    named = blame(readings)
    nodes_of = by_port(readings)
    out = []

    def text(r: PairReading) -> str:
        at = size.get((r.a, r.b), 0)
        return (f"{r.busbw:g} GB/s all-reduce {r.a} + {r.b}" + (f" at {at >> 20} MiB" if at else "")
                + (f", floor {r.floor:g} GB/s" if r.floor is not None else "") + (f", {r.note}" if r.note else ""))

    for node in nodes:
        key = (node, "", 0)
        runs = failed_runs.get(node, [])
        notes = (skipped_runs or {}).get(node, [])  # its pairs not run, said in any verdict of it
        seen = [r for r in readings if node in (r.a, r.b) and r.busbw is not None]
        mine = [r for r in named.get(key, []) if isinstance(r, PairReading)]
        if mine:
            where = ("this node: slow in every pair" if culprit(nodes_of, key)
                     else "the path between the pair (both nodes' NICs, cables, switches)")
            out.append(failed("fabric.nccl-pairs", f"{where}: " + "; ".join(text(r) for r in mine) +
                              "".join(f"; {x}" for x in [*runs, *notes]),
                              "gpuk8s verify --fabric's fabric.rdma names a slow port; else the GPU-to-NIC path "
                              "(preflight's fabric.affinity and fabric.gpudirect), the NICs' firmware and the "
                              "switches' counters; NCCL_DEBUG=INFO in a test job shows the transport NCCL chose",
                              subject=finding_node(node)))
        elif runs:
            out.append(failed("fabric.nccl-pairs", "; ".join([*runs, *notes]),
                              "kubectl describe pod of the fabric's worker and launcher pods (the GPUs free, the "
                              "image pulled, the sshd port free on the host); then gpuk8s verify --fabric again",
                              subject=finding_node(node)))
        elif seen:
            parts = [text(r) + (f": slow, named on {r.b if r.a == node else r.a}" if slow(r) else "")
                     for r in seen if isinstance(r, PairReading)]
            out.append(passed("fabric.nccl-pairs", "; ".join([*parts, *notes]), subject=finding_node(node)))
        elif notes:
            out.append(skipped("fabric.nccl-pairs", "; ".join(notes), subject=finding_node(node)))
    return out


def gpudirect_used(modes: tuple[str, str], ch: NetChannels) -> tuple[str, str | None]:
    """How NCCL moved a pair's data, from its connection lines (`modes`: each node's gpudirect() path): a note for
    the pair's result, and a failure where the fabric was not used as planned: TCP sockets instead of RDMA, or
    GPUDirect RDMA planned on both nodes and a connection without it (the data through host memory)."""
    if not ch.connections:
        return "NCCL printed no connection line", None
    if any(n.lower() == "socket" for n in ch.nets):
        return "", (f"NCCL went over TCP sockets ({', '.join('NET/' + n for n in ch.nets)}), not the RDMA fabric: it "
                    "found no usable RDMA device (libibverbs in the image, the rdma/fabric devices in the pod)")
    planned = [m for m in modes if m != "none"]
    if ch.gdr == ch.connections:
        return f"GPUDirect RDMA on all {ch.connections} connections", None
    if len(planned) == 2 and ch.received_gdr < ch.received:
        return "", (f"GPUDirect RDMA ({'/'.join(dict.fromkeys(planned))}) planned, but {ch.received - ch.received_gdr} "
                    f"of {ch.received} NCCL receive connections went through host memory (no /GDRDMA on NCCL's via "
                    "NET lines): nvidia-peermem not loaded or dma-buf refused, or a GPU farther from its NIC than "
                    "NCCL_NET_GDR_LEVEL allows (preflight's fabric.gpudirect and fabric.affinity)")
    if planned and ch.received and ch.received_gdr == ch.received:
        return (f"GPUDirect RDMA on all {ch.received} receive connections ({ch.gdr} of {ch.connections} in all: "
                "sends read GPU memory directly only where NCCL_NET_GDR_READ is on)"), None
    return f"{ch.connections - ch.gdr} of {ch.connections} connections through host memory: no GPUDirect RDMA " \
           "path on both nodes", None
