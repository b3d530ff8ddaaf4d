"""Parsers of what the RDMA fabric's tools print (issue 43): `ibstat` (and `ibstatus`), `nvidia-smi topo -m`,
nccl-tests' `all_reduce_perf` and NCCL's failure messages. Pure, linear in the text, any text accepted (host and
pod data: bounded, never trusted beyond the fields read).

Real texts these read, with their sources: tests/fixtures/real/fabric/ (tests/unit/test_real_corpus_fabric.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINES = 20000  # no host prints more (16 HCAs x 2 ports of ibstat is ~600 lines): the rest is not read
MAX_LINE = 4096  # characters of a line read

# The PCI device ids of NVIDIA (Mellanox) network adapters, as `ibstat`'s "CA type: MT<decimal id>" names them
# (MT4129 = 0x1021): sriov-network-operator's supported NIC table (vendor 15b3), the PCI ids database's names.
CA_TYPES = {
    0x1013: "ConnectX-4", 0x1015: "ConnectX-4 Lx", 0x1017: "ConnectX-5", 0x1019: "ConnectX-5 Ex",
    0x101B: "ConnectX-6", 0x101D: "ConnectX-6 Dx", 0x101F: "ConnectX-6 Lx", 0x1021: "ConnectX-7",
    0x1023: "ConnectX-8", 0xA2D6: "BlueField-2", 0xA2DC: "BlueField-3",
}


def _lines(text: str) -> list[str]:
    return [ln[:MAX_LINE].rstrip("\r") for ln in text.split("\n", MAX_LINES)[:MAX_LINES]]


# -- ibstat ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA adapter as `ibstat` prints it (infiniband-diags: "CA 'mlx5_0'" then "Port 1:")."""

    device: str  # mlx5_0
    port: int
    state: str  # Active, Down, Initializing, Armed (the logical state)
    physical_state: str  # LinkUp, Disabled, Polling, ...
    rate: float | None  # Gb/s ("Rate: 400"; ibstatus and sysfs: "400 Gb/sec (4X NDR)")
    link_layer: str  # InfiniBand or Ethernet (RoCE)
    ca_type: str = ""  # "MT4129"
    firmware: str = ""
    sm_lid: int | None = None  # InfiniBand: the subnet manager's LID (0: none answered)

    @property
    def adapter(self) -> str:
        """The adapter's family from its CA type ("ConnectX-7"), or the CA type as printed."""
        m = re.fullmatch(r"MT([0-9]{1,6})", self.ca_type)
        return CA_TYPES.get(int(m.group(1)), self.ca_type) if m else self.ca_type

    @property
    def active(self) -> bool:
        return self.state == "Active" and self.physical_state == "LinkUp"


_CA = re.compile(r"^CA '([A-Za-z0-9_.:-]{1,64})'$")
_KV = re.compile(r"^\s+([A-Za-z][A-Za-z ]{0,40}):\s*(.{0,200})$")
_PORT = re.compile(r"^\s+Port ([0-9]{1,3}):$")
_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:/()-]{0,80}$")


def parse_ibstat(text: str) -> tuple[RdmaPort, ...]:
    """Every port `ibstat` lists, in its order. A port is kept once its State line was read; what follows the last
    whole block (an error line, a cut paste) is not read as a port."""
    out: list[RdmaPort] = []
    ca: dict[str, str] = {}
    port: dict[str, str] | None = None
    device = ""
    number = 0

    def flush() -> None:
        if port is not None and device and "State" in port:
            rate = port.get("Rate", "")
            sm = port.get("SM lid", "")
            out.append(RdmaPort(device, number, port["State"], port.get("Physical state", ""), _rate(rate),
                                port.get("Link layer", ""), ca.get("CA type", ""), ca.get("Firmware version", ""),
                                int(sm) if sm.isdigit() and len(sm) <= 6 else None))

    for line in _lines(text):
        m = _CA.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if m:
            flush()
            device, ca, port = m.group(1), {}, None
            continue
        m = _PORT.match(line)
        if m and device:
            flush()
            number, port = int(m.group(1)), {}
            continue
        m = _KV.match(line)
        if m and device:
            key, value = m.group(1).strip(), m.group(2).strip()
            target = port if port is not None else ca
            if key not in target and _VALUE.match(value):
                target[key] = value
    flush()
    return tuple(out)


