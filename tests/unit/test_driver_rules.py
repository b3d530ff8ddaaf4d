"""The inventory's `driver:` and the rules that choose a node's driver branch and kernel modules
(gpuk8s/driver/rules.py): every refusal with its reason and remedy, from the version matrix's driver section."""

from __future__ import annotations

from datetime import date

import pytest

from gpuk8s import versions
from gpuk8s.driver import rules
from gpuk8s.driver.rules import DriverRuleError, choose, combine, modules_of_capability, modules_of_pci
from gpuk8s.facts.model import PciDevice
from gpuk8s.inventory import loader
from gpuk8s.inventory.model import DriverSettings

HEAD = "cluster: {name: lab}\nssh: {user: gpuk8s}\n"


def inv(hosts: str, extra: str = "") -> str:
    return HEAD + extra + "hosts:\n  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n" + hosts


def problems(text: str) -> list[str]:
    with pytest.raises(loader.InventoryError) as e:
        loader.loads(text, "inv.yaml")
    return [str(p) for p in e.value.problems if p.severity == "error"]


def test_driver_from_defaults_groups_and_the_host() -> None:
    i = loader.loads(inv("  - {name: gpu-1, address: 10.0.0.2, gpus: 8}\n"
                         "  - {name: gpu-2, address: 10.0.0.3, gpus: 8, gpu_group: old}\n"
                         "  - {name: gpu-3, address: 10.0.0.4, gpus: 8, driver: {manage: false}}\n",
                         "gpu_defaults:\n  driver: {manage: true}\n"
                         "gpu_groups:\n  old:\n    driver: {manage: true, branch: 535, flavor: proprietary}\n"),
                     "inv.yaml")
    assert i.host("gpu-1").gpu.driver == DriverSettings(manage=True, line=4)
    d2 = i.host("gpu-2").gpu.driver
    assert (d2.manage, d2.branch, d2.flavor, d2.source) == (True, "535", "proprietary", "distro")
    assert i.host("gpu-3").gpu.driver.manage is False
    assert i.host("cp-1").gpu.driver == DriverSettings()  # not a GPU node: never managed


@pytest.mark.parametrize(("driver", "message", "fix"), [
    ('{manage: true, branch: "590"}', "gpuk8s does not install driver branch 590", '"580"'),
    ("{manage: true, branch: 58}", "'58' is not a driver branch", '"535", "580"'),
    ("{manage: true, flavor: opne}", "'opne' is not one of auto, open, proprietary", "did you mean 'open'?"),
    ("{manage: true, source: cuda}", "'cuda' is not one of distro, nvidia", "distro"),
    ("{manage: yes please}", "expected true or false", "write true or false"),
    ("{manage: true, kind: open}", "unknown key", "valid keys"),
])
def test_driver_mistakes_are_located_with_a_fix(driver: str, message: str, fix: str) -> None:
    found = problems(inv(f"  - {{name: gpu-1, address: 10.0.0.2, gpus: 8, driver: {driver}}}\n"))
    assert len(found) == 1, found
    assert found[0].startswith("inv.yaml:5:") and message in found[0] and fix in found[0]


def test_settings_without_manage_warn_that_they_do_nothing() -> None:
    i = loader.loads(inv('  - {name: gpu-1, address: 10.0.0.2, gpus: 8, driver: {branch: "580"}}\n'), "inv.yaml")
    (w,) = [str(p) for p in i.warnings]
    assert "no effect without manage: true" in w and "inv.yaml:5:" in w


@pytest.mark.parametrize(("cap", "arch", "modules"), [
    ("6.0", "x86_64", "proprietary"),  # P100
    ("7.0", "x86_64", "proprietary"),  # V100: Volta, before Turing
    ("7.5", "x86_64", "either"),  # T4
    ("8.0", "x86_64", "either"),  # A100
    ("9.0", "x86_64", "either"),  # H100, H200
    ("9.0", "aarch64", "open"),  # GH200: Grace Hopper needs the open modules
    ("10.0", "x86_64", "open"),  # B200
    ("12.0", "x86_64", "open"),  # RTX PRO 6000 Blackwell
    ("N/A", "x86_64", "unknown"),
])
def test_modules_by_compute_capability(cap: str, arch: str, modules: str) -> None:
    assert modules_of_capability(cap, arch) == modules


