"""Preflight checks of the RDMA fabric of GPU nodes whose inventory sets `fabric:` (docs/fabric.md, issue 43):
the ports of the link layer active, the link layer the inventory names, a subnet manager on InfiniBand, every port
at the expected rate and none slower than its siblings. Pure: host and facts in, findings out."""

from __future__ import annotations

from collections import Counter

from gpuk8s.fabricplan import NAMES, PEERMEM_DRIVER, chosen, gpudirect, link_layer, roce_v2
from gpuk8s.facts.fabric import IB_MTUS, ROCE_OVERHEAD, RdmaPort, roce_mtu
from gpuk8s.facts.model import HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host
from gpuk8s.preflight.result import CheckResult, failed, passed, skipped

IDS = ("fabric.ports", "fabric.link-layer", "fabric.subnet-manager", "fabric.rate", "fabric.roce-gid",
       "fabric.roce-mtu", "fabric.gpudirect", "fabric.affinity", "fabric.acs")


def _name(p: RdmaPort) -> str:
    return f"{p.device} port {p.port}"


def _show(p: RdmaPort) -> str:
    rate = f", {p.rate:g} Gb/s" if p.rate is not None else ""
    return f"{_name(p)} ({p.state}/{p.physical_state}{rate})"


def fabric_consistency(hosts: list[Host], facts: dict[str, HostFacts]) -> list[CheckResult]:
    """cluster.fabric-consistent: every node with a fabric on the same link layer and port rate (NCCL's rings run
    at the slowest node's speed, and InfiniBand and RoCE nodes do not reach each other); nothing without two."""
    seen: dict[str, str] = {}
    for h in hosts:
        f = facts.get(h.name)
        s = h.gpu.fabric
        if not is_gpu_node(h) or not s.enabled or f is None or f.rdma is None:
            continue
        ports = chosen(s, f.rdma)
        layer = link_layer(s, ports)
        rates = Counter(p.rate for p in ports if p.active and p.link_layer == layer and p.rate is not None)
        if layer and rates:
            seen[h.name] = f"{NAMES[layer]} at {rates.most_common(1)[0][0]:g} Gb/s"
    if len(seen) < 2:
        return []
    if len(set(seen.values())) == 1:
        return [passed("cluster.fabric-consistent", f"every fabric node: {next(iter(seen.values()))}")]
    common = Counter(seen.values()).most_common(1)[0][0]
    odd = "; ".join(f"{h}: {v}" for h, v in sorted(seen.items()) if v != common)
    return [failed("cluster.fabric-consistent", f"the fabric differs between nodes: most have {common}, but {odd}",
                   "one job's ranks run at the slowest node's rate, and InfiniBand and RoCE nodes cannot reach each "
                   "other: give the odd nodes the same adapters, cables and link type, or list them in another "
                   "gpu_group with their own fabric")]


