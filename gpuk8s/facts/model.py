"""Typed host facts, read once per host and consumed by checks and operations."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gpuk8s.versions import Release

OSFamily = Literal["debian", "rhel", "unknown"]


@dataclass(frozen=True)
class OSInfo:
    id: str = ""
    id_like: tuple[str, ...] = ()
    version_id: str = ""
    pretty_name: str = ""
    family: OSFamily = "unknown"


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    uuid: str
    memory_mib: int | None
    mig_mode: str


@dataclass(frozen=True)
class GPUInfo:
    state: Literal["ok", "absent", "failed"]
    driver: str | None = None
    driver_release: Release | None = None
    cuda_version: str | None = None  # as nvidia-smi --version reports it, where it does
    gpus: tuple[GPU, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class Runtime:
    name: str
    raw: str
    release: Release | None
    active: bool | None  # None: unknown (no systemctl)


@dataclass(frozen=True)
class ContainerdConfig:
    present: bool
    disabled_plugins: tuple[str, ...] = ()
    default_runtime: str | None = None
    systemd_cgroup: bool | None = None
    nvidia_runtime: bool = False
    imports: tuple[str, ...] = ()
    error: str = ""  # the configuration cannot be read (not TOML, too large): the fields above are unknown
    error_file: str = ""  # the file at fault


@dataclass(frozen=True)
class DockerDaemon:
    present: bool
    default_runtime: str | None = None
    nvidia_runtime: bool = False
    cgroup_driver: str | None = None
    error: str = ""


@dataclass(frozen=True)
class HostFacts:
    uid: int | None
    hostname: str
    os: OSInfo
    kernel: str
    arch: str
    cpus: int | None
    memory_mb: int | None
    swap: tuple[str, ...]
    modules: frozenset[str] | None  # None: could not be read
    sysctl: dict[str, str]
    gpu: GPUInfo
    containerd: Runtime | None
    containerd_config: ContainerdConfig
    docker: Runtime | None
    docker_daemon: DockerDaemon
    nvidia_ctk: str | None
    kubeadm: str | None
    kubelet: str | None
    firewalld_active: bool
    tools: frozenset[str]
    listening_ports: frozenset[int] | None
    macs: tuple[str, ...]
    product_uuid: str | None
    machine_id: str | None
    kube_files: tuple[str, ...]
    time: float | None
    raw_errors: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("modules", "tools", "listening_ports"):
            if d[k] is not None:
                d[k] = sorted(d[k])
        d.pop("raw_errors")
        d["gpu"]["driver_release"] = None if self.gpu.driver_release is None else list(self.gpu.driver_release)
        for rt in ("containerd", "docker"):
            if d[rt] and d[rt]["release"] is not None:
                d[rt]["release"] = list(d[rt]["release"])
        return d
