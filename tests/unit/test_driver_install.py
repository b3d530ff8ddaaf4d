"""Install's driver, for nodes with driver: {manage: true}: the steps playbooks/nvidia-driver.yaml renders for the
branch and modules gpuk8s/driver/rules.py chose (valid sh, every value quoted), and what the driver phase
(gpuk8s/phases/driver.py) decides a node needs from its facts."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest

from gpuk8s.facts.model import DriverFacts, GPUInfo, PciDevice
from gpuk8s.install.prepare import playbooks_for
from gpuk8s.inventory.loader import loads
from gpuk8s.phases.driver import action, services
from gpuk8s.playbook.model import load_playbook
from gpuk8s.playbook.render import context, render_playbook
from gpuk8s.playbook.script import build_script
from tests.unit.test_checks import READY_DRIVER, facts

INV = loads("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
            "  - {name: gpu-1, address: 10.0.0.11, gpus: 8, driver: {manage: true}}\n"
            "  - {name: gpu-2, address: 10.0.0.12, gpus: 8}\n", "inv.yaml")
H100 = tuple(PciDevice(f"0000:{0x1b + i:02x}:00.0", 0x0302, 0x2330, "GH100 [H100 SXM5 80GB]") for i in range(8))
SWITCHES = tuple(PciDevice(f"0000:{0x07 + i:02x}:00.0", 0x0680, 0x22A3, "GH100 [H100 NVSwitch]") for i in range(4))
BARE = facts(gpu=GPUInfo("absent"), compute_caps=(), modules=frozenset({"overlay", "nouveau"}),
             driver=DriverFacts(read=True, lspci=True, pci_gpus=H100, nvswitches=SWITCHES))


def steps(host: str, f=BARE):
    ctx = context(INV, INV.host(host), f)
    return {s.name: s for n in playbooks_for(INV) for s in render_playbook(load_playbook(n), ctx)}


def test_a_managed_bare_hgx_node_gets_the_chosen_driver_held_with_fabric_manager(tmp_path) -> None:
    got = steps("gpu-1")
    pkgs = got["driver-packages-apt"].run
    assert "nvidia-headless-no-dkms-580-server-open nvidia-utils-580-server nvidia-fabricmanager-580 " \
           "libnvidia-nscq-580 linux-modules-nvidia-580-server-open-\"$(uname -r)\"" in pkgs
    assert "apt-mark hold nvidia-headless-no-dkms-580-server-open" in got["driver-hold-apt"].run
    assert got["driver-nouveau-blacklist"].file_content.splitlines()[1:] == ["blacklist nouveau",
                                                                             "options nouveau modeset=0"]
    assert "update-initramfs -u" in got["driver-initramfs"].run
    assert "systemctl enable nvidia-fabricmanager" in got["driver-fabricmanager"].run
    # the driver first, before the toolkit and the runtime
    assert list(got).index("driver-packages-apt") < list(got).index("toolkit-packages-apt")
    for shell in ("sh", "bash") if shutil.which("bash") else ("sh",):
        for dry in (False, True):
            script = tmp_path / "s.sh"
            script.write_text(build_script(list(got.values()), owner="test", dry_run=dry))
            p = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
            assert p.returncode == 0, p.stderr


def test_unmanaged_and_refused_nodes_get_no_driver_step() -> None:
    assert not [n for n in steps("gpu-2") if n.startswith("driver-")]  # the user's driver: untouched
    v100 = replace(BARE.driver, pci_gpus=(PciDevice("0000:1b:00.0", 0x0302, 0x1DB5, "GV100GL [Tesla V100 SXM2 32GB]"),),
                   nvswitches=())
    got = steps("gpu-1", replace(BARE, driver=v100))  # before Turing: proprietary modules of R580, no switches
    assert "nvidia-headless-no-dkms-580-server nvidia-utils-580-server linux-modules-nvidia-580-server-" in \
        got["driver-packages-apt"].run and "driver-fabricmanager" not in got
    alinux_v100 = replace(BARE, driver=v100, os=replace(BARE.os, id="alinux", family="rhel", version_id="3"))
    assert not [n for n in steps("gpu-1", alinux_v100) if n.startswith("driver-")]  # refused by driver.plan instead


def test_alibaba_cloud_linux_gets_nvidias_rhel8_repository_the_open_stream_and_locks(tmp_path) -> None:
    alinux = replace(BARE, os=replace(BARE.os, id="alinux", family="rhel", version_id="3"))
    got = steps("gpu-1", alinux)
    assert not [n for n in got if n.endswith("-apt")]
    assert "baseurl=https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64" in \
        got["driver-cuda-repo"].file_content
    assert "gpgkey=https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/D42D0685.pub" in \
        got["driver-cuda-repo"].file_content and "driver-rpm-key" not in got  # dnf imports it over https
    assert "dnf module enable -y -q nvidia-driver:580-open" in got["driver-module-stream"].run
    assert "dnf install -y -q nvidia-open nvidia-fabricmanager" in got["driver-packages-dnf"].run
    assert "dnf versionlock add nvidia-open kmod-nvidia-open-dkms nvidia-driver nvidia-driver-libs " \
           "nvidia-fabricmanager" in got["driver-hold-dnf"].run
    assert 'kernel-devel-$(uname -r)' in got["driver-kernel-devel"].run and "dracut -f" in got["driver-initramfs"].run
    script = tmp_path / "s.sh"
    script.write_text(build_script(list(got.values()), owner="test", dry_run=False))
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True).returncode == 0


def test_a_mirror_of_nvidias_rhel8_repository_over_http_has_its_key_checked_against_the_pin(tmp_path) -> None:
    """install.driver_repo (a mirror, or the copy a bundle serves): the repository file names it; over plain http
    its key is fetched and checked against the pinned fingerprint (the shared repo-key step) and dnf reads that
    local copy, never a key from the network."""
    fp = "0123456789ABCDEF0123456789ABCDEF01234567"
    inv = loads("install:\n  driver_repo: {url: 'http://10.0.0.10:5480/repos/driver', insecure_http: true, "
                f"key_fingerprint: {fp}}}\n" + "hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                "  - {name: gpu-1, address: 10.0.0.11, gpus: 8, "
                "driver: {manage: true}}\n", "inv.yaml")
    alinux = replace(BARE, os=replace(BARE.os, id="alinux", family="rhel", version_id="3"))
    ctx = context(inv, inv.host("gpu-1"), alinux)
    got = {s.name: s for n in playbooks_for(inv) for s in render_playbook(load_playbook(n), ctx)}
    repo = got["driver-cuda-repo"].file_content
    assert "baseurl=http://10.0.0.10:5480/repos/driver/x86_64\n" in repo
    assert "gpgkey=file:///etc/pki/rpm-gpg/gpuk8s-cuda-rhel8.asc\n" in repo
    key = got["driver-rpm-key"]
    assert "url=http://10.0.0.10:5480/repos/driver/x86_64/D42D0685.pub" in key.run and f"pin={fp}" in key.run
    assert "proto==http,https" in key.run.replace(" ", "").replace("'", "")
    assert list(got).index("driver-rpm-key") < list(got).index("driver-cuda-repo")
    script = tmp_path / "s.sh"
    script.write_text(build_script(list(got.values()), owner="test", dry_run=False))
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True).returncode == 0


def test_an_ubuntu_hosts_driver_source_is_the_inventorys_copy_or_none_of_gpuk8s() -> None:
    """install.driver_apt_repo (a mirror of Ubuntu's archive, or a bundle's served copy) is written as the host's
    gpuk8s-driver.list; without it the host's own sources serve the driver, and the file an earlier run wrote (a
    bundle's server, gone) is removed."""
    got = steps("gpu-1")
    assert "driver-apt-source" not in got
    gone = got["driver-apt-source-removed"]
    assert "rm -f /etc/apt/sources.list.d/gpuk8s-driver.list" in gone.run
    assert "! test -e /etc/apt/sources.list.d/gpuk8s-driver.list" in gone.check
    inv = loads("install:\n  driver_apt_repo: https://mirror.example.com/ubuntu\nhosts:\n"
                "  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                "  - {name: gpu-1, address: 10.0.0.11, gpus: 8, driver: {manage: true}}\n", "inv.yaml")
    ctx = context(inv, inv.host("gpu-1"), BARE)
    got = {s.name: s for n in playbooks_for(inv) for s in render_playbook(load_playbook(n), ctx)}
    assert "driver-apt-source-removed" not in got
    assert got["driver-apt-source"].file_content.strip() == (
        "deb [signed-by=/usr/share/keyrings/ubuntu-archive-keyring.gpg] https://mirror.example.com/ubuntu "
        "jammy-updates restricted")
    assert list(got).index("driver-apt-source") < list(got).index("driver-packages-apt")


LOADED = replace(READY_DRIVER, module_version="580.95.05", libraries=("580.95.05",), module_flavor="open")


@pytest.mark.parametrize(("driver", "modules", "expected"), [
    (LOADED, None, ("ok", "driver 580.95.05 loaded")),
    (replace(LOADED, persistenced="inactive"), None, ("start", "start nvidia-persistenced")),
    (replace(LOADED, nvswitches=SWITCHES, fabric_manager="inactive"), None,
     ("start", "start nvidia-fabricmanager")),
    (replace(LOADED, module_version=None), None,
     ("load", "driver 580.95.05 installed, no module loaded: modprobe nvidia && modprobe nvidia_uvm")),
    (replace(LOADED, module_version=None), {"overlay", "nouveau"}, ("reboot", "nouveau holds the GPUs")),
    (replace(LOADED, module_version="535.274.02"), None,
     ("reboot", "module 535.274.02 is loaded, 580.95.05 is installed")),
    (replace(LOADED, libraries=()), None,
     ("failed", "no NVIDIA driver library is installed (the driver packages did not install)")),
])
def test_what_the_driver_phase_does_for_a_node(driver: DriverFacts, modules: set[str] | None,
                                              expected: tuple[str, str]) -> None:
    f = facts(driver=driver, **({"modules": frozenset(modules)} if modules else {}))
    assert action(f) == expected
    assert services(f) == ["nvidia-persistenced", *(["nvidia-fabricmanager"] if driver.nvswitches else [])]


def test_a_node_is_at_its_target_only_with_the_branch_flavour_loaded_and_services_up() -> None:
    from gpuk8s.phases.driver_upgrade import at_target

    want = {"manage": True, "branch": "580", "flavor": "open"}
    f = facts(driver=LOADED)
    assert at_target(f, want)
    assert not at_target(f, {**want, "branch": "595"})  # another branch wanted: upgrade
    assert not at_target(f, {**want, "flavor": "proprietary"})  # another flavour: upgrade
    assert not at_target(facts(driver=replace(LOADED, libraries=("595.71.05",))), want)  # packages moved, no reboot
    assert not at_target(facts(driver=replace(LOADED, persistenced="inactive")), want)
    assert not at_target(f, {"manage": False})


def test_driver_upgrade_finishes_a_node_an_earlier_run_left_cordoned_after_its_reboot() -> None:
    """Issue 41: stopped after the reboot (Ctrl-C, a lost connection, GPUs late), the re-run found the node "already
    at driver" and left it cordoned for good. Now: its GPUs waited for, uncordoned, the mark dropped, and said."""
    from gpuk8s import gpuplan
    from gpuk8s.phases.base import Context
    from gpuk8s.phases.driver_upgrade import DriverUpgrade, at_target, wanted
    from gpuk8s.phases.nodeops import CORDONED_BY as CORDONED_BY_UPGRADE
    from gpuk8s.phases.upgrade import UpgradeOptions
    from tests.unit.fakekube import FakeKube

    f = facts(driver=LOADED)
    h = INV.host("gpu-1")
    assert at_target(f, wanted(h, f)), wanted(h, f)
    kube = FakeKube()
    kube.add_node("gpu-1", gpus=8, labels={CORDONED_BY_UPGRADE: "driver-upgrade"})
    kube.nodes["gpu-1"]["spec"]["unschedulable"] = True
    ctx = Context(INV, sessions={"gpu-1": object()}, facts={"gpu-1": f}, kube_client=kube,  # type: ignore[dict-item]
                  initialized_cache=True, plans=gpuplan.plans(INV, {"gpu-1": f}))
    step = DriverUpgrade(UpgradeOptions(to="", poll=0.01, drain_timeout=1))
    planned = step.plan(ctx)
    assert planned.status == "would-change" and "left cordoned by an earlier run" in planned.changes[0].what
    r = step.run(ctx)
    assert r.status == "changed" and "resumed: gpu-1 uncordoned" in r.message
    assert ("uncordon", "gpu-1") in [c[:2] for c in kube.calls]
    assert CORDONED_BY_UPGRADE not in kube.nodes["gpu-1"]["metadata"]["labels"]
    # a re-run: nothing left to do
    assert step.run(ctx).status == "unchanged" and step.plan(ctx).status == "unchanged"
    # a node a stopped gpuk8s upgrade (its mark) or someone else (no mark) cordoned is not this command's to uncordon
    for labels in ({CORDONED_BY_UPGRADE: "true"}, {}):
        kube.calls.clear()
        kube.nodes["gpu-1"]["metadata"]["labels"] = dict(labels)
        kube.nodes["gpu-1"]["spec"]["unschedulable"] = True
        assert step.run(ctx).status == "unchanged" and not [c for c in kube.calls if c[0] == "uncordon"]


def test_driver_upgrades_dry_run_lists_what_the_run_does_and_no_kubelet() -> None:
    from gpuk8s import gpuplan
    from gpuk8s.phases.base import Context
    from gpuk8s.phases.driver_upgrade import DriverUpgrade
    from gpuk8s.phases.upgrade import UpgradeOptions
    from tests.unit.fakekube import FakeKube

    f = facts(driver=replace(LOADED, module_version="535.274.02", libraries=("535.274.02",)))
    kube = FakeKube()
    kube.add_node("gpu-1", gpus=8)
    ctx = Context(INV, facts={"gpu-1": f}, kube_client=kube, initialized_cache=True,
                  plans=gpuplan.plans(INV, {"gpu-1": f}))
    whats = [c.what for c in DriverUpgrade(UpgradeOptions(to="")).plan(ctx).changes]
    assert not any("kubelet" in w for w in whats)
    assert whats[0].startswith("wait (at most") and whats[-1] == "uncordon gpu-1"
    assert any(w.startswith("reboot gpu-1 into driver") for w in whats)


def test_install_refuses_to_change_the_driver_of_a_node_in_the_cluster() -> None:
    """Issue 41: install (and doctor --fix) with another branch on a node already in the cluster replaced its driver
    under running GPU pods (and with --allow-reboot rebooted it undrained): driver.plan fails for that host (it is
    held out of install, the others go on) and names gpuk8s driver upgrade; a host not in a cluster gets it."""
    from gpuk8s.preflight.driver_checks import plan

    other = loads("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                  '  - {name: gpu-1, address: 10.0.0.11, gpus: 8, driver: {manage: true, branch: "535"}}\n', "i.yaml")
    h = other.host("gpu-1")
    joined = facts(driver=replace(LOADED, pci_gpus=H100), kube_files=("/etc/kubernetes/kubelet.conf",))
    r = plan(h, joined)
    assert r.status == "fail" and "this node is in the cluster and runs driver 580.95.05" in r.message
    assert r.remedy.startswith("gpuk8s driver upgrade")
    assert plan(h, replace(joined, kube_files=())).status == "pass"  # not joined yet: install brings 535
    assert plan(INV.host("gpu-1"), joined).status == "pass"  # the branch it runs: nothing to change


def test_alibaba_cloud_linux_across_branches_checks_the_version_and_switches_the_stream(tmp_path) -> None:
    """Issue 41: on the RHEL 8 family `rpm -q nvidia-open` and the versionlock check accepted any version, so a driver
    upgrade across branches changed nothing. The checks now want the branch; the stream is switched with its
    packages (NVIDIA's `dnf module switch-to ... --allowerasing`) once the old locks are lifted."""
    inv = loads("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                '  - {name: gpu-1, address: 10.0.0.11, gpus: 8, driver: {manage: true, branch: "595"}}\n', "i.yaml")
    alinux = replace(BARE, os=replace(BARE.os, id="alinux", family="rhel", version_id="3"))
    got = {s.name: s for n in playbooks_for(inv) for s in render_playbook(load_playbook(n),
                                                                          context(inv, inv.host("gpu-1"), alinux))}
    stream = got["driver-module-stream"].run
    assert "nvidia-fabric-manager nvidia-fabricmanager" in stream  # a 535 host's lock is under the old name
    assert stream.index("dnf versionlock delete nvidia-open") < stream.index(
        "dnf -y -q module switch-to nvidia-driver:595-open --allowerasing")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    rpm = bindir / "rpm"
    for installed, ok in (("580.95.05", False), ("595.71.05", True)):
        rpm.write_text(f"#!/bin/sh\nprintf '%s\\n' {installed}\n")
        rpm.chmod(0o755)
        r = subprocess.run(["sh", "-c", got["driver-packages-dnf"].check], env={"PATH": f"{bindir}:/usr/bin:/bin"})
        assert (r.returncode == 0) is ok, installed
    lock = tmp_path / "versionlock.list"
    check = got["driver-hold-dnf"].check.replace("/etc/dnf/plugins/versionlock.list", str(lock))
    for version, ok in (("580.95.05", False), ("595.71.05", True)):
        lock.write_text("".join(f"{p}-3:{version}-1.el8.*\n" for p in
                                ("nvidia-open", "kmod-nvidia-open-dkms", "nvidia-driver", "nvidia-driver-libs",
                                 "nvidia-fabricmanager")))
        assert (subprocess.run(["sh", "-c", check]).returncode == 0) is ok, version