@pytest.mark.parametrize(("name", "device", "arch", "modules"), [
    ("GV100GL [Tesla V100 SXM2 32GB]", 0x1DB5, "x86_64", "proprietary"),
    ("TU104GL [Tesla T4]", 0x1EB8, "x86_64", "either"),
    ("GA100 [A100 SXM4 80GB]", 0x20B2, "x86_64", "either"),
    ("GH100 [H100 SXM5 80GB]", 0x2330, "x86_64", "either"),
    ("GH100 [GH200 120GB]", 0x2342, "aarch64", "open"),
    ("GB100 [B200]", 0x2901, "x86_64", "open"),
    ("Device 1db4", 0x1DB4, "x86_64", "proprietary"),  # an old PCI database: the id still says before Turing
    ("Device 2b85", 0x2B85, "x86_64", "unknown"),  # an id the database cannot name: Turing or newer, which?
])
def test_modules_by_pci_name_or_id(name: str, device: int, arch: str, modules: str) -> None:
    assert modules_of_pci(PciDevice("0000:17:00.0", 0x0302, device, name), arch) == modules


def test_a_host_mixing_pre_turing_and_blackwell_gpus_is_refused() -> None:
    assert combine(["either", "open", "unknown"]) == "open"
    assert combine(["either", "either"]) == "either"
    assert combine(["either", "unknown"]) == "unknown"
    with pytest.raises(DriverRuleError, match="no NVIDIA driver serves both"):
        combine(["proprietary", "open"])


DAY = date(2026, 12, 1)


def test_auto_picks_open_from_turing_and_proprietary_before() -> None:
    dm = versions.drivers()
    c = choose(DriverSettings(manage=True), "either", DAY)
    assert (c.branch, c.flavor) == (dm.default_branch, "open") and "R560" in c.why
    c = choose(DriverSettings(manage=True), "proprietary", DAY)
    assert (c.branch, c.flavor) == (dm.default_branch, "proprietary") and "older than Turing" in c.why
    assert choose(DriverSettings(manage=True, flavor="proprietary"), "either", DAY).flavor == "proprietary"
    c = choose(DriverSettings(manage=True), "unknown", DAY)
    assert c.flavor == "open" and "unknown" in c.why


@pytest.mark.parametrize(("settings", "accepted", "message", "remedy"), [
    (DriverSettings(True, flavor="open"), "proprietary", "open kernel modules do not serve them", "proprietary"),
    (DriverSettings(True, branch="595"), "proprietary", "no longer serves GPUs older than Turing", '"580"'),
    (DriverSettings(True, flavor="proprietary"), "open", "only the open kernel modules serve them", "flavor: open"),
    (DriverSettings(True, branch="535"), "open", "predates Blackwell", '"580"'),
])
def test_settings_the_gpus_refuse(settings: DriverSettings, accepted: rules.Modules, message: str,
                                  remedy: str) -> None:
    with pytest.raises(DriverRuleError) as e:
        choose(settings, accepted, DAY)
    assert message in e.value.message and remedy in e.value.remedy


def test_a_branch_past_its_end_of_life_is_said() -> None:
    c = choose(DriverSettings(True, branch="535", flavor="proprietary"), "either", DAY)
    assert "reached its end of life on 2026-06-30" in c.why
    assert "end of life" not in choose(DriverSettings(True, branch="535"), "either", date(2026, 6, 30)).why


def test_the_matrix_driver_section_is_checked() -> None:
    good = {"driver": {"default_branch": "580", "open_modules_since": "515", "last_branch_before_turing": "580",
                       "blackwell_since": "570",
                       "branches": {"580": {"designation": "long-term-support", "end_of_life": date(2028, 6, 30)}}}}
    assert versions.parse_drivers(good).default_branch == "580"
    bad_default = {"driver": {**good["driver"], "default_branch": "595"}}
    with pytest.raises(versions.MatrixError, match="default_branch"):
        versions.parse_drivers(bad_default)
    bad_branch = {"driver": {**good["driver"], "branches": {"580": {"designation": "beta",
                                                                      "end_of_life": date(2028, 6, 30)}}}}
    with pytest.raises(versions.MatrixError, match="designation"):
        versions.parse_drivers(bad_branch)
