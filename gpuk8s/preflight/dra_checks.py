"""Preflight checks of the hosts whose inventory says `allocator: dra` (docs/dra.md): the NVIDIA driver at the DRA
driver's floor, and CDI in the container runtime (the DRA driver hands its devices to containers as CDI devices).
The Kubernetes minor is the loader's to refuse (before any host is contacted). Pure: host and facts in, findings out.
"""

from __future__ import annotations

from gpuk8s import versions
from gpuk8s.facts.model import SUPPORTED_OS, HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Cluster, Host
from gpuk8s.preflight.result import CheckResult, failed, passed, skipped
from gpuk8s.versions import at_least, fmt

IDS = ("dra.driver", "dra.cdi")
CONFIG = "/etc/containerd/config.toml"


def dra_checks(host: Host, f: HostFacts, cluster: Cluster) -> list[CheckResult]:
    """Nothing for a host whose GPUs the device plugin serves."""
    if not is_gpu_node(host) or host.gpu.allocator.kind != "dra":
        return []
    return [_driver(host, f), _cdi(f, cluster)]


def _driver(host: Host, f: HostFacts) -> CheckResult:
    floor = versions.dra_driver().driver_floor
    have = f.gpu.driver_release
    if have is None:
        if host.gpu.driver.manage:  # install brings the branch the inventory names (the loader checked its floor)
            return skipped("dra.driver", "no driver yet: install brings the branch of the host's driver: setting")
        return skipped("dra.driver", "no working driver (see gpu.driver)")
    shown = f.gpu.driver or fmt(have)  # as nvidia-smi prints it (535.104.05)
    if at_least(have, floor):
        return passed("dra.driver", f"driver {shown} (the DRA driver needs {floor[0]} or newer)")
    if host.gpu.driver.manage:
        # install brings the inventory's branch before any DRA driver runs (the loader refused a branch below the
        # floor): the driver running now is not what the node will have (issue 41: a composition preflight
        # blocked although its own remedy proposes it)
        branch = host.gpu.driver.branch or versions.drivers().default_branch
        return passed("dra.driver", f"driver {shown} now; install brings branch {branch} (driver: manage) before "
                      f"the DRA driver serves the node (it needs {floor[0]} or newer); a node already in the "
                      "cluster changes its driver through gpuk8s driver upgrade")
    return failed("dra.driver", f"driver {shown} is older than the DRA driver's floor ({floor[0]})",
                  f"upgrade the driver to branch {floor[0]} or newer (gpuk8s driver upgrade, with driver: "
                  f"{{manage: true, branch: \"{versions.drivers().default_branch}\"}}), or write allocator: "
                  "device-plugin for this host")


def _cdi(f: HostFacts, cluster: Cluster) -> CheckResult:
    """containerd 2.x enables CDI unless its config says enable_cdi = false; 1.7 only with enable_cdi = true; 1.6
    not at all (containerd docs/cri/config.md). Where the node has none of these, install brings containerd 2.x
    (versions.containerd_floor, as it does below a minor's floor) on the OSes it upgrades containerd on."""
    if cluster.container_runtime != "containerd":
        return failed("dra.cdi", "the DRA driver needs CDI, which gpuk8s sets up with containerd only",
                      "write cluster.container_runtime: containerd")
    cfg = f.containerd_config
    if cfg.error:
        return skipped("dra.cdi", f"the containerd config cannot be read: {cfg.error}")
    have = f.containerd.release if f.containerd is not None else None
    floor = versions.containerd_floor(cluster.kubernetes_version, True, have, cfg.enable_cdi)
    target = versions.containerd_install_release()
    # what install does (playbook/render.py containerd_plan): below the floor, containerd.io where the OS has it
    upgraded = have is None or (not at_least(have, floor) and at_least(target, floor)
                                and (f.os.id, f.os.version_id) in SUPPORTED_OS)
    major = target[0] if upgraded else have[0] if have else 0
    where = "version 3: plugins.'io.containerd.cri.v1.runtime'" if major >= 2 else \
        "plugins.\"io.containerd.grpc.v1.cri\""
    if cfg.enable_cdi is False:  # kept by containerd 2.x's migration of the config too: said, never overridden
        return failed("dra.cdi", f"{CONFIG} sets enable_cdi = false: containers would get no GPU from a claim",
                      f"remove enable_cdi = false (or set it true) under [{where}] and restart containerd")
    if upgraded:
        why = f"containerd {fmt(have)} has CDI off" if have else "no containerd yet"
        return passed("dra.cdi", f"{why}: install brings containerd {fmt(target)}, which enables CDI by default")
    if cfg.enable_cdi or major >= 2:
        return passed("dra.cdi", "enable_cdi = true" if cfg.enable_cdi else
                      f"containerd {major}.x enables CDI by default")
    shown = fmt(have or (0,))
    why = "has no CDI (1.7 or newer has)" if have and not at_least(have, versions.CDI_FROM) else \
        "does not enable CDI unless its config says so"
    return failed("dra.cdi", f"containerd {shown} {why}, and install upgrades containerd only on Ubuntu 22.04 and "
                  "Alibaba Cloud Linux 3",
                  f"install containerd 2.x, or on 1.7 set enable_cdi = true under [{where}] in {CONFIG} and restart "
                  "containerd")


def not_ready_now(f: HostFacts, cluster: Cluster) -> str:
    """Why a node cannot serve GPUs through the DRA driver as it is now ("" when it can): for `gpuk8s allocator`,
    which moves a running node and installs nothing (what install would bring does not count here)."""
    floor = versions.dra_driver().driver_floor
    have = f.gpu.driver_release
    if have is None:
        return "it has no working NVIDIA driver"
    if not at_least(have, floor):
        return f"its driver {f.gpu.driver or fmt(have)} is below the DRA driver's floor ({floor[0]})"
    if cluster.container_runtime != "containerd":
        return "the DRA driver needs CDI, which gpuk8s sets up with containerd only"
    rt = f.containerd.release if f.containerd is not None else None
    cdi = f.containerd_config.enable_cdi
    if rt is None or cdi is False or not at_least(rt, versions.containerd_floor(cluster.kubernetes_version, True,
                                                                               rt, cdi)):
        return (f"its containerd {fmt(rt) if rt else '(none)'} does not hand CDI devices to containers "
                f"(2.x does unless enable_cdi = false; 1.7 with enable_cdi = true)")
    return ""
