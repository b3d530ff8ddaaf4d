"""Host and cluster checks as pure functions of typed facts (no SSH)."""

from __future__ import annotations

from dataclasses import replace
from datetime import date

from gpuk8s import versions
from gpuk8s.facts.model import (
    GPU,
    ContainerdConfig,
    DockerDaemon,
    DriverFacts,
    GPUInfo,
    HostFacts,
    OSInfo,
    PciDevice,
    Runtime,
)
from gpuk8s.facts.parse import Section, parse_containerd_config
from gpuk8s.inventory.model import Cluster, Host, InstallSettings, SSHSettings
from gpuk8s.preflight.cluster_checks import check_cluster
from gpuk8s.preflight.host_checks import check_host
from gpuk8s.preflight.result import apply_ignores

# containerd 2.x runs every minor of the version matrix, the default one included: a ready host has it
CONTAINERD_2 = Runtime("containerd", "containerd github.com/containerd/containerd/v2 v2.2.1 dd8a2f2d", (2, 2, 1), True)
CONTAINERD_16 = Runtime("containerd", "containerd 1.6.20", (1, 6, 20), True)  # Debian 12's: runs up to 1.35


def facts(**kw) -> HostFacts:
    base = HostFacts(
        uid=0, hostname="gpu-1", os=OSInfo("ubuntu", ("debian",), "22.04", "Ubuntu 22.04.4 LTS", "debian"),
        kernel="5.15.0-105-generic", arch="x86_64", cpus=16, memory_mb=64000, swap=(),
        modules=frozenset({"overlay", "br_netfilter"}),
        sysctl={"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1",
                "net.bridge.bridge-nf-call-ip6tables": "1"},
        gpu=GPUInfo("ok", "535.104.05", (535, 104, 5), "12.2",
                    tuple(GPU(i, "NVIDIA A100", f"GPU-{i}", 81920, "Disabled") for i in range(8))),
        containerd=CONTAINERD_2,
        containerd_config=ContainerdConfig(True, (), "nvidia", True, True),
        docker=None, docker_daemon=DockerDaemon(False), nvidia_ctk="NVIDIA Container Toolkit CLI version 1.17.0",
        kubeadm=None, kubelet=None, firewalld_active=False, tools=frozenset({"conntrack", "socat", "ebtables",
                                                                            "ethtool"}),
        listening_ports=frozenset({22}), macs=("02:00:00:00:00:01",), product_uuid=None, machine_id="m1",
        kube_files=(), time=1000.0, cgroup_version=2, driver=READY_DRIVER)
    return replace(base, **kw)


# a well-kept host's driver: the loaded module and its libraries of one version, persistenced running, packages held
READY_DRIVER = DriverFacts(
    read=True, lspci=True, module_version="535.104.05", module_flavor="proprietary", libraries=("535.104.05",),
    pci_gpus=tuple(PciDevice(f"0000:{0x17 + i:02x}:00.0", 0x0302, 0x20B2, "GA100 [A100 SXM4 80GB]") for i in range(8)),
    disk_module_version="535.104.05", module_signer="", secure_boot=False, kernel_headers=True,
    fabric_manager="inactive", persistenced="active",
    packages=(("nvidia-driver-535-server", "535.104.05-0ubuntu0.22.04.1"),), held=("nvidia-driver-535-server",))


HOST = Host("gpu-1", "10.0.0.11", "worker", SSHSettings(), gpus=8)
CP = Host("cp-1", "10.0.0.10", "control-plane", SSHSettings())
# the day issue 16 was done: end of life is judged on a fixed date, so that no test changes with the calendar
TODAY = date(2026, 11, 30)
CONTAINERD_17 = Runtime("containerd", "containerd github.com/containerd/containerd 1.7.12 1.7.12-0ubuntu2~22.04.1",
                        (1, 7, 12), True)


def by_id(results):
    return {r.id: r for r in results}


def test_ready_host_passes_everything():
    r = check_host(HOST, facts(), Cluster(), today=TODAY)
    assert [x.id for x in r if x.status != "pass"] == []
    assert r[[x.id for x in r].index("k8s.version-eol")].message == \
        f"Kubernetes {versions.default_minor()} is supported until " \
        f"{versions.kubernetes(versions.default_minor()).end_of_life.isoformat()}"


