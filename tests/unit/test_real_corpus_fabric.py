"""The fabric's real texts (tests/fixtures/real/fabric/, issue 43), each read by gpuk8s/facts/fabric.py against
readings written from the text (the ibstat ports as awk extracts them from the file, independently of the parser;
the rest by hand): ibstat and ibstatus across ConnectX-3 to ConnectX-8 and BlueField-3, InfiniBand and RoCE,
MLNX_OFED and distribution stacks; nvidia-smi topo -m of DGX-1 to B300 systems; nccl-tests' all_reduce_perf on
A100, H100 and H200, single node and two nodes, a degraded run; NCCL's failures. Every file of the folders is
read (a file without its .meta, or without a reading here, fails)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from gpuk8s.facts import fabric
from gpuk8s.phases.fabric_nccl import launcher_said

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "fabric"

IBSTAT = {
    "ibstat-a100-cx7vf-8x200-ib-cx6dx-eth-gpud": [
        "mlx5_0:1 Active LinkUp 200 Ethernet MT4126",
        "mlx5_1:1 Active LinkUp 200 InfiniBand MT4126",
        "mlx5_2:1 Active LinkUp 200 InfiniBand MT4126",
        "mlx5_3:1 Active LinkUp 200 InfiniBand MT4126",
        "mlx5_4:1 Active LinkUp 200 InfiniBand MT4126",
        "mlx5_5:1 Active LinkUp 200 InfiniBand MT4126",
        "mlx5_6:1 Active LinkUp 200 InfiniBand MT4126",
        "mlx5_7:1 Active LinkUp 200 InfiniBand MT4126",
        "mlx5_8:1 Active LinkUp 200 InfiniBand MT4126",
    ],
    "ibstat-azure-a100-cx6vf-8x200-ib-ibpanic-gpud": [
        "mlx5_0:1 Active LinkUp 200 InfiniBand MT4124",
        "mlx5_1:1 Active LinkUp 200 InfiniBand MT4124",
        "mlx5_2:1 Active LinkUp 200 InfiniBand MT4124",
        "mlx5_3:1 Active LinkUp 200 InfiniBand MT4124",
        "mlx5_4:1 Active LinkUp 200 InfiniBand MT4124",
        "mlx5_5:1 Active LinkUp 200 InfiniBand MT4124",
        "mlx5_6:1 Active LinkUp 200 InfiniBand MT4124",
        "mlx5_7:1 Active LinkUp 200 InfiniBand MT4124",
    ],
    "ibstat-b300-cx8-disabled-cx7-ib100-xe9780": [
        "mlx5_0:1 Down Disabled 10 InfiniBand MT4131",
        "mlx5_1:1 Down Disabled 10 InfiniBand MT4131",
        "mlx5_10:1 Down Disabled 10 InfiniBand MT4131",
        "mlx5_2:1 Active LinkUp 100 InfiniBand MT4129",
        "mlx5_3:1 Active LinkUp 100 InfiniBand MT4129",
        "mlx5_4:1 Active LinkUp 100 InfiniBand MT4129",
        "mlx5_5:1 Active LinkUp 100 InfiniBand MT4129",
        "mlx5_6:1 Down Disabled 10 InfiniBand MT4131",
        "mlx5_7:1 Down Disabled 10 InfiniBand MT4131",
        "mlx5_8:1 Down Disabled 10 InfiniBand MT4131",
        "mlx5_9:1 Down Disabled 10 InfiniBand MT4131",
    ],
    "ibstat-cx3-mlx4-ib-polling-eth-disabled-linux-rdma-2020": [
        "mlx4_0:1 Down Polling 10 InfiniBand MT4099",
        "mlx4_0:2 Down Disabled 40 Ethernet MT4099",
    ],
    "ibstat-cx5-ib100-two-disabled-mlnx-ofed-5.5-ucx-8772": [
        "mlx5_0:1 Active LinkUp 100 InfiniBand MT4119",
        "mlx5_1:1 Active LinkUp 100 InfiniBand MT4119",
        "mlx5_2:1 Down Disabled 10 InfiniBand MT4119",
        "mlx5_3:1 Down Disabled 10 InfiniBand MT4119",
    ],
    "ibstat-cx6-hdr-active-lid18-magnate3": [
        "mlx5_5:1 Active LinkUp 200 InfiniBand MT4123",
    ],
    "ibstat-cx6-hdr-initializing-no-sm-magnate3": [
        "mlx5_5:1 Initializing LinkUp 200 InfiniBand MT4123",
    ],
    "ibstat-cx6dx-roce100-two-ports-l2fwd-nv-6": [
        "mlx5_0:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_1:1 Active LinkUp 100 Ethernet MT4125",
    ],
    "ibstat-cx6lx-eth25-cx7-ib200-ucx-10868": [
        "mlx5_0:1 Active LinkUp 25 Ethernet MT4127",
        "mlx5_1:1 Down Disabled 40 Ethernet MT4127",
        "mlx5_2:1 Active LinkUp 200 InfiniBand MT4129",
    ],
    "ibstat-cx6vf-hdr-down-linkup-pod-network-operator-249": [
        "mlx5_7:1 Down LinkUp 200 InfiniBand MT4124",
    ],
    "ibstat-cx7-ndr400-one-ca-nccl-1591": [
        "mlx5_5:1 Active LinkUp 400 InfiniBand MT4129",
    ],
    "ibstat-h100-cx7-8x400-ib-bf3-bond-200-gpud": [
        "mlx5_0:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_1:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_4:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_5:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_6:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_7:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_8:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_9:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_bond_0:1 Active LinkUp 200 Ethernet MT41692",
    ],
    "ibstat-h100-cx7-8x400-ib-cx6dx-disabled-gpud": [
        "mlx5_0:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_1:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_10:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_11:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_2:1 Down Disabled 40 Ethernet MT4125",
        "mlx5_3:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_4:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_5:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_6:1 Active LinkUp 400 InfiniBand MT4129",
        "mlx5_7:1 Down Disabled 40 Ethernet MT4125",
        "mlx5_8:1 Down Disabled 40 Ethernet MT4125",
        "mlx5_9:1 Active LinkUp 400 InfiniBand MT4129",
    ],
    "ibstat-h100-cx7-8x400-roce-cx6dx-100-gpud": [
        "mlx5_0:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_1:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_10:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_11:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_2:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_3:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_4:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_5:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_6:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_7:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_8:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_9:1 Active LinkUp 400 Ethernet MT4129",
    ],
    "ibstat-h100-cx7-roce-two-disabled-gpud": [
        "mlx5_0:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_1:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_10:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_11:1 Down Disabled 40 Ethernet MT4129",
        "mlx5_2:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_3:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_4:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_5:1 Down Disabled 40 Ethernet MT4129",
        "mlx5_6:1 Active LinkUp 400 Ethernet MT4129",
        "mlx5_7:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_8:1 Active LinkUp 100 Ethernet MT4125",
        "mlx5_9:1 Active LinkUp 400 Ethernet MT4129",
    ],
}

IBSTATUS = {
    "ibstatus-azure-a100-8x-hdr-ib-eth-gpud": [
        "mlx5_0:1 ACTIVE LinkUp 200 InfiniBand",
        "mlx5_1:1 ACTIVE LinkUp 200 InfiniBand",
        "mlx5_2:1 ACTIVE LinkUp 200 InfiniBand",
        "mlx5_3:1 ACTIVE LinkUp 200 InfiniBand",
        "mlx5_4:1 ACTIVE LinkUp 200 InfiniBand",
        "mlx5_5:1 ACTIVE LinkUp 200 InfiniBand",
        "mlx5_6:1 ACTIVE LinkUp 200 InfiniBand",
        "mlx5_7:1 ACTIVE LinkUp 200 InfiniBand",
        "mlx5_8:1 ACTIVE LinkUp 40 Ethernet",
    ],
    "ibstatus-bf3-roce-200-hdr-400-ndr-deepep-17": [
        "mlx5_0:1 ACTIVE LinkUp 200 Ethernet",
        "mlx5_1:1 ACTIVE LinkUp 400 Ethernet",
        "mlx5_2:1 ACTIVE LinkUp 400 Ethernet",
    ],
    "ibstatus-cx6dx-roce-disabled-100-edr-magnate3": [
        "mlx5_0:1 DOWN Disabled 40 Ethernet",
        "mlx5_1:1 ACTIVE LinkUp 100 Ethernet",
    ],
}

# nvidia-smi topo -m: the GPUs, the first and last NIC (the NIC Legend's name; the column's own on old drivers), and
# the nearest NICs of GPU0 and GPU4 (read from each matrix's rows by hand)
TOPO = {
    "a100x8-10nic-amd-epyc-nps4-oyanghd": (8, 10, "mlx5_0", "mlx5_9", ("PXB", ("mlx5_0", "mlx5_1")),
                                           ("PXB", ("mlx5_4", "mlx5_5"))),
    "b300x8-8nic-cx8-bond-roce-deepep-590": (8, 8, "mlx5_bond_0", "mlx5_bond_7", ("PXB", ("mlx5_bond_0",)),
                                             ("PXB", ("mlx5_bond_4",))),
    "dgx-a100-12nic-mlx5-columns-gengwg": (8, 12, "mlx5_0", "mlx5_11", ("PXB", ("mlx5_0", "mlx5_1")),
                                           ("PXB", ("mlx5_6", "mlx5_7"))),
    "dgx1-v100-4nic-nv1-nv2-ucx-py": (8, 4, "mlx5_0", "mlx5_3", ("PIX", ("mlx5_0",)), ("PIX", ("mlx5_2",))),
    "dgx1-v100-4nic-topo-mp-gengwg": (8, 4, "mlx5_0", "mlx5_3", ("PIX", ("mlx5_0",)), ("PIX", ("mlx5_2",))),
    "h100x8-12nic-dell-ib-topo-mp-deepep-397": (8, 12, "mlx5_0", "mlx5_11", ("PIX", ("mlx5_0", "mlx5_1", "mlx5_2")),
                                                ("PIX", ("mlx5_6", "mlx5_7", "mlx5_8"))),
    "h100x8-13nic-ib-eth-penny-blog": (8, 13, "mlx5_ib0", "mlx5_eth4", ("PIX", ("mlx5_ib0",)), ("PIX", ("mlx5_ib4",))),
    "h100x8-8nic-sglang-30401": (8, 8, "mlx5_0", "mlx5_7", ("PIX", ("mlx5_0",)), ("PIX", ("mlx5_4",))),
    "hgx-hopper-x8-12nic-ib-eth-mooncake-2039": (8, 12, "mlx5_0", "mlx5_11", ("PIX", ("mlx5_0", "mlx5_1", "mlx5_2")),
                                                 ("PIX", ("mlx5_6", "mlx5_7", "mlx5_8"))),
}

# all_reduce_perf: rows of the table (counted with grep), the average bus bandwidth and NCCL version printed
ALL_REDUCE = {
    "allreduce-a100-40gb-2node-roce-oci-oke-nccl2.25.1": (3, 188.648, "2.25.1"),
    "allreduce-a100-80gb-2node-gcm-nccl2.12.12": (6, 150.209, "2.12.12"),
    "allreduce-a100-80gb-8gpu-single-node-gcm-nccl2.16.2": (6, 210.99, "2.16.2"),
    "allreduce-h100-2node-ib-degraded-doca-nccl-tests-319": (32, 33.4128, "2.26.2"),
    "allreduce-h100-2node-ib-ndr-nccl2.26.2-nccl-tests-309": (32, 139.56, "2.26.2"),
    "allreduce-h100-2node-ib-srun-prefixed-nccl-tests-290": (11, 142.735, ""),
    "allreduce-h100-8gpu-single-node-nvls-nccl-tests-290": (6, 439.369, ""),
    "allreduce-h200-2node-roce-oci-nccl2.27.5": (5, 476.572, "2.27.5"),
}

# NCCL's failures: the kinds each log names
NCCL_ERRORS = {
    "err-gdr-disabled-for-hca-roce-nccl-1537": ["gdr-disabled"],
    "err-ib-completion-error12-legacy-azure-ml-engineering": ["ib-completion"],
    "err-ib-completion-status12-vendor129-roce-k8s-nccl-1405": ["ib-completion"],
    "err-ib-completion-status5-vendor249-roce-nccl-1814": ["ib-completion"],
    "err-ib-create-cq-enomem-h200-deepep-143": ["ib-no-memory"],
    "err-ib-no-device-found-socket-fallback-h100-nccl-1519": ["ib-no-device"],
    "err-ib-reg-mr-iova2-einval-a100-nccl2.27.3-nccl-1842": ["memory-registration"],
    "err-ibv-modify-qp-connection-timed-out-hgx-nccl-2013": ["ib-connect-timeout"],
    "err-libibverbs-missing-info-socket-h100-k8s-nccl-1410": ["ibverbs-missing"],
    "err-libibverbs-missing-warn-ibvwrap-nccl2.10.3-detectron2-4730": ["ibverbs-missing"],
    "err-socket-connect-timed-out-no-ib-device-oneflow-3586": ["ib-no-device"],
    "err-watchdog-collective-timeout-allreduce-llamafactory-7396": ["collective-timeout"],
}
# perftest's result rows, as read off the texts by hand: (bytes, iterations, peak, average) in the text's own unit
PERFTEST = {
    "ib_read_bw-roce-cx5-mbsec-kube-ansible": ("MB/sec", 65536, 1000, 8354.37, 8354.22),
    "ib_write_bw-postlist-8b-duration-perftest-273": ("Gb/sec", 8, 224958464, 0.00, 0.48),
    "ib_write_bw-roce-4qp-oci-oke": ("Gb/sec", 65536, 20000, 98.01, 98.01),
    "ib_write_bw-roce-cx5-duration-kube-ansible": ("MB/sec", 65536, 24777100, 0.00, 10322.23),
    "ib_write_bw-roce-dgx-spark-run-infinitely": ("Gb/sec", 65536, 882821, 0.00, 92.57),  # the last of its rows
}
# NCCL's connection lines across nodes (NCCL_DEBUG=INFO): (connections, with /GDRDMA, networks), read off by hand
CHANNELS = {
    "channels-gdrdma-2node-8nic-nccl2.29.3-slurmv4": (4, 4, ("IB",)),
    "channels-gdrdma-shared-nccl2.16.5-nccl-tests-350": (3, 3, ("IB",)),
    "channels-no-gdr-ib-a100-nccl-1412": (2, 0, ("IB",)),
    "channels-socket-2node-nccl-tests-166": (2, 0, ("Socket",)),
}
# lspci -vvv's ACS controls: (bdf, controls on, redirects peer-to-peer)
ACS = {
    "lspci-vvv-acs-enabled-haswell-e-root-port-pciutils-cap-aer-root": (
        "00:02.0", ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd"), True),
    "lspci-vvv-acs-disabled-quickpath-root-port-pciutils-cap-pcie-1": ("00:01.0", (), False),
}
# what verify --fabric's NCCL pairs say of a launcher that could not start its ranks (phases/fabric_nccl.py)
MPI = {"mpirun-ssh-refused-orte-failed-daemon-launch": (
    "ssh: connect to host 192.168.43.57 port 22: Connection refused / ORTE was unable to reliably start one or more "
    "daemons.")}
# texts collected for what is not parsed yet (rdma link, ibdev2netdev, show_gids, ibv_devinfo): read by nothing so
# far, listed so that a new file is noticed
NOT_READ_YET = ("rdma",)
_STATES = {"ACTIVE": "Active", "DOWN": "Down", "INIT": "Initializing", "ARMED": "Armed"}


def _text(folder: str, name: str) -> str:
    return (REAL / folder / f"{name}.txt").read_text()


def _port(p: fabric.RdmaPort) -> str:
    rate = f"{p.rate:g}" if p.rate is not None else "?"
    return f"{p.device}:{p.port} {p.state} {p.physical_state} {rate} {p.link_layer}"


def test_every_text_has_its_source_and_a_reading() -> None:
    read = {("ibstat", n) for n in [*IBSTAT, *IBSTATUS]} | {("topo", n) for n in TOPO} | {
        ("nccl", n) for n in [*ALL_REDUCE, *NCCL_ERRORS, *CHANNELS]} | {("perftest", n) for n in PERFTEST} | {
        ("mpi", n) for n in MPI} | {("pci", n) for n in ACS}
    found = set()
    for txt in REAL.glob("*/*.txt"):
        assert txt.with_suffix(".meta").is_file(), f"{txt.name}: no .meta sidecar (its source)"
        meta = txt.with_suffix(".meta").read_text()
        assert "source:" in meta and "command:" in meta, txt.name
        if txt.parent.name not in NOT_READ_YET and not txt.name.startswith("ibv_devinfo"):
            found.add((txt.parent.name, txt.stem))
    assert found == read, sorted(found ^ read)
    assert len(list(REAL.glob("*/*.txt"))) >= 30


@pytest.mark.parametrize("name", sorted(IBSTAT))
def test_ibstat(name: str) -> None:
    ports = fabric.parse_ibstat(_text("ibstat", name))
    assert [f"{_port(p)} {p.ca_type}" for p in ports] == IBSTAT[name]


@pytest.mark.parametrize("name", sorted(IBSTATUS))
def test_ibstatus(name: str) -> None:
    want = []
    for line in IBSTATUS[name]:
        where, state, rest = line.split(" ", 2)
        want.append(f"{where} {_STATES[state]} {rest}")
    assert [_port(p) for p in fabric.parse_ibstatus(_text("ibstat", name))] == want


def test_what_ibstat_says_of_the_adapter_and_the_subnet_manager() -> None:
    ports = fabric.parse_ibstat(_text("ibstat", "ibstat-h100-cx7-8x400-ib-bf3-bond-200-gpud"))
    assert {p.adapter for p in ports} == {"ConnectX-7", "BlueField-3"}
    assert ports[0].firmware == "28.41.1000" and all(p.active for p in ports)
    # no subnet manager answered: the port is up but not active (SM lid 0)
    (p,) = fabric.parse_ibstat(_text("ibstat", "ibstat-cx6-hdr-initializing-no-sm-magnate3"))
    assert (p.state, p.physical_state, p.sm_lid, p.active, p.adapter) == ("Initializing", "LinkUp", 0, False,
                                                                          "ConnectX-6")
    # a VF's CA type not in the table is shown as printed
    assert fabric.parse_ibstat(_text("ibstat", "ibstat-azure-a100-cx6vf-8x200-ib-ibpanic-gpud"))[0].adapter == "MT4124"


@pytest.mark.parametrize("name", sorted(TOPO))
def test_topo(name: str) -> None:
    gpus, n_nics, first, last, gpu0, gpu4 = TOPO[name]
    t = fabric.parse_topo(_text("topo", name))
    assert t is not None
    assert (len(t.gpus), len(t.nics), t.nics[0], t.nics[-1]) == (gpus, n_nics, first, last)
    assert t.nearest("GPU0") == gpu0 and t.nearest("GPU4") == gpu4


def test_topo_names_the_nic_across_the_socket() -> None:
    t = fabric.parse_topo(_text("topo", "h100x8-8nic-sglang-30401"))
    assert t is not None and t.links[("GPU0", "mlx5_4")] == "SYS" and t.links[("GPU0", "mlx5_1")] == "NODE"
    assert fabric.parse_topo("nvidia-smi: command not found") is None


@pytest.mark.parametrize("name", sorted(ALL_REDUCE))
def test_all_reduce(name: str) -> None:
    rows, avg, nccl = ALL_REDUCE[name]
    r = fabric.parse_all_reduce(_text("nccl", name))
    assert r is not None and (len(r.rows), r.avg_busbw, r.nccl, r.wrong) == (rows, avg, nccl, 0)
    assert r.peak_busbw >= avg


def test_the_degraded_run_peaks_far_below_the_healthy_one() -> None:
    bad = fabric.parse_all_reduce(_text("nccl", "allreduce-h100-2node-ib-degraded-doca-nccl-tests-319"))
    good = fabric.parse_all_reduce(_text("nccl", "allreduce-h100-2node-ib-ndr-nccl2.26.2-nccl-tests-309"))
    assert bad is not None and good is not None and bad.peak_busbw < good.peak_busbw / 2


@pytest.mark.parametrize("name", sorted(PERFTEST))
def test_perftest(name: str) -> None:
    unit, size, iters, peak, avg = PERFTEST[name]
    r = fabric.parse_perftest(_text("perftest", name))
    k = 1.0 if unit == "Gb/sec" else 1048576 * 8 / 1e9  # perftest's MB: 2^20 bytes
    assert r is not None and (r.unit, r.size, r.iterations) == (unit, size, iters)
    assert (r.peak, r.average) == (round(peak * k, 2), round(avg * k, 2))


def test_perftest_reads_the_new_mib_header_and_nothing_from_a_server_or_a_failure() -> None:
    # perftest 24.07.0-0.44 on: "BW peak[MiB/sec]" (src/perftest_parameters.h RESULT_FMT; the row as REPORT_FMT)
    text = (" #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n"
            " 65536      5000             11000.00            10990.50\t\t     0.175848\n")
    r = fabric.parse_perftest(text)
    assert r is not None and r.unit == "MiB/sec" and r.average == round(10990.50 * 1048576 * 8 / 1e9, 2)
    banner = "\n************************************\n* Waiting for client to connect... *\n"  # a server's
    assert fabric.parse_perftest(banner) is None
    assert fabric.parse_perftest(" Port number 1 state is Down\n Couldn't get context for the device\n") is None
    # a row without the header is not a result
    assert fabric.parse_perftest(" 65536      5000             11000.00            10990.50\t\t     0.175848\n") is None


@pytest.mark.parametrize("name", sorted(NCCL_ERRORS))
def test_nccl_failures(name: str) -> None:
    got = fabric.classify_nccl(_text("nccl", name))
    assert [f.kind for f in got] == NCCL_ERRORS[name]
    assert all(f.remedy for f in got)


def test_nccl_failures_say_the_numbers_the_log_gave() -> None:
    (f,) = fabric.classify_nccl(_text("nccl", "err-ib-completion-error12-legacy-azure-ml-engineering"))
    assert "IBV_WC_RETRY_EXC_ERR (12), vendor error 129" in f.detail and "10.2.0.5<33092>" in f.detail
    (f,) = fabric.classify_nccl(_text("nccl", "err-gdr-disabled-for-hca-roce-nccl-1537"))
    assert "mlx5_0, mlx5_1" in f.detail
    (f,) = fabric.classify_nccl(_text("nccl", "err-watchdog-collective-timeout-allreduce-llamafactory-7396"))
    assert "ALLREDUCE" in f.detail and "600 s" in f.detail


def test_hostile_texts_are_read_in_bounded_time() -> None:
    """Host and pod texts are data: a runaway output is read up to the caps, in linear time."""
    huge = "CA 'mlx5_0'\n\tPort 1:\n\t\tState: " + "A" * 10_000_000 + "\n"
    many = "CA 'x'\n\tCA type: MT4129\n\tPort 1:\n\t\tState: Active\n" * 200_000
    row = "GPU0\t" + "SYS\t" * 100_000 + "\n"
    nccl = "x" * 5_000_000 + "\nNET/IB : Got completion from peer x with status=12 " + " " * 500 + "vendor err 1\n"
    t0 = time.monotonic()
    assert fabric.parse_ibstat(huge) == ()
    assert len(fabric.parse_ibstat(many)) <= fabric.MAX_LINES
    assert fabric.parse_topo("\tGPU0\tNIC0\n" + row) is not None
    assert fabric.parse_all_reduce("8 2 float sum -1 " * 1_000_000) is None
    assert fabric.parse_perftest(" #bytes #iterations BW peak[Gb/sec] BW average[\n" + "1 " * 5_000_000) is None
    (f,) = fabric.classify_nccl(nccl)  # the log's last MiB; the vendor error too far from it is not claimed
    assert f.kind == "ib-completion" and "vendor" not in f.detail
    assert time.monotonic() - t0 < 20  # a bound against a quadratic parser, not a speed figure


@pytest.mark.parametrize("name", sorted(MPI))
def test_a_launchers_failure_in_its_own_words(name: str) -> None:
    assert launcher_said(_text("mpi", name)) == MPI[name]


@pytest.mark.parametrize("name", sorted(CHANNELS))
def test_nccls_connection_lines(name: str) -> None:
    ch = fabric.parse_nccl_channels(_text("nccl", name))
    assert (ch.connections, ch.gdr, ch.nets) == CHANNELS[name]


@pytest.mark.parametrize("name", sorted(ACS))
def test_lspci_acs(name: str) -> None:
    """The whole -vvv text and the probe's cut (header and ACSCtl lines only) read alike."""
    text = _text("pci", name)
    cut = "\n".join(ln for ln in text.splitlines() if re.match(r"^[0-9a-f]", ln) or "ACSCtl" in ln)
    for t in (text, cut):
        r = fabric.parse_lspci_acs(t)
        assert [(b.bdf, b.ctl, b.redirects) for b in r.bridges] == [ACS[name]] and not r.denied
