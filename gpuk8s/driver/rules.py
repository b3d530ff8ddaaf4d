"""Which NVIDIA driver a node gets: the branch and the kernel modules (open or proprietary), decided once per node
from its inventory `driver:` and its GPUs; pure (docs/driver.md says why each rule holds, with its source).

The rules, by what the node's GPUs accept (`Modules`):
- before Turing (compute capability below 7.5: Maxwell, Pascal, Volta): the proprietary modules only, and no
  branch after the matrix's `last_branch_before_turing` (NVIDIA moved those GPUs to a legacy 580 branch);
- Turing to Hopper (7.5 to 9.x): either; `auto` picks the open modules, the installers' default since R560;
- Grace Hopper and Blackwell and newer (9.0 on an aarch64 Grace host, 10.x, 12.x): the open modules only,
  Blackwell from the matrix's `blackwell_since` branch on.
The open modules exist from the matrix's `open_modules_since` branch on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import Literal

from gpuk8s import versions
from gpuk8s.errors import GpuK8sError
from gpuk8s.facts.model import UBUNTU_CODENAMES, HostFacts, PciDevice
from gpuk8s.inventory.model import DriverSettings, InstallSettings

Modules = Literal["proprietary", "either", "open", "unknown"]
Flavor = Literal["open", "proprietary"]

# lspci's chip names (the PCI ID database): the prefix names the architecture. GK Kepler, GM Maxwell, GP Pascal,
# GV Volta: before Turing; TU Turing, GA Ampere, AD Ada, GH Hopper: either; GB Blackwell: open only.
_CHIP = re.compile(r"\b(GK|GM|GP|GV|TU|GA|AD|GH|GB)[0-9]{3}")
_CHIP_MODULES: dict[str, Modules] = {"GK": "proprietary", "GM": "proprietary", "GP": "proprietary",
                                     "GV": "proprietary", "TU": "either", "GA": "either", "AD": "either",
                                     "GH": "either", "GB": "open"}
# The first Turing device id (TU102, 0x1E02, is the lowest id in the open modules' table of supported GPUs):
# every NVIDIA GPU before Turing has a lower id, so an id the PCI database cannot name still tells that much.
FIRST_TURING_DEVICE = 0x1E00


def accepted_modules(f: HostFacts) -> Modules:
    """What the host's GPUs accept: from nvidia-smi's compute capabilities where the driver answers, else from
    lspci (a host without a driver)."""
    if f.compute_caps:
        return combine([modules_of_capability(c, f.arch) for c in f.compute_caps])
    return combine([modules_of_pci(g, f.arch) for g in f.driver.pci_gpus])


class DriverRuleError(GpuK8sError):
    """A driver setting that cannot work on this node's GPUs (or at all)."""

    kind = "driver-rule"


def modules_of_capability(cap: str, arch: str) -> Modules:
    """What a GPU of compute capability `cap` ("9.0") accepts; `arch` is the host's (uname -m)."""
    rel = versions.release(cap)
    if rel is None:
        return "unknown"
    if rel < (7, 5):
        return "proprietary"
    if rel >= (10, 0) or (rel[:1] == (9,) and arch == "aarch64"):
        return "open"
    return "either"


def modules_of_pci(gpu: PciDevice, arch: str) -> Modules:
    m = _CHIP.search(gpu.name)
    if m is not None:
        got = _CHIP_MODULES[m.group(1)]
        return "open" if got == "either" and m.group(1) == "GH" and arch == "aarch64" else got
    return "proprietary" if gpu.device_id < FIRST_TURING_DEVICE else "unknown"


def combine(kinds: list[Modules]) -> Modules:
    """What every GPU of a host accepts: 'unknown' where a GPU cannot be told and the others leave a choice."""
    known = set(kinds) - {"unknown"}
    if "proprietary" in known and "open" in known:
        raise DriverRuleError("this host mixes GPUs before Turing (proprietary modules only) with Blackwell or "
                              "Grace Hopper GPUs (open modules only): no NVIDIA driver serves both",
                              "give each kind of GPU its own server")
    for k in ("open", "proprietary"):
        if k in known:
            return k
    return "unknown" if "unknown" in kinds or not kinds else "either"


@dataclass(frozen=True)
class DriverChoice:
    """What a node gets: the branch and the modules, with why (shown by preflight and --dry-run)."""

    branch: str
    flavor: Flavor
    why: str


