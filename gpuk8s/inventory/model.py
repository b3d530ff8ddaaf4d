"""Typed inventory: what the loader produces and everything else reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuk8s import versions

Role = Literal["control-plane", "worker"]
SudoMode = Literal["nopasswd", "password"]
HostKeyPolicy = Literal["strict", "accept-new"]


@dataclass(frozen=True)
class Sudo:
    mode: SudoMode = "nopasswd"
    password_env: str = "GPUK8S_SUDO_PASSWORD"
    prompt: bool = False


@dataclass(frozen=True)
class Bastion:
    address: str
    user: str
    port: int = 22
    identity_file: str | None = None


@dataclass(frozen=True)
class SSHSettings:
    user: str = "root"
    port: int = 22
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout: float = 10.0
    command_timeout: float = 600.0
    host_key_policy: HostKeyPolicy = "strict"
    bastion: Bastion | None = None
    sudo: Sudo = field(default_factory=Sudo)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    role: Role
    ssh: SSHSettings
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpus: int | None = None
    line: int = 0

    @property
    def is_control_plane(self) -> bool:
        return self.role == "control-plane"


@dataclass(frozen=True)
class Cluster:
    name: str = "gpuk8s"
    # "1.N" or "1.N.P", N a minor of the version matrix (gpuk8s/data/versions.yaml); default: its default minor
    kubernetes_version: str = versions.default_minor()
    pod_cidr: str = "10.244.0.0/16"
    service_cidr: str = "10.96.0.0/12"
    cni: Literal["calico", "flannel"] = "calico"
    container_runtime: Literal["containerd", "docker"] = "containerd"
    control_plane_endpoint: str | None = None


@dataclass(frozen=True)
class PreflightSettings:
    min_bandwidth_gbit: float = 10.0
    max_rtt_ms: float = 1.0
    max_clock_skew_s: float = 5.0
    network_test_seconds: float = 2.0
    ignore: tuple[str, ...] = ()


_PINS = versions.pins()  # the default minor's; the loader uses those of the inventory's minor


@dataclass(frozen=True)
class InstallSettings:
    """Where packages come from and how long to wait for a host's package manager lock.

    The versions default to the pins of the default Kubernetes minor in the version matrix; the loader
    fills them from the pins of the inventory's cluster.kubernetes_version (gpuk8s.versions.install_defaults).
    """

    toolkit_version: str = _PINS.toolkit
    toolkit_repo: str = "https://nvidia.github.io/libnvidia-container"
    kubernetes_repo: str = "https://pkgs.k8s.io/core:/stable:"
    package_lock_timeout: int = 120
    device_plugin_version: str = _PINS.device_plugin
    calico_manifest: str = _PINS.calico.url
    flannel_manifest: str = _PINS.flannel.url
    verify_image: str = ""  # empty: chosen from each node's driver
    # A repository over plain http is accepted only with insecure_http and its signing key's fingerprint
    # (40 uppercase hex digits); a fingerprint may be pinned for an https repository too.
    toolkit_repo_insecure_http: bool = False
    toolkit_repo_key_fingerprint: str | None = None
    kubernetes_repo_insecure_http: bool = False
    kubernetes_repo_key_fingerprint: str | None = None
    # sha256 (64 lowercase hex digits) the CNI manifest must have; required for a plain http URL.
    # None: gpuk8s.versions.manifest_sha256 falls back to the pin of the default URL, if any.
    calico_manifest_sha256: str | None = None
    flannel_manifest_sha256: str | None = None


@dataclass(frozen=True)
class Inventory:
    path: Path
    cluster: Cluster
    ssh: SSHSettings
    hosts: tuple[Host, ...]
    preflight: PreflightSettings = field(default_factory=PreflightSettings)
    install: InstallSettings = field(default_factory=InstallSettings)
    warnings: tuple[Problem, ...] = ()

    @property
    def control_planes(self) -> list[Host]:
        return [h for h in self.hosts if h.is_control_plane]

    @property
    def workers(self) -> list[Host]:
        return [h for h in self.hosts if not h.is_control_plane]

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)


@dataclass(frozen=True)
class Problem:
    """One inventory mistake, located in the file, with what to write instead."""

    file: str
    line: int
    column: int
    key: str
    message: str
    fix: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        key = f" {self.key}:" if self.key else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{where}: {self.severity}:{key} {self.message}{fix}"
