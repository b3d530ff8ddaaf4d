"""Preflight's driver checks (docs/driver.md): what is loaded against what is installed, what would stop the module
loading (nouveau, Secure Boot, missing headers), what must run beside it (fabric manager on NVSwitch systems,
persistence) and what keeps it in place (package holds); with `driver: {manage: true}`, which driver install
gives the node. Pure functions of a host's facts and its inventory entry.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from datetime import date

from gpuk8s.driver import rules
from gpuk8s.facts.model import DriverFacts, HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host
from gpuk8s.preflight.result import CheckResult, failed, passed, skipped

KUBELET_CONF = "/etc/kubernetes/kubelet.conf"  # the probe's kube-files: the host is a node of a cluster
IDS = ("driver.mismatch", "driver.nouveau", "driver.secure-boot", "driver.fabric-manager", "driver.persistence",
       "driver.held")
# Package names whose hold keeps the driver in place (apt-mark showhold lists names; dnf's versionlock.list lists
# NAME-[EPOCH:]VERSION-RELEASE.* entries, matched by prefix): the meta package users install, and fabric manager
DRIVER_PACKAGES = ("nvidia-driver", "nvidia-open", "nvidia-headless-no-dkms", "nvidia-utils", "nvidia-fabricmanager",
                   "nvidia-fabric-manager", "linux-modules-nvidia", "kmod-nvidia", "nvidia-dkms", "libnvidia-nscq")


def driver_checks(host: Host, f: HostFacts, today: date | None = None) -> list[CheckResult]:
    """Every driver check of one GPU node (none on a CPU node)."""
    if not is_gpu_node(host):
        return []
    d = f.driver
    manage = host.gpu.driver.manage
    out = [plan(host, f, today)] if manage else []
    if not d.read:
        return out + [skipped(i, "the probe did not report the driver's state") for i in IDS]
    out += [_mismatch(d, manage), _nouveau(f, manage), _secure_boot(d, manage), *_headers(host, f),
            _fabric_manager(d, manage), _persistence(d, f), _held(d, f, manage)]
    return out


def plan(host: Host, f: HostFacts, today: date | None = None) -> CheckResult:
    """driver.plan: the branch and modules install gives this node, or why its settings cannot work on its GPUs."""
    where = f"driver (inventory line {host.gpu.driver.line})" if host.gpu.driver.line else "driver"
    try:
        c = rules.plan_for(host.gpu.driver, f, today)
    except rules.DriverRuleError as e:
        return failed("driver.plan", f"{where}: {e.message}", e.remedy)
    have = f.driver.module_version or (f.gpu.driver if f.gpu.state == "ok" else None)
    now = f"; installed: {have} ({f.driver.module_flavor or 'flavour unknown'})" if have else "; no driver installed"
    flavor = f.driver.module_flavor
    if have and KUBELET_CONF in f.kube_files and (have.split(".")[0] != c.branch or (flavor and flavor != c.flavor)):
        # a node of the cluster: install would replace its driver's packages under its GPU pods (and, with
        # --allow-reboot, reboot it without a drain); only gpuk8s driver upgrade drains it first (issue 41)
        return failed("driver.plan", f"{where}: this node is in the cluster and runs driver {have} "
                      f"({flavor or 'flavour unknown'}); the inventory asks branch {c.branch} ({c.flavor} modules): "
                      "install never changes the driver of a running node",
                      "gpuk8s driver upgrade (the node cordoned, its GPU pods waited for, drained, rebooted into the "
                      "new driver, uncordoned), or write the branch it runs in its driver: setting")
    return passed("driver.plan", f"install gives branch {c.branch}, {c.flavor} modules ({c.why}){now}")


def _mismatch(d: DriverFacts, manage: bool) -> CheckResult:
    """driver.mismatch: the loaded kernel module against the NVML libraries installed: after a package upgrade
    without a reboot they differ, and nvidia-smi (and every CUDA program) fails with 'Failed to initialize NVML:
    Driver/library version mismatch' while the kernel logs 'NVRM: API mismatch'."""
    if d.module_version is None:
        return skipped("driver.mismatch", "no NVIDIA kernel module is loaded" + (
            f" (installed on disk: {d.disk_module_version})" if d.disk_module_version else ""))
    if not d.libraries:
        return skipped("driver.mismatch", f"module {d.module_version} loaded; no NVML library found to compare")
    other = [v for v in d.libraries if v != d.module_version]
    if not other:
        return passed("driver.mismatch", f"module {d.module_version} ({d.module_flavor}) and its libraries agree")
    if manage:  # install's driver phase loads the installed module (a reboot with --allow-reboot): not blocking
        return skipped("driver.mismatch", f"kernel module {d.module_version} is loaded, the libraries are "
                       f"{', '.join(other)}: install reboots the node into the installed driver (--allow-reboot)")
    return failed("driver.mismatch",
                  f"kernel module {d.module_version} is loaded, but the driver's libraries are {', '.join(other)}: "
                  "'Failed to initialize NVML: Driver/library version mismatch' (the packages were upgraded without "
                  "a reboot)" + (f"; a reboot loads {d.disk_module_version}" if d.disk_module_version else ""),
                  "reboot the host (or stop every GPU user and reload the nvidia modules); then hold the driver "
                  "packages so that unattended upgrades cannot do it again"
                  + ("; gpuk8s install --allow-reboot reboots it" if manage else ""))


