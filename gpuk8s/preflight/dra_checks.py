"""Preflight checks of the hosts whose inventory says `allocator: dra` (docs/dra.md): the NVIDIA driver at the DRA
driver's floor, and CDI in the container runtime (the DRA driver hands its devices to containers as CDI devices).
The Kubernetes minor is the loader's to refuse (before any host is contacted). Pure: host and facts in, findings out.
"""

from __future__ import annotations

from gpuk8s import runtimeplan, versions
from gpuk8s.facts.model import HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Cluster, Host, InstallSettings
from gpuk8s.preflight.result import CheckResult, failed, passed, skipped
from gpuk8s.versions import at_least, fmt

IDS = ("dra.driver", "dra.cdi")
CONFIG = "/etc/containerd/config.toml"


def dra_checks(host: Host, f: HostFacts, cluster: Cluster, install: InstallSettings | None = None
               ) -> list[CheckResult]:
    """Nothing for a host whose GPUs the device plugin serves. `install`: the inventory's install settings
    (default: the matrix's pins)."""
    if not is_gpu_node(host) or host.gpu.allocator.kind != "dra":
        return []
    return [_driver(host, f), _cdi(f, cluster, install or InstallSettings())]


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


def _cdi(f: HostFacts, cluster: Cluster, install: InstallSettings) -> CheckResult:
    """containerd 2.x enables CDI unless its config says enable_cdi = false; 1.7 only with enable_cdi = true; 1.6
    not at all (containerd docs/cri/config.md). Below that, install brings containerd.io at
    install.containerd_version where that has CDI on and the OS is one it upgrades containerd on (runtimeplan)."""
    if cluster.container_runtime != "containerd":
        return failed("dra.cdi", "the DRA driver needs CDI, which gpuk8s sets up with containerd only",
                      "write cluster.container_runtime: containerd")
    cfg = f.containerd_config
    if cfg.error:
        return skipped("dra.cdi", f"the containerd config cannot be read: {cfg.error}")
    plan = runtimeplan.containerd_plan(cluster, install, f, dra=True)
    have = plan.have
    if have is None:  # install brings no containerd: runtime.installed says what to do
        return skipped("dra.cdi", "no containerd on the host (see runtime.installed)")
    where = "version 3: plugins.'io.containerd.cri.v1.runtime'" if plan.major >= 2 else \
        "plugins.\"io.containerd.grpc.v1.cri\""
    if cfg.enable_cdi is False:  # kept by containerd 2.x's migration of the config too: said, never overridden
        return failed("dra.cdi", f"{CONFIG} sets enable_cdi = false: containers would get no GPU from a claim",
                      f"remove enable_cdi = false (or set it true) under [{where}] and restart containerd")
    if plan.upgrade:
        return passed("dra.cdi", f"containerd {fmt(have)} has CDI off: install brings containerd "
                      f"{fmt(plan.target)} (install.containerd_version), which enables CDI by default")
    if cfg.enable_cdi or have[0] >= 2:
        return passed("dra.cdi", "enable_cdi = true" if cfg.enable_cdi else
                      f"containerd {have[0]}.x enables CDI by default")
    why = "has no CDI (1.7 or newer has)" if not at_least(have, versions.CDI_FROM) else \
        "does not enable CDI unless its config says so"
    if not plan.os_upgrades:
        cannot = "install upgrades containerd only on Ubuntu 22.04 and Alibaba Cloud Linux 3"
    else:
        cannot = (f"install.containerd_version {install.containerd_version} (containerd {fmt(plan.target)}) "
                  "would not turn CDI on either")
    return failed("dra.cdi", f"containerd {fmt(have)} {why}, and {cannot}",
                  f"install containerd 2.x (install.containerd_version: a 2.x containerd.io release), or on 1.7 set "
                  f"enable_cdi = true under [{where}] in {CONFIG} and restart containerd")


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
