"""The fabric's first steps (issue 43): the inventory's `fabric:` (every mistake with file:line and a fix), the
probe's rdma section (sysfs printed as ibstatus prints it: the probe's own function run against a sysfs tree
holding a real ibstatus text's values, read back by the parser of the real texts) and preflight's fabric checks on
real hosts' ports (tests/fixtures/real/fabric/ibstat)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from gpuk8s.facts import fabric
from gpuk8s.facts.health import RDMA_SECTION, HealthFacts
from gpuk8s.health.checks import judge_rdma
from gpuk8s.inventory import InventoryError, loads
from gpuk8s.preflight.fabric_checks import fabric_checks
from tests.unit.test_checks import facts

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "fabric" / "ibstat"
PROBE = Path(__file__).resolve().parents[2] / "gpuk8s" / "facts" / "probe.sh"
BASE = "cluster: {kubernetes_version: \"1.33\"}\nhosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"


def inv(text: str):
    return loads(BASE + text, "inventory.yaml")


def problems(text: str) -> list[str]:
    with pytest.raises(InventoryError) as e:
        inv(text)
    return [str(p) for p in e.value.problems]


def ports(name: str) -> tuple[fabric.RdmaPort, ...]:
    return fabric.parse_ibstat((REAL / f"{name}.txt").read_text())


def by_id(results):
    return {r.id: r for r in results}


def test_the_inventory_takes_fabric_per_host_group_or_default() -> None:
    i = inv("  - {name: gpu-1, address: 10.0.0.2, gpus: 8, fabric: {link_layer: infiniband, nics: [mlx5_0, mlx5_3],"
            " expect: {ports: 2, rate: 400}}}\n"
            "  - {name: gpu-2, address: 10.0.0.3, gpus: 8}\n"
            "  - {name: gpu-3, address: 10.0.0.4, gpus: 8, fabric: {link_layer: none}}\n"
            "gpu_defaults: {fabric: {link_layer: auto, gpudirect: peermem}}\n")
    one, two, three = (i.host(n).gpu.fabric for n in ("gpu-1", "gpu-2", "gpu-3"))
    assert (one.link_layer, one.nics, one.ports, one.rate, one.gpudirect, one.enabled) == (
        "infiniband", ("mlx5_0", "mlx5_3"), 2, 400, "auto", True)
    assert (two.link_layer, two.gpudirect, two.nics) == ("auto", "peermem", ())
    assert not three.enabled
    # off as written, though YAML 1.1 reads a plain off as false
    assert inv("  - {name: gpu-1, address: 10.0.0.2, gpus: 8, fabric: {link_layer: roce, gpudirect: off}}\n").host(
        "gpu-1").gpu.fabric.gpudirect == "off"
    assert not inv("  - {name: gpu-1, address: 10.0.0.2, gpus: 8}\n").host("gpu-1").gpu.fabric.enabled  # default


@pytest.mark.parametrize("text, where, words", [
    ("{link_layer: infiniiband}", "inventory.yaml:4:", "did you mean 'infiniband'"),
    ("{link_layer: roce, expect: {rate: 300}}", "inventory.yaml:4:", "300 Gb/s is not a rate"),
    ("{link_layer: roce, expect: {ports: 0}}", "inventory.yaml:4:", "out of range"),
    ("{link_layer: roce, nics: mlx5_0}", "inventory.yaml:4:", "expected auto or a list of RDMA devices"),
    ("{link_layer: roce, nics: [mlx5_0, mlx5_0]}", "inventory.yaml:4:", "listed twice"),
    ("{link_layer: roce, nics: [\"mlx5_0; reboot\"]}", "inventory.yaml:4:", "not a valid RDMA device name"),
    ("{nics: [mlx5_0]}", "inventory.yaml:4:", "fabric.link_layer: is missing"),
    ("{link_layer: roce, speed: 400}", "inventory.yaml:4:", "speed"),
])
def test_fabric_mistakes_are_named_with_their_line_and_a_fix(text: str, where: str, words: str) -> None:
    got = problems(f"  - {{name: gpu-1, address: 10.0.0.2, gpus: 8, fabric: {text}}}\n")
    assert any(where in p and words in p for p in got), got


def test_the_probe_prints_sysfs_as_ibstatus_does(tmp_path: Path) -> None:
    """The probe's rdma function on a sysfs tree holding the values of a real ibstatus text (ibstatus prints the
    sysfs files): the parser reads the same ports from both."""
    real = (REAL / "ibstatus-azure-a100-8x-hdr-ib-eth-gpud.txt").read_text()
    want = fabric.parse_ibstatus(real)
    root = tmp_path / "sys" / "class" / "infiniband"
    for block in real.split("Infiniband device ")[1:]:
        m = re.match(r"'([^']+)' port ([0-9]+) status:", block)
        assert m
        d = root / m.group(1) / "ports" / m.group(2)
        d.mkdir(parents=True)
        for key, file in (("state", "state"), ("phys state", "phys_state"), ("rate", "rate"),
                          ("link_layer", "link_layer"), ("sm lid", "sm_lid")):
            v = re.search(rf"^\s+{key}:\s+(.*)$", block, re.M)
            assert v, key
            (d / file).write_text(v.group(1).strip() + "\n")
    text = PROBE.read_text()
    fn = text[text.index("rdmaval() {"):text.index("quick rdma rdma")].replace("/sys/class/infiniband", str(root))
    r = subprocess.run(["sh", "-c", fn + "rdma"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert fabric.parse_ibstatus(r.stdout) == want and len(want) == 9
    assert fabric.parse_ibstatus(r.stdout)[0].sm_lid == 1
    # no RDMA adapter: nothing printed
    r = subprocess.run(["sh", "-c", fn.replace(str(root), str(tmp_path / "none")) + "rdma"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == ""


GIDS = REAL.parent / "rdma"


@pytest.mark.parametrize("name", ["show-gids-roce-ens-np0-nccl-1131", "show-gids-sparse-ipv4-first-nccl-pr1587",
                                  "show-gids-cx6-roce-ipv6-ipv4-spectrumscale-pr4"])
def test_the_probe_prints_the_gid_tables_as_show_gids_does(tmp_path: Path, name: str) -> None:
    """The probe's gids function on a sysfs tree holding a real show_gids text's GID tables (gids/N,
    gid_attrs/types/N as the kernel words them, ndevs/N; empty slots whose type reads EINVAL, as on a real port):
    read back, the same rows."""
    want = fabric.parse_show_gids((GIDS / f"{name}.txt").read_text())
    assert want
    root = tmp_path / "sys" / "class" / "infiniband"
    for g in want:
        d = root / g.device / "ports" / str(g.port)
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "link_layer").write_text("Ethernet\n")
        (d / "gids" / str(g.index)).write_text(g.gid + "\n")
        (d / "gid_attrs" / "types" / str(g.index)).write_text({"v1": "IB/RoCE v1", "v2": "RoCE v2"}[g.version] + "\n")
        (d / "gid_attrs" / "ndevs" / str(g.index)).write_text(g.netdev + "\n")
        (d / "gid_attrs" / "types" / "200").mkdir(exist_ok=True)  # unreadable as a file: an empty slot
    text = PROBE.read_text()
    fn = text[text.index("gids() {"):text.index("quick gids gids")].replace("/sys/class/infiniband", str(root))
    r = subprocess.run(["sh", "-c", fn + "gids"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not r.stderr, r.stderr
    def key(g: fabric.Gid) -> tuple[str, int, int]:
        return g.device, g.port, g.index

    assert sorted(fabric.parse_show_gids(r.stdout), key=key) == sorted(want, key=key)


def test_a_roce_port_without_a_v2_ipv4_gid_is_named() -> None:
    """The real text's ports have v2 IPv4 GIDs (pass); with its IPv4 entries gone (no address on the netdev, only
    the link-local GIDs left) the port is named with its netdev."""
    gids = fabric.parse_show_gids((GIDS / "show-gids-roce-ens-np0-nccl-1131.txt").read_text())
    rdma = tuple(fabric.RdmaPort(d, 1, "Active", "LinkUp", 200.0, "Ethernet") for d in ("mlx5_0", "mlx5_1"))
    ok = by_id(fabric_checks(host("{link_layer: roce}"), facts(rdma=rdma, gids=gids)))
    assert (ok["fabric.roce-gid"].status, ok["fabric.roce-gid"].message) == ("pass",
                                                                             "2 port(s) with a RoCE v2 IPv4 GID")
    local = tuple(g for g in gids if g.device == "mlx5_0" or not g.ipv4)
    bad = by_id(fabric_checks(host("{link_layer: roce}"), facts(rdma=rdma, gids=local)))["fabric.roce-gid"]
    assert bad.status == "fail" and bad.message.startswith("no RoCE v2 GID with an IPv4 address on mlx5_1 port 1 "
                                                           "(ens2np0): GIDs 0 v1 fe80:")
    assert "IPv4 address" in bad.remedy
    unread = by_id(fabric_checks(host("{link_layer: roce}"), facts(rdma=rdma, gids=None)))["fabric.roce-gid"]
    assert unread.status == "fail"


def host(fab: str, gpus: int = 8):
    return inv(f"  - {{name: gpu-1, address: 10.0.0.2, gpus: {gpus}, fabric: {fab}}}\n").host("gpu-1")


H100_IB = "ibstat-h100-cx7-8x400-ib-cx6dx-disabled-gpud"  # 8 CX-7 InfiniBand at 400, 4 CX-6 Dx Ethernet (3 down)


def test_an_infiniband_node_as_expected_passes() -> None:
    got = by_id(fabric_checks(host("{link_layer: infiniband, expect: {ports: 8, rate: 400}}"),
                              facts(rdma=ports(H100_IB))))
    assert {i: r.status for i, r in got.items()} == {"fabric.ports": "pass", "fabric.link-layer": "pass",
                                                     "fabric.subnet-manager": "pass", "fabric.rate": "pass",
                                                     "fabric.roce-gid": "skip", "fabric.roce-mtu": "skip",
                                                     "fabric.gpudirect": "warn", "fabric.affinity": "skip",
                                                     "fabric.acs": "skip"}
    assert got["fabric.rate"].message == "8 x 400 Gb/s"
    # auto takes InfiniBand where the node has it (the Ethernet ports are another network)
    auto = by_id(fabric_checks(host("{link_layer: auto}"), facts(rdma=ports(H100_IB))))
    assert auto["fabric.ports"].message == "8 active InfiniBand port(s)"


def test_a_roce_node_with_its_ports_down_is_named() -> None:
    got = by_id(fabric_checks(host("{link_layer: roce, expect: {ports: 4}}"), facts(rdma=ports(H100_IB))))
    assert got["fabric.ports"].status == "fail"
    msg = got["fabric.ports"].message
    assert "1 active RoCE (Ethernet) port(s), fabric.expect.ports is 4" in msg
    assert "mlx5_2 port 1 (Down/Disabled, 40 Gb/s)" in msg and "mlx5_7" in msg
    assert got["fabric.subnet-manager"].status == "skip"


def test_the_wrong_link_layer_is_named() -> None:
    roce_only = ports("ibstat-cx6dx-roce100-two-ports-l2fwd-nv-6")
    got = by_id(fabric_checks(host("{link_layer: infiniband}"), facts(rdma=roce_only)))
    assert got["fabric.link-layer"].status == "fail"
    assert "fabric.link_layer is infiniband, but the node's RDMA ports are RoCE (Ethernet)" in got[
        "fabric.link-layer"].message
    assert "write fabric.link_layer: roce" in got["fabric.link-layer"].remedy


def test_an_infiniband_port_without_a_subnet_manager_is_named() -> None:
    got = by_id(fabric_checks(host("{link_layer: infiniband}"),
                              facts(rdma=ports("ibstat-cx6-hdr-initializing-no-sm-magnate3"))))
    assert got["fabric.subnet-manager"].status == "fail"
    assert "mlx5_5 port 1 (Initializing/LinkUp, 200 Gb/s)" in got["fabric.subnet-manager"].message
    assert got["fabric.ports"].status == "fail"  # and it is not active


def test_a_named_nic_that_is_down_or_absent_is_named() -> None:
    b300 = ports("ibstat-b300-cx8-disabled-cx7-ib100-xe9780")  # CX-8 ports Disabled, CX-7 active at 100
    got = by_id(fabric_checks(host("{link_layer: infiniband, nics: [mlx5_0, mlx5_2, mlx5_99]}"), facts(rdma=b300)))
    msg = got["fabric.ports"].message
    assert got["fabric.ports"].status == "fail"
    assert "no RDMA device mlx5_99 on the node" in msg and "mlx5_0 port 1 (Down/Disabled, 10 Gb/s) is not active" in msg


def test_a_port_slower_than_expected_or_than_its_siblings_is_named() -> None:
    eight = list(ports("ibstat-h100-cx7-8x400-ib-bf3-bond-200-gpud"))[:8]  # 8 CX-7 at 400
    assert {p.rate for p in eight} == {400.0}
    eight[3] = dataclasses.replace(eight[3], rate=200.0)  # one link trained down
    got = by_id(fabric_checks(host("{link_layer: infiniband}"), facts(rdma=tuple(eight))))
    assert got["fabric.rate"].status == "fail"
    assert got["fabric.rate"].message == ("slower than the node's other InfiniBand ports (400 Gb/s): mlx5_5 port 1 "
                                          "(Active/LinkUp, 200 Gb/s)")
    got = by_id(fabric_checks(host("{link_layer: infiniband, expect: {rate: 400}}"), facts(rdma=tuple(eight))))
    assert got["fabric.rate"].message.startswith("below the expected 400 Gb/s: mlx5_5 port 1")


def test_no_fabric_no_check_and_unread_ports_are_a_failure() -> None:
    assert fabric_checks(inv("  - {name: gpu-1, address: 10.0.0.2, gpus: 8}\n").host("gpu-1"),
                         facts(rdma=())) == []
    got = by_id(fabric_checks(host("{link_layer: roce}"), facts(rdma=None)))
    assert got["fabric.ports"].status == "fail" and got["fabric.rate"].status == "skip"
    none = by_id(fabric_checks(host("{link_layer: auto}"), facts(rdma=())))
    assert none["fabric.ports"].status == "fail" and "no RDMA adapter found" in none["fabric.ports"].message


def test_nodes_whose_fabrics_differ_are_named() -> None:
    from gpuk8s.preflight.fabric_checks import fabric_consistency

    i = inv("  - {name: gpu-1, address: 10.0.0.2, gpus: 8}\n  - {name: gpu-2, address: 10.0.0.3, gpus: 8}\n"
            "  - {name: gpu-3, address: 10.0.0.4, gpus: 8}\n  - {name: gpu-4, address: 10.0.0.5, gpus: 8}\n"
            "gpu_defaults: {fabric: {link_layer: auto}}\n")
    ib400 = ports("ibstat-h100-cx7-8x400-ib-bf3-bond-200-gpud")
    roce = ports("ibstat-h100-cx7-8x400-roce-cx6dx-100-gpud")  # 8 x 400 CX-7 and 4 x 100 CX-6 Dx, all RoCE
    seen = {"gpu-1": facts(rdma=ib400), "gpu-2": facts(rdma=ib400), "gpu-3": facts(rdma=ib400),
            "gpu-4": facts(rdma=roce)}
    (r,) = fabric_consistency(list(i.hosts), seen)
    assert r.status == "fail" and r.message == ("the fabric differs between nodes: most have InfiniBand at 400 Gb/s, "
                                                "but gpu-4: RoCE (Ethernet) at 400 Gb/s")
    (r,) = fabric_consistency(list(i.hosts), {**seen, "gpu-4": facts(rdma=ib400)})
    assert r.status == "pass" and r.message == "every fabric node: InfiniBand at 400 Gb/s"
    # one node with a fabric (or none): nothing to compare; a node whose ports were not read is left out
    assert fabric_consistency(list(i.hosts), {"gpu-1": facts(rdma=ib400), "gpu-2": facts(rdma=None)}) == []


TOPO = REAL.parent / "topo"


@pytest.mark.parametrize("name", sorted(p.stem for p in TOPO.glob("*.txt")))
def test_every_real_board_has_a_nic_behind_each_gpus_switch(name: str) -> None:
    """The real boards of the corpus (DGX-1 to 8 x B300), every NIC in the fabric: each GPU has one at PIX/PXB."""
    t = fabric.parse_topo((TOPO / f"{name}.txt").read_text())
    assert t is not None
    rdma = tuple(fabric.RdmaPort(n, 1, "Active", "LinkUp", 400.0, "InfiniBand") for n in t.nics)
    got = by_id(fabric_checks(host("{link_layer: infiniband}"), facts(rdma=rdma, topo=t)))["fabric.affinity"]
    assert got.status == "pass" and got.message == f"every GPU ({len(t.gpus)}) has a fabric NIC behind its PCIe switch"


def test_gpus_whose_nearest_fabric_nic_is_across_the_cpu_are_named() -> None:
    """A real 8 x H100 board (one NIC per GPU, two sockets) with only two of its NICs in the fabric: read off the
    text, GPU0 and GPU1 have theirs (PIX), GPU2 and GPU3 reach them through their socket's host bridges (NODE), the
    other four across the sockets (SYS)."""
    t = fabric.parse_topo((TOPO / "h100x8-8nic-sglang-30401.txt").read_text())
    rdma = tuple(fabric.RdmaPort(n, 1, "Active", "LinkUp", 400.0, "InfiniBand") for n in ("mlx5_0", "mlx5_1"))
    got = by_id(fabric_checks(host("{link_layer: infiniband}"), facts(rdma=rdma, topo=t)))["fabric.affinity"]
    assert got.status == "warn"
    assert got.message == ("GPU2, GPU3: nearest fabric NIC across the PCIe host bridges of its CPU (NODE: mlx5_0, "
                           "mlx5_1); GPU4, GPU5, GPU6, GPU7: nearest fabric NIC across the CPU sockets (SYS: mlx5_0, "
                           "mlx5_1)")
    # not read (no GK_FABRIC, or nvidia-smi failed): skipped, not passed
    assert by_id(fabric_checks(host("{link_layer: infiniband}"), facts(rdma=rdma)))["fabric.affinity"].status == "skip"


def test_health_reads_the_ports_error_counters_and_names_those_above_zero(tmp_path: Path) -> None:
    """The fabric level's section run by sh on a sysfs tree (the kernel's counter names, drivers/infiniband/core/
    sysfs.c), its lines read back; hostile lines and unknown counters ignored; a port with errors named."""
    root = tmp_path / "sys" / "class" / "infiniband"
    for dev, errs in (("mlx5_0", {}), ("mlx5_1", {"symbol_error": 65535, "link_downed": 2})):
        d = root / dev / "ports" / "1" / "counters"
        d.mkdir(parents=True)
        for c in fabric.ERROR_COUNTERS + ("port_xmit_wait",):
            (d / c).write_text(f"{errs.get(c, 0)}\n")
    fn = RDMA_SECTION.split("quick ")[0].replace("/sys/class/infiniband", str(root))
    out = subprocess.run(["sh", "-c", fn + "rdmacnt"], capture_output=True, text=True, check=True).stdout
    out = out.replace(str(root), "/sys/class/infiniband")
    hostile = "/sys/class/infiniband/x/ports/1/counters/symbol_error:1e9\n" + "\x1b[31m" * 3 + "\n"
    got = fabric.parse_port_counters(out + hostile)
    assert set(got) == {("mlx5_0", 1), ("mlx5_1", 1)} and set(got[("mlx5_0", 1)]) == set(fabric.ERROR_COUNTERS)
    assert got[("mlx5_1", 1)]["symbol_error"] == 65535 and "port_xmit_wait" not in got[("mlx5_1", 1)]
    up = fabric.RdmaPort("mlx5_0", 1, "Active", "LinkUp", 400.0, "InfiniBand")
    f = facts(rdma=(up, dataclasses.replace(up, device="mlx5_1")))
    host = loads("hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
                 "  - {name: g, address: 10.0.0.2, gpus: 2, fabric: {link_layer: infiniband, expect: {rate: 400}}}\n",
                 "inventory.yaml").host("g")
    r = judge_rdma(host, f, HealthFacts(rdma_counters=got))
    assert r.status == "fail" and r.message == "mlx5_1: symbol_error 65535, link_downed 2"
    r = judge_rdma(host, f, HealthFacts(rdma_counters={k: v for k, v in got.items() if k[0] == "mlx5_0"}))
    assert r.status == "pass" and r.message == "2 InfiniBand port(s) Active at 400 Gb/s, no error counted"
    r = judge_rdma(host, f, HealthFacts())  # counters not read: not a pass, but the ports still judged
    assert r.status == "skip" and r.message == "2 InfiniBand port(s) Active at 400 Gb/s; their error counters could " \
        "not be read"
    down = facts(rdma=(up, dataclasses.replace(up, device="mlx5_1", state="Down", physical_state="Polling")))
    r = judge_rdma(host, down, HealthFacts())
    assert r.status == "fail" and r.message == "mlx5_1 Down/Polling"


def test_roces_packet_size_follows_the_interfaces_mtu_as_the_kernel_derives_it() -> None:
    """include/rdma/ib_addr.h iboe_get_mtu: the MTU less 96 bytes of RoCE headers, rounded down to an IB MTU."""
    assert {m: fabric.roce_mtu(m) for m in (1500, 2144, 2143, 4191, 4192, 4200, 9000, 300)} == {
        1500: 1024, 2144: 2048, 2143: 1024, 4191: 2048, 4192: 4096, 4200: 4096, 9000: 4096, 300: 0}
    text = "/sys/class/net/ens3np0/mtu:1500\n/sys/class/net/../mtu:1\n/sys/class/net/ens4np0/mtu:9000\njunk\n"
    assert fabric.parse_net_mtu(text) == {"ens3np0": 1500, "ens4np0": 9000}


def test_acs_redirecting_bridges_are_named_and_an_unread_reading_is_no_pass() -> None:
    real = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "fabric" / "pci"
    on = fabric.parse_lspci_acs((real / "lspci-vvv-acs-enabled-haswell-e-root-port-pciutils-cap-aer-root.txt")
                                .read_text())
    off = fabric.parse_lspci_acs((real / "lspci-vvv-acs-disabled-quickpath-root-port-pciutils-cap-pcie-1.txt")
                                 .read_text())
    up = fabric.RdmaPort("mlx5_0", 1, "Active", "LinkUp", 400.0, "InfiniBand")
    h = host("{link_layer: infiniband}")
    got = by_id(fabric_checks(h, facts(rdma=(up,), acs=on)))["fabric.acs"]
    assert got.status == "warn" and "00:02.0 (PCI bridge: Intel Corporation" in got.message
    assert by_id(fabric_checks(h, facts(rdma=(up,), acs=off)))["fabric.acs"].status == "pass"
    denied = fabric.parse_lspci_acs("00:02.0 PCI bridge: Intel\n\tCapabilities: <access denied>\n")
    assert denied.denied and by_id(fabric_checks(h, facts(rdma=(up,), acs=denied)))["fabric.acs"].status == "skip"
    # hostile text: a control line without a device, junk controls: nothing read as a bridge
    assert fabric.parse_lspci_acs("\t\tACSCtl:\tReqRedir+\n" + "x" * 100000 + "\n").bridges == ()