_RATE = re.compile(r"^([0-9]{1,4}(?:\.[0-9]{1,2})?)(?: Gb/sec(?: \([0-9]{1,2}X [A-Z]{2,4}\))?)?$")


def _rate(value: str) -> float | None:
    m = _RATE.match(value.strip())
    return float(m.group(1)) if m else None


# ibstatus (infiniband-diags' script over /sys/class/infiniband/DEV/ports/N/): the sysfs values as the kernel writes
# them ("4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", "InfiniBand"; drivers/infiniband/core/sysfs.c)
_STATUS = re.compile(r"^Infiniband device '([A-Za-z0-9_.:-]{1,64})' port ([0-9]{1,3}) status:$")
_SYSFS_KV = re.compile(r"^\s+([a-z_ ]{1,20}):\s+(.{0,200})$")
IB_STATES = {"1": "Down", "2": "Initializing", "3": "Armed", "4": "Active", "5": "Active Defer"}
_NUMBERED = re.compile(r"^([0-9]{1,2}): ([A-Za-z][A-Za-z ]{0,30})$")


def parse_ibstatus(text: str) -> tuple[RdmaPort, ...]:
    """Every port `ibstatus` lists (the kernel's sysfs values): state and physical state by their numbers, the rate
    in Gb/s."""
    out: list[RdmaPort] = []
    cur: dict[str, str] | None = None
    where = ("", 0)

    def flush() -> None:
        if cur is not None and "state" in cur:
            st = _NUMBERED.match(cur["state"])
            ph = _NUMBERED.match(cur.get("phys state", ""))
            out.append(RdmaPort(where[0], where[1], IB_STATES.get(st.group(1), st.group(2)) if st else cur["state"],
                                ph.group(2) if ph else cur.get("phys state", ""), _rate(cur.get("rate", "")),
                                cur.get("link_layer", ""), sm_lid=_hex(cur.get("sm lid", ""))))

    for line in _lines(text):
        m = _STATUS.match(line.strip())
        if m:
            flush()
            cur, where = {}, (m.group(1), int(m.group(2)))
            continue
        m = _SYSFS_KV.match(line)
        if m and cur is not None and m.group(1) not in cur:
            cur[m.group(1)] = m.group(2).strip()
    flush()
    return tuple(out)


def _hex(value: str) -> int | None:
    return int(value, 16) if re.fullmatch(r"0x[0-9a-fA-F]{1,8}", value) else None


# -- error counters ------------------------------------------------------------------------------------------

# An RDMA port's error counters as the kernel's sysfs names them (drivers/infiniband/core/sysfs.c PORT_PMA_ATTR: the
# port's PMA counters; they count since the last clear and stop at their width's maximum). infiniband-diags'
# ibqueryerrors reports each of them above its threshold, "The default threshold is zero (0)" (ibqueryerrors(8)).
ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
                  "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors", "VL15_dropped")
# what `grep -H . FILE...` prints of them (the probe prints the same): PATH:VALUE
_COUNTER = re.compile(r"^/sys/class/infiniband/([A-Za-z0-9_.:-]{1,64})/ports/([0-9]{1,3})/counters/([A-Za-z0-9_]{1,64})"
                      r":([0-9]{1,20})$")