def _nouveau(f: HostFacts, manage: bool) -> CheckResult:
    """driver.nouveau: the kernel's own nouveau driver holds NVIDIA GPUs and keeps the nvidia module off them."""
    if f.modules is None:
        return skipped("driver.nouveau", "lsmod could not be read")
    if "nouveau" not in f.modules:
        return passed("driver.nouveau", "nouveau is not loaded")
    fix = ("gpuk8s install blacklists it, rebuilds the initramfs and reboots with --allow-reboot" if manage else
           "blacklist it (echo 'blacklist nouveau' and 'options nouveau modeset=0' into "
           "/etc/modprobe.d/blacklist-nouveau.conf), rebuild the initramfs (update-initramfs -u, or dracut -f) and "
           "reboot")
    why = (" though a modprobe.d file blacklists it: the initramfs still loads it" if f.driver.nouveau_blacklisted
           else ": the nvidia module cannot take the GPUs while it holds them")
    return failed("driver.nouveau", f"nouveau (the kernel's open driver for NVIDIA GPUs) is loaded{why}", fix)


def _secure_boot(d: DriverFacts, manage: bool) -> CheckResult:
    """driver.secure-boot: with Secure Boot on, the kernel refuses an unsigned module ('Key was rejected by
    service'); Canonical's linux-modules-nvidia packages are signed, a DKMS build needs its key enrolled (MOK)."""
    if d.secure_boot is None:
        return skipped("driver.secure-boot", "Secure Boot state unknown (no mokutil, or not an EFI system)")
    if not d.secure_boot:
        return passed("driver.secure-boot", "Secure Boot is off")
    if d.module_signer == "":
        return failed("driver.secure-boot", f"Secure Boot is on and the nvidia module on disk "
                      f"({d.disk_module_version}) is unsigned: the kernel will refuse to load it",
                      "install Canonical's signed modules (linux-modules-nvidia-BRANCH-server-open-generic) or enroll "
                      "the DKMS signing key (mokutil --import /var/lib/dkms/mok.pub, then confirm at the next boot)")
    signer = f", signed by {d.module_signer}" if d.module_signer else ""
    return passed("driver.secure-boot", f"Secure Boot is on; the nvidia module{signer}"
                  + ("" if d.module_signer or manage else " (no module on disk yet)"))


def _headers(host: Host, f: HostFacts) -> list[CheckResult]:
    """driver.kernel-headers, only where gpuk8s builds the module by DKMS (a managed driver on Alibaba Cloud Linux,
    or from NVIDIA's repository): the running kernel's headers; Canonical's precompiled modules need none."""
    s = host.gpu.driver
    if not (s.manage and (f.os.family == "rhel" or s.source == "nvidia")):
        return []
    if f.driver.kernel_headers:
        return [passed("driver.kernel-headers", f"headers of {f.kernel} present")]
    pkg = f"kernel-devel-{f.kernel}" if f.os.family == "rhel" else f"linux-headers-{f.kernel}"
    return [failed("driver.kernel-headers", f"the headers of the running kernel {f.kernel} are missing: DKMS cannot "
                  "build the nvidia module", f"install {pkg} (gpuk8s install does, where the repositories have it)")]


