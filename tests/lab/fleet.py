"""Fleet files: the lab's description of simulated GPU servers (see tests/lab/README.md)."""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

OS_RELEASES = {
    "ubuntu-22.04": (
        'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\n'
        'VERSION="22.04.4 LTS (Jammy Jellyfish)"\nVERSION_CODENAME=jammy\nID=ubuntu\nID_LIKE=debian\n'
        "UBUNTU_CODENAME=jammy\n",
        "5.15.0-105-generic",
    ),
    "ubuntu-24.04": (
        'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
        'VERSION="24.04.3 LTS (Noble Numbat)"\nVERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\n',
        "6.8.0-45-generic",
    ),
    "alinux-3": (
        'NAME="Alibaba Cloud Linux"\nVERSION="3 (Soaring Falcon)"\nID="alinux"\n'
        'ID_LIKE="rhel fedora centos anolis"\nVERSION_ID="3"\nPLATFORM_ID="platform:al8"\n'
        'PRETTY_NAME="Alibaba Cloud Linux 3 (Soaring Falcon)"\n',
        "5.10.134-16.1.al8.x86_64",
    ),
    "centos-7": (
        'NAME="CentOS Linux"\nVERSION="7 (Core)"\nID="centos"\nID_LIKE="rhel fedora"\nVERSION_ID="7"\n'
        'PRETTY_NAME="CentOS Linux 7 (Core)"\n',
        "3.10.0-1160.el7.x86_64",
    ),
}

DEFAULTS: dict[str, Any] = {
    "role": "worker",
    "os": "ubuntu-22.04",
    "os_release": None,
    "kernel": None,
    "arch": "x86_64",
    "cpus": 16,
    "memory_mb": 65536,
    "gpus": 4,
    "gpu_model": "NVIDIA A100-SXM4-80GB",
    "gpu_memory_mib": 81920,
    "mig": "Disabled",
    # MIG mode changes: "reset" (pending until nvidia-smi -r or a reboot) or "auto" (the driver resets an idle GPU)
    "mig_activation": "reset",
    "driver": "535.104.05",  # the loaded module and its libraries; null: no driver (a bare server)
    "driver_flavor": "proprietary",  # or open: /proc/driver/nvidia/version's wording, the package's -open
    "driver_held": True,  # the driver package is held (apt-mark hold) on Ubuntu hosts
    "persistenced": True,  # nvidia-persistenced runs
    "nvswitches": 0,  # NVSwitches lspci shows (an HGX board: 4 on H100/H200)
    "fabricmanager": False,  # with nvswitches and a driver: nvidia-fabricmanager of its version installed, running
    "driver_libraries": None,  # the driver's user-space version where it differs from the loaded module's
    "driver_inventory": None,  # copied as the host's inventory `driver:` (docs/driver.md), e.g. {manage: true}
    "runtime": "containerd",
    "runtime_version": "debian",  # 'debian': Debian's real containerd binary; else a faked version string
    "runtime_active": True,
    "cgroup": 2,  # what /sys/fs/cgroup is in the host: 2 (cgroup2fs), 1 (tmpfs: v1), 0 (left as ip netns makes it)
    "containerd_config": None,  # verbatim config.toml; None: none at all
    "swap": True,
    "modules": ["overlay"],
    "sysctl": {"net.ipv4.ip_forward": "0"},
    "tools": ["ethtool"],
    "login": "gpuk8s",  # the inventory's ssh user: gpuk8s (sudo) or root
    "sudo": "nopasswd",  # nopasswd or password
    "sudo_password": None,
    "link": {"rate": "10gbit", "delay_ms": 0.02},
    "overrides": {},  # command -> {stdout, stderr, exit}
    "gpu_sharing": None,  # copied to the host's inventory entry (docs/sharing.md), e.g. {strategy: mps, replicas: 4}
    "mig_layout": None,  # copied as the host's inventory `mig:` (docs/mig.md): {strategy: single, config: all-1g.10gb}
    "compute_cap": None,  # what nvidia-smi reports as compute_cap; None: the GPU model's
    "allocator": None,  # copied as the host's inventory `allocator:` (docs/dra.md): dra or device-plugin
    # GPU health faults (gpuk8s health, docs/health.md): xid [{gpu, xid}] (kernel log lines as the real driver writes
    # them), lost [gpu] (fell off the bus: nvidia-smi leaves it out, lspci still lists it), remap_pending [gpu],
    # remap_failed [gpu], ecc_uncorrected {gpu: n}, pcie_width {gpu: width}, nvlink_down {gpu: [link]}, slowdown [gpu],
    # nvlinks (links per GPU nvidia-smi nvlink -s lists; 0: none, as on a PCIe GPU). A reboot clears xid, lost and
    # the pending remaps; a GPU reset (nvidia-smi -r) the GPU's pending remap. dcgm: a DCGM version (dcgmi installed,
    # its diagnostic answers), dcgm_fail [gpu] (those GPUs fail its software test).
    "health": {},
    "faults": [],  # sshd-stopped, drop-packets, unknown-hostkey, changed-hostkey, auth-refused, repo-unreachable
    # RDMA ports (issue 43): [{device, port, state, phys_state, rate, link_layer, sm_lid}], each value the text the
    # kernel's sysfs file holds (as real ibstatus texts show them: "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)",
    # "InfiniBand", "0x1"); the host's /sys/class/infiniband holds them (LabHost.start_sshd). [] = no adapter.
    "rdma": [],
    # nvidia-smi topo -m: the name of a real text of tests/fixtures/real/fabric/topo (its GPUs and NICs should be the
    # host's); "" = none modelled (the fake then fails as nvidia-smi does on a command it cannot serve)
    "topo": "",
    # lspci -vvv: the name of a real text of tests/fixtures/real/fabric/pci (a device with its ACS controls) that the
    # host's lspci -vvv prints; "" = none (lspci -vvv prints the GPUs' header lines only)
    "lspci_vvv": "",
}


