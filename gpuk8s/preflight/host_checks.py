"""Per-host readiness checks: pure functions of a host's facts and its inventory entry."""

from __future__ import annotations

import re
from datetime import date

from gpuk8s import versions
from gpuk8s.facts.model import HostFacts
from gpuk8s.facts.parse import CONTAINERD_CONFIG, TOO_LARGE
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Cluster, Host
from gpuk8s.preflight.result import CheckResult, failed, passed, skipped
from gpuk8s.versions import at_least, cuda_versions_supported, fmt, release

DRIVER_FLOOR = (418, 87, 1)
DRIVER_FLOOR_TEXT = "418.87.01"
DOCKER_FLOOR = (19, 3, 5)
CONTAINERD_FLOOR = (1, 4, 3)
SUPPORTED_OS = {("ubuntu", "22.04"): "Ubuntu 22.04 LTS", ("alinux", "3"): "Alibaba Cloud Linux 3"}
SUPPORTED_ARCH = ("x86_64", "aarch64")
CONTROL_PLANE_PORTS = (6443, 2379, 2380, 10250, 10257, 10259)
WORKER_PORTS = (10250,)
REQUIRED_TOOLS = ("conntrack", "socat", "ebtables", "ethtool")
SYSCTLS = ("net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_host(host: Host, facts: HostFacts, cluster: Cluster, today: date | None = None) -> list[CheckResult]:
    """Every check of one host; `today` (default: the date) decides whether the Kubernetes minor is past its
    end of life."""
    results: list[CheckResult] = []
    results += _os(facts)
    results += _gpu(host, facts)
    results += _runtime(facts, cluster, is_gpu_node(host))
    results.append(_kubernetes_version(cluster, today or versions.today()))
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


def _containerd_compat(rt_release: tuple[int, ...], cluster: Cluster) -> CheckResult:
    """runtime.kubernetes-compat for containerd: the containerd floor of the cluster's minor (version matrix)."""
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
    if floor[0] >= 2 and rt_release[0] < 2:
        return failed("runtime.kubernetes-compat",
                      f"Kubernetes {k.minor} needs containerd >= {k.containerd_floor}, found {fmt(rt_release)}: "
                      f"{_last_minor_on(rt_release[0])} is the last minor that runs on containerd "
                      f"{rt_release[0]}.x{tested}",
                      "gpuk8s install cannot upgrade containerd to 2.x yet: upgrade it by hand (containerd's "
                      "release from github.com/containerd/containerd/releases, or a 2.x package of your "
                      "distribution), write a version 3 config (containerd config default > "
                      "/etc/containerd/config.toml) and restart containerd, then run gpuk8s install" + instead)
    return failed("runtime.kubernetes-compat",
                  f"Kubernetes {k.minor} needs CRI v1: containerd >= {k.containerd_floor}, found {fmt(rt_release)}"
                  f"{tested}",
                  f"upgrade containerd to {k.containerd_floor} or newer (Ubuntu: apt-get install containerd; "
                  "RHEL-like: dnf install containerd.io)" + instead)


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
        shown = ", ".join(cudas) if cudas else "none of 9.0 or newer"
        if g.cuda_version:
            shown += f"; nvidia-smi reports CUDA {g.cuda_version}"
        if any(c.split(".")[0] == "12" for c in cudas):
            out.append(passed("gpu.cuda", f"can run CUDA {shown}"))
        else:
            out.append(failed("gpu.cuda", f"driver {g.driver} runs CUDA {shown} only: CUDA 12 images "
                              "(e.g. nvidia/cuda:12.x) fail with 'unsatisfied condition: cuda>=12'",
                              "upgrade the driver to >= 525.60.13 for CUDA 12, or use images built for "
                              f"CUDA {cudas[0] if cudas else '10.1'}"))
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


def _runtime(f: HostFacts, cluster: Cluster, gpu_host: bool) -> list[CheckResult]:
    out: list[CheckResult] = []
    name = cluster.container_runtime
    rt = f.containerd if name == "containerd" else f.docker
    floor = CONTAINERD_FLOOR if name == "containerd" else DOCKER_FLOOR
    if rt is None:
        other = f.docker if name == "containerd" else f.containerd
        hint = f" ({other.name} {other.raw} is installed: set cluster.container_runtime: {other.name}?)" if other \
            else ""
        out.append(failed("runtime.installed", f"{name} is not installed{hint}",
                          f"install {name} >= {fmt(floor)} (Ubuntu: apt-get install containerd; "
                          "RHEL-like: dnf install containerd.io)"))
        return out
    out.append(passed("runtime.installed", f"{rt.raw}"))
    if rt.release is None or not at_least(rt.release, floor):
        out.append(failed("runtime.version", f"{name} {rt.raw} is older than {fmt(floor)}",
                          f"upgrade {name} to >= {fmt(floor)}"))
    else:
        out.append(passed("runtime.version", f"{name} {fmt(rt.release)} >= {fmt(floor)}"))
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
        elif "cri" in cfg.disabled_plugins or "io.containerd.grpc.v1.cri" in cfg.disabled_plugins:
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
            out.append(_containerd_compat(rt.release, cluster))
        if cfg.error:
            out.append(skipped("runtime.cgroup-driver", unreadable))
        elif cfg.systemd_cgroup:
            out.append(passed("runtime.cgroup-driver", "SystemdCgroup = true"))
        else:
            out.append(failed("runtime.cgroup-driver", "runc does not use the systemd cgroup driver "
                              "(SystemdCgroup is not true); kubelet uses systemd", "gpuk8s install sets it"))
        default_rt = cfg.default_runtime
    else:
        # every minor of the version matrix is >= 1.24, which removed dockershim
        out.append(failed("runtime.kubernetes-compat",
                          f"Kubernetes {cluster.kubernetes_version} has no dockershim: "
                          "Docker needs cri-dockerd (unix:///run/cri-dockerd.sock)",
                          "install cri-dockerd, or use containerd (cluster.container_runtime: containerd)"))
        d = f.docker_daemon
        if d.cgroup_driver == "systemd":
            out.append(passed("runtime.cgroup-driver", "native.cgroupdriver=systemd"))
        else:
            out.append(failed("runtime.cgroup-driver", "Docker does not use the systemd cgroup driver",
                              "gpuk8s install sets exec-opts native.cgroupdriver=systemd in daemon.json"))
        default_rt = d.default_runtime
    if not gpu_host:
        return out
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