def fabric_checks(host: Host, f: HostFacts) -> list[CheckResult]:
    """Nothing for a host without `fabric:` (or with link_layer none)."""
    s = host.gpu.fabric
    if not is_gpu_node(host) or not s.enabled:
        return []
    if f.rdma is None:
        return [failed("fabric.ports", "the RDMA ports could not be read (/sys/class/infiniband)",
                       "check the host (the probe's rdma section)")] + [
            skipped(i, "no RDMA ports read") for i in IDS[1:]]
    ports = chosen(s, f.rdma)
    missing = [n for n in s.nics if n not in {p.device for p in f.rdma}]
    layer = link_layer(s, ports)
    out: list[CheckResult] = []
    others = [p for p in ports if p.link_layer != layer]
    of_layer = [p for p in ports if p.link_layer == layer]
    if s.link_layer != "auto" and not of_layer and others:
        out.append(failed("fabric.link-layer", f"fabric.link_layer is {s.link_layer}, but the node's RDMA ports are "
                          f"{', '.join(sorted({NAMES.get(p.link_layer, p.link_layer) for p in others}))}: "
                          + ", ".join(_show(p) for p in others[:8]),
                          f"write fabric.link_layer: {'roce' if others[0].link_layer == 'Ethernet' else 'infiniband'}"
                          " (or auto), or set the adapters' link type (mlxconfig LINK_TYPE_P1)"))
    else:
        out.append(passed("fabric.link-layer", f"{NAMES.get(layer, 'no')} ports" if layer else "no active RDMA port"))
    active = [p for p in of_layer if p.active]
    down = [p for p in of_layer if not p.active]
    problems = []
    if missing:
        problems.append(f"no RDMA device {', '.join(missing)} on the node (it has "
                        f"{', '.join(sorted({p.device for p in f.rdma})) or 'none'})")
    if s.nics:
        problems += [f"{_show(p)} is not active" for p in down]
    if not active:
        problems.append(f"no active {NAMES.get(layer, 'RDMA')} port" + (
            f" ({', '.join(_show(p) for p in ports[:8])})" if ports else " (no RDMA adapter found)"))
    elif s.ports is not None and len(active) < s.ports:
        problems.append(f"{len(active)} active {NAMES[layer]} port(s), fabric.expect.ports is {s.ports}"
                        + (f"; not active: {', '.join(_show(p) for p in down[:8])}" if down else ""))
    if problems:
        out.append(failed("fabric.ports", "; ".join(problems),
                          "check the cables, transceivers and switch ports of the ports named (ibstat shows each "
                          "one's state); a port Disabled is switched off (mlxlink, the switch), Polling has no link"))
    else:
        rest = f"; not active and not used: {', '.join(_show(p) for p in down[:8])}" if down else ""
        out.append(passed("fabric.ports", f"{len(active)} active {NAMES[layer]} port(s)" + rest))
    if layer == "InfiniBand":
        no_sm = [p for p in of_layer if p.physical_state == "LinkUp" and p.state in ("Initializing", "Armed")]
        if no_sm:
            out.append(failed("fabric.subnet-manager", "the link is up but no subnet manager configured the port: "
                              + ", ".join(_show(p) for p in no_sm[:8]),
                              "run a subnet manager on the fabric (the switches' own, UFM, or opensm on one host), "
                              "then check that ibstat shows State: Active and an SM lid"))
        else:
            out.append(passed("fabric.subnet-manager", "every InfiniBand port with a link has a subnet manager"
                              if of_layer else "no InfiniBand port"))
    else:
        out.append(skipped("fabric.subnet-manager", "not InfiniBand"))
    out.append(_roce_gid(f, layer, active))
    out.append(_roce_mtu(f, layer, active))
    out += _gpudirect(host, f)
    out.append(_affinity(f, active))
    out.append(_acs(f))
    rates = [p for p in active if p.rate is not None]
    top = max((p.rate or 0.0 for p in rates), default=0.0)
    slow = [p for p in rates if s.rate is not None and (p.rate or 0) < s.rate]
    behind = [p for p in rates if (p.rate or 0) < top] if not slow else []
    if slow:
        out.append(failed("fabric.rate", f"below the expected {s.rate} Gb/s: " + ", ".join(_show(p) for p in slow[:8]),
                          "a port at a lower rate has a cable, transceiver or switch port of another speed, or "
                          "trained down: reseat or replace it (mlxlink -d DEV shows why)"))
    elif behind:
        out.append(failed("fabric.rate", f"slower than the node's other {NAMES[layer]} ports ({top:g} Gb/s): "
                          + ", ".join(_show(p) for p in behind[:8]),
                          "a port at a lower rate than its siblings has a cable, transceiver or switch port of "
                          "another speed, or trained down: reseat or replace it (mlxlink -d DEV shows why); if the "
                          "ports differ on purpose, list the fabric's own in fabric.nics"))
    elif rates:
        out.append(passed("fabric.rate", f"{len(rates)} x {top:g} Gb/s"))
    else:
        out.append(skipped("fabric.rate", "no active port"))
    return out