def parse_port_counters(text: str) -> dict[tuple[str, int], dict[str, int]]:
    """Each port's error counters, (device, port) -> name -> value; other lines and counters ignored."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    for line in _lines(text):
        m = _COUNTER.match(line.strip())
        if m and m.group(3) in ERROR_COUNTERS:
            out.setdefault((m.group(1), int(m.group(2))), {})[m.group(3)] = int(m.group(4))
    return out


# -- PCIe ACS ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AcsBridge:
    """A PCI device with the Access Control Services capability, as `lspci -vvv` prints it: its ACSCtl controls."""

    bdf: str
    name: str
    ctl: tuple[str, ...]  # the controls on ("SrcValid", "ReqRedir", ...)

    @property
    def redirects(self) -> bool:
        """Peer-to-peer requests or completions sent up to the root complex (NCCL's troubleshooting guide, "PCI
        Access Control Services (ACS)": it can cut GPUDirect's bandwidth or hang it)."""
        return "ReqRedir" in self.ctl or "CmpltRedir" in self.ctl


@dataclass(frozen=True)
class AcsReading:
    bridges: tuple[AcsBridge, ...]
    denied: bool  # "Capabilities: <access denied>": lspci ran without root, the extended capabilities unread


_PCI_HEAD = re.compile(r"^((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (.{1,300})$")
_ACS_CTL = re.compile(r"^\s+ACSCtl:\s+((?:[A-Za-z]{1,20}[+-]\s*){1,16})$")


def parse_lspci_acs(text: str) -> AcsReading:
    """Each device's ACSCtl line under its header line (other lines ignored: the probe prints only these)."""
    out: list[AcsBridge] = []
    head: tuple[str, str] | None = None
    denied = False
    for line in _lines(text):
        m = _PCI_HEAD.match(line)
        if m:
            head = (m.group(1), m.group(2).strip())
            continue
        if "<access denied>" in line:
            denied = True
            continue
        m = _ACS_CTL.match(line)
        if m and head is not None:
            on = tuple(t[:-1] for t in m.group(1).split() if t.endswith("+"))
            out.append(AcsBridge(head[0], head[1], on))
            head = None
    return AcsReading(tuple(out), denied)


# -- RoCE's MTU -----------------------------------------------------------------------------------------------

_NET_MTU = re.compile(r"^/sys/class/net/([A-Za-z0-9_][A-Za-z0-9_.:@-]{0,31})/mtu:([0-9]{1,6})$")
# The RoCE path MTU the kernel derives from a netdev's MTU (include/rdma/ib_addr.h iboe_get_mtu): the MTU less the
# RoCE headers (GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 bytes, include/rdma/ib_pack.h), rounded down
# to an InfiniBand MTU (mlx5 then takes min(4096, that)): 1500 gives 1024, 4200 or 9000 gives 4096.
ROCE_OVERHEAD = 96
IB_MTUS = (4096, 2048, 1024, 512, 256)


def parse_net_mtu(text: str) -> dict[str, int]:
    """Each network interface's MTU from `grep -H . /sys/class/net/NAME/mtu` lines."""
    out: dict[str, int] = {}
    for line in _lines(text):
        m = _NET_MTU.match(line.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def roce_mtu(netdev_mtu: int) -> int:
    """The RoCE path MTU of a netdev MTU (0: below 256 + the headers)."""
    return next((m for m in IB_MTUS if netdev_mtu - ROCE_OVERHEAD >= m), 0)


# -- show_gids -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gid:
    """One entry of a RoCE port's GID table as MLNX_OFED's show_gids prints it (the kernel's sysfs gids/N,
    gid_attrs/types/N: "IB/RoCE v1" or "RoCE v2", gid_attrs/ndevs/N)."""

    device: str
    port: int
    index: int
    gid: str
    ipv4: str  # "" for an IPv6 or link-local GID
    version: str  # v1 | v2
    netdev: str


_GID_ROW = re.compile(r"^([A-Za-z0-9_.:-]{1,64})\s+([0-9]{1,3})\s+([0-9]{1,4})\s+((?:[0-9a-f]{4}:){7}[0-9a-f]{4})\s+"
                      r"(?:([0-9]{1,3}(?:\.[0-9]{1,3}){3})\s+)?(v1|v2)(?:\s+([A-Za-z0-9_.@:-]{1,32}))?\s*$")


def parse_show_gids(text: str) -> tuple[Gid, ...]:
    """show_gids' rows (the header and its dashes, and anything else, skipped)."""
    out = []
    for line in _lines(text):
        m = _GID_ROW.match(line)
        if m:
            out.append(Gid(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5) or "", m.group(6),
                           m.group(7) or ""))
    return tuple(out)


# -- nvidia-smi topo -m ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Topology:
    """`nvidia-smi topo -m`: how each GPU reaches each NIC (X, PIX, PXB, PHB, NODE, SYS, NV#: its legend)."""

    gpus: tuple[str, ...]  # GPU0 ...
    nics: tuple[str, ...]  # the RDMA device of each NIC column (the NIC Legend's mlx5_N; the column's own name else)
    links: dict[tuple[str, str], str]  # (GPU, NIC device) -> PIX | PXB | PHB | NODE | SYS

    def nearest(self, gpu: str) -> tuple[str, tuple[str, ...]]:
        """The closest relation of a GPU to any NIC and the NICs at it ("", () where it reaches none)."""
        for rel in ("PIX", "PXB", "PHB", "NODE", "SYS"):
            nics = tuple(n for n in self.nics if self.links.get((gpu, n)) == rel)
            if nics:
                return rel, nics
        return "", ()


_RELATION = re.compile(r"^(X|PIX|PXB|PHB|NODE|SYS|NV[0-9]{1,3})$")
_GPU = re.compile(r"^GPU[0-9]{1,3}$")
_NIC_LEGEND = re.compile(r"^\s*(NIC[0-9]{1,3}): ([A-Za-z0-9_.:-]{1,64})\s*$")


def parse_topo(text: str) -> Topology | None:
    """The matrix of `nvidia-smi topo -m` (or `-mp`), with NIC columns named as the NIC Legend says (drivers before
    R470 printed the RDMA device itself as the column's name); None when the text holds no matrix."""
    lines = _lines(text)
    header: list[str] | None = None
    rows: dict[str, list[str]] = {}
    legend: dict[str, str] = {}
    for line in lines:
        m = _NIC_LEGEND.match(line)
        if m:
            legend[m.group(1)] = m.group(2)
            continue
        cells = line.split("\t") if "\t" in line else re.split(r"\s{2,}|(?<=\S)\s(?=\S)", line)
        words = [c.strip() for c in cells]
        if header is None:
            first = [w for w in words if w][:1]
            if first and _GPU.match(first[0]):
                header = []
                for w in [w for w in words if w]:
                    if w in ("CPU Affinity", "CPU", "NUMA Affinity", "NUMA", "GPU NUMA ID"):
                        break
                    header.append(w)
            continue
        if not words:
            continue
        label = next((w for w in words if w), "")
        if not _GPU.match(label) or label in rows:
            continue
        values = [w for w in words if w][1:]
        rows[label] = values[:len(header)]
    if not header or not rows:
        return None
    nic_cols = [i for i, h in enumerate(header) if not _GPU.match(h)]
    nics = tuple(legend.get(header[i], header[i]) for i in nic_cols)
    links: dict[tuple[str, str], str] = {}
    for gpu, values in rows.items():
        for i, nic in zip(nic_cols, nics, strict=True):
            rel = values[i] if i < len(values) else ""
            if _RELATION.match(rel) and rel != "X" and not rel.startswith("NV"):
                links[(gpu, nic)] = rel
    gpus = tuple(h for h in header if _GPU.match(h) and h in rows)
    return Topology(gpus, nics, links)


# -- nccl-tests ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AllReduce:
    """An `all_reduce_perf` run: each size's bus bandwidth (out of place, in place; GB/s), its errors, the average."""

    rows: tuple[tuple[int, float, float], ...]  # (bytes, busbw out of place, busbw in place)
    wrong: int  # the #wrong columns summed (0 for a correct run; -c 0 prints N/A: 0)
    avg_busbw: float | None  # "# Avg bus bandwidth : N"
    nccl: str  # "2.26.2" where the run printed "# nccl-tests ... NCCL version 2.26.2" or "NCCL version 2.26.2+cuda"
    # each host the run's ranks were on, with its count of ranks, as "# Using devices" lists them ("#  Rank  8 Group
    # 0 Pid  26633 on bm-h100-02 device  0 ..."): a run across nodes proves it ran on each
    hosts: tuple[tuple[str, int], ...] = ()

    @property
    def peak_busbw(self) -> float:
        return max((max(o, i) for _, o, i in self.rows), default=0.0)


_NUM = r"[0-9]{1,12}(?:\.[0-9]{1,6})?"
# the run's rows: size count type redop root, then time algbw busbw #wrong twice (out of place, in place); srun's
# "N: " prefix allowed
_ROW = re.compile(rf"^\s*(?:[0-9]{{1,5}}:\s+)?([0-9]{{1,15}})\s+([0-9]{{1,15}})\s+([a-z0-9_]{{1,12}})\s+"
                  rf"([a-z]{{1,8}})\s+(-?[0-9]{{1,4}})\s+({_NUM})\s+({_NUM})\s+({_NUM})\s+([0-9]{{1,12}}|N/A)"
                  rf"\s+({_NUM})\s+({_NUM})\s+({_NUM})\s+([0-9]{{1,12}}|N/A)\s*$")
_AVG = re.compile(rf"^\s*(?:[0-9]{{1,5}}:\s+)?#\s*Avg bus bandwidth\s*:\s*({_NUM})\s*$")
_NCCL_VERSION = re.compile(r"NCCL version ([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3})")
_RANK = re.compile(r"^\s*(?:[0-9]{1,5}:\s+)?#\s+Rank\s+[0-9]{1,6}\s+Group\s+[0-9]{1,6}\s+Pid\s+[0-9]{1,10}\s+on\s+"
                   r"([^\s]{1,253})\s+device\s")


def parse_all_reduce(text: str) -> AllReduce | None:
    """nccl-tests' all_reduce_perf output; None when no row of the table is in it."""
    rows: list[tuple[int, float, float]] = []
    wrong = 0
    avg: float | None = None
    nccl = ""
    hosts: dict[str, int] = {}
    for line in _lines(text):
        m = _ROW.match(line)
        if m:
            rows.append((int(m.group(1)), float(m.group(8)), float(m.group(12))))
            wrong += sum(int(g) for g in (m.group(9), m.group(13)) if g.isdigit())
            continue
        m = _RANK.match(line)
        if m:
            hosts[m.group(1)] = hosts.get(m.group(1), 0) + 1
            continue
        m = _AVG.match(line)
        if m:
            avg = float(m.group(1))
            continue
        if not nccl:
            v = _NCCL_VERSION.search(line)
            if v:
                nccl = v.group(1)
    if not rows:
        return None
    return AllReduce(tuple(rows), wrong, avg, nccl, tuple(hosts.items()))


# NCCL's connection lines across nodes (NCCL_DEBUG=INFO; src/transport/net.cc, every version from 2.7 to 2.30):
# "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA" (2.18.3+), "Channel 01 : 13[92000] -> 4[89000] ..." (older),
# a PXN proxy rank "(8)" after the device, "/GDRDMA(PCI)" on C2C systems, "/Shared" for a shared connection. The
# network's name is the plugin's (IB, Socket, IBext_v8, gIB, ...). /GDRDMA: GPUDirect RDMA carried the connection.
_NET_CHANNEL = re.compile(r"(?:Channel|Ring) [0-9]{1,4}(?:/[0-9]{1,4})? : [0-9]{1,7}(?:\[[0-9a-f]{1,16}\])? -> "
                          r"[0-9]{1,7}(?:\[[0-9a-f]{1,16}\])? \[(send|receive)\] via NET/([A-Za-z0-9_.-]{1,32})/"
                          r"[0-9]{1,4}(?:\([0-9]{1,7}\))?(/GDRDMA(?:\(PCI\))?)?(?:/Shared)?\s*$")


@dataclass(frozen=True)
class NetChannels:
    """What NCCL's connection lines across nodes say: how many, how many GPUDirect RDMA carried, the networks."""

    connections: int
    gdr: int
    nets: tuple[str, ...]
    # the receive side's connections and those with /GDRDMA: GPUDirect RDMA writes into GPU memory wherever it is
    # available, while a send reads GPU memory directly only where NCCL_NET_GDR_READ is on (by default on NVLink
    # platforms only), so a send line without /GDRDMA proves nothing
    received: int = 0
    received_gdr: int = 0


def parse_nccl_channels(text: str) -> NetChannels:
    n = gdr = rn = rgdr = 0
    nets: dict[str, None] = {}
    for line in _lines(text):
        m = _NET_CHANNEL.search(line)
        if m:
            n += 1
            gdr += bool(m.group(3))
            nets[m.group(2)] = None
            if m.group(1) == "receive":
                rn += 1
                rgdr += bool(m.group(3))
    return NetChannels(n, gdr, tuple(nets), rn, rgdr)


# -- perftest ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Perftest:
    """A perftest bandwidth run (ib_write_bw, ib_read_bw): its result row, bandwidths in Gb/s."""

    size: int  # bytes per message
    iterations: int
    peak: float  # 0.00 in duration (-D) and --run_infinitely modes: not measured
    average: float
    unit: str  # as printed: Gb/sec (--report_gbits), MiB/sec or MB/sec


# " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]": the unit of both columns; MiB/sec
# from perftest 24.07.0-0.44 (commit 1d202bb), MB/sec (the same 2^20 bytes) before, Gb/sec with --report_gbits
_PT_HEAD = re.compile(r"^\s*#bytes\s+#iterations\s+BW peak\[(Gb/sec|MB/sec|MiB/sec)\]\s+BW average\[")
_PT_ROW = re.compile(rf"^\s*([0-9]{{1,12}})\s+([0-9]{{1,15}})\s+({_NUM})\s+({_NUM})\s+({_NUM})\s*$")
# perftest's MB is 2^20 bytes, its Gb 125,000,000 bytes (src/perftest_parameters.c: format_factor = report_fmt == MBS
# ? 0x100000 : 125000000)
MB_GBITS = 0x100000 / 125000000


def parse_perftest(text: str) -> Perftest | None:
    """The result of a perftest bandwidth run; None where it printed no result row (a server's side, a failure).
    Where rows repeat (--run_infinitely) the last counts."""
    unit = ""
    found: Perftest | None = None
    for line in _lines(text):
        h = _PT_HEAD.match(line)
        if h:
            unit = h.group(1)
            continue
        m = _PT_ROW.match(line) if unit else None
        if m:
            k = 1.0 if unit == "Gb/sec" else MB_GBITS
            found = Perftest(int(m.group(1)), int(m.group(2)), round(float(m.group(3)) * k, 2),
                             round(float(m.group(4)) * k, 2), unit)
    return found


# -- NCCL's failures -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NcclFailure:
    kind: str  # a stable id: ib-completion, ib-no-device, ibverbs-missing, gdr-disabled, ...
    detail: str  # what the text said (its numbers), for the finding's message
    remedy: str


# NCCL's own words (its source: transport/net_ib.cc, misc/ibvwrap.cc; the texts in tests/fixtures/real/fabric/nccl)
_COMPLETION = re.compile(r"NET/IB ?: Got completion (?:from peer (\S{1,80}) )?with (?:error |status=)([0-9]{1,4})"
                         r"(?:[\s\S]{0,160}?vendor err ([0-9]{1,5}))?")
_CALL_FAILED = re.compile(r"Call to (ibv_[a-z_0-9]{1,40}) failed with (?:error )?(?:([0-9]{1,4}) )?"
                          r"([A-Za-z][A-Za-z ]{0,60})")
_GDR_OFF = re.compile(r"NET/IB ?: GPU Direct RDMA Disabled for HCA [0-9]{1,3} '([A-Za-z0-9_.:-]{1,64})'")
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=([0-9]{1,12}), "
                       r"OpType=([A-Z_]{1,32})[^)]{0,200}Timeout\(ms\)=([0-9]{1,12})\)")
