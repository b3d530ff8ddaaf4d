"""The driver's facts (gpuk8s/facts/driver.py) read from real texts (tests/fixtures/real/driver/, each with its
source), and preflight's driver checks (gpuk8s/preflight/driver_checks.py) on the facts they give."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuk8s.driver.rules import combine, modules_of_pci
from gpuk8s.facts.driver import parse_driver, parse_lspci, parse_proc_version, parse_secure_boot, split_subsections
from gpuk8s.facts.model import DriverFacts, GPUInfo, PciDevice
from gpuk8s.inventory.model import Cluster, DriverSettings, Host, NodeGPUSettings, SSHSettings
from gpuk8s.preflight.driver_checks import driver_checks
from gpuk8s.preflight.host_checks import check_host
from tests.unit.test_checks import READY_DRIVER, TODAY, facts

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "driver"


def real(name: str) -> str:
    head, sep, body = (REAL / name).read_text().partition("\n---\n")
    assert sep and "source: " in head and "verbatim: yes" in head, f"{name}: no header with its source"
    return body


# (file, the loaded module's version and flavour, written by hand from the text)
PROC = [
    ("proc-version-proprietary-384-neofetch-876.txt", ("384.98", "proprietary")),
    ("proc-version-proprietary-580-truenas-19.txt", ("580.173.02", "proprietary")),
    ("proc-version-open-565-nixgl-186.txt", ("565.57.01", "open")),
    ("proc-version-open-525-local-build-nixgl-121.txt", ("525.60.11", "open")),
    ("proc-version-open-555-localized-date-hyprland-6715.txt", ("555.58", "open")),
    ("proc-version-open-aarch64-l4t-nixgl-139.txt", ("35.3.1", "open")),
]


def test_every_real_driver_text_is_in_a_table() -> None:
    named = {n for n, _ in PROC} | {n for n, *_ in LSPCI} | {n for n, _ in MOKUTIL}
    assert sorted(p.name for p in REAL.glob("*.txt")) == sorted(named)


@pytest.mark.parametrize(("name", "expected"), PROC)
def test_proc_version_real(name: str, expected: tuple[str, str]) -> None:
    assert parse_proc_version(real(name)) == expected


@pytest.mark.parametrize("text", ["", "cat: /proc/driver/nvidia/version: No such file or directory",
                                  "NVRM version: NVIDIA UNIX x86_64 Kernel Module  ", "x" * 100000,
                                  "NVRM version: NVIDIA UNIX x86_64 Kernel Module  5" + ".5" * 50000])
def test_proc_version_other_text_is_no_module(text: str) -> None:
    assert parse_proc_version(text) is None


# (file, GPUs, NVSwitches, the GPUs' device id, what their GPUs accept): written by hand from the text
LSPCI: list[tuple[str, int, int, int, str]] = [
    ("lspci-hgx-h100-named-rhel-ai.txt", 8, 4, 0x2330, "either"),  # the ASPEED VGA line is not NVIDIA's
    ("lspci-hgx-a100-mixed-names-gpud.txt", 8, 6, 0x20B2, "either"),  # switches unnamed: 'Device [10de:1af1]'
]
MOKUTIL = [
    ("mokutil-enabled-sos-1574.txt", True),
    ("mokutil-disabled-setup-mode-system76-388.txt", False),
    ("mokutil-no-secure-boot-support-gruuuuu.txt", None),
]


@pytest.mark.parametrize(("name", "gpus", "switches", "device", "accepted"), LSPCI)
def test_lspci_real(name: str, gpus: int, switches: int, device: int, accepted: str) -> None:
    got_gpus, got_switches = parse_lspci(real(name))
    assert (len(got_gpus), len(got_switches)) == (gpus, switches)
    assert {g.device_id for g in got_gpus} == {device} and all(g.class_id == 0x0302 for g in got_gpus)
    assert all(s.class_id == 0x0680 for s in got_switches)
    assert combine([modules_of_pci(g, "x86_64") for g in got_gpus]) == accepted


@pytest.mark.parametrize(("name", "state"), MOKUTIL)
def test_secure_boot_real(name: str, state: bool | None) -> None:
    assert parse_secure_boot(0, real(name)) is state


def test_sub_sections_and_a_whole_section() -> None:
    section = ("@@drv lspci 0\n\n@@drv nvml 0\nlibnvidia-ml.so.535.104.05\nlibnvidia-ml.so.530.30.02\n"
               "@@drv modinfo 1\nmodinfo: ERROR: Module nvidia not found.\n@@drv secureboot 127\n@@drv headers 0\nno\n"
               "@@drv units 0\ninactive\nactive\n@@drv packages 0\nnvidia-driver-535-server 535.104.05-0ubuntu1\n"
               "@@drv holds 0\nnvidia-driver-535-server\n@@drv blacklist 0\n/etc/modprobe.d/blacklist-nouveau.conf")
    assert set(split_subsections(section)) == {"lspci", "nvml", "modinfo", "secureboot", "headers", "units",
                                               "packages", "holds", "blacklist"}
    d = parse_driver(section, real("proc-version-open-565-nixgl-186.txt"))
    assert (d.read, d.lspci, d.module_version, d.module_flavor) == (True, True, "565.57.01", "open")
    assert d.libraries == ("530.30.02", "535.104.05") and d.disk_module_version is None and d.secure_boot is None
    assert (d.kernel_headers, d.fabric_manager, d.persistenced) == (False, "inactive", "active")
    assert d.packages == (("nvidia-driver-535-server", "535.104.05-0ubuntu1"),)
    assert d.held == ("nvidia-driver-535-server",) and d.nouveau_blacklisted
    assert parse_driver("", "") == DriverFacts()  # an older probe: nothing read, nothing claimed


# -- the checks -----------------------------------------------------------------------------------------------------
GPU_HOST = Host("gpu-1", "10.0.0.11", "worker", SSHSettings(), gpus=8)
MANAGED = replace(GPU_HOST, gpu=NodeGPUSettings(driver=DriverSettings(manage=True, line=12)))


def by_id(host: Host, d: DriverFacts, **kw: object) -> dict[str, tuple[str, str, str]]:
    return {r.id: (r.status, r.message, r.remedy) for r in driver_checks(host, facts(driver=d, **kw), TODAY)}


def test_a_well_kept_host_passes_and_unmanaged_has_no_plan() -> None:
    got = by_id(GPU_HOST, READY_DRIVER)
    assert {k: v[0] for k, v in got.items()} == {
        "driver.mismatch": "pass", "driver.nouveau": "pass", "driver.secure-boot": "pass",
        "driver.fabric-manager": "pass", "driver.persistence": "pass", "driver.held": "pass"}


def test_version_mismatch_names_both_versions_and_the_reboot() -> None:
    d = replace(READY_DRIVER, module_version="580.173.02", libraries=("580.178",), disk_module_version="580.178")
    status, message, remedy = by_id(GPU_HOST, d)["driver.mismatch"]
    assert status == "fail" and "580.173.02 is loaded" in message and "580.178" in message
    assert "a reboot loads 580.178" in message and remedy.startswith("reboot the host")


def test_nouveau_loaded_and_blacklisted_but_still_in_the_initramfs() -> None:
    f_mods = frozenset({"overlay", "br_netfilter", "nouveau"})
    status, message, remedy = by_id(GPU_HOST, READY_DRIVER, modules=f_mods)["driver.nouveau"]
    assert status == "warn" and "cannot take the GPUs" in message and "update-initramfs -u" in remedy
    d = replace(READY_DRIVER, nouveau_blacklisted=True)
    assert "initramfs still loads it" in by_id(GPU_HOST, d, modules=f_mods)["driver.nouveau"][1]
    assert "install blacklists it" in by_id(MANAGED, d, modules=f_mods)["driver.nouveau"][2]


HGX = tuple(PciDevice(f"0000:{0x07 + i:02x}:00.0", 0x0680, 0x22A3, "GH100 [H100 NVSwitch]") for i in range(4))


@pytest.mark.parametrize(("change", "message"), [
    ({"fabric_manager": "inactive", "packages": ()}, "4 NVSwitch(es) and no fabric manager: CUDA programs fail with "
                                                     "error 802"),
    ({"fabric_manager": "failed", "packages": (("nvidia-fabricmanager-535", "535.54.03-1"),)},
     "fabric manager 535.54.03-1 does not match the loaded driver 535.104.05"),
    ({"fabric_manager": "inactive", "packages": (("nvidia-fabricmanager-535", "535.104.05-0ubuntu1"),)},
     "nvidia-fabricmanager is inactive"),
])
def test_nvswitch_systems_need_fabric_manager_of_the_drivers_version(change: dict[str, object], message: str) -> None:
    d = replace(READY_DRIVER, nvswitches=HGX, **change)  # type: ignore[arg-type]
    status, got, _ = by_id(GPU_HOST, d)["driver.fabric-manager"]
    assert status == "fail" and message in got
    ok = replace(READY_DRIVER, nvswitches=HGX, fabric_manager="active",
                 packages=(("nvidia-fabricmanager-535", "535.104.05-1"),))
    assert by_id(GPU_HOST, ok)["driver.fabric-manager"][0] == "pass"


def test_unheld_packages_persistence_and_unsigned_module_under_secure_boot() -> None:
    d = replace(READY_DRIVER, held=(), persistenced="inactive", secure_boot=True, module_signer="")
    got = by_id(GPU_HOST, d)
    assert got["driver.held"][0] == "warn" and "apt-mark hold nvidia-driver-535-server" in got["driver.held"][2]
    assert got["driver.persistence"][0] == "warn" and "nvidia-persistenced is inactive" in got["driver.persistence"][1]
    assert got["driver.secure-boot"][0] == "warn" and "unsigned" in got["driver.secure-boot"][1]
    signed = replace(d, module_signer="Canonical Ltd. Kernel Module Signing")
    assert "signed by Canonical" in by_id(GPU_HOST, signed)["driver.secure-boot"][1]


def test_a_bare_managed_host_is_planned_not_blocked() -> None:
    bare = DriverFacts(read=True, lspci=True, pci_gpus=tuple(
        PciDevice(f"0000:{0x1b + i:02x}:00.0", 0x0302, 0x2330, "GH100 [H100 SXM5 80GB]") for i in range(8)))
    f = facts(driver=bare, gpu=GPUInfo("absent"), compute_caps=(), modules=frozenset({"nouveau"}))
    r = {x.id: x for x in check_host(MANAGED, f, Cluster(), today=TODAY)}
    assert r["gpu.driver"].status == "skip" and "install installs the driver" in r["gpu.driver"].message
    assert r["driver.plan"].status == "pass" and "branch 580, open modules" in r["driver.plan"].message
    assert "no driver installed" in r["driver.plan"].message
    unmanaged = {x.id: x for x in check_host(GPU_HOST, f, Cluster(), today=TODAY)}
    assert unmanaged["gpu.driver"].status == "fail" and "driver.plan" not in unmanaged


def test_a_managed_flavour_the_gpus_refuse_fails_the_plan_with_its_line() -> None:
    v100 = DriverFacts(read=True, lspci=True, pci_gpus=(PciDevice("0000:1b:00.0", 0x0302, 0x1DB5,
                                                                   "GV100GL [Tesla V100 SXM2 32GB]"),))
    host = replace(MANAGED, gpu=NodeGPUSettings(driver=DriverSettings(manage=True, flavor="open", line=12)))
    status, message, remedy = by_id(host, v100, compute_caps=())["driver.plan"]
    assert status == "fail" and message.startswith("driver (inventory line 12): flavor: open")
    assert "proprietary" in remedy


def test_alibaba_cloud_linux_is_planned_with_open_modules_and_refused_before_turing() -> None:
    from gpuk8s.facts.model import OSInfo

    alinux = OSInfo("alinux", ("rhel", "fedora", "centos", "anolis"), "3", "Alibaba Cloud Linux 3", "rhel")
    h100 = DriverFacts(read=True, lspci=True, pci_gpus=(PciDevice("0000:1b:00.0", 0x0302, 0x2330,
                                                                   "GH100 [H100 SXM5 80GB]"),))
    status, message, _ = by_id(MANAGED, h100, os=alinux, compute_caps=())["driver.plan"]
    assert status == "pass" and "branch 580, open modules" in message
    v100 = replace(h100, pci_gpus=(PciDevice("0000:1b:00.0", 0x0302, 0x1DB5, "GV100GL [Tesla V100 SXM2 32GB]"),))
    status, message, remedy = by_id(MANAGED, v100, os=alinux, compute_caps=())["driver.plan"]
    assert status == "fail" and "open kernel modules only" in message and "manage: false" in remedy
    nvidia = replace(MANAGED, gpu=NodeGPUSettings(driver=DriverSettings(manage=True, source="nvidia")))
    status, message, _ = by_id(nvidia, h100, compute_caps=())["driver.plan"]  # Ubuntu: source nvidia not built yet
    assert status == "fail" and "Ubuntu's archive only" in message