def _roce_gid(f: HostFacts, layer: str, active: list[RdmaPort]) -> CheckResult:
    """fabric.roce-gid: on RoCE, each active port of the fabric has a RoCE v2 GID with an IPv4 address."""
    if layer != "Ethernet":
        return skipped("fabric.roce-gid", "not RoCE")
    if f.gids is None:
        return failed("fabric.roce-gid", "the RoCE ports' GID tables could not be read "
                      "(/sys/class/infiniband/DEV/ports/N/gids)", "check the host (the probe's gids section)")
    bad = []
    for p in active:
        if roce_v2(f.gids, p) is None:
            mine = [g for g in f.gids if (g.device, g.port) == (p.device, p.port)]
            nd = next((g.netdev for g in mine if g.netdev), "")
            have = ", ".join(f"{g.index} {g.version} {g.ipv4 or g.gid}" for g in mine[:4]) or "none"
            bad.append(f"{_name(p)}{f' ({nd})' if nd else ''}: GIDs {have}")
    if bad:
        return failed("fabric.roce-gid", "no RoCE v2 GID with an IPv4 address on " + "; ".join(bad[:8]),
                      "give each port's network interface its IPv4 address on the fabric's subnet: the kernel then "
                      "adds the RoCE v2 GID for it (show_gids lists it), which NCCL (NCCL_IB_ADDR_FAMILY AF_INET, its "
                      "default) and its peers use")
    return passed("fabric.roce-gid", f"{len(active)} port(s) with a RoCE v2 IPv4 GID")


def _acs(f: HostFacts) -> CheckResult:
    """fabric.acs (warning): no PCIe bridge redirects peer-to-peer traffic to the root complex (ACSCtl ReqRedir+ or
    CmpltRedir+: NCCL's troubleshooting guide, "PCI Access Control Services (ACS)")."""
    if f.acs is None:
        return skipped("fabric.acs", "lspci -vvv was not read (lspci not installed, or the host has no fabric:)")
    if f.acs.denied and not f.acs.bridges:
        return skipped("fabric.acs", "lspci -vvv could not read the devices' extended capabilities (not root)")
    on = [b for b in f.acs.bridges if b.redirects]
    if on:
        more = f" and {len(on) - 6} more" if len(on) > 6 else ""
        shown = ", ".join(f"{b.bdf} ({b.name[:100]})" for b in on[:6]) + more
        return failed("fabric.acs", f"{len(on)} PCIe device(s) redirect peer-to-peer traffic to the root complex "
                      f"(ACS ReqRedir/CmpltRedir on): {shown}: GPUDirect (GPU to GPU, GPU to NIC) slows down or hangs",
                      "disable ACS in the BIOS (or at each boot: setpci -s BDF ECAP_ACS+0x6.w=0000 for each device "
                      "named, NCCL's troubleshooting guide); not on a host that passes devices to virtual machines, "
                      "which need ACS")
    return passed("fabric.acs", f"{len(f.acs.bridges)} device(s) with ACS, none redirecting peer-to-peer traffic")


def _roce_mtu(f: HostFacts, layer: str, active: list[RdmaPort]) -> CheckResult:
    """fabric.roce-mtu (warning): on RoCE, each active port's network interface has an MTU that gives RoCE 4096-byte
    packets (the kernel's iboe_get_mtu: the MTU less 96 bytes of headers; 1500 gives 1024)."""
    if layer != "Ethernet":
        return skipped("fabric.roce-mtu", "not RoCE")
    if f.gids is None or f.netdev_mtu is None:
        return skipped("fabric.roce-mtu", "the RoCE ports' network interfaces could not be read")
    low, seen = [], []
    for p in active:
        nd = next((g.netdev for g in f.gids if (g.device, g.port) == (p.device, p.port) and g.netdev), "")
        mtu = f.netdev_mtu.get(nd)
        if mtu is None:
            continue
        seen.append(mtu)
        if roce_mtu(mtu) < IB_MTUS[0]:
            low.append(f"{_name(p)} ({nd} MTU {mtu}: RoCE packets of {roce_mtu(mtu)} bytes)")
    if low:
        return failed("fabric.roce-mtu", "RoCE below 4096-byte packets on " + "; ".join(low[:8]),
                      f"set the interfaces' MTU to {IB_MTUS[0] + ROCE_OVERHEAD} or more (9000 is common) on the "
                      "hosts and on the switch ports of the fabric (netplan or nmcli: mtu), then check ibv_devinfo's "
                      "active_mtu: 4096")
    if not seen:
        return skipped("fabric.roce-mtu", "no active RoCE port's network interface was found")
    return passed("fabric.roce-mtu", f"{len(seen)} port(s) with RoCE packets of 4096 bytes (MTU {min(seen)} or more)")