CENTOS_7 = OSInfo("centos", ("rhel", "fedora"), "7", "CentOS Linux 7 (Core)", "rhel")


def test_containerd_too_old_for_kubernetes_126():
    # on an OS gpuk8s does not upgrade containerd on: a failure that says how to do it by hand
    r = by_id(check_host(HOST, facts(os=CENTOS_7, containerd=Runtime("containerd", "1.5.9", (1, 5, 9), True)),
                         Cluster(kubernetes_version="1.30"), today=TODAY))
    compat = r["runtime.kubernetes-compat"]
    assert compat.status == "fail" and "needs CRI v1: containerd >= 1.6.15, found 1.5.9" in compat.message
    assert compat.remedy.startswith("upgrade containerd to 1.6.15 or newer")
    assert r["runtime.version"].status == "pass"  # 1.5.9 is above the 1.4.3 floor
    # on Ubuntu 22.04 install upgrades it (containerd.io from the matrix): a warning naming what install does
    r = by_id(check_host(HOST, facts(containerd=Runtime("containerd", "1.5.9", (1, 5, 9), True)),
                         Cluster(kubernetes_version="1.30"), today=TODAY))
    compat = r["runtime.kubernetes-compat"]
    assert compat.status == "warn" and compat.severity == "error" and "found 1.5.9" in compat.message
    assert compat.remedy.startswith(f"gpuk8s install upgrades it: containerd.io {versions.matrix().containerd_version}")


def test_containerd_17_with_a_minor_that_needs_containerd_2_is_upgraded_by_install():
    """Ubuntu 22.04's containerd is 1.7; Kubernetes 1.35 was the last minor to run on containerd 1.x: install
    brings it to the matrix's containerd.io 2.x, so preflight warns (naming what install will do) and passes."""
    m = versions.matrix()
    needs_2 = [k for k in m.minors.values() if k.containerd_floor.startswith("2.")]
    assert needs_2  # 1.36 and 1.37; the default is one of them now that install sets up containerd 2.x
    assert versions.kubernetes(versions.default_minor()) in needs_2 and m.containerd_installable == 2
    for k in needs_2:
        for os_info, repo in ((facts().os, "Docker's apt repository (linux/ubuntu)"),
                              (OSInfo("alinux", ("rhel",), "3", "Alibaba Cloud Linux 3", "rhel"),
                               "Docker's yum repository (linux/rhel/8)")):
            r = by_id(check_host(HOST, facts(os=os_info, containerd=CONTAINERD_17), Cluster(kubernetes_version=k.minor),
                                 today=TODAY))
            compat = r["runtime.kubernetes-compat"]
            assert compat.status == "warn" and compat.severity == "error", k.minor
            assert compat.message.startswith(f"Kubernetes {k.minor} needs containerd >= 2.0, found 1.7.12")
            assert compat.remedy.startswith(
                f"gpuk8s install upgrades it: containerd.io {m.containerd_version} (containerd "
                f"{versions.fmt(versions.containerd_install_release())}) from {repo}")
            assert "kept in /var/lib/gpuk8s/backup" in compat.remedy and "version 3" in compat.remedy
            assert compat.remedy.endswith('or choose cluster.kubernetes_version: "1.35", the newest minor that runs '
                                          "on containerd 1.7.12")
        # where install does not upgrade (an OS it does not support): a failure with the by-hand way
        bad = by_id(check_host(HOST, facts(os=CENTOS_7, containerd=CONTAINERD_17),
                               Cluster(kubernetes_version=k.minor), today=TODAY))["runtime.kubernetes-compat"]
        assert bad.status == "fail" and bad.message.startswith(
            f"Kubernetes {k.minor} needs containerd >= 2.0, found 1.7.12: Kubernetes 1.35 is the last minor that "
            "runs on containerd 1.x")
        assert bad.remedy.startswith("gpuk8s install upgrades containerd only on Ubuntu 22.04 and Alibaba Cloud "
                                     "Linux 3: upgrade it by hand")
        assert "containerd config default > /etc/containerd/config.toml" in bad.remedy
        # the inventory pins a containerd.io below the floor: install would not upgrade, and preflight says so
        pinned = by_id(check_host(HOST, facts(containerd=CONTAINERD_17), Cluster(kubernetes_version=k.minor),
                                  today=TODAY, install=InstallSettings(containerd_version="1.7.29-1")))
        assert pinned["runtime.kubernetes-compat"].status == "fail" and pinned["runtime.kubernetes-compat"].message \
            .endswith("and install.containerd_version 1.7.29-1 (containerd 1.7.29) is below it too"), pinned
    # the same host suits 1.35, and the message names what containerd recommends for it
    ok = by_id(check_host(HOST, facts(containerd=CONTAINERD_17), Cluster(kubernetes_version="1.35"), today=TODAY))
    assert ok["runtime.kubernetes-compat"].status == "pass"
    assert ok["runtime.kubernetes-compat"].message == ("containerd 1.7.12 suits Kubernetes 1.35: it needs >= 1.6.15 "
                                                       "(containerd recommends 2.2.0+, 2.1.5+, 1.7.28+)")
    # and containerd 2.x suits every minor; containerd 1.6.20 those up to 1.35, and install upgrades it for the rest
    for k in m.minors.values():
        for rt, want in ((CONTAINERD_2, "pass"), (CONTAINERD_16, "warn" if k in needs_2 else "pass")):
            compat = by_id(check_host(HOST, facts(containerd=rt), Cluster(kubernetes_version=k.minor), today=TODAY))[
                "runtime.kubernetes-compat"]
            assert compat.status == want, (k.minor, rt.raw)


