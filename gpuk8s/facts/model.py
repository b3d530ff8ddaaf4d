"""Typed host facts, read once per host and consumed by checks and operations."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gpuk8s.facts.fabric import AcsReading, Gid, RdmaPort, Topology
from gpuk8s.versions import Release

OSFamily = Literal["debian", "rhel", "unknown"]
# The systems gpuk8s installs on: (os-release ID, VERSION_ID) -> the name users know. Preflight refuses others;
# the playbooks are written for these.
SUPPORTED_OS = {("ubuntu", "22.04"): "Ubuntu 22.04 LTS", ("alinux", "3"): "Alibaba Cloud Linux 3"}
# nodeRegistration.criSocket per cluster.container_runtime: kubeadm's own names for the endpoints
# (cmd/kubeadm/app/constants/constants_unix.go: CRISocketContainerd, CRISocketDocker). Docker is reached
# through cri-dockerd (playbooks/cri-dockerd.yaml), whose socket unit listens on %t/cri-dockerd.sock, i.e.
# /run/cri-dockerd.sock: the same socket, /var/run being a link to /run. Always written: on a Docker host
# containerd's socket exists too, and kubeadm refuses to guess ("found multiple CRI endpoints on the host").
CRI_SOCKETS = {"containerd": "unix:///var/run/containerd/containerd.sock",
               "docker": "unix:///var/run/cri-dockerd.sock"}


# Ubuntu's release codenames (VERSION_ID -> the suite name of its archive and of Docker's repository)
UBUNTU_CODENAMES = {"20.04": "focal", "22.04": "jammy", "24.04": "noble"}


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
class MigProfile:
    """One row of `nvidia-smi mig -lgip`."""

    gpu: int
    name: str  # 1g.10gb, 1g.10gb+me (without the "MIG " prefix)
    id: int
    free: int
    total: int
    memory_gib: str


@dataclass(frozen=True)
class MigGpuInstance:
    """One row of `nvidia-smi mig -lgi`."""

    gpu: int
    profile: str
    profile_id: int
    id: int
    placement: str  # start:size


@dataclass(frozen=True)
class MigComputeInstance:
    """One row of `nvidia-smi mig -lci`."""

    gpu: int
    gi: int
    profile: str
    profile_id: int
    id: int


@dataclass(frozen=True)
class GpuProcess:
    """One row of `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name` (host data: never a trusted pid)."""

    gpu_uuid: str
    pid: int
    name: str


@dataclass(frozen=True)
class MigGPU:
    index: int
    uuid: str
    current: str  # Enabled | Disabled | [N/A] (no MIG on this GPU)
    pending: str
    profiles: tuple[MigProfile, ...] = ()
    instances: tuple[MigGpuInstance, ...] = ()
    computes: tuple[MigComputeInstance, ...] = ()
    processes: tuple[GpuProcess, ...] = ()

    @property
    def capable(self) -> bool:
        return self.current in ("Enabled", "Disabled")


@dataclass(frozen=True)
class MigFacts:
    """MIG per GPU (gpuk8s/facts/mig.py parses the probe's `mig` section)."""

    state: Literal["ok", "absent", "failed"] = "absent"
    gpus: tuple[MigGPU, ...] = ()
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
    enable_cdi: bool | None = None  # the CRI plugin's enable_cdi where written (None: containerd's default)
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
class SourceReach:
    """One source install fetches from, as curl on the host reached it (the probe's `sources` section)."""

    url: str
    exit_status: int  # curl's: 0 an HTTP answer (any status), 6 name not resolved, 7 refused, 28 timed out
    http_code: int  # 0 where nothing answered

    @property
    def reached(self) -> bool:
        return self.exit_status == 0


@dataclass(frozen=True)
class PciDevice:
    """One NVIDIA PCI function as `lspci -Dnn -d 10de:` shows it (host data): a GPU (class 0300/0302) or an
    NVSwitch (class 0680). `name` is what the host's PCI ID database calls it ("GH100 [H100 SXM5 80GB]"), or
    "Device 2330" where that database is older than the device."""

    slot: str
    class_id: int
    device_id: int
    name: str


@dataclass(frozen=True)
class DriverFacts:
    """The NVIDIA driver beyond nvidia-smi (gpuk8s/facts/driver.py parses the probe's `driver` section): what is
    loaded, what is installed, and what runs beside it. None: could not be told."""

    read: bool = False  # the probe's driver section came back (False: an older probe, or it failed)
    pci_gpus: tuple[PciDevice, ...] = ()
    nvswitches: tuple[PciDevice, ...] = ()
    lspci: bool = False  # lspci answered (pci_gpus and nvswitches mean something)
    module_version: str | None = None  # the loaded kernel module's (/proc/driver/nvidia/version)
    module_flavor: Literal["open", "proprietary"] | None = None
    libraries: tuple[str, ...] = ()  # the NVML library versions installed (libnvidia-ml.so.VERSION)
    disk_module_version: str | None = None  # the module a reboot would load (modinfo nvidia)
    module_signer: str | None = None  # its signer ('' unsigned; None unknown or no module on disk)
    secure_boot: bool | None = None  # mokutil --sb-state; None: not an EFI system, or mokutil missing
    kernel_headers: bool | None = None  # /lib/modules/$(uname -r)/build exists (DKMS builds need it)
    fabric_manager: str = "absent"  # systemctl is-active nvidia-fabricmanager: active, inactive, failed, absent
    persistenced: str = "absent"  # the same for nvidia-persistenced
    packages: tuple[tuple[str, str], ...] = ()  # installed driver packages: (name, version)
    held: tuple[str, ...] = ()  # package holds (apt-mark showhold; dnf versionlock entries)
    nouveau_blacklisted: bool = False  # a modprobe.d file says 'blacklist nouveau'

    def package_version(self, prefix: str) -> str | None:
        return next((v for n, v in self.packages if n.startswith(prefix)), None)


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
    cgroup_version: int | None = None  # 2 (cgroup2fs at /sys/fs/cgroup), 1 (tmpfs: v1 or hybrid), None: unknown
    containerd_configd: tuple[str, ...] = ()  # *.toml in /etc/containerd/config.d/ (toolkit 1.18.0's wrong path)
    mig: MigFacts = field(default_factory=MigFacts)  # gpuk8s/facts/mig.py
    # CUDA compute capability per GPU ("8.0"), in index order; () where nvidia-smi cannot tell (drivers before
    # R510 do not know the compute_cap field)
    compute_caps: tuple[str, ...] = ()
    # the sources the inventory names (gpuk8s/mirrors.py sources), as this host reached them; () when not asked
    sources: tuple[SourceReach, ...] = ()
    driver: DriverFacts = field(default_factory=DriverFacts)  # gpuk8s/facts/driver.py
    # the RDMA ports sysfs shows (gpuk8s/facts/fabric.py); None where the probe did not read them
    rdma: tuple[RdmaPort, ...] | None = None
    gids: tuple[Gid, ...] | None = None  # RoCE ports' GID tables (show_gids' rows); None: not read
    netdev_mtu: dict[str, int] | None = None  # the MTU of each RoCE GID's network interface; None: not read
    acs: AcsReading | None = None  # PCIe ACS controls of the devices (lspci -vvv; GK_FABRIC only); None: not read
    topo: Topology | None = None  # nvidia-smi topo -m, read where the inventory sets fabric: (GK_FABRIC)

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
        if self.topo is not None:  # JSON has no tuple keys: GPU -> NIC -> relation
            links: dict[str, dict[str, str]] = {}
            for (gpu, nic), rel in self.topo.links.items():
                links.setdefault(gpu, {})[nic] = rel
            d["topo"]["links"] = links
        return d
