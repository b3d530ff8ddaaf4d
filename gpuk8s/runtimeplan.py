"""What install does about containerd itself on a host. The one place that decides it.

Install upgrades a host's containerd when it is below its floor (the cluster's minor's, version matrix; on a DRA
node the floor of one that hands CDI devices to containers: versions.containerd_floor), the containerd.io release
of `install.containerd_version` meets that floor, and the OS is one install upgrades containerd on (Ubuntu 22.04,
Alibaba Cloud Linux 3: Docker's jammy and rhel/8 packages). A host without containerd gets none from install.

The containerd playbook's values (playbook/render.py) and preflight's promises (runtime.kubernetes-compat,
dra.cdi) read it, so that what preflight says install will bring is what install brings, at the version the
inventory pins (not the matrix's default when the inventory names another). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuk8s import versions
from gpuk8s.facts.model import SUPPORTED_OS, HostFacts
from gpuk8s.inventory.model import Cluster, InstallSettings
from gpuk8s.versions import Release, at_least, release


@dataclass(frozen=True)
class ContainerdPlan:
    have: Release | None  # the host's containerd release, None without one (or under Docker's)
    floor: Release  # the release this node needs
    target: Release  # what install would bring: install.containerd_version's release
    upgrade: bool  # install replaces the host's containerd by containerd.io at `target`
    os_upgrades: bool  # the OS is one install upgrades containerd on

    @property
    def major(self) -> int:
        """The containerd major the host has once install ran (1 without containerd: no config to write)."""
        return self.target[0] if self.upgrade else (self.have[0] if self.have else 1)


def target_release(install: InstallSettings) -> Release:
    """The containerd release of install.containerd_version ("X.Y.Z-1" -> (X, Y, Z))."""
    return release(install.containerd_version.split("-")[0]) or (0,)


def containerd_plan(cluster: Cluster, install: InstallSettings, facts: HostFacts, dra: bool = False) -> ContainerdPlan:
    """`dra`: the node is to serve GPUs through the DRA driver (its containerd must hand CDI devices over)."""
    cd = facts.containerd
    have = cd.release if cd is not None and cd.release else None
    floor = versions.containerd_floor(cluster.kubernetes_version, dra, have, facts.containerd_config.enable_cdi)
    target = target_release(install)
    os_upgrades = (facts.os.id, facts.os.version_id) in SUPPORTED_OS
    upgrade = (cluster.container_runtime == "containerd" and have is not None and not at_least(have, floor)
               and at_least(target, floor) and os_upgrades)
    return ContainerdPlan(have, floor, target, upgrade, os_upgrades)