@dataclass
class HostSpec:
    name: str
    address: str
    spec: dict[str, Any]

    @property
    def os_release(self) -> str:
        return self.spec["os_release"] or OS_RELEASES[self.spec["os"]][0]

    @property
    def kernel(self) -> str:
        return self.spec["kernel"] or OS_RELEASES.get(self.spec["os"], ("", "5.15.0-105-generic"))[1]


@dataclass
class Fleet:
    subnet: ipaddress.IPv4Network
    hosts: list[HostSpec]
    cluster: dict[str, Any]


def load_fleet(path: str | Path, subnet: str | None = None) -> Fleet:
    data = yaml.safe_load(Path(path).read_text()) or {}
    net = ipaddress.ip_network(subnet or data.get("subnet", "10.213.0.0/16"))
    defaults = {**copy.deepcopy(DEFAULTS), **(data.get("defaults") or {})}
    hosts: list[HostSpec] = []
    for entry in data.get("hosts", []):
        count = int(entry.get("count", 1))
        for n in range(count):
            spec = {**copy.deepcopy(defaults), **{k: v for k, v in entry.items() if k != "count"}}
            name = spec.pop("name")
            if count > 1:
                name = f"{name}-{n + 1:02d}"
            if spec["role"] == "control-plane" and "gpus" not in entry:
                spec["gpus"] = 0
            if spec["os"] not in OS_RELEASES and not spec["os_release"]:
                raise ValueError(f"{name}: unknown os {spec['os']!r}; known: {', '.join(OS_RELEASES)}")
            hosts.append(HostSpec(name, "", spec))
    if len(hosts) > net.num_addresses - 20:
        raise ValueError(f"subnet {net} is too small for {len(hosts)} hosts")
    for i, h in enumerate(hosts):
        h.address = str(net.network_address + 10 + i)
    return Fleet(net, hosts, data.get("cluster") or {})