def _gpudirect(host: Host, f: HostFacts) -> list[CheckResult]:
    """fabric.gpudirect (warning): the path GPU memory takes to the NICs; fabric.peermem (error): nvidia-peermem,
    where asked for, can load."""
    path, why = gpudirect(host, f)
    out: list[CheckResult] = []
    if path == "none" and host.gpu.fabric.gpudirect != "off":
        out.append(failed("fabric.gpudirect", f"no GPUDirect RDMA: {why}; NCCL then copies through host memory",
                          "use the open kernel modules (driver: {flavor: open}) on Linux 5.12 or newer for dma-buf, "
                          "or, where NVIDIA's DOCA-OFED or MLNX_OFED is installed, fabric.gpudirect: peermem"))
    else:
        out.append(passed("fabric.gpudirect", why))
    if path == "peermem":
        modules = f.modules or frozenset()
        branch = (int(host.gpu.driver.branch) if host.gpu.driver.manage and host.gpu.driver.branch.isdigit()
                  else (f.gpu.driver_release or (0,))[0])
        if "nv_peer_mem" in modules:
            out.append(failed("fabric.peermem", "nv_peer_mem is loaded: nvidia-peermem cannot load beside it (only one "
                              "peer memory module can be loaded)", "stop and remove nv_peer_mem (its service and "
                              "package), then install again"))
        elif branch and branch < PEERMEM_DRIVER:
            out.append(failed("fabric.peermem", f"driver branch {branch} has no nvidia-peermem (it ships from "
                              f"R{PEERMEM_DRIVER})",
                              f"a driver of branch {PEERMEM_DRIVER} or newer (driver: {{manage: true}})"))
        else:
            out.append(passed("fabric.peermem", "nvidia_peermem loaded" if "nvidia_peermem" in modules
                              else "install loads nvidia-peermem and keeps it across reboots"))
    return out


CLOSE = ("PIX", "PXB")  # behind the same PCIe switch as the GPU (nvidia-smi topo's legend)
FAR = {"PHB": "through the CPU's PCIe host bridge", "NODE": "across the PCIe host bridges of its CPU",
       "SYS": "across the CPU sockets"}


def _affinity(f: HostFacts, active: list[RdmaPort]) -> CheckResult:
    """fabric.affinity (warning): each GPU has a NIC of the fabric behind its own PCIe switch (nvidia-smi topo -m:
    PIX or PXB), as HGX boards pair them; a GPU whose nearest fabric NIC is farther is named with where it is."""
    if f.topo is None:
        return skipped("fabric.affinity", "the GPU-to-NIC topology was not read (nvidia-smi topo -m)")
    mine = {p.device for p in active}
    nics = tuple(n for n in f.topo.nics if n in mine)
    if not nics or not f.topo.gpus:
        return skipped("fabric.affinity", "no GPU or fabric NIC in nvidia-smi topo -m")
    far: dict[str, list[str]] = {}
    for gpu in f.topo.gpus:
        best = next(((rel, tuple(n for n in nics if f.topo.links.get((gpu, n)) == rel))
                     for rel in ("PIX", "PXB", "PHB", "NODE", "SYS")
                     if any(f.topo.links.get((gpu, n)) == rel for n in nics)), ("", ()))
        if best[0] and best[0] not in CLOSE:
            far.setdefault(f"{best[0]}: {', '.join(best[1][:4])}", []).append(gpu)
    if far:
        return failed("fabric.affinity", "; ".join(
            f"{', '.join(gpus)}: nearest fabric NIC {FAR[key.split(':')[0]]} ({key})" for key, gpus in far.items()),
            "GPUDirect RDMA from a GPU to a NIC beyond its PCIe switch crosses the CPU (NCCL_NET_GDR_LEVEL sets how "
            "far NCCL still uses it): put one fabric NIC behind each GPU's PCIe switch, or list in fabric.nics the "
            "NICs that are (nvidia-smi topo -m shows PIX)")
    return passed("fabric.affinity", f"every GPU ({len(f.topo.gpus)}) has a fabric NIC behind its PCIe switch")