def _fabric_manager(d: DriverFacts, manage: bool) -> CheckResult:
    """driver.fabric-manager: on NVSwitch systems (HGX/DGX A100, H100, H200) no CUDA program runs until
    nvidia-fabricmanager, of exactly the driver's version, has configured the switches (CUDA error 802, 'system not
    yet initialized'); fabric manager refuses a driver of another version ('fabric manager NVIDIA GPU driver
    interface version X don't match with driver version Y')."""
    if not d.lspci:
        return skipped("driver.fabric-manager", "lspci not available: NVSwitches cannot be seen")
    if not d.nvswitches:
        return passed("driver.fabric-manager", "no NVSwitch: fabric manager not needed")
    n = len(d.nvswitches)
    fm = d.package_version("nvidia-fabricmanager") or d.package_version("nvidia-fabric-manager")
    fix = "gpuk8s install installs and starts it with the driver" if manage else (
        "install nvidia-fabricmanager of exactly the driver's version (Ubuntu: nvidia-fabricmanager-BRANCH; "
        "NVIDIA's repository: nvidia-fabricmanager), hold it, and systemctl enable --now nvidia-fabricmanager")
    if manage and d.fabric_manager != "active":
        # prepare installs it of the driver's version and the driver phase starts it once the module is loaded
        return skipped("driver.fabric-manager", f"{n} NVSwitch(es), fabric manager {fm or 'not installed'} "
                       f"({d.fabric_manager}): install installs and starts it with the driver (driver: manage)")
    if fm is None and d.fabric_manager != "active":
        return failed("driver.fabric-manager", f"{n} NVSwitch(es) and no fabric manager: CUDA programs fail with "
                      "error 802 'system not yet initialized'", fix)
    if d.module_version and fm and not fm.split(":")[-1].startswith(d.module_version):
        return failed("driver.fabric-manager", f"fabric manager {fm} does not match the loaded driver "
                      f"{d.module_version}: it refuses to start ('driver interface version ... don't match with "
                      "driver version')", fix if manage else "install the fabric manager package of the driver's "
                      "exact version (or reboot, if the driver was upgraded and the old module is still loaded)")
    if d.fabric_manager != "active":
        return failed("driver.fabric-manager", f"{n} NVSwitch(es); nvidia-fabricmanager is {d.fabric_manager}: CUDA "
                      "programs fail with error 802 until it runs",
                      "systemctl enable --now nvidia-fabricmanager; journalctl -u nvidia-fabricmanager says why "
                      "it stopped")
    return passed("driver.fabric-manager", f"{n} NVSwitch(es); fabric manager {fm or ''} active".replace("  ", " "))


def _persistence(d: DriverFacts, f: HostFacts) -> CheckResult:
    """driver.persistence: nvidia-persistenced keeps the driver initialised between GPU users (without it each
    nvidia-smi and container start re-initialises every GPU, seconds on an 8-GPU server)."""
    if f.gpu.state != "ok":
        return skipped("driver.persistence", "no working driver")
    if d.persistenced == "active":
        return passed("driver.persistence", "nvidia-persistenced is active")
    return failed("driver.persistence", f"nvidia-persistenced is {d.persistenced}: every GPU user re-initialises the "
                  "driver", "systemctl enable --now nvidia-persistenced (it comes with the driver packages)")


def _held(d: DriverFacts, f: HostFacts, manage: bool) -> CheckResult:
    """driver.held: an unattended upgrade that replaces the driver's packages under running pods leaves the old
    module loaded and every new GPU user failing (the version mismatch) until a reboot."""
    installed = [n for n, _v in d.packages if n.startswith(DRIVER_PACKAGES)]
    if not installed:
        return skipped("driver.held", "no driver package installed by the package manager (a .run install, or "
                       "none)")
    # a hold names the package (apt-mark showhold) or the package and its version (dnf versionlock list:
    # name-epoch:version-release.*), found by bisection (comparing every package with every hold was 2.5 s per
    # host at 4,096 of each)
    holds = held_names(d.held, installed)
    held = [n for n in installed if n in holds]
    loose = [n for n in installed if n not in holds]
    if not loose:
        return passed("driver.held", f"held: {', '.join(held)}")
    hold = "apt-mark hold" if f.os.family == "debian" else "dnf versionlock add"
    return failed("driver.held", f"driver packages not held: {', '.join(loose[:6])}: an automatic upgrade would "
                  "replace them under running pods (then 'Driver/library version mismatch' until a reboot)",
                  ("gpuk8s install holds them" if manage else f"{hold} {' '.join(loose[:6])}"))


def held_names(holds: Iterable[str], names: Iterable[str]) -> set[str]:
    """The `names` a hold stands for: a hold that is the name, or starts with the name and '-' (dnf versionlock's
    NAME-[EPOCH:]VERSION-RELEASE.*). The holds sorted once, each name found by bisection: n log n."""
    ordered = sorted(set(holds))
    out: set[str] = set()
    for n in names:
        at = bisect_left(ordered, n)
        if at < len(ordered) and ordered[at] == n:
            out.add(n)
            continue
        at = bisect_left(ordered, n + "-", at)
        if at < len(ordered) and ordered[at].startswith(n + "-"):
            out.add(n)
    return out