# ibv_wc_status (libibverbs verbs.h): the completion statuses NCCL prints as a number
WC_STATUS = {5: "IBV_WC_WR_FLUSH_ERR", 12: "IBV_WC_RETRY_EXC_ERR", 13: "IBV_WC_RNR_RETRY_EXC_ERR",
             10: "IBV_WC_REM_ACCESS_ERR", 4: "IBV_WC_LOC_PROT_ERR"}
MAX_TEXT = 1 << 20  # a pod log read: its last MiB


def classify_nccl(text: str) -> list[NcclFailure]:
    """NCCL's failures named in a log (NCCL_DEBUG=INFO or WARN), the cause first: each kind once."""
    text = text[-MAX_TEXT:]
    out: dict[str, NcclFailure] = {}
    m = _COMPLETION.search(text)
    if m:
        status = int(m.group(2))
        name = WC_STATUS.get(status, f"status {status}")
        vendor = f", vendor error {m.group(3)}" if m.group(3) else ""
        peer = f" from {m.group(1)}" if m.group(1) else ""
        out["ib-completion"] = NcclFailure(
            "ib-completion", f"an InfiniBand/RoCE work completion failed{peer}: {name} ({status}){vendor}",
            "a link, cable or switch port between the two nodes drops packets (retries exhausted): find the port "
            "with gpuk8s verify --fabric and check its counters (perfquery, ethtool -S); on RoCE, check PFC/ECN and "
            "the GID index (NCCL_IB_GID_INDEX)")
    for m in _CALL_FAILED.finditer(text):
        call, errno, words = m.group(1), m.group(2), m.group(3).strip()
        if call.startswith("ibv_reg_mr"):
            kind, remedy = "memory-registration", (
                "NCCL could not register GPU memory with the NIC: GPUDirect RDMA needs nvidia-peermem loaded or "
                "dma-buf (open kernel modules), and the pod an unlimited memlock (IPC_LOCK)")
        elif "Cannot allocate memory" in words:
            kind, remedy = "ib-no-memory", (
                "the RDMA verbs ran out of locked memory: give the pod IPC_LOCK and an unlimited memlock ulimit "
                "(the container runtime's default is 64 KiB or 8 MiB)")
        elif call == "ibv_modify_qp" and ("timed out" in words or errno == "110"):
            kind, remedy = "ib-connect-timeout", (
                "the queue pair could not connect to its peer: on RoCE the GID index or the VLAN/subnet differs "
                "between the nodes (NCCL_IB_GID_INDEX), on InfiniBand the port is not active")
        else:
            kind, remedy = "ibverbs-call", "see the call and its error; check the RDMA device with ibv_devinfo"
        out.setdefault(kind, NcclFailure(kind, f"{call} failed: {words}" + (f" ({errno})" if errno else ""), remedy))
    if "Failed to open libibverbs.so" in text:
        out["ibverbs-missing"] = NcclFailure(
            "ibverbs-missing", "libibverbs is not in the image: NCCL cannot use RDMA and falls back to TCP sockets",
            "install rdma-core's libibverbs (and the provider, libmlx5) in the image")
    elif "NET/IB : No device found" in text or "NET/IB: No device found" in text:
        out["ib-no-device"] = NcclFailure(
            "ib-no-device", "NCCL found no RDMA device in the pod: it falls back to TCP sockets",
            "give the pod the node's RDMA devices (the RDMA device plugin's resource, or hostNetwork with "
            "/dev/infiniband); check that the node has an active RDMA port (gpuk8s preflight)")
    gdr = sorted(set(_GDR_OFF.findall(text)))
    if gdr:
        out["gdr-disabled"] = NcclFailure(
            "gdr-disabled", f"GPUDirect RDMA is disabled for {', '.join(gdr[:8])}: traffic bounces through host "
            "memory", "load nvidia-peermem (or use the open kernel modules with dma-buf) and check PCIe ACS "
            "(peer-to-peer must not be redirected)")
    w = _WATCHDOG.search(text)
    if w:
        out["collective-timeout"] = NcclFailure(
            "collective-timeout", f"a collective ({w.group(2)}, sequence {w.group(1)}) did not finish within "
            f"{int(w.group(3)) // 1000} s", "a peer stopped or the fabric stalls: look for the first failure in the "
            "other ranks' logs; gpuk8s verify --fabric names a slow link")
    return list(out.values())
