"""Typed inventory: what the loader produces and everything else reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuk8s import versions
from gpuk8s.mig.layout import Layout

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
    # the OpenSSH client config read for this host ("none": none); see gpuk8s/inventory/sshconfig.py
    config_file: str = "~/.ssh/config"
    alias: str | None = None  # the name looked up in that config (Host patterns); default: the host's address
    # the keys written in the inventory: those win over the ssh config
    explicit: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


SharingStrategy = Literal["none", "time-slicing", "mps", "hami"]
SHARING_STRATEGIES: tuple[str, ...] = ("none", "time-slicing", "mps", "hami")
MAX_REPLICAS = 20  # the seed's limit: at most 20 pods per GPU (the device plugin sets none)


@dataclass(frozen=True)
class GPUSharing:
    """How one node shares its GPUs (inventory `gpu_sharing:`); docs/sharing.md."""

    strategy: SharingStrategy = "none"
    replicas: int = 1  # pods per GPU: 1 without sharing, 2..MAX_REPLICAS with it (HAMi: its deviceSplitCount)
    rename: bool = False  # advertise nvidia.com/gpu.shared instead of nvidia.com/gpu
    fail_requests_greater_than_one: bool = True
    pod_memory_mib: int | None = None  # the GPU memory one pod needs, for preflight's time-slicing warning
    line: int = 0  # where it was written in the inventory (0: the default)


MIG_STRATEGIES: tuple[str, ...] = ("none", "single", "mixed")  # the device plugin's --mig-strategy values


@dataclass(frozen=True)
class MIGSettings:
    """How one node partitions its GPUs with MIG (inventory `mig:`); docs/mig.md."""

    strategy: str = "none"  # none | single | mixed
    config: str = ""  # the named layout (all-1g.10gb), "custom" for an explicit list, "" with strategy none
    layout: Layout | None = None  # gpuk8s.mig.layout: resolved per GPU by the MIG phase and the GPU plan
    line: int = 0

    @property
    def enabled(self) -> bool:
        return self.strategy != "none" and self.layout is not None


DriverFlavor = Literal["auto", "open", "proprietary"]
DRIVER_FLAVORS: tuple[str, ...] = ("auto", "open", "proprietary")
DriverSource = Literal["distro", "nvidia"]
DRIVER_SOURCES: tuple[str, ...] = ("distro", "nvidia")


@dataclass(frozen=True)
class DriverSettings:
    """Whether and how gpuk8s installs the NVIDIA driver on one node (inventory `driver:`); docs/driver.md.

    With manage false (the default) the driver is the user's: preflight checks it, install never touches it.
    """

    manage: bool = False
    branch: str = ""  # "580": a branch of the version matrix's `driver:` section; "" its default branch
    flavor: DriverFlavor = "auto"  # kernel modules: auto decides per GPU architecture (gpuk8s/driver/rules.py)
    source: DriverSource = "distro"  # the OS's own packages, or NVIDIA's CUDA repository
    line: int = 0


Allocator = Literal["device-plugin", "dra"]
ALLOCATORS: tuple[str, ...] = ("device-plugin", "dra")


@dataclass(frozen=True)
class AllocatorSetting:
    """Who serves one node's GPUs to pods (inventory `allocator:`); docs/dra.md."""

    kind: Allocator = "device-plugin"
    line: int = 0  # where it was written (0: the default)


FabricLinkLayer = Literal["none", "auto", "infiniband", "roce"]
FABRIC_LINK_LAYERS: tuple[str, ...] = ("none", "auto", "infiniband", "roce")
GpuDirect = Literal["auto", "peermem", "dmabuf", "off"]
GPUDIRECT_MODES: tuple[str, ...] = ("auto", "peermem", "dmabuf", "off")


@dataclass(frozen=True)
class FabricSettings:
    """The RDMA fabric one node's GPUs reach other nodes over (inventory `fabric:`; docs/fabric.md, issue 43).

    link_layer none (the default: no `fabric:`) leaves the network to the user; auto takes the link layer of the
    node's active RDMA ports; infiniband and roce say which it must be.
    """

    link_layer: FabricLinkLayer = "none"
    nics: tuple[str, ...] = ()  # the RDMA devices to use (mlx5_0 ...); () = every one of the link layer
    gpudirect: GpuDirect = "auto"
    ports: int | None = None  # expect: how many active ports of the link layer
    rate: int | None = None  # expect: each one's rate at least (Gb/s)
    line: int = 0

    @property
    def enabled(self) -> bool:
        return self.link_layer != "none"