def test_an_end_of_life_minor_is_a_warning_with_its_date():
    r = by_id(check_host(HOST, facts(), Cluster(kubernetes_version="1.30.14"), today=TODAY))
    eol = r["k8s.version-eol"]
    assert (eol.status, eol.severity, eol.ok) == ("warn", "warning", True)  # a warning: install goes on
    assert eol.message == ("Kubernetes 1.30 reached end of life on 2025-07-15: it gets no security fixes since (its "
                           "last patch release is 1.30.14)")
    default = versions.kubernetes(versions.default_minor())
    assert eol.remedy == (f'choose a supported minor, e.g. cluster.kubernetes_version: "{default.minor}" (the '
                          f"default, supported until {default.end_of_life.isoformat()}); 'gpuk8s versions' lists them")
    assert [x.id for x in r.values() if x.status not in ("pass", "skip")] == ["k8s.version-eol"]
    # every end-of-life minor of the matrix warns; the day after its end of life at the latest
    for k in versions.matrix().minors.values():
        before = by_id(check_host(HOST, facts(), Cluster(kubernetes_version=k.minor),
                                  today=date.fromordinal(k.end_of_life.toordinal() - 1)))["k8s.version-eol"]
        on = by_id(check_host(HOST, facts(), Cluster(kubernetes_version=k.minor), today=k.end_of_life))
        assert before.status == "pass" and on["k8s.version-eol"].status == "warn", k.minor
        assert k.end_of_life.isoformat() in on["k8s.version-eol"].message


def test_an_unknown_minor_is_skipped_not_crashed():
    """The loader refuses it; a Cluster made by hand must still not crash preflight."""
    r = by_id(check_host(HOST, facts(), Cluster(kubernetes_version="1.99"), today=TODAY))
    assert r["k8s.version-eol"].status == "skip"


def test_docker_needs_cri_dockerd_from_124():
    f = facts(docker=Runtime("docker", "20.10.24", (20, 10, 24), True), docker_daemon=DockerDaemon(True, "nvidia", True,
                                                                                                  "systemd"))
    r = by_id(check_host(HOST, f, Cluster(container_runtime="docker")))
    # no dockershim: install sets up cri-dockerd (tests/unit/test_cri_dockerd.py has the other verdicts)
    assert r["runtime.kubernetes-compat"].status == "pass" and "cri-dockerd" in r["runtime.kubernetes-compat"].message
    assert r["toolkit.default-runtime"].status == "pass"


def test_docker_below_floor():
    f = facts(docker=Runtime("docker", "19.03.4", (19, 3, 4), True))
    assert by_id(check_host(HOST, f, Cluster(container_runtime="docker")))["runtime.version"].status == "fail"


