"""Per-host readiness checks: pure functions of a host's facts and its inventory entry."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import date

from gpuk8s import mirrors, runtimeplan, versions
from gpuk8s.facts.model import CRI_SOCKETS, SUPPORTED_OS, HostFacts
from gpuk8s.facts.parse import CONTAINERD_CONFIG, TOO_LARGE
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Cluster, Host, InstallSettings
from gpuk8s.preflight.dra_checks import dra_checks
from gpuk8s.preflight.driver_checks import driver_checks
from gpuk8s.preflight.fabric_checks import fabric_checks
from gpuk8s.preflight.mig_checks import mig_checks
from gpuk8s.preflight.result import CheckResult, failed, passed, skipped
from gpuk8s.versions import at_least, cuda_driver_floor, cuda_versions_supported, fmt, release

DRIVER_FLOOR = (418, 87, 1)
DRIVER_FLOOR_TEXT = "418.87.01"
DOCKER_FLOOR = (19, 3, 5)
DOCKER_FLOOR_TEXT = "19.03.5"  # as Docker spells its versions
CONTAINERD_FLOOR = (1, 4, 3)
SUPPORTED_ARCH = ("x86_64", "aarch64")
# The CRI plugin's ids in containerd config versions 1, 2 and 3 (disabling any of them disables CRI)
CRI_PLUGIN_IDS = ("cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images")
# nvidia-ctk 1.18.0's drop-in directory (NVIDIA/nvidia-container-toolkit issue 1404; PR 1407 moved it to conf.d)
TOOLKIT_BAD_DROPIN_DIR = "/etc/containerd/config.d/"
CONTROL_PLANE_PORTS = (6443, 2379, 2380, 10250, 10257, 10259)
WORKER_PORTS = (10250,)
REQUIRED_TOOLS = ("conntrack", "socat", "ebtables", "ethtool")
SYSCTLS = ("net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_host(host: Host, facts: HostFacts, cluster: Cluster, today: date | None = None,
               device_plugin_version: str | None = None, install: InstallSettings | None = None) -> list[CheckResult]:
    """Every check of one host; `today` (default: the date) decides whether the Kubernetes minor is past its
    end of life; `device_plugin_version` (default: the pin of the cluster's minor) is the plugin install uses;
    `install` (default: the matrix's pins) the inventory's install settings, whose containerd_version install
    would bring (runtimeplan)."""
    install = install or InstallSettings()
    results: list[CheckResult] = []
    results += _os(facts)
    results += _gpu(host, facts)
    results += driver_checks(host, facts, today)
    results += gpu_sharing(host, facts,
                           device_plugin_version or versions.pins(cluster.kubernetes_version).device_plugin)
    results += mig_checks(host, facts)
    results += fabric_checks(host, facts)
    results += dra_checks(host, facts, cluster, install)
    results += _runtime(facts, cluster, is_gpu_node(host), install)
    results.append(_kubernetes_version(cluster, today or versions.today()))
    results.append(_cgroup(cluster, facts))
    results += _kubernetes(host, facts)
    return results


def _kubernetes_version(cluster: Cluster, today: date) -> CheckResult:
    """k8s.version-eol: a minor past its end of life installs, with a warning naming the date."""
    v = cluster.kubernetes_version
    k = versions.kubernetes(v)
    if k is None:
        return skipped("k8s.version-eol", f"Kubernetes {v} is not in gpuk8s's version matrix")
    if not k.end_of_life_reached(today):
        return passed("k8s.version-eol", f"Kubernetes {k.minor} is supported until {k.end_of_life.isoformat()}")
    default = versions.kubernetes_or_default(versions.default_minor())
    return failed("k8s.version-eol",
                  f"Kubernetes {k.minor} reached end of life on {k.end_of_life.isoformat()}: it gets no security "
                  f"fixes since (its last patch release is {k.latest_patch})",
                  f"choose a supported minor, e.g. cluster.kubernetes_version: \"{default.minor}\" (the default, "
                  f"supported until {default.end_of_life.isoformat()}); 'gpuk8s versions' lists them")


def _containerd_compat(rt_release: tuple[int, ...], cluster: Cluster, f: HostFacts, install: InstallSettings
                       ) -> CheckResult:
    """runtime.kubernetes-compat for containerd: the containerd floor of the cluster's minor (version matrix).

    Where `gpuk8s install` upgrades containerd (runtimeplan: below the floor, install.containerd_version meeting
    it, on Ubuntu 22.04 or Alibaba Cloud Linux 3): a warning naming what it will do, so that preflight passes a host
    that install can fix."""
    k = versions.kubernetes_or_default(cluster.kubernetes_version)
    floor = release(k.containerd_floor) or (0,)
    tested = f" (containerd recommends {', '.join(t + '+' for t in k.containerd_tested)})" \
        if k.containerd_tested else ""
    if at_least(rt_release, floor):
        return passed("runtime.kubernetes-compat",
                      f"containerd {fmt(rt_release)} suits Kubernetes {k.minor}: it needs >= {k.containerd_floor}"
                      f"{tested}")
    runs_here = [m for m in versions.matrix().minors.values() if at_least(rt_release, release(m.containerd_floor)
                                                                         or (0,))]
    instead = f"; or choose cluster.kubernetes_version: \"{runs_here[0].minor}\", the newest minor that runs on " \
        f"containerd {fmt(rt_release)}" if runs_here else ""
    plan = runtimeplan.containerd_plan(cluster, install, f)
    if plan.upgrade:
        repo = "Docker's apt repository (linux/ubuntu)" if f.os.family == "debian" else \
            "Docker's yum repository (linux/rhel/8)"
        return replace(failed(
            "runtime.kubernetes-compat",
            f"Kubernetes {k.minor} needs containerd >= {k.containerd_floor}, found {fmt(rt_release)}{tested}",
            f"gpuk8s install upgrades it: {versions.matrix().containerd_package} {install.containerd_version} "
            f"(containerd {fmt(plan.target)}) from {repo} or install.containerd_repo, replacing the distribution's "
            "containerd and runc; the old /etc/containerd/config.toml is kept in /var/lib/gpuk8s/backup and "
            "replaced by a version 3 configuration" + instead), status="warn")
    if plan.os_upgrades and cluster.container_runtime == "containerd":  # the inventory pins one below the floor
        return failed("runtime.kubernetes-compat",
                      f"Kubernetes {k.minor} needs containerd >= {k.containerd_floor}, found {fmt(rt_release)}, and "
                      f"install.containerd_version {install.containerd_version} (containerd {fmt(plan.target)}) is "
                      "below it too",
                      f"remove install.containerd_version (the default is {versions.matrix().containerd_version}) or "
                      f"write a release >= {k.containerd_floor}" + instead)
    if floor[0] >= 2 and rt_release[0] < 2:
        return failed("runtime.kubernetes-compat",
                      f"Kubernetes {k.minor} needs containerd >= {k.containerd_floor}, found {fmt(rt_release)}: "
                      f"{_last_minor_on(rt_release[0])} is the last minor that runs on containerd "
                      f"{rt_release[0]}.x{tested}",
                      "gpuk8s install upgrades containerd only on Ubuntu 22.04 and Alibaba Cloud Linux 3: "
                      "upgrade it by hand (containerd's "
                      "release from github.com/containerd/containerd/releases, or a 2.x package of your "
                      "distribution), write a version 3 config (containerd config default > "
                      "/etc/containerd/config.toml) and restart containerd, then run gpuk8s install" + instead)
    return failed("runtime.kubernetes-compat",
                  f"Kubernetes {k.minor} needs CRI v1: containerd >= {k.containerd_floor}, found {fmt(rt_release)}"
                  f"{tested}",
                  f"upgrade containerd to {k.containerd_floor} or newer (Ubuntu: apt-get install containerd; "
                  "RHEL-like: dnf install containerd.io)" + instead)


_CRI_DOCKERD_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}  # uname -m -> cri-dockerd's archive names


def _docker_compat(rt_release: tuple[int, ...] | None, arch: str, cluster: Cluster) -> CheckResult:
    """runtime.kubernetes-compat for Docker: every minor of the matrix is >= 1.24, which removed dockershim, so
    the kubelet reaches Docker only through cri-dockerd, which install sets up (playbooks/cri-dockerd.yaml)."""

    k = versions.kubernetes_or_default(cluster.kubernetes_version)
    pin = versions.cri_dockerd()
    if rt_release is None:
        return skipped("runtime.kubernetes-compat", "cannot read Docker's version")
    if _CRI_DOCKERD_ARCH.get(arch) not in pin.sha256:
        return failed("runtime.kubernetes-compat",
                      f"Kubernetes {k.minor} has no dockershim and reaches Docker only through cri-dockerd, and "
                      f"cri-dockerd publishes no release archive for {arch or 'this architecture'} (only "
                      f"{' and '.join(pin.sha256)}): gpuk8s install cannot set it up",
                      "use containerd (cluster.container_runtime: containerd), or install cri-dockerd yourself "
                      f"with its socket at {CRI_SOCKETS['docker']}")
    return passed("runtime.kubernetes-compat",
                  f"Docker {fmt(rt_release)}: Kubernetes {k.minor} has no dockershim and reaches Docker through "
                  f"cri-dockerd; gpuk8s install sets up cri-dockerd {pin.version} ({CRI_SOCKETS['docker']})")


def _last_minor_on(containerd_major: int) -> str:
    """The newest minor of the matrix whose containerd floor is of this major or older: "Kubernetes 1.N"."""
    ok = [m.minor for m in versions.matrix().minors.values()
          if (release(m.containerd_floor) or (0,))[0] <= containerd_major]
    return f"Kubernetes {ok[0]}" if ok else "an older Kubernetes"


def _os(f: HostFacts) -> list[CheckResult]:
    out = []
    name = SUPPORTED_OS.get((f.os.id, f.os.version_id))
    if name:
        note = " (treated as RHEL 8: NVIDIA does not list it for the toolkit)" if f.os.id == "alinux" else ""
        out.append(passed("os.supported", f"{name}, kernel {f.kernel}{note}"))
    else:
        found = f.os.pretty_name or f.os.id or "unknown (no /etc/os-release)"
        out.append(failed("os.supported", f"{found} is not supported: gpuk8s supports "
                          f"{' and '.join(SUPPORTED_OS.values())} (packages, repositories and paths are "
                          "only tested there)",
                          "reinstall with a supported OS, or --ignore os.supported at your own risk"))
    if f.arch in SUPPORTED_ARCH:
        out.append(passed("os.arch", f.arch))
    else:
        out.append(failed("os.arch", f"architecture {f.arch or 'unknown'} is not supported",
                          f"use {' or '.join(SUPPORTED_ARCH)} servers"))
    return out


def _gpu(host: Host, f: HostFacts) -> list[CheckResult]:
    g = f.gpu
    ids = ("gpu.driver", "gpu.driver-version", "gpu.count", "gpu.cuda")
    if not is_gpu_node(host):
        if g.state == "ok":
            return [passed("gpu.driver", f"driver {g.driver}, {len(g.gpus)} GPU(s) on a host without GPU role")]
        return [skipped(i, "CPU-only host: no GPU expected") for i in ids]
    if g.state in ("absent", "failed") and host.gpu.driver.manage:
        # install installs (or repairs) it: driver.plan says which, driver.mismatch and driver.nouveau what is wrong
        return [skipped("gpu.driver", ("no NVIDIA driver installed" if g.state == "absent" else
                                       f"nvidia-smi failed: {g.error}") + ": install installs the driver "
                        "(driver: manage: true)")] + [skipped(i, "no working driver yet") for i in ids[1:]]
    if g.state == "absent":
        return [failed("gpu.driver", "nvidia-smi not found: the NVIDIA driver is not installed",
                       "install the NVIDIA datacenter driver (>= 418.87.01) and reboot; "
                       "or set gpus: 0 for this host if it has no GPU")] + [
            skipped(i, "no working driver") for i in ids[1:]]
    if g.state == "failed":
        return [failed("gpu.driver", f"nvidia-smi failed: {g.error}", _driver_remedy(g.error))] + [
            skipped(i, "no working driver") for i in ids[1:]]
    out = [passed("gpu.driver", f"nvidia-smi works, driver {g.driver}")]
    rel = g.driver_release
    if rel is None:
        out.append(failed("gpu.driver-version", f"cannot read the driver version from {g.driver!r}",
                          "check nvidia-smi on the host"))
    elif at_least(rel, DRIVER_FLOOR):
        out.append(passed("gpu.driver-version", f"{g.driver} >= {DRIVER_FLOOR_TEXT}"))
    else:
        out.append(failed("gpu.driver-version", f"driver {g.driver} is older than {DRIVER_FLOOR_TEXT}",
                          "upgrade the NVIDIA driver to R418.87.01 or newer (R535+ recommended) and reboot"))
    summary = _gpu_summary(f)
    if host.gpus is None:
        out.append(passed("gpu.count", summary))
    elif host.gpus == len(g.gpus):
        out.append(passed("gpu.count", f"{summary} (as the inventory expects)"))
    else:
        out.append(failed("gpu.count", f"the inventory expects {host.gpus} GPU(s), nvidia-smi lists {len(g.gpus)}: "
                          f"{summary}",
                          "check for a GPU fallen off the bus (nvidia-smi -L, dmesg | grep -i xid) or fix gpus: "
                          "in the inventory"))
    if rel is not None:
        cudas = cuda_versions_supported(rel)
        floor = cuda_driver_floor("12.0")  # the matrix's table: CUDA 12.0's GA driver
        cuda12 = floor.text if floor is not None else "CUDA 12.0's driver"
        shown = ", ".join(cudas) if cudas else "none of 9.0 or newer"
        if g.cuda_version:
            shown += f"; nvidia-smi reports CUDA {g.cuda_version}"
        if any(c.split(".")[0] == "12" for c in cudas):
            out.append(passed("gpu.cuda", f"can run CUDA {shown}"))
        else:
            out.append(failed("gpu.cuda", f"driver {g.driver} runs CUDA {shown} only: CUDA 12 images "
                              "(e.g. nvidia/cuda:12.x) fail with 'unsatisfied condition: cuda>=12'",
                              f"upgrade the driver to >= {cuda12} for CUDA 12, or use images built for "
                              f"CUDA {cudas[0] if cudas else '10.1'}"))
    return out


# The device plugin release that brought each sharing strategy (NVIDIA/k8s-device-plugin CHANGELOG: time-slicing
# with the config file and config-manager in v0.12.0, MPS in v0.15.0)
SHARING_SINCE = {"time-slicing": (0, 12, 0), "mps": (0, 15, 0)}
# MPS clients per GPU below compute capability 7.5 (48 from 7.5 on): the limit of the device plugin's MPS control
# daemon, which refuses more replicas ("maximum allowed replicas exceeded: N > 16"; k8s-device-plugin
# cmd/mps-control-daemon/mps/device.go maxClients, v7.5 compared). NVIDIA's MPS documentation gives 48 from Volta
# (7.0), but the daemon gpuk8s deploys applies 16 to 7.0 (V100), and it is what fails.
MPS_CLIENTS_OLD_GPU = 16
# The kubelet's default maxPods (KubeletConfiguration), which gpuk8s does not change, and what a node's own pods
# take of it (kube-proxy, the CNI, the device plugin, the MPS daemon, the exporters)
KUBELET_MAX_PODS = 110
NODE_PODS = 10


def gpu_sharing(host: Host, f: HostFacts, plugin_version: str) -> list[CheckResult]:
    """What users trip on with shared GPUs (docs/sharing.md); nothing on a node without sharing."""
    sh = host.gpu.sharing
    if not is_gpu_node(host) or sh.strategy == "none":
        return []
    out: list[CheckResult] = []
    where = f"gpu_sharing (inventory line {sh.line})" if sh.line else "gpu_sharing"
    gpus = f.gpu.gpus if f.gpu.state == "ok" else ()
    memory = min((g.memory_mib for g in gpus if g.memory_mib), default=None)
    if sh.strategy == "time-slicing":
        if sh.pod_memory_mib is None:
            out.append(skipped("gpu.sharing-memory", f"time-slicing with {sh.replicas} replicas: no memory "
                               "isolation, and no per-pod size stated to check it against",
                               f"state what one pod needs: {where}.pod_memory_mib"))
        elif memory is None:
            out.append(skipped("gpu.sharing-memory", "the GPUs' memory is unknown (nvidia-smi did not answer)"))
        elif sh.replicas * sh.pod_memory_mib > memory:
            fits = memory // sh.pod_memory_mib
            out.append(failed("gpu.sharing-memory",
                              f"{sh.replicas} replicas x {sh.pod_memory_mib} MiB = {sh.replicas * sh.pod_memory_mib} "
                              f"MiB > {memory} MiB of one GPU: time-slicing has no memory isolation, so pods beyond "
                              f"the {fits}th on a GPU fail with CUDA out of memory",
                              f"set {where}.replicas to at most {max(fits, 2)}, or use strategy: hami (memory "
                              "limits enforced) or mps (memory divided between clients)"))
        else:
            out.append(passed("gpu.sharing-memory", f"{sh.replicas} x {sh.pod_memory_mib} MiB fits in {memory} MiB"))
    if sh.strategy == "mps":
        caps = f.compute_caps
        if not caps:
            out.append(skipped("gpu.mps-clients", "compute capability unknown (nvidia-smi before R510 cannot tell)",
                               f"MPS serves at most {MPS_CLIENTS_OLD_GPU} clients per GPU below compute capability "
                               "7.5: keep replicas at 16 or fewer there"))
        else:
            old = sorted({c for c in caps if release(c) is not None and not at_least(release(c) or (), (7, 5))})
            if old and sh.replicas > MPS_CLIENTS_OLD_GPU:
                out.append(failed("gpu.mps-clients",
                                  f"{sh.replicas} MPS replicas per GPU, but compute capability {', '.join(old)} "
                                  f"(< 7.5) serves at most {MPS_CLIENTS_OLD_GPU} MPS clients per GPU: the device "
                                  "plugin's MPS daemon refuses more (maximum allowed replicas exceeded)",
                                  f"set {where}.replicas to {MPS_CLIENTS_OLD_GPU} or fewer, or use time-slicing"))
            else:
                out.append(passed("gpu.mps-clients", f"{sh.replicas} MPS clients per GPU, compute capability "
                                  f"{', '.join(sorted(set(caps)))}"))
    count = len(gpus) or host.gpus
    if count:
        slices, usable = count * sh.replicas, KUBELET_MAX_PODS - NODE_PODS
        if slices > usable:
            out.append(failed("gpu.sharing-max-pods",
                              f"{count} GPUs x {sh.replicas} replicas = {slices} slices, but the kubelet runs at most "
                              f"{KUBELET_MAX_PODS} pods per node (its default maxPods), about {usable} of them for "
                              f"workloads: pods beyond that stay Pending with 'Too many pods'",
                              f"set {where}.replicas to at most {max(usable // count, 2)}, or raise maxPods in "
                              "this node's /var/lib/kubelet/config.yaml (docs/sharing.md, pods per node)"))
        else:
            out.append(passed("gpu.sharing-max-pods", f"{slices} slices within the kubelet's {KUBELET_MAX_PODS} "
                              "pods per node"))
    since = SHARING_SINCE.get(sh.strategy)
    if since is not None:
        rel = release(plugin_version)
        if rel is None or at_least(rel, since):
            out.append(passed("gpu.sharing-plugin-version", f"device plugin {plugin_version} supports {sh.strategy}"))
        else:
            out.append(failed("gpu.sharing-plugin-version",
                              f"device plugin {plugin_version} predates {sh.strategy} (since v{fmt(since)})",
                              "remove install.device_plugin_version to use the version matrix's plugin, or set one "
                              f">= v{fmt(since)}"))
    return out


def _gpu_summary(f: HostFacts) -> str:
    models: dict[str, int] = {}
    for gpu in f.gpu.gpus:
        mem = f" {gpu.memory_mib // 1024} GiB" if gpu.memory_mib else ""
        key = f"{gpu.name}{mem}"
        models[key] = models.get(key, 0) + 1
    mig = sorted({gpu.mig_mode for gpu in f.gpu.gpus})
    parts = ", ".join(f"{n} x {m}" for m, n in models.items())
    return f"{len(f.gpu.gpus)} GPU(s): {parts}; MIG {'/'.join(mig)}"


def _driver_remedy(error: str) -> str:
    if "version mismatch" in error:
        return "the driver was upgraded without reloading the kernel module: reboot the host"
    if "couldn't communicate" in error or "exit status 9" in error:
        return ("the kernel module is not loaded (kernel update, nouveau, Secure Boot): check "
                "lsmod | grep -E 'nvidia|nouveau', reinstall the driver for $(uname -r) and reboot")
    if "No devices were found" in error:
        return "no GPU visible: check lspci | grep -i nvidia and dmesg for Xid errors"
    return "run nvidia-smi on the host and fix the driver"


def _runtime(f: HostFacts, cluster: Cluster, gpu_host: bool, install: InstallSettings) -> list[CheckResult]:
    out: list[CheckResult] = []
    name = cluster.container_runtime
    rt = f.containerd if name == "containerd" else f.docker
    floor = CONTAINERD_FLOOR if name == "containerd" else DOCKER_FLOOR
    floor_text = fmt(floor) if name == "containerd" else DOCKER_FLOOR_TEXT
    if rt is None:
        other = f.docker if name == "containerd" else f.containerd
        hint = f" ({other.name} {other.raw} is installed: set cluster.container_runtime: {other.name}?)" if other \
            else ""
        out.append(failed("runtime.installed", f"{name} is not installed{hint}",
                          f"install {name} >= {floor_text} " + ("(Ubuntu: apt-get install containerd; RHEL-like: "
                                                                 "dnf install containerd.io)" if name == "containerd"
                                                                 else "(docs.docker.com/engine/install)")))
        return out
    out.append(passed("runtime.installed", f"{rt.raw}"))
    if rt.release is None or not at_least(rt.release, floor):
        out.append(failed("runtime.version", f"{name} {rt.raw} is older than {floor_text}",
                          f"upgrade {name} to >= {floor_text}"))
    else:
        out.append(passed("runtime.version", f"{name} {fmt(rt.release)} >= {floor_text}"))
    if rt.active is False:
        out.append(failed("runtime.active", f"{name} is installed but not running",
                          f"systemctl enable --now {name}"))
    elif rt.active:
        out.append(passed("runtime.active", f"{name} is running"))
    else:
        out.append(skipped("runtime.active", "cannot tell (no systemctl)"))
    if name == "containerd":
        cfg = f.containerd_config
        bad_file = cfg.error_file or CONTAINERD_CONFIG
        unreadable = f"unknown: {bad_file} cannot be read"
        if cfg.error:
            out.append(failed("runtime.config", cfg.error,
                              f"make {bad_file} smaller, or --ignore runtime.config" if TOO_LARGE in cfg.error else
                              f"fix the TOML syntax of {bad_file} (containerd config dump shows what containerd "
                              "reads)"))
            out.append(skipped("runtime.cri-plugin", unreadable))
        elif any(p in cfg.disabled_plugins for p in CRI_PLUGIN_IDS):
            out.append(failed("runtime.cri-plugin", "/etc/containerd/config.toml has disabled_plugins = [\"cri\"] "
                              "(Docker's containerd.io default): kubeadm fails with 'unknown service "
                              "runtime.v1.RuntimeService' and nvidia-ctk changes nothing",
                              "gpuk8s install rewrites it; by hand: containerd config default > "
                              "/etc/containerd/config.toml && systemctl restart containerd"))
        else:
            out.append(passed("runtime.cri-plugin", "the CRI plugin is enabled"))
        if rt.release is None:
            out.append(skipped("runtime.kubernetes-compat", f"cannot read containerd's version from {rt.raw!r}"))
        else:
            out.append(_containerd_compat(rt.release, cluster, f, install))
        if cfg.error:
            out.append(skipped("runtime.cgroup-driver", unreadable))
        elif cfg.systemd_cgroup:
            out.append(passed("runtime.cgroup-driver", "SystemdCgroup = true"))
        else:
            out.append(failed("runtime.cgroup-driver", "runc does not use the systemd cgroup driver "
                              "(SystemdCgroup is not true); kubelet uses systemd", "gpuk8s install sets it"))
        default_rt = cfg.default_runtime
    else:
        out.append(_docker_compat(rt.release, f.arch, cluster))
        d = f.docker_daemon
        if d.cgroup_driver == "systemd":
            out.append(passed("runtime.cgroup-driver", "native.cgroupdriver=systemd"))
        else:
            out.append(failed("runtime.cgroup-driver", "Docker does not use the systemd cgroup driver",
                              "gpuk8s install sets exec-opts native.cgroupdriver=systemd in daemon.json"))
        default_rt = d.default_runtime
    if not gpu_host:
        return out
    if name == "containerd":
        out.append(_toolkit_dropin_path(f))
    if f.nvidia_ctk:
        out.append(passed("toolkit.installed", f.nvidia_ctk))
    else:
        out.append(failed("toolkit.installed", "nvidia-container-toolkit is not installed",
                          "gpuk8s install installs it"))
    if name == "containerd" and f.containerd_config.error:
        out.append(skipped("toolkit.default-runtime", f"unknown: "
                           f"{f.containerd_config.error_file or CONTAINERD_CONFIG} cannot be read"))
    elif default_rt == "nvidia":
        out.append(passed("toolkit.default-runtime", f"nvidia is {name}'s default runtime"))
    else:
        out.append(failed("toolkit.default-runtime", f"{name}'s default runtime is {default_rt or 'runc'}, not nvidia: "
                          "pods would not see the GPUs", f"gpuk8s install runs nvidia-ctk runtime configure "
                          f"--runtime={name} --set-as-default"))
    return out


def _toolkit_dropin_path(f: HostFacts) -> CheckResult:
    """toolkit.dropin-path: nvidia-ctk 1.18.0 wrote /etc/containerd/config.d/99-nvidia.toml (and imported
    config.d/*.toml) instead of conf.d/ (toolkit issue 1404, fixed by PR 1407 in the next release)."""
    bad_imports = [i for i in f.containerd_config.imports if i.startswith(TOOLKIT_BAD_DROPIN_DIR)]
    if not f.containerd_configd and not bad_imports:
        return passed("toolkit.dropin-path", f"no drop-in in {TOOLKIT_BAD_DROPIN_DIR}")
    found = ", ".join([*f.containerd_configd, *(f"imports = {i!r}" for i in bad_imports)])
    return failed("toolkit.dropin-path",
                  f"nvidia-container-toolkit 1.18.0's drop-in is in {TOOLKIT_BAD_DROPIN_DIR} ({found}): that release "
                  "wrote it there instead of /etc/containerd/conf.d/ (NVIDIA/nvidia-container-toolkit issue 1404, "
                  "fixed by PR 1407), where containerd does not look unless config.toml imports it",
                  "gpuk8s install moves it to /var/lib/gpuk8s/backup, removes its import and writes "
                  "/etc/containerd/conf.d/99-nvidia.toml with the pinned toolkit; by hand: upgrade the toolkit, "
                  "remove /etc/containerd/config.d/99-nvidia.toml and run nvidia-ctk runtime configure "
                  "--runtime=containerd --set-as-default")


def _cgroup(cluster: Cluster, f: HostFacts) -> CheckResult:
    """k8s.cgroup-v2: from the matrix's cgroup_v2_from on, the kubelet refuses cgroup v1 (failCgroupV1: true)."""
    minor = versions.minor_of(cluster.kubernetes_version)
    if f.cgroup_version is None:
        return skipped("k8s.cgroup-v2", "cannot tell the cgroup version (stat -fc %T /sys/fs/cgroup/)")
    if f.cgroup_version == 2:
        return passed("k8s.cgroup-v2", "cgroup v2")
    if not versions.needs_cgroup_v2(minor):
        return passed("k8s.cgroup-v2", f"cgroup v1: Kubernetes {minor} still runs on it (deprecated; from "
                      f"{versions.matrix().cgroup_v2_from} on the kubelet refuses it)")
    return failed("k8s.cgroup-v2",
                  f"the host runs cgroup v1 (/sys/fs/cgroup is a tmpfs): the kubelet of Kubernetes {minor} refuses "
                  "to start there (\"kubelet is configured to not run on a host using cgroup v1\"; failCgroupV1 "
                  f"defaults to true from {versions.matrix().cgroup_v2_from} on, KEP-5573)",
                  "boot with cgroup v2: add systemd.unified_cgroup_hierarchy=1 to the kernel command line (grubby "
                  "--update-kernel=ALL --args=systemd.unified_cgroup_hierarchy=1 on Alibaba Cloud Linux 3) and "
                  "reboot; or choose an older minor (cluster.kubernetes_version)")


def _kubernetes(host: Host, f: HostFacts) -> list[CheckResult]:
    out: list[CheckResult] = []
    if f.swap:
        out.append(failed("k8s.swap", f"swap is on ({', '.join(f.swap)}): the kubelet refuses to start by default",
                          "gpuk8s install turns it off and comments it out in /etc/fstab"))
    else:
        out.append(passed("k8s.swap", "swap is off"))
    if f.modules is None:
        out.append(skipped("k8s.modules", "cannot list kernel modules (lsmod failed)"))
    else:
        missing = [m for m in ("overlay", "br_netfilter") if m not in f.modules]
        if missing:
            out.append(failed("k8s.modules", f"kernel module(s) not loaded: {', '.join(missing)}",
                              "gpuk8s install loads them and persists them in /etc/modules-load.d/"))
        else:
            out.append(passed("k8s.modules", "overlay and br_netfilter are loaded"))
    wrong = [k for k in SYSCTLS if f.sysctl.get(k) != "1"]
    if wrong:
        out.append(failed("k8s.sysctl", "not set to 1: " + ", ".join(f"{k}={f.sysctl.get(k, 'absent')}" for k in wrong),
                          "gpuk8s install writes /etc/sysctl.d/ and applies it"))
    else:
        out.append(passed("k8s.sysctl", "ip_forward and bridge-nf-call sysctls are 1"))
    ports = CONTROL_PLANE_PORTS if host.is_control_plane else WORKER_PORTS
    if f.kube_files:
        out.append(skipped("k8s.ports", f"already part of a cluster ({', '.join(f.kube_files)})"))
    elif f.listening_ports is None:
        out.append(skipped("k8s.ports", "cannot list listening ports (ss failed)", "install iproute2"))
    else:
        busy = [p for p in ports if p in f.listening_ports]
        if busy:
            out.append(failed("k8s.ports", f"port(s) in use: {', '.join(map(str, busy))}",
                              "stop what listens there (ss -ltnp), e.g. a leftover cluster: kubeadm reset"))
        else:
            out.append(passed("k8s.ports", f"free: {', '.join(map(str, ports))}"))
    if host.is_control_plane:
        if f.cpus is not None and f.cpus < 2:
            out.append(failed("k8s.cpus", f"{f.cpus} CPU: a control plane needs at least 2", "use a larger server"))
        else:
            out.append(passed("k8s.cpus", f"{f.cpus} CPUs"))
        if f.memory_mb is not None and f.memory_mb < 1700:
            out.append(failed("k8s.memory", f"{f.memory_mb} MB of memory: a control plane needs at least 1700 MB",
                              "use a larger server"))
        else:
            out.append(passed("k8s.memory", f"{f.memory_mb} MB"))
    if len(f.hostname) > 253 or not _NODE_NAME.match(f.hostname or "-"):
        out.append(failed("k8s.hostname", f"hostname {f.hostname[:80]!r} is not a valid node name (RFC 1123)",
                          "gpuk8s registers the node as the inventory name; rename the host to match "
                          f"(hostnamectl set-hostname {host.name})"))
    elif f.hostname != host.name:
        out.append(failed("k8s.hostname", f"hostname {f.hostname!r} differs from the inventory name {host.name!r}",
                          f"gpuk8s registers the node as {host.name!r}; rename the host to match to avoid "
                          "confusion (hostnamectl set-hostname)"))
    else:
        out.append(passed("k8s.hostname", f.hostname))
    missing_tools = [t for t in REQUIRED_TOOLS if t not in f.tools]
    if missing_tools:
        out.append(failed("k8s.tools", f"missing: {', '.join(missing_tools)} (kubeadm needs them)",
                          "they come with the kubelet package; or install them: apt-get install "
                          + " ".join(missing_tools)))
    else:
        out.append(passed("k8s.tools", ", ".join(REQUIRED_TOOLS)))
    if f.firewalld_active:
        out.append(failed("k8s.firewalld", "firewalld is active: ports 6443 and 10250 must be open between nodes",
                          "open them (firewall-cmd --add-port=6443/tcp --add-port=10250/tcp --permanent) "
                          "or stop firewalld"))
    return out


_CURL_EXIT = {6: "the name does not resolve", 7: "the connection was refused", 28: "no answer in time",
              35: "the TLS handshake failed", 60: "its certificate is not trusted", 127: "curl is not installed"}


def sources_check(wanted: list[mirrors.Source], f: HostFacts) -> CheckResult:
    """net.sources: the host reaches each source install fetches from (`wanted`: SourcePlan.for_host, in
    gpuk8s/preflight/sources.py); the message names the first one it cannot. Only the URLs gpuk8s asked for are
    read from the probe's output."""
    got = {s.url: s for s in f.sources}
    if not wanted:
        return skipped("net.sources", "no source to check")
    if all(got.get(s.url) is None or got[s.url].exit_status == 127 for s in wanted):
        return skipped("net.sources", "curl is not installed or the probe did not check the sources",
                       "install curl (install needs it too)")
    bad = [s for s in wanted if got.get(s.url) is not None and not got[s.url].reached]
    if not bad:
        return passed("net.sources", f"reaches {len(wanted)} sources: " + ", ".join(s.url for s in wanted))
    first = bad[0]
    e = got[first.url].exit_status
    why = _CURL_EXIT.get(e, f"curl exit status {e}")
    return failed("net.sources", f"cannot reach {first.what} at {first.url} ({why})"
                  + (f"; {len(bad) - 1} more unreachable" if len(bad) > 1 else ""),
                  f"point {first.fix} at a mirror this host reaches (docs/mirrors.md), or fix its DNS, firewall or "
                  "proxy", evidence=[f"{s.url}: {_CURL_EXIT.get(got[s.url].exit_status, got[s.url].exit_status)}"
                                     for s in bad])