@dataclass(frozen=True)
class NodeGPUSettings:
    """Per-node GPU settings, each from the host's own key, else its `gpu_group`, else `gpu_defaults`.

    One inventory key per field (loader._NODE_GPU_KEYS); a key is taken whole from the first layer that
    sets it, never merged.
    """

    sharing: GPUSharing = field(default_factory=GPUSharing)
    mig: MIGSettings = field(default_factory=MIGSettings)
    driver: DriverSettings = field(default_factory=DriverSettings)
    allocator: AllocatorSetting = field(default_factory=AllocatorSetting)
    fabric: FabricSettings = field(default_factory=FabricSettings)


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
    gpu_group: str | None = None  # a name of the inventory's gpu_groups
    gpu: NodeGPUSettings = field(default_factory=NodeGPUSettings)

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
    # containerd below the floor of the cluster's minor: install brings it to this containerd.io version
    # from Docker's repositories (or a mirror of them: ubuntu/ and rhel/ under the URL), version matrix
    containerd_version: str = versions.matrix().containerd_version
    containerd_repo: str = "https://download.docker.com/linux"
    containerd_repo_insecure_http: bool = False
    containerd_repo_key_fingerprint: str | None = None
    # NVIDIA's RHEL 8 repository, where a managed driver comes from on Alibaba Cloud Linux 3 (x86_64/ and sbsa/
    # below it; a mirror of it, or the copy a bundle serves); Ubuntu's driver comes from the host's own archive
    driver_repo: str = "https://developer.download.nvidia.com/compute/cuda/repos/rhel8"
    driver_repo_insecure_http: bool = False
    driver_repo_key_fingerprint: str | None = None
    # Ubuntu: where the driver's packages come from ("": the host's own apt sources, Ubuntu's archive or the site's
    # mirror of it); a URL: a copy of Ubuntu's archive with CODENAME-updates restricted (signed by Ubuntu's archive
    # key, which every Ubuntu host trusts), written as the host's source gpuk8s-driver.list; a run from a bundle
    # serves the bundle's copy there
    driver_apt_repo: str = ""
    driver_apt_repo_insecure_http: bool = False
    driver_apt_repo_key_fingerprint: str | None = None
    # cri-dockerd (Docker hosts): the directory its release archives are downloaded from (the release's, or
    # a mirror of it) and their sha256 per architecture (amd64, arm64), checked on the host before the archive
    # is unpacked; both default to the version matrix's pin
    cri_dockerd_url: str = versions.cri_dockerd().url
    cri_dockerd_sha256: dict[str, str] = field(default_factory=lambda: dict(versions.cri_dockerd().sha256))
    # sha256 (64 lowercase hex digits) the CNI manifest must have; required for a plain http URL.
    # None: gpuk8s.phases.cni.manifest_sha256 falls back to the pin of the default URL, if any.
    calico_manifest_sha256: str | None = None
    flannel_manifest_sha256: str | None = None


@dataclass(frozen=True)
class MonitoringSettings:
    """The monitoring section: the DCGM exporter, and how Prometheus (and Grafana) get its metrics."""

    enabled: bool = False
    namespace: str = "gpu-monitoring"
    # auto: servicemonitor when the Prometheus Operator's CRDs exist, else deploy; none: print the scrape config
    prometheus: Literal["auto", "deploy", "servicemonitor", "none"] = "auto"
    retention: str = "15d"  # --storage.tsdb.retention.time of the Prometheus gpuk8s deploys
    storage_class: str | None = None  # None: emptyDir (the data is lost when the pod restarts)
    storage_size: str = "20Gi"
    grafana: bool = False
    # servicemonitor: the namespace of the Prometheus Operator's Prometheus whose Service prometheus-operated
    # verify asks (None: `namespace`); never a Service of that name found elsewhere, which anyone may create
    prometheus_namespace: str | None = None


@dataclass(frozen=True)
class HealthSettings:
    """The health section (docs/health.md): the GPU health check install and join run before a node joins."""

    before_join: Literal["quick", "standard", "long", "fabric", "off"] = "quick"
    # quarantine: joined with the taint gpuk8s.io/quarantine=<finding>:NoSchedule; skip: not joined; fail: the run
    # stops before any node is initialised or joined
    on_failure: Literal["quarantine", "skip", "fail"] = "quarantine"


@dataclass(frozen=True)
class RegistrySettings:
    """Where container images and CNI manifests come from (inventory `registry:`); docs/mirrors.md.

    gpuk8s/mirrors.py is the one place that turns these into image references and manifest URLs.
    """

    mirror: str | None = None  # host[:port][/path]: every upstream registry's images under it
    overrides: dict[str, str] = field(default_factory=dict)  # upstream registry -> host[:port][/path]
    manifests: str | None = None  # base URL: a manifest URL https://H/P is fetched from BASE/H/P
    credentials_env: str | None = None  # the environment variable holding user:password for the mirror
    credentials_file: str | None = None  # or a local file holding it (never the inventory)
    insecure_http: bool = False  # the mirror speaks plain http (hosts.toml: http://...)
    ca_file: str | None = None  # a CA certificate on each host that signs the mirror's certificate
    line: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.mirror or self.overrides)


@dataclass(frozen=True)
class Inventory:
    path: Path
    cluster: Cluster
    ssh: SSHSettings
    hosts: tuple[Host, ...]
    preflight: PreflightSettings = field(default_factory=PreflightSettings)
    install: InstallSettings = field(default_factory=InstallSettings)
    warnings: tuple[Problem, ...] = ()
    monitoring: MonitoringSettings = field(default_factory=MonitoringSettings)
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    health: HealthSettings = field(default_factory=HealthSettings)

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