def test_busy_ports_on_control_plane_and_small_machine():
    f = facts(listening_ports=frozenset({22, 6443, 2379}), cpus=1, memory_mb=1024, hostname="cp-1")
    r = by_id(check_host(CP, f, Cluster()))
    assert r["k8s.ports"].status == "fail" and "6443, 2379" in r["k8s.ports"].message
    assert r["k8s.cpus"].status == "fail" and r["k8s.memory"].status == "fail"
    assert r["gpu.driver"].status == "pass"  # GPUs present on a control plane are reported, not required


def test_cuda12_warning_on_old_driver():
    f = facts(gpu=replace(facts().gpu, driver="470.82.01", driver_release=(470, 82, 1), cuda_version=None))
    r = by_id(check_host(HOST, f, Cluster()))
    assert r["gpu.cuda"].status == "warn" and "525.60.13" in r["gpu.cuda"].remedy


def test_ignore_downgrades_only_named_failures():
    f = facts(cpus=1, hostname="cp-1")
    out = by_id(apply_ignores(check_host(CP, f, Cluster()), {"k8s.cpus"}))
    assert out["k8s.cpus"].status == "warn" and out["k8s.cpus"].ignored


def test_cluster_names_the_odd_hosts():
    fs = {f"h{i}": facts(hostname=f"h{i}", machine_id=f"m{i}", macs=(f"02:00:00:00:00:0{i}",)) for i in range(4)}
    fs["h3"] = replace(fs["h3"], kernel="5.15.0-999-generic", os=replace(fs["h3"].os, pretty_name="Ubuntu 20.04"))
    fs["h2"] = replace(fs["h2"], machine_id="m1", time=1100.0)
    r = by_id(check_cluster(fs, [], {h: 1000.0 for h in fs}, 5.0))
    assert r["cluster.os-consistent"].status == "fail" and "h3: Ubuntu 20.04" in r["cluster.os-consistent"].message
    assert "h0" not in r["cluster.kernel-consistent"].message
    assert r["cluster.unique-machine-id"].status == "fail" and "m1 on h1, h2" in r["cluster.unique-machine-id"].message
    assert r["cluster.clock-skew"].status == "warn" and "h2" in r["cluster.clock-skew"].message
    assert r["cluster.unique-macs"].status == "pass"


def test_containerd_config_that_is_not_toml_fails_with_a_remedy():
    cfg = parse_containerd_config(Section('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd\n', 0))
    r = by_id(check_host(HOST, facts(containerd_config=cfg), Cluster()))
    bad = r["runtime.config"]
    assert bad.status == "fail" and bad.severity == "error"
    assert "/etc/containerd/config.toml is not valid TOML" in bad.message
    assert bad.remedy == ("fix the TOML syntax of /etc/containerd/config.toml (containerd config dump shows what "
                          "containerd reads)")
    # what the file would have said is unknown: neither passed nor failed
    assert {i: r[i].status for i in ("runtime.cri-plugin", "runtime.cgroup-driver", "toolkit.default-runtime")} == {
        "runtime.cri-plugin": "skip", "runtime.cgroup-driver": "skip", "toolkit.default-runtime": "skip"}


def test_broken_dropin_names_the_dropin_in_the_remedy():
    cfg = ContainerdConfig(True, error="/etc/containerd/conf.d/99-nvidia.toml is not valid TOML: x",
                           error_file="/etc/containerd/conf.d/99-nvidia.toml")
    r = by_id(check_host(HOST, facts(containerd_config=cfg), Cluster()))
    assert "fix the TOML syntax of /etc/containerd/conf.d/99-nvidia.toml" in r["runtime.config"].remedy
    big = parse_containerd_config(Section("# x\n", 141))
    r = by_id(check_host(HOST, facts(containerd_config=big), Cluster()))
    assert r["runtime.config"].status == "fail" and "larger than the 256 KiB" in r["runtime.config"].message
    assert r["runtime.config"].remedy == "make /etc/containerd/config.toml smaller, or --ignore runtime.config"


def test_runtime_config_is_only_reported_when_it_fails():
    assert "runtime.config" not in by_id(check_host(HOST, facts(), Cluster()))