def choose(settings: DriverSettings, accepted: Modules, today: date | None = None) -> DriverChoice:
    """The branch and flavour for a node whose GPUs accept `accepted`; DriverRuleError where the settings cannot
    work on them (an explicit flavour they refuse, a branch that does not serve them), with the remedy."""
    dm = versions.drivers()
    branch = settings.branch or dm.default_branch
    b = dm.branch(branch)
    if b is None:
        raise DriverRuleError(f"driver branch {branch} is not one gpuk8s installs",
                              f"use one of {', '.join(dm.branches)} (gpuk8s versions)")
    n = int(branch)
    if accepted == "proprietary":
        if settings.flavor == "open":
            raise DriverRuleError("flavor: open, but this node's GPUs are older than Turing: the open kernel "
                                  "modules do not serve them", "use flavor: proprietary (or auto)")
        if n > dm.last_branch_before_turing:
            raise DriverRuleError(f"driver branch {branch} no longer serves GPUs older than Turing (the last "
                                  f"branch for them is {dm.last_branch_before_turing})",
                                  f"use branch: \"{dm.last_branch_before_turing}\"")
        flavor: Flavor = "proprietary"
        why = "GPUs older than Turing: proprietary modules only"
    elif accepted == "open":
        if settings.flavor == "proprietary":
            raise DriverRuleError("flavor: proprietary, but this node has Blackwell or Grace Hopper GPUs: only "
                                  "the open kernel modules serve them", "use flavor: open (or auto)")
        if n < dm.blackwell_since:
            raise DriverRuleError(f"driver branch {branch} predates Blackwell (served from {dm.blackwell_since})",
                                  f"use branch: \"{dm.default_branch}\"")
        flavor = "open"
        why = "Blackwell or Grace Hopper GPUs: open modules only"
    else:
        flavor = "open" if settings.flavor in ("auto", "open") else "proprietary"
        why = ("Turing or newer GPUs: open modules (NVIDIA's default since R560)" if settings.flavor == "auto"
               else f"flavor: {settings.flavor}, as the inventory says")
        if accepted == "unknown" and settings.flavor == "auto":
            why = "GPU architecture unknown: open modules assumed (Turing or newer)"
    if flavor == "open" and n < dm.open_modules_since:
        raise DriverRuleError(f"driver branch {branch} has no open kernel modules (from {dm.open_modules_since})",
                              "use a newer branch, or flavor: proprietary")
    day = today or versions.today()
    if b.end_of_life_reached(day):
        why += f"; branch {branch} reached its end of life on {b.end_of_life.isoformat()}"
    return DriverChoice(branch, flavor, why)


def check_channel(settings: DriverSettings, os_family: str) -> None:
    """DriverRuleError where gpuk8s cannot install the driver this way on this OS. Ubuntu: its archive (signed,
    precompiled modules: Secure Boot works without enrolling a key); `source: nvidia` there (NVIDIA's CUDA repository)
    is planned, not built. Alibaba Cloud Linux 3 has no NVIDIA driver of its own: NVIDIA's RHEL 8 repository, open
    modules built by DKMS (rhel_packages), whatever `source` says."""
    if os_family == "debian" and settings.source != "distro":
        raise DriverRuleError("gpuk8s installs the driver from Ubuntu's archive only, so far (source: distro)",
                              "with source: nvidia install it yourself from NVIDIA's CUDA repository and set "
                              "driver.manage: false")
    if os_family not in ("debian", "rhel"):
        only = "gpuk8s installs the driver on Ubuntu 22.04 and Alibaba Cloud Linux 3 only"
        raise DriverRuleError(only, only)


def check_flavor(c: DriverChoice, os_family: str) -> None:
    """On the RHEL 8 family gpuk8s installs the open modules only (NVIDIA's nvidia-driver:BRANCH-open module stream);
    the proprietary ones there (GPUs before Turing) are not built yet: DriverRuleError."""
    if os_family == "rhel" and c.flavor != "open":
        raise DriverRuleError("on Alibaba Cloud Linux 3 gpuk8s installs the open kernel modules only, so far (NVIDIA's "
                              f"nvidia-driver:{c.branch}-open)", "for these GPUs install the proprietary driver "
                              "yourself and set driver.manage: false")


