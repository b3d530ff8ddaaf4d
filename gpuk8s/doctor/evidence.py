"""What doctor reads, as plain data (the cluster's objects, each node's host as the probe saw it), and the pure
parsing of a host's probe output. No SSH and no kubectl here: gpuk8s/doctor/diagnose.py reads, and the classifier
(gpuk8s/doctor/classify.py) judges only what this module holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuk8s.driver.xid import is_fatal
from gpuk8s.facts.health import KernelLog, parse_kernel_log
from gpuk8s.facts.model import HostFacts
from gpuk8s.facts.parse import ParseError, parse_probe, split_sections
from gpuk8s.gpuplan import GPUPlan
from gpuk8s.kube.dra import NodeDevices
from gpuk8s.kube.state import DaemonSetState
from gpuk8s.text import clean

DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
# The NVIDIA device plugin's socket for nvidia.com/gpu (its log: "Starting to serve 'nvidia.com/gpu' on
# /var/lib/kubelet/device-plugins/nvidia-gpu.sock"); a MIG resource's is nvidia-mig-<profile>.sock
PLUGIN_SOCKET_PREFIX = "nvidia-"

HAMI_SCHEDULER = "hami-scheduler"
# The toolkit's setting that makes the runtime ignore NVIDIA_VISIBLE_DEVICES in containers without CAP_SYS_ADMIN,
# the device plugin's among them (NVIDIA/k8s-device-plugin issue 856)
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
ENVVAR_UNPRIVILEGED = "accept-nvidia-visible-devices-envvar-when-unprivileged"

@dataclass(frozen=True)
class HostEvidence:
    """A node's host as doctor sees it over SSH; `unreachable` says why it could not be read ('' when read)."""

    facts: HostFacts | None = None
    runtime: str = "containerd"
    sockets: tuple[str, ...] | None = None  # names in /var/lib/kubelet/device-plugins; None: unknown
    dev_char_links: int | None = None  # /dev/char links to NVIDIA devices
    dev_nodes: tuple[str, ...] = ()
    unreachable: str = ""
    envvar_unprivileged: bool | None = None  # the toolkit's accept-...-envvar-when-unprivileged; None: not set
    kernel: KernelLog | None = None  # the kernel's Xid lines since boot (gpuk8s/facts/health.py); None: not read

    @property
    def runtime_default(self) -> str | None:
        if self.facts is None:
            return None
        if self.runtime == "docker":
            return self.facts.docker_daemon.default_runtime or "runc"
        return self.facts.containerd_config.default_runtime or "runc"

    @property
    def systemd_cgroup(self) -> bool | None:
        if self.facts is None:
            return None
        if self.runtime == "docker":
            return self.facts.docker_daemon.cgroup_driver == "systemd" if self.facts.docker_daemon.present else None
        return self.facts.containerd_config.systemd_cgroup

    @property
    def driver_problem(self) -> str:
        f = self.facts
        if f is None or f.gpu.state == "ok":
            return ""
        return f.gpu.error or f.gpu.state

    def lines(self) -> list[str]:
        """The host's evidence, one line each."""
        if self.unreachable:
            return [f"over SSH: {self.unreachable}"]
        f = self.facts
        out = []
        if f is not None:
            if f.gpu.state == "ok":
                out.append(f"nvidia-smi: {len(f.gpu.gpus)} GPU(s), driver {f.gpu.driver or '?'}"
                           + (f", CUDA {f.gpu.cuda_version}" if f.gpu.cuda_version else ""))
            else:
                out.append(f"nvidia-smi: {self.driver_problem}")
            d = f.driver
            if d.read and (d.module_version or d.libraries):
                out.append(f"driver: module {d.module_version or 'not loaded'}"
                           + (f" ({d.module_flavor})" if d.module_flavor else "")
                           + f", libraries {', '.join(d.libraries) or 'none'}")
            if d.read and d.nvswitches:
                out.append(f"{len(d.nvswitches)} NVSwitch(es); nvidia-fabricmanager {d.fabric_manager}")
            out.append(f"{self.runtime} default runtime: {self.runtime_default}")
            out.append(f"nvidia-container-toolkit: {f.nvidia_ctk or 'not installed (no nvidia-ctk)'}")
        if self.sockets is not None:
            out.append(f"{DEVICE_PLUGINS}: " + (", ".join(self.sockets) or "empty"))
        if self.envvar_unprivileged is False:
            out.append(f"{TOOLKIT_CONFIG}: {ENVVAR_UNPRIVILEGED} = false")
        if self.kernel is not None:  # each Xid's first line, those that need a reset or a reboot first
            firsts = sorted(self.kernel.firsts, key=lambda ec: not is_fatal(ec[0]))
            out += [f"kernel: {e.line}" + (f" (x{c})" if c > 1 else "") for e, c in firsts[:6]]
            out += [f"kernel: GPU {b} fell off the bus" for b in self.kernel.fallen
                    if not any(e.bus == b and e.xid == 79 for e in self.kernel.xids)]
        return out


def parse_host(stdout: str, runtime: str) -> HostEvidence:
    try:
        facts = parse_probe(stdout)
    except ParseError as e:
        return HostEvidence(unreachable=f"the probe printed nothing usable: {e}", runtime=runtime)
    s = split_sections(stdout)

    def out(name: str) -> str | None:
        sec = s.get(name)
        return sec.output if sec is not None else None

    socks = out("doctor-sockets")
    dc = (out("doctor-devchar") or "").strip()
    nodes = out("doctor-devnodes") or ""
    envvar = None
    for line in (out("doctor-toolkit") or "").splitlines():
        key, _, value = line.partition("=")
        value = value.split("#", 1)[0].strip()  # a comment after the value
        if key.strip().strip('"') == ENVVAR_UNPRIVILEGED and value in ("true", "false"):
            envvar = value == "true"
    klog = s.get("health-kernel")
    return HostEvidence(facts, runtime,
                        tuple(clean(x) for x in socks.split() if x) if socks is not None else None,
                        int(dc) if dc.isdigit() else None, tuple(clean(x) for x in nodes.split() if x),
                        envvar_unprivileged=envvar,
                        kernel=parse_kernel_log(klog.output) if klog is not None and klog.ok else None)


@dataclass
class ClusterEvidence:
    """What doctor read from the cluster (and the hosts) for one diagnosis."""

    nodes: dict[str, dict[str, Any]]
    pods: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    plans: dict[str, GPUPlan] = field(default_factory=dict)
    plugin: DaemonSetState | None = None
    configs: tuple[str, ...] | None = None  # the device plugin ConfigMap's config names; None: no ConfigMap
    hami_scheduler: bool = False  # HAMi's scheduler Deployment exists
    logs: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, pod) -> its log tail
    hosts: dict[str, HostEvidence] = field(default_factory=dict)
    # DRA (docs/dra.md), read only where a node or a pod uses it: each node's published devices and the claims
    # holding them, and the claim templates by (namespace, name) as the API returned them (hostile: read typed)
    dra: dict[str, NodeDevices] | None = None
    claim_templates: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods if (p.get("metadata") or {}).get("name") == name
                     and (p.get("metadata") or {}).get("namespace", "default") == namespace), None)