def plan_for(settings: DriverSettings, f: HostFacts, today: date | None = None) -> DriverChoice:
    """The driver a managed node gets on its OS and GPUs; DriverRuleError (message, remedy) where its settings cannot
    work there. The one decision preflight's driver.plan reports and the playbook's context follows."""
    check_channel(settings, f.os.family)
    c = choose(settings, accepted_modules(f), today)
    check_flavor(c, f.os.family)
    return c


# NVIDIA's RHEL 8 repository (NVIDIA/gpu-driver-container rhel8/install.sh: cuda-rhel8.repo; its key D42D0685.pub);
# aarch64 hosts use the sbsa directory. install.driver_repo names it (or a mirror, or a bundle's served copy).
CUDA_RHEL8 = InstallSettings.driver_repo
CUDA_KEY = "D42D0685.pub"


def cuda_arch_dir(arch: str) -> str:
    """The directory of NVIDIA's RHEL 8 repository for a host's architecture (uname -m)."""
    return "sbsa" if arch == "aarch64" else "x86_64"


def rhel_fabric_manager(branch: str) -> str:
    """Fabric manager's package in NVIDIA's RHEL 8 repository: nvidia-fabricmanager from R580 on, before it
    nvidia-fabric-manager."""
    return "nvidia-fabricmanager" if int(branch) >= 580 else "nvidia-fabric-manager"


def rhel_packages(c: DriverChoice, nvswitch: bool, arch: str,
                  repo: str = CUDA_RHEL8) -> dict[str, object]:
    """The driver on the RHEL 8 family from NVIDIA's repository (NVIDIA's driver installation guide, "Open GPU Kernel
    Modules Installation": `dnf module enable nvidia-driver:BRANCH-open`, `dnf install nvidia-open`): the module stream
    locks the branch, versionlock the release; the modules built by DKMS against the running kernel's headers
    (kernel-devel); fabric manager named nvidia-fabricmanager from R580 on, nvidia-fabric-manager before."""
    fm = rhel_fabric_manager(c.branch) if nvswitch else ""
    return {"stream": f"{c.branch}-open", "packages": ["nvidia-open", *([fm] if fm else [])],
            "locked": ["nvidia-open", "kmod-nvidia-open-dkms", "nvidia-driver", "nvidia-driver-libs",
                       *([fm] if fm else [])],
            "repo": f"{repo.rstrip('/')}/{cuda_arch_dir(arch)}"}


def ubuntu_packages(c: DriverChoice, nvswitch: bool) -> dict[str, object]:
    """The packages of a choice on Ubuntu (Canonical's 'NVIDIA drivers installation' guide and NVIDIA's own
    precompiled Ubuntu 22.04 driver image): the headless driver without DKMS, nvidia-smi, and the kernel's signed
    precompiled modules (linux-modules-nvidia-BRANCH-server[-open]-KERNEL, for the running kernel); on NVSwitch
    systems fabric manager and NSCQ, which match the -server driver of their branch."""
    suffix = "-server-open" if c.flavor == "open" else "-server"
    pkgs = [f"nvidia-headless-no-dkms-{c.branch}{suffix}", f"nvidia-utils-{c.branch}-server"]
    if nvswitch:
        pkgs += [f"nvidia-fabricmanager-{c.branch}", f"libnvidia-nscq-{c.branch}"]
    return {"packages": pkgs, "modules_prefix": f"linux-modules-nvidia-{c.branch}{suffix}-"}


def playbook_context(settings: DriverSettings, f: HostFacts, today: date | None = None,
                     repo: str = CUDA_RHEL8) -> dict[str, object]:
    """What playbooks/nvidia-driver.yaml sees as `driver`: manage false where gpuk8s leaves the driver alone (not
    managed, or settings preflight refused: that host is blocked before any playbook runs). `repo`: the inventory's
    install.driver_repo (NVIDIA's RHEL 8 repository or a copy of it)."""
    if not settings.manage:
        return {"manage": False}
    try:
        c = plan_for(settings, f, today)
    except DriverRuleError:
        return {"manage": False}
    nvswitch = bool(f.driver.nvswitches)
    own = rhel_packages(c, nvswitch, f.arch, repo) if f.os.family == "rhel" else {
        **ubuntu_packages(c, nvswitch), "apt_suite": f"{UBUNTU_CODENAMES.get(f.os.version_id, 'jammy')}-updates"}
    return {"manage": True, "branch": c.branch, "flavor": c.flavor, "nvswitch": nvswitch, **own}
