"""Load and validate an inventory file, reporting every problem with file:line:column.

The YAML is composed into nodes (not constructed into Python objects) so that each
value keeps its position in the file; validation walks those nodes and collects
problems instead of stopping at the first one. Nothing here touches the network.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpuk8s import versions
from gpuk8s.errors import GpuK8sError
from gpuk8s.inventory import sshconfig
from gpuk8s.inventory.model import (
    ALLOCATORS,
    DRIVER_FLAVORS,
    DRIVER_SOURCES,
    FABRIC_LINK_LAYERS,
    GPUDIRECT_MODES,
    MAX_REPLICAS,
    MIG_STRATEGIES,
    SHARING_STRATEGIES,
    AllocatorSetting,
    Bastion,
    Cluster,
    DriverSettings,
    FabricSettings,
    GPUSharing,
    HealthSettings,
    Host,
    InstallSettings,
    Inventory,
    MIGSettings,
    MonitoringSettings,
    NodeGPUSettings,
    PreflightSettings,
    Problem,
    RegistrySettings,
    SSHSettings,
    Sudo,
    Taint,
)
from gpuk8s.mig import layout as miglayout
from gpuk8s.text import ascii_int

ENV_VAR = "GPUK8S_INVENTORY"
DEFAULT_FILE = "inventory.yaml"

_STR_TAG = "tag:yaml.org,2002:str"
_NULL_TAG = "tag:yaml.org,2002:null"

# RFC 1123 subdomain: what Kubernetes accepts as a node name.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_K8S_VERSION = re.compile(r"^v?(1)\.(\d{1,3})(?:\.(\d{1,3}))?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_TAINT = re.compile(r"^(?P<key>[^=:\s]+)(=(?P<value>[^:\s]*))?:(?P<effect>[A-Za-z]+)$")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_CHECK_ID = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_SSH_ALIAS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$")

_CLUSTER_KEYS = (
    "name", "kubernetes_version", "pod_cidr", "service_cidr", "cni", "container_runtime",
    "control_plane_endpoint",
)
_SSH_KEYS = (
    "user", "port", "identity_file", "known_hosts", "connect_timeout", "command_timeout",
    "host_key_policy", "bastion", "sudo", "config_file", "alias",
)
_SUDO_KEYS = ("mode", "password_env", "prompt")
_BASTION_KEYS = ("address", "user", "port", "identity_file")
# Per-node GPU settings: each key may be written on a host, in a gpu_groups entry or in gpu_defaults, and is
# taken whole from the first of those that sets it. A new per-node GPU setting (issue 18's `mig`) adds its key
# here, its field to model.NodeGPUSettings, and its reader to _Reader.node_gpu_readers.
_NODE_GPU_KEYS = ("gpu_sharing", "mig", "driver", "allocator", "fabric")
_NODE_GPU_FIELDS = {"gpu_sharing": "sharing", "mig": "mig", "driver": "driver",
                    "allocator": "allocator", "fabric": "fabric"}  # key -> NodeGPUSettings field
_FABRIC_KEYS = ("link_layer", "nics", "gpudirect", "expect")
_FABRIC_EXPECT_KEYS = ("ports", "rate")
_RDMA_DEVICE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# the rates an InfiniBand or RoCE port reports (Gb/s): what `expect.rate` is compared with
FABRIC_RATES = (10, 20, 25, 40, 50, 56, 100, 200, 400, 800, 1600)
_DRIVER_KEYS = ("manage", "branch", "flavor", "source")
_MIG_KEYS = ("strategy", "config")
_MIG_ENTRY_KEYS = ("devices", "mig-enabled", "mig-devices")  # nvidia-mig-parted's names
_SHARING_KEYS = ("strategy", "replicas", "rename", "fail_requests_greater_than_one", "pod_memory_mib")
_HOST_KEYS = ("name", "address", "role", "ssh", "labels", "taints", "gpus", "gpu_group", *_NODE_GPU_KEYS)
_PREFLIGHT_KEYS = ("min_bandwidth_gbit", "max_rtt_ms", "max_clock_skew_s", "network_test_seconds", "ignore")
_INSTALL_KEYS: tuple[str, ...] = ("toolkit_version", "toolkit_repo", "kubernetes_repo", "package_lock_timeout",
                 "device_plugin_version", "calico_manifest", "flannel_manifest", "calico_manifest_sha256",
                 "flannel_manifest_sha256", "verify_image", "containerd_version", "containerd_repo",
                 "driver_repo", "driver_apt_repo")
# A repository written as a mapping: a mirror without TLS is allowed only with the signing key pinned.
_REPO_KEYS = ("url", "insecure_http", "key_fingerprint")
_REPOS = ("toolkit_repo", "kubernetes_repo", "containerd_repo", "driver_repo", "driver_apt_repo")
_MANIFESTS = ("calico_manifest", "flannel_manifest")
# cri-dockerd on Docker hosts: a mirror of its release directory (plain http too: the archive's sha256 is
# always checked on the host) and the sha256 per architecture, {amd64: ..., arm64: ...}
_INSTALL_KEYS += ("cri_dockerd_url", "cri_dockerd_sha256")
_IMAGE_TAG = re.compile(r"^v?[0-9][A-Za-z0-9._-]{0,63}$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[0-9]+)?(/[a-z0-9._-]+)*(:[A-Za-z0-9._-]{1,128})?$")
_TOP_KEYS: tuple[str, ...] = ("cluster", "ssh", "hosts", "preflight", "install", "gpu_defaults", "gpu_groups")
_TOP_KEYS += ("monitoring",)
_TOP_KEYS += ("registry",)
_TOP_KEYS += ("health",)
_HEALTH_KEYS = ("before_join", "on_failure")
# registry: (docs/mirrors.md; gpuk8s/mirrors.py turns it into image references and manifest URLs)
_REGISTRY_KEYS = ("mirror", "overrides", "manifests", "credentials", "insecure_http", "ca_file")
_CREDENTIAL_KEYS = ("env", "file")
# host[:port][/path] of a registry (a mirror's repository prefix): no scheme, lowercase path, no tag
_REGISTRY_REPO = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
_REGISTRY_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$")
_HOST_PATH = re.compile(r"^/[A-Za-z0-9._/-]{0,255}$")
_MONITORING_KEYS = ("enabled", "namespace", "prometheus", "retention", "storage_class", "storage_size", "grafana",
                    "prometheus_namespace")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a namespace name (RFC 1123 label)
_DURATION = re.compile(r"^([0-9]{1,6}(ms|s|m|h|d|w|y))+$")  # a Prometheus duration: 15d, 12h, 1y
_QUANTITY = re.compile(r"^[0-9]{1,9}(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")  # a storage quantity: 20Gi
# Repository URLs reach a shell and files on every host: a strict subset of URL syntax, no shell metacharacters.
_REPO_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~:/%+@=-]*)?$")
_PKG_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~-]{0,63}$")
_FINGERPRINT = re.compile(r"^[0-9A-F]{40}$")  # an OpenPGP v4 fingerprint, spaces and 0x removed
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# An inventory is a few kilobytes; this much is read at most (`-i /dev/zero` must not eat the memory).
MAX_BYTES = 4 << 20
_SECRET_KEYS = ("password", "sudo_password", "passphrase", "token")

_MISSING = object()
_Layer = dict[str, tuple[Any, Node]]  # per-node GPU settings of one layer: key -> (value, where it was read)


class InventoryError(GpuK8sError):
    """The inventory cannot be used; `problems` holds every error (and warning) found, each with its file:line
    and fix."""

    kind = "inventory"

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if p.severity == "error"]
        super().__init__("\n".join(str(p) for p in errors) or "invalid inventory",
                         "fix each problem at its file:line (gpuk8s inventory validate lists them)")


def find_inventory(explicit: str | os.PathLike[str] | None) -> Path:
    """The conventional search: -i, then $GPUK8S_INVENTORY, then ./inventory.yaml."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path(DEFAULT_FILE)


def load(path: str | os.PathLike[str]) -> Inventory:
    p = Path(path)
    try:
        # at most MAX_BYTES + 1 bytes: a device, a FIFO or a huge file is read only that far
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise InventoryError(
            [Problem(str(p), 0, 0, "", f"cannot read the inventory: {reason}",
                     f"pass -i FILE, set ${ENV_VAR}, or run 'gpuk8s inventory init'")]
        ) from None
    return loads(data, str(p))


def loads(text: str | bytes, filename: str = "<inventory>") -> Inventory:
    """Parse and validate; raise InventoryError listing every problem, or return the inventory."""
    if len(text) > MAX_BYTES:
        raise InventoryError([_too_large(filename)])
    if isinstance(text, bytes):
        raw = text
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            raise InventoryError(
                [Problem(filename, line, 1, "", "the file is not valid UTF-8", "save the file as UTF-8")]
            ) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise InventoryError(
            [Problem(filename, line, col, "", f"YAML syntax error: {what}",
                     "check indentation, colons and quotes around this position")]
        ) from None
    except yaml.YAMLError as e:
        raise InventoryError(
            [Problem(filename, 1, 1, "", f"YAML error: {e}", "remove unprintable or control characters")]
        ) from None
    except RecursionError:
        raise InventoryError(
            [Problem(filename, 1, 1, "", "YAML nested too deeply", "an inventory needs only a few levels")]
        ) from None
    reader = _Reader(filename)
    inventory = reader.inventory(node)
    reader.problems.sort(key=lambda p: (p.line, p.column))
    errors = [p for p in reader.problems if p.severity == "error"]
    if errors or inventory is None:
        raise InventoryError(reader.problems)
    return replace(inventory, warnings=tuple(p for p in reader.problems if p.severity == "warning"))


def _too_large(filename: str) -> Problem:
    return Problem(filename, 1, 1, "", f"the inventory is larger than {MAX_BYTES >> 20} MiB",
                   "an inventory is a few kilobytes: check that -i (or $GPUK8S_INVENTORY) names the inventory "
                   "file, not a device, a log or an archive")


class _Reader:
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.problems: list[Problem] = []

    # -- reporting -------------------------------------------------------
    def report(self, node: Node | None, key: str, message: str, fix: str, severity: str = "error") -> None:
        line, col = (node.start_mark.line + 1, node.start_mark.column + 1) if node is not None else (1, 1)
        self.problems.append(Problem(self.filename, line, col, key, message, fix, severity))  # type: ignore[arg-type]

    # -- structure -------------------------------------------------------
    def mapping(self, node: Node, key: str, allowed: tuple[str, ...]) -> dict[str, tuple[Node, Node]] | None:
        if not isinstance(node, MappingNode):
            self.report(node, key, f"expected a mapping of keys, got {_kind(node)}",
                        f"write it as 'key: value' lines; valid keys: {', '.join(allowed)}")
            return None
        out: dict[str, tuple[Node, Node]] = {}
        for knode, vnode in node.value:
            if not (isinstance(knode, ScalarNode) and knode.tag == _STR_TAG):
                self.report(knode, key, f"keys must be plain names, got {_kind(knode)}",
                            f"valid keys: {', '.join(allowed)}")
                continue
            name = knode.value
            path = f"{key}.{name}" if key else name
            if name in out:
                first = out[name][0].start_mark.line + 1
                self.report(knode, path, f"duplicate key (first set on line {first})", "keep only one of them")
                continue
            if name not in allowed:
                if name.lower() in _SECRET_KEYS:
                    self.report(knode, path, "secrets must not be written in the inventory",
                                "remove it; set sudo.password_env to the name of an environment variable "
                                "holding the password (default GPUK8S_SUDO_PASSWORD), or sudo.prompt: true")
                else:
                    near = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
                    fix = f"did you mean '{near[0]}'?" if near else f"valid keys here: {', '.join(allowed)}"
                    self.report(knode, path, f"unknown key '{name}'", fix)
                continue
            out[name] = (knode, vnode)
        return out

    def value(self, node: Node, key: str) -> Any:
        if not isinstance(node, ScalarNode):
            self.report(node, key, f"expected a single value, got {_kind(node)}", "write a single value")
            return _MISSING
        try:
            return SafeConstructor().construct_object(node)
        except Exception:  # a malformed timestamp, say: report it, never crash
            self.report(node, key, f"cannot read the value {node.value!r}", "quote it to make it a string")
            return _MISSING

    def string(self, node: Node, key: str, pattern: re.Pattern[str] | None = None,
               fix: str = "", what: str = "") -> str | None:
        v = self.value(node, key)
        if v is _MISSING:
            return None
        if not isinstance(v, str):
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.report(node, key, f"expected text, got the number {node.value}",
                            f"quote it: \"{node.value}\"")
            else:
                self.report(node, key, f"expected text, got {_kind(node)}", fix or "write it as text")
            return None
        if "\x00" in v or "\n" in v or "\r" in v:
            self.report(node, key, "contains a line break or NUL character", "write it on one line")
            return None
        if pattern is not None and not pattern.match(v):
            self.report(node, key, f"{v!r} is not a valid {what or 'value'}", fix)
            return None
        return v

    def integer(self, node: Node, key: str, lo: int, hi: int) -> int | None:
        v = self.value(node, key)
        if v is _MISSING:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.report(node, key, f"expected a whole number, got {node.value!r}", f"write a number from {lo} to {hi}")
            return None
        if not lo <= v <= hi:
            self.report(node, key, f"{v} is out of range", f"write a number from {lo} to {hi}")
            return None
        return v

    def number(self, node: Node, key: str, lo: float, hi: float) -> float | None:
        v = self.value(node, key)
        if v is _MISSING:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            self.report(node, key, f"expected a number, got {node.value!r}", f"write a number from {lo} to {hi}")
            return None
        if not lo <= v <= hi:
            self.report(node, key, f"{v} is out of range", f"write a number from {lo} to {hi}")
            return None
        return float(v)

    def boolean(self, node: Node, key: str) -> bool | None:
        v = self.value(node, key)
        if v is _MISSING:
            return None
        if not isinstance(v, bool):
            self.report(node, key, f"expected true or false, got {node.value!r}", "write true or false")
            return None
        return v

    def choice(self, node: Node, key: str, options: tuple[str, ...]) -> str | None:
        # the word as written: YAML 1.1 reads a plain off, on, yes or no as a boolean (gpudirect: off)
        if isinstance(node, ScalarNode) and not node.style and node.value in options:
            return str(node.value)
        v = self.value(node, key)
        if v is _MISSING:
            return None
        if not isinstance(v, str) or v not in options:
            near = difflib.get_close_matches(str(v), options, n=1, cutoff=0.5)
            fix = f"did you mean '{near[0]}'?" if near else f"write one of: {', '.join(options)}"
            self.report(node, key, f"{node.value!r} is not one of {', '.join(options)}", fix)
            return None
        return v

    def whole(self, node: Node, key: str, allowed: tuple[str, ...], readers: Mapping[str, Callable[[Node, str], Any]]
              ) -> tuple[dict[str, tuple[Node, Node]], dict[str, Any]] | None:
        """A mapping read whole: its entries and the values read; None where it is no mapping or a value is invalid
        (each reported by its reader)."""
        m = self.mapping(node, key, allowed)
        if m is None:
            return None
        got = self.fields(node, key, allowed, readers, m)
        if any(k not in got and not _is_null(v) for k, (_, v) in m.items()):
            return None
        return m, got

    def fields(self, node: Node, key: str, allowed: tuple[str, ...],
               readers: Mapping[str, Callable[[Node, str], Any]],
               m: dict[str, tuple[Node, Node]] | None = None) -> dict[str, Any]:
        """Read a mapping with one reader per key; keys that are null or invalid are left out."""
        if m is None:
            m = self.mapping(node, key, allowed)
        out: dict[str, Any] = {}
        for name, (_k, v) in (m or {}).items():
            if isinstance(v, ScalarNode) and v.tag == _NULL_TAG:
                continue
            got = readers[name](v, f"{key}.{name}" if key else name)
            if got is not None:
                out[name] = got
        return out

    # -- sections --------------------------------------------------------
    def inventory(self, node: Node | None) -> Inventory | None:
        if node is None:
            self.report(None, "", "the inventory is empty",
                        "run 'gpuk8s inventory init' for a commented starter")
            return None
        top = self.mapping(node, "", _TOP_KEYS)
        if top is None:
            return None
        cluster = self.cluster(top["cluster"][1]) if "cluster" in top else Cluster()
        ssh = self.ssh(top["ssh"][1], "ssh", SSHSettings()) if "ssh" in top else SSHSettings()
        preflight = self.preflight(top["preflight"][1]) if "preflight" in top else PreflightSettings()
        # the versions install.* defaults to are the version matrix's pins for the cluster's minor
        pins = versions.install_defaults(cluster.kubernetes_version)
        install = self.install(top["install"][1], pins) if "install" in top else InstallSettings(**pins)
        if "hosts" not in top:
            self.report(node, "hosts", "no hosts are listed",
                        "add a 'hosts:' list with at least one host whose role is control-plane")
            return None
        defaults = self.node_gpu(top["gpu_defaults"][1], "gpu_defaults") if "gpu_defaults" in top else {}
        groups = self.gpu_groups(top["gpu_groups"][1]) if "gpu_groups" in top else {}
        hosts = self.hosts(top["hosts"][1], ssh, defaults, groups)
        self.ssh_configs(hosts)
        self.sharing_across(hosts, install)
        self.allocator_across(hosts, cluster)
        monitoring = self.monitoring(top["monitoring"][1]) if "monitoring" in top else MonitoringSettings()
        registry = self.registry(top["registry"][1], cluster, install) if "registry" in top else RegistrySettings()
        health = self.health(top["health"][1]) if "health" in top else HealthSettings()
        return Inventory(Path(self.filename), cluster, ssh, tuple(hosts), preflight, install,
                         monitoring=monitoring, registry=registry, health=health)

    def cluster(self, node: Node) -> Cluster:
        readers: dict[str, Callable[[Node, str], Any]] = {
            "name": lambda n, k: self.string(n, k, _NODE_NAME, "lowercase letters, digits and '-'", "cluster name"),
            "kubernetes_version": self.k8s_version,
            "pod_cidr": self.cidr,
            "service_cidr": self.cidr,
            "cni": lambda n, k: self.choice(n, k, ("calico", "flannel")),
            "container_runtime": lambda n, k: self.choice(n, k, ("containerd", "docker")),
            "control_plane_endpoint": self.endpoint,
        }
        got = self.fields(node, "cluster", _CLUSTER_KEYS, readers)
        cluster = Cluster(**got)
        if "pod_cidr" in got and "service_cidr" in got:
            pod = ipaddress.ip_network(cluster.pod_cidr)
            svc = ipaddress.ip_network(cluster.service_cidr)
            if pod.version == svc.version and pod.overlaps(svc):
                self.report(node, "cluster.service_cidr", f"{svc} overlaps the pod CIDR {pod}",
                            "choose ranges that do not overlap, e.g. pod 10.244.0.0/16 and service 10.96.0.0/12")
        return cluster

    def k8s_version(self, node: Node, key: str) -> str | None:
        """"1.N" or "1.N.P" with 1.N a minor of the version matrix (gpuk8s/data/versions.yaml)."""
        example = f'"{versions.default_minor()}"'
        v = self.value(node, key)
        if isinstance(v, float):
            self.report(node, key, f"{node.value} was read as a number, which loses digits ({node.value} becomes "
                        f"{v:g})", f"quote it: \"{node.value}\"")
            return None
        s = self.string(node, key)
        if s is None:
            return None
        m = _K8S_VERSION.match(s)
        if not m:
            self.report(node, key, f"{s!r} is not a Kubernetes version",
                        f"write the minor version, e.g. {example}, or a patch release of it")
            return None
        minor = f"1.{int(m.group(2))}"
        if versions.kubernetes(minor) is None:
            self.report(node, key, f"gpuk8s does not install Kubernetes {minor}; the minors it installs are "
                        f"{', '.join(reversed(versions.supported_minors()))}",
                        f"write one of them, e.g. {example} (the default); 'gpuk8s versions' shows each with its "
                        "end of life and what it installs")
            return None
        return minor + (f".{int(m.group(3))}" if m.group(3) else "")

    def cidr(self, node: Node, key: str) -> str | None:
        s = self.string(node, key)
        if s is None:
            return None
        try:
            return str(ipaddress.ip_network(s, strict=True))
        except ValueError as e:
            self.report(node, key, f"{s!r} is not a network in CIDR form ({e})", "write e.g. 10.244.0.0/16")
            return None

    def endpoint(self, node: Node, key: str) -> str | None:
        s = self.string(node, key)
        if s is None:
            return None
        host, _, port = s.rpartition(":") if s.count(":") == 1 else (s, "", "")
        if not _valid_address(host) or (port and not 0 < (ascii_int(port, 5) or 0) < 65536):
            self.report(node, key, f"{s!r} is not an address with an optional port",
                        "write e.g. k8s-api.example.com:6443 or 10.0.0.10")
            return None
        return s

    def address(self, node: Node, key: str) -> str | None:
        s = self.string(node, key)
        if s is None:
            return None
        if not _valid_address(s):
            self.report(node, key, f"{s!r} is neither an IP address nor a host name",
                        "write an IPv4/IPv6 address or a DNS name")
            return None
        return s

    def path(self, node: Node, key: str) -> str | None:
        return self.string(node, key)

    def port(self, node: Node, key: str) -> int | None:
        return self.integer(node, key, 1, 65535)

    def user(self, node: Node, key: str) -> str | None:
        return self.string(node, key, _USER, "a POSIX user name, e.g. ubuntu", "user name")

    def ssh(self, node: Node, key: str, base: SSHSettings) -> SSHSettings:
        readers: dict[str, Callable[[Node, str], Any]] = {
            "user": self.user,
            "port": self.port,
            "identity_file": self.path,
            "known_hosts": self.path,
            "connect_timeout": lambda n, k: self.number(n, k, 0.1, 3600),
            "command_timeout": lambda n, k: self.number(n, k, 1, 86400),
            "host_key_policy": lambda n, k: self.choice(n, k, ("strict", "accept-new")),
            "bastion": self.bastion,
            "sudo": lambda n, k: self.sudo(n, k, base.sudo),
            "config_file": self.ssh_config_file,
            "alias": lambda n, k: self.string(n, k, _SSH_ALIAS, "a name of your ssh config's Host lines, e.g. gpu-01",
                                              "ssh alias"),
        }
        got = self.fields(node, key, _SSH_KEYS, readers)
        return replace(base, **got, explicit=base.explicit | frozenset(got))

    def ssh_config_file(self, node: Node, key: str) -> str | None:
        """An OpenSSH client config to read, or none; a file named here must exist."""
        s = self.path(node, key)
        if s is None or s.lower() == "none":
            return s
        if not os.path.isfile(os.path.expanduser(s)):
            self.report(node, key, f"the ssh config {s!r} does not exist",
                        "name an existing file, or write config_file: none to read no ssh config")
            return None
        return s

    def ssh_configs(self, hosts: list[Host]) -> None:
        """Each host's ssh config (~/.ssh/config unless ssh.config_file says otherwise): its errors, and the
        keywords that apply to a host but that gpuk8s does not honour, as problems at the config's file:line."""
        seen: set[tuple[str, int, str]] = set()
        for h in hosts:
            try:
                notes: tuple[Any, ...] = sshconfig.resolve(h.address, h.ssh, h.ssh.alias).notes
            except sshconfig.SSHConfigError as e:
                if (e.file, e.line, e.message) not in seen:
                    seen.add((e.file, e.line, e.message))
                    self.problems.append(Problem(e.file or self.filename, e.line, 1, "", e.message,
                                                 e.remedy or "fix the ssh config"))
                continue
            for n in notes:
                if (n.file, n.line, n.key) not in seen:
                    seen.add((n.file, n.line, n.key))
                    self.problems.append(Problem(n.file, n.line, 1, n.key, n.message, n.fix, "warning"))

    def sudo(self, node: Node, key: str, base: Sudo) -> Sudo:
        readers: dict[str, Callable[[Node, str], Any]] = {
            "mode": lambda n, k: self.choice(n, k, ("nopasswd", "password")),
            "password_env": lambda n, k: self.string(
                n, k, _ENV_NAME, "the NAME of an environment variable, e.g. GPUK8S_SUDO_PASSWORD",
                "environment variable name"),
            "prompt": self.boolean,
        }
        return replace(base, **self.fields(node, key, _SUDO_KEYS, readers))

    def bastion(self, node: Node, key: str) -> Bastion | None:
        readers: dict[str, Callable[[Node, str], Any]] = {
            "address": self.address, "user": self.user, "port": self.port, "identity_file": self.path,
        }
        m = self.mapping(node, key, _BASTION_KEYS)
        got = self.fields(node, key, _BASTION_KEYS, readers, m)
        if m is None:
            return None
        missing = [k for k in ("address", "user") if k not in m]  # present but invalid: reported by its reader
        if missing:
            self.report(node, key, f"the bastion needs {' and '.join(missing)}",
                        "write e.g. bastion: {address: jump.example.com, user: ops}")
        if missing or any(k not in got for k in ("address", "user")):
            return None
        return Bastion(**got)

    def preflight(self, node: Node) -> PreflightSettings:
        readers: dict[str, Callable[[Node, str], Any]] = {
            "min_bandwidth_gbit": lambda n, k: self.number(n, k, 0, 10000),
            "max_rtt_ms": lambda n, k: self.number(n, k, 0, 100000),
            "max_clock_skew_s": lambda n, k: self.number(n, k, 0, 86400),
            "network_test_seconds": lambda n, k: self.number(n, k, 0, 60),
            "ignore": self.check_ids,
        }
        return PreflightSettings(**self.fields(node, "preflight", _PREFLIGHT_KEYS, readers))

    def health(self, node: Node) -> HealthSettings:
        """The health section (docs/health.md): the check before a node joins and what a failure does."""
        readers: dict[str, Callable[[Node, str], Any]] = {
            # YAML 1.1 reads a bare off as false: that is what the user wrote
            "before_join": lambda n, k: "off" if self.value(n, k) is False else self.choice(
                n, k, ("quick", "standard", "long", "fabric", "off")),
            "on_failure": lambda n, k: self.choice(n, k, ("quarantine", "skip", "fail")),
        }
        return HealthSettings(**self.fields(node, "health", _HEALTH_KEYS, readers))

    def monitoring(self, node: Node) -> MonitoringSettings:
        """The monitoring section (docs/monitoring.md): every value reaches manifests or kubectl's argv."""
        readers: dict[str, Callable[[Node, str], Any]] = {
            "enabled": self.boolean,
            "namespace": lambda n, k: self.string(n, k, _DNS_LABEL, "a namespace name: lowercase letters, digits "
                                                  "and '-', at most 63, e.g. gpu-monitoring", "namespace"),
            "prometheus": lambda n, k: self.choice(n, k, ("auto", "deploy", "servicemonitor", "none")),
            "retention": lambda n, k: self.string(n, k, _DURATION, "a Prometheus duration, e.g. 15d or 12h",
                                                  "duration"),
            "storage_class": lambda n, k: self.string(n, k, _NODE_NAME, "the name of a StorageClass "
                                                      "(kubectl get storageclass)", "storage class name"),
            "storage_size": lambda n, k: self.string(n, k, _QUANTITY, "a size, e.g. 20Gi", "size"),
            "grafana": self.boolean,
            "prometheus_namespace": lambda n, k: self.string(
                n, k, _DNS_LABEL, "the namespace of your Prometheus resource (kubectl get prometheus -A), e.g. "
                "monitoring", "namespace"),
        }
        return MonitoringSettings(**self.fields(node, "monitoring", _MONITORING_KEYS, readers))

    def install(self, node: Node, pins: versions.InstallPins) -> InstallSettings:
        """The install section; `pins` are the defaults of the cluster's minor (versions.install_defaults)."""
        url_fix = "write an https URL without spaces or quotes, e.g. https://mirror.example.com/libnvidia-container"
        readers: dict[str, Callable[[Node, str], Any]] = {
            "toolkit_version": lambda n, k: self.string(
                n, k, _PKG_VERSION,
                f"a package version as the repository spells it, e.g. \"{pins['toolkit_version']}\"",
                "package version"),
            "toolkit_repo": lambda n, k: self.repo(n, k, url_fix),
            "kubernetes_repo": lambda n, k: self.repo(n, k, "write e.g. https://pkgs.k8s.io/core:/stable:"),
            "driver_repo": lambda n, k: self.repo(
                n, k, "write e.g. https://developer.download.nvidia.com/compute/cuda/repos/rhel8 (a mirror with "
                "x86_64/ and sbsa/ below it)"),
            "driver_apt_repo": lambda n, k: self.repo(
                n, k, "write e.g. https://mirror.example.com/ubuntu (a mirror of Ubuntu's archive with "
                "CODENAME-updates restricted, as Ubuntu signs it: the hosts verify it with their Ubuntu keyring)"),
            "containerd_version": lambda n, k: self.string(
                n, k, _PKG_VERSION,
                f"a containerd.io package version, e.g. \"{versions.matrix().containerd_version}\"",
                "package version"),
            "containerd_repo": lambda n, k: self.repo(
                n, k, "write e.g. https://download.docker.com/linux (a mirror with ubuntu/ and rhel/ below it)"),
            "package_lock_timeout": lambda n, k: self.integer(n, k, 0, 3600),
            "device_plugin_version": lambda n, k: self.string(n, k, _IMAGE_TAG,
                                                              f"an image tag, e.g. {pins['device_plugin_version']}",
                                                              "tag"),
            "calico_manifest": lambda n, k: self.url(n, k, "an https URL of calico.yaml, or of your mirror"),
            "flannel_manifest": lambda n, k: self.url(n, k, "an https URL of kube-flannel.yml, or of your mirror"),
            "calico_manifest_sha256": self.sha256,
            "flannel_manifest_sha256": self.sha256,
            "verify_image": lambda n, k: self.string(n, k, _IMAGE, "an image reference, e.g. "
                                                     f"{versions.matrix().cuda_test_images[0]}", "image"),
            "cri_dockerd_url": lambda n, k: self.url(n, k, "the URL of a directory holding cri-dockerd's release "
                                                     f"archives, e.g. {versions.cri_dockerd().url}"),
            "cri_dockerd_sha256": self.arch_sha256,
        }
        m = self.mapping(node, "install", _INSTALL_KEYS)
        got = self.fields(node, "install", _INSTALL_KEYS, readers, m)
        for name in _REPOS:
            if name in got:
                got[name], got[f"{name}_insecure_http"], got[f"{name}_key_fingerprint"] = got[name]
        # A manifest is applied as cluster-admin: over plain http only when its sha256 is pinned.
        for name in _MANIFESTS:
            url = got.get(name)
            if m and url and not url.startswith("https://") and not got.get(f"{name}_sha256"):
                self.report(m[name][1], f"install.{name}",
                            f"{url!r} is plain http: this manifest is applied as cluster-admin, and anyone on "
                            "the network path could change it",
                            f"use https://...; a mirror without TLS needs install.{name}_sha256: the sha256 "
                            "of the file (64 hex digits, from sha256sum)")
                del got[name]
        return InstallSettings(**{**pins, **got})

    def registry(self, node: Node, cluster: Cluster, install: InstallSettings) -> RegistrySettings:
        """The registry section (docs/mirrors.md): mirrors of the image registries and of the CNI manifests.

        Every value reaches files and shells on the hosts; the credentials are only named here (an
        environment variable or a local file), never written.
        """
        repo_fix = ("write host[:port][/path] without https://, e.g. registry.example.cn/k8s (lowercase path, "
                    "no tag)")
        readers: dict[str, Callable[[Node, str], Any]] = {
            "mirror": lambda n, k: self.registry_repo(n, k, repo_fix),
            "overrides": self.registry_overrides,
            "manifests": lambda n, k: self.url(n, k, "the URL of a directory holding the manifests as "
                                               "HOST/PATH below it, e.g. https://mirror.example.cn/manifests"),
            "credentials": self.registry_credentials,
            "insecure_http": self.boolean,
            "ca_file": lambda n, k: self.string(n, k, _HOST_PATH, "an absolute path on the hosts, e.g. "
                                                "/etc/pki/ca-trust/source/anchors/mirror.crt", "path"),
        }
        before = len(self.problems)
        m = self.mapping(node, "registry", _REGISTRY_KEYS)
        got = self.fields(node, "registry", _REGISTRY_KEYS, readers, m)
        creds = got.pop("credentials", (None, None))
        out = RegistrySettings(**got, credentials_env=creds[0], credentials_file=creds[1],
                               line=node.start_mark.line + 1)
        if m is None:
            return out
        if len(self.problems) == before and not out.enabled and any(
                k in m for k in ("credentials", "insecure_http", "ca_file")):
            self.report(node, "registry", "credentials, insecure_http and ca_file apply to a mirror, and none "
                        "is set", "add 'mirror: registry.example.cn/k8s' (or overrides:)")
        if out.insecure_http and "credentials" in m and (out.credentials_env or out.credentials_file):
            # hosts.toml would send them as a Basic header to the http mirror: to anyone on the network path
            self.report(m["credentials"][1], "registry.credentials",
                        "refused with insecure_http: every node would send the mirror's user:password over plain "
                        "http (a Basic header anyone on the network path can read)",
                        "serve the mirror over https (ca_file for a private CA) and remove insecure_http, or remove "
                        "credentials and let the mirror serve anonymous pulls")
        if out.insecure_http and out.ca_file:
            self.report(m["ca_file"][1], "registry.ca_file", "has no effect with insecure_http (plain http)",
                        "remove ca_file, or insecure_http", severity="warning")
        base = out.manifests
        if base and not base.startswith("https://"):
            url = install.calico_manifest if cluster.cni == "calico" else install.flannel_manifest
            pinned = (getattr(install, f"{cluster.cni}_manifest_sha256")
                      or versions.DEFAULT_MANIFEST_SHA256.get(url))
            if not pinned:
                self.report(m["manifests"][1], "registry.manifests",
                            f"{base!r} is plain http and the {cluster.cni} manifest has no sha256 pin: it is "
                            "applied as cluster-admin, and anyone on the network path could change it",
                            f"use https://...; or set install.{cluster.cni}_manifest_sha256")
        return out

    def registry_repo(self, node: Node, key: str, fix: str) -> str | None:
        s = self.string(node, key, _REGISTRY_REPO, fix, "registry host[:port][/path]")
        if s is None:
            return None
        host = s.split("/", 1)[0]
        if "." not in host and ":" not in host and host != "localhost":
            self.report(node, key, f"{host!r} is not a registry host name (it would be read as a Docker Hub "
                        "user)", "write the registry's full name, e.g. registry.example.cn or 10.0.0.5:5000")
            return None
        return s.rstrip("/")

    def registry_overrides(self, node: Node, key: str) -> dict[str, str] | None:
        """{upstream registry: host[:port][/path]}: where that registry's images are taken from instead."""
        if not isinstance(node, MappingNode):
            self.report(node, key, f"expected a mapping of registry: mirror, got {_kind(node)}",
                        "write e.g. overrides: {nvcr.io: registry.example.cn/nvcr}")
            return None
        out: dict[str, str] = {}
        ok = True
        for knode, vnode in node.value:
            up = self.string(knode, key, _REGISTRY_HOST, "an upstream registry's host name, e.g. nvcr.io",
                             "registry host")
            if up is None:
                ok = False
                continue
            if "." not in up and ":" not in up and up != "localhost":
                self.report(knode, key, f"{up!r} is not a registry host name",
                            "write e.g. registry.k8s.io, nvcr.io, docker.io, quay.io or ghcr.io")
                ok = False
                continue
            if up in out:
                self.report(knode, f"{key}.{up}", "duplicate registry", "keep only one of them")
                ok = False
                continue
            v = self.registry_repo(vnode, f"{key}.{up}", "write host[:port][/path], e.g. registry.example.cn/nvcr")
            if v is None:
                ok = False
            else:
                out[up] = v
        return out if ok else None

    def registry_credentials(self, node: Node, key: str) -> tuple[str | None, str | None] | None:
        """{env: NAME} or {file: PATH}: where gpuk8s reads the mirror's user:password (never from here)."""
        fix = ("write credentials: {env: GPUK8S_REGISTRY_AUTH} (a variable holding user:password) or "
               "credentials: {file: ~/.config/gpuk8s/registry-auth}")
        if isinstance(node, ScalarNode):
            self.report(node, key, "credentials are never written in the inventory", fix)
            return None
        readers: dict[str, Callable[[Node, str], Any]] = {
            "env": lambda n, k: self.string(n, k, _ENV_NAME, "an environment variable's name, e.g. "
                                            "GPUK8S_REGISTRY_AUTH", "variable name"),
            "file": lambda n, k: self.string(n, k, None, fix),
        }
        m = self.mapping(node, key, _CREDENTIAL_KEYS)
        got = self.fields(node, key, _CREDENTIAL_KEYS, readers, m)
        if m is None:
            return None
        if len(m) != 1:
            self.report(node, key, "name exactly one of env and file", fix)
            return None
        if not got:
            return None
        return got.get("env"), got.get("file")

    def url(self, node: Node, key: str, fix: str) -> str | None:
        """The syntax of a URL (http or https); whether plain http is allowed is the caller's decision."""
        s = self.string(node, key, _REPO_URL, fix, "URL")
        return s.rstrip("/") if s else None

    def repo(self, node: Node, key: str, fix: str) -> tuple[str, bool, str | None] | None:
        """A package repository: an https URL, or {url, insecure_http, key_fingerprint}.

        Its signing key is fetched from the same place (the URL + /gpgkey, /Release.key, gpgkey=), so plain
        http is allowed only with insecure_http: true and the key's fingerprint pinned.
        """
        http_fix = (f"use https://...; a mirror without TLS needs `insecure_http: true` on that source together "
                    f"with `key_fingerprint:` of the signing key, e.g. {key.rsplit('.', 1)[-1]}: "
                    "{url: http://mirror.example.com/..., insecure_http: true, key_fingerprint: <40 hex digits>}")
        if isinstance(node, ScalarNode):
            url = self.url(node, key, fix)
            if url is None:
                return None
            if not url.startswith("https://"):
                self.report(node, key, f"{url!r} is plain http: its packages and signing key could be replaced "
                            "by anyone on the network path", http_fix)
                return None
            return url, False, None
        if not isinstance(node, MappingNode):
            self.report(node, key, f"expected a URL or a mapping {{url, insecure_http, key_fingerprint}}, "
                        f"got {_kind(node)}", fix)
            return None
        readers: dict[str, Callable[[Node, str], Any]] = {
            "url": lambda n, k: self.url(n, k, fix),
            "insecure_http": self.boolean,
            "key_fingerprint": self.fingerprint,
        }
        m = self.mapping(node, key, _REPO_KEYS)
        got = self.fields(node, key, _REPO_KEYS, readers, m)
        if m is None:
            return None
        if "url" not in m or _is_null(m["url"][1]):
            self.report(node, f"{key}.url", "the repository has no url", f"add 'url: ...' ({fix})")
        url, insecure, fp = got.get("url"), got.get("insecure_http", False), got.get("key_fingerprint")
        if url is None or any(k not in got and not _is_null(v) for k, (_, v) in m.items()):
            return None  # missing or invalid: reported above
        if not url.startswith("https://"):
            if not insecure:
                self.report(m["url"][1], f"{key}.url", f"{url!r} is plain http: its packages and signing key "
                            "could be replaced by anyone on the network path", http_fix)
                return None
            if fp is None:
                self.report(m["insecure_http"][1], f"{key}.insecure_http",
                            "insecure_http needs key_fingerprint: the signing key fetched over plain http is "
                            "trusted only if its fingerprint is the one written here",
                            "add key_fingerprint: the 40 hex digits of the signing key's fingerprint "
                            "(gpg --show-keys --with-fingerprint KEYFILE)")
                return None
        elif insecure:
            self.report(m["insecure_http"][1], f"{key}.insecure_http", "has no effect on an https URL",
                        "remove insecure_http", severity="warning")
            insecure = False
        return url, insecure, fp

    def fingerprint(self, node: Node, key: str) -> str | None:
        s = self.string(node, key)
        if s is None:
            return None
        fp = s.replace(" ", "").upper()
        fp = fp[2:] if fp.startswith("0X") else fp
        if not _FINGERPRINT.match(fp):
            self.report(node, key, "is not an OpenPGP key fingerprint (40 hexadecimal digits)",
                        "write the fingerprint of the repository's signing key, e.g. from "
                        "gpg --show-keys --with-fingerprint KEYFILE")
            return None
        return fp

    def sha256(self, node: Node, key: str) -> str | None:
        s = self.string(node, key)
        if s is None:
            return None
        h = s.strip().lower()
        h = h[len("sha256:"):] if h.startswith("sha256:") else h
        if not _SHA256.match(h):
            self.report(node, key, "is not a sha256 digest (64 hexadecimal digits)",
                        "write the output of sha256sum for the manifest file")
            return None
        return h

    def arch_sha256(self, node: Node, key: str) -> dict[str, str] | None:
        """{architecture: sha256} for the cri-dockerd archives; an architecture not written keeps the pin."""
        if not isinstance(node, MappingNode):
            self.report(node, key, f"expected a mapping of architecture: sha256, got {_kind(node)}",
                        "write e.g. cri_dockerd_sha256: {amd64: <64 hex digits from sha256sum>}")
            return None
        out = dict(versions.cri_dockerd().sha256)
        ok = True
        for knode, vnode in node.value:
            arch = self.string(knode, key)
            if arch is None:
                ok = False
                continue
            if arch not in versions.CRI_DOCKERD_ARCHES:
                self.report(knode, key, f"{arch!r} is not an architecture cri-dockerd publishes an archive for",
                            f"use {' or '.join(versions.CRI_DOCKERD_ARCHES)}")
                ok = False
                continue
            h = self.sha256(vnode, f"{key}.{arch}")
            if h is None:
                ok = False
            else:
                out[arch] = h
        return out if ok else None

    def check_ids(self, node: Node, key: str) -> tuple[str, ...] | None:
        if not isinstance(node, SequenceNode):
            self.report(node, key, f"expected a list of check ids, got {_kind(node)}", "write e.g. [gpu.count]")
            return None
        out = []
        for i, item in enumerate(node.value):
            s = self.string(item, f"{key}[{i}]", _CHECK_ID, "a check id as printed by preflight, e.g. net.bandwidth",
                            "check id")
            if s:
                out.append(s)
        return tuple(out)

    def labels(self, node: Node, key: str) -> dict[str, str] | None:
        if not isinstance(node, MappingNode):
            self.report(node, key, f"expected a mapping of label: value, got {_kind(node)}",
                        "write e.g. labels: {team: ml}")
            return None
        out: dict[str, str] = {}
        for knode, vnode in node.value:
            name = self.string(knode, key)
            if name is None:
                continue
            path = f"{key}.{name}"
            if not _valid_label_key(name):
                self.report(knode, path, f"{name!r} is not a valid label key",
                            "use [prefix/]name with letters, digits, '-', '_', '.' (name at most 63 characters)")
                continue
            v = self.value(vnode, path)
            if v is _MISSING:
                continue
            text = "" if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
            if not (isinstance(v, (str, int, bool)) or v is None) or len(text) > 63 or not _LABEL_VALUE.match(text):
                self.report(vnode, path, f"{vnode.value!r} is not a valid label value",
                            "at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric")
                continue
            out[name] = text
        return out

    def taints(self, node: Node, key: str) -> tuple[Taint, ...] | None:
        if not isinstance(node, SequenceNode):
            self.report(node, key, f"expected a list of taints, got {_kind(node)}",
                        "write e.g. taints: [\"nvidia.com/gpu=present:NoSchedule\"]")
            return None
        out = []
        for i, item in enumerate(node.value):
            s = self.string(item, f"{key}[{i}]")
            if s is None:
                continue
            m = _TAINT.match(s)
            if (not m or m.group("effect") not in _TAINT_EFFECTS or not _valid_label_key(m.group("key"))
                    or not _LABEL_VALUE.match(m.group("value") or "")):
                self.report(item, f"{key}[{i}]", f"{s!r} is not a taint",
                            f"write key=value:Effect with Effect one of {', '.join(_TAINT_EFFECTS)}")
                continue
            out.append(Taint(m.group("key"), m.group("value") or "", m.group("effect")))
        return tuple(out)

    # -- per-node GPU settings (gpu_defaults < gpu_groups.NAME < the host's own keys) ---------------
    def node_gpu_readers(self) -> dict[str, Callable[[Node, str], Any]]:
        """One reader per key of _NODE_GPU_KEYS."""
        return {"gpu_sharing": self.gpu_sharing, "mig": self.mig, "driver": self.driver,
                "allocator": self.allocator, "fabric": self.fabric}

    def node_gpu(self, node: Node, key: str, m: dict[str, tuple[Node, Node]] | None = None) -> _Layer:
        """One layer of per-node GPU settings: inventory key -> (value, the node it was read from)."""
        if m is None:
            m = self.mapping(node, key, _NODE_GPU_KEYS)
        readers = self.node_gpu_readers()
        out: _Layer = {}
        for name, (_k, v) in (m or {}).items():
            if name not in _NODE_GPU_KEYS or _is_null(v):
                continue
            got = readers[name](v, f"{key}.{name}")
            if got is not None:
                out[name] = (got, v)
        return out

    def gpu_groups(self, node: Node) -> dict[str, _Layer]:
        if not isinstance(node, MappingNode):
            self.report(node, "gpu_groups", f"expected a mapping of group name: settings, got {_kind(node)}",
                        "write e.g. gpu_groups: {inference: {gpu_sharing: {strategy: time-slicing, replicas: 10}}}")
            return {}
        out: dict[str, _Layer] = {}
        for knode, vnode in node.value:
            name = self.string(knode, "gpu_groups", _NODE_NAME, "a group name: lowercase letters, digits and '-'",
                               "group name")
            if name is None:
                continue
            if name in out:
                self.report(knode, f"gpu_groups.{name}", "duplicate group", "keep only one of them")
                continue
            out[name] = self.node_gpu(vnode, f"gpu_groups.{name}")
        return out

    def gpu_sharing(self, node: Node, key: str) -> GPUSharing | None:
        readers: dict[str, Callable[[Node, str], Any]] = {
            "strategy": lambda n, k: self.choice(n, k, SHARING_STRATEGIES),
            "replicas": lambda n, k: self.integer(n, k, -(1 << 31), 1 << 31),
            "rename": self.boolean,
            "fail_requests_greater_than_one": self.boolean,
            "pod_memory_mib": lambda n, k: self.integer(n, k, 1, 1 << 24),
        }
        read = self.whole(node, key, _SHARING_KEYS, readers)
        if read is None:
            return None
        m, got = read
        strategy = got.get("strategy", "none")
        if "strategy" not in got:
            self.report(node, f"{key}.strategy", "no strategy given",
                        f"add strategy: one of {', '.join(SHARING_STRATEGIES)}")
            return None
        replicas = got.get("replicas")
        limit_fix = (f"write replicas: 2 to {MAX_REPLICAS} (pods per GPU; {MAX_REPLICAS} is gpuk8s's limit, "
                     "the seed's 'at most 20 pods per GPU'), or strategy: none for whole GPUs")
        if strategy == "none":
            if replicas not in (None, 1):
                self.report(m["replicas"][1], f"{key}.replicas", "has no effect with strategy: none",
                            "remove replicas, or choose a strategy: time-slicing, mps or hami")
                return None
            return GPUSharing(line=node.start_mark.line + 1, **{k: v for k, v in got.items() if k != "replicas"})
        if replicas is None:
            if strategy != "hami":
                self.report(node, f"{key}.replicas", f"strategy {strategy} needs replicas", limit_fix)
                return None
            replicas = 10  # HAMi's own default deviceSplitCount (charts/hami/values.yaml)
        elif replicas == 1:
            self.report(m["replicas"][1], f"{key}.replicas", "1 replica per GPU is no sharing", limit_fix)
            return None
        elif not 2 <= replicas <= MAX_REPLICAS:
            self.report(m["replicas"][1], f"{key}.replicas",
                        f"{replicas} is out of range: the device plugin needs at least 2 and gpuk8s allows at most "
                        f"{MAX_REPLICAS} pods per GPU", limit_fix)
            return None
        if strategy == "hami" and got.get("rename"):
            self.report(m["rename"][1], f"{key}.rename", "HAMi has its own resource names (nvidia.com/gpu, "
                        "nvidia.com/gpumem, nvidia.com/gpucores)", "remove rename, or use time-slicing or mps")
            return None
        got["replicas"] = replicas
        return GPUSharing(line=node.start_mark.line + 1, **got)

    def allocator(self, node: Node, key: str) -> AllocatorSetting | None:
        """`allocator: device-plugin | dra`; what a dra node cannot have is checked on the settings it gets
        (host_gpu) and against the cluster (allocator_across)."""
        kind = self.choice(node, key, ALLOCATORS)
        return None if kind is None else AllocatorSetting(kind, node.start_mark.line + 1)  # type: ignore[arg-type]

    def fabric(self, node: Node, key: str) -> FabricSettings | None:
        """`fabric: {link_layer: infiniband|roce|auto|none, nics: auto | [mlx5_0, ...], gpudirect: auto|peermem|
        dmabuf|off, expect: {ports: N, rate: Gb/s}}`; what the node really has is checked by preflight."""
        readers: dict[str, Callable[[Node, str], Any]] = {
            "link_layer": lambda n, k: self.choice(n, k, FABRIC_LINK_LAYERS),
            "nics": self.fabric_nics,
            "gpudirect": lambda n, k: self.choice(n, k, GPUDIRECT_MODES),
            "expect": lambda n, k: self.fields(n, k, _FABRIC_EXPECT_KEYS, {
                "ports": lambda n2, k2: self.integer(n2, k2, 1, 64),
                "rate": lambda n2, k2: self.fabric_rate(n2, k2)}),
        }
        read = self.whole(node, key, _FABRIC_KEYS, readers)
        if read is None:
            return None
        m, got = read
        expect = got.pop("expect", {})
        if "link_layer" not in got:
            self.report(node, f"{key}.link_layer", "is missing", "write link_layer: infiniband, roce or auto (none "
                        "leaves the network to you)")
            return None
        if got["link_layer"] == "none" and (set(got) - {"link_layer"} or expect):
            self.report(node, f"{key}.link_layer", "nics, gpudirect and expect have no effect with link_layer: none",
                        "write link_layer: infiniband, roce or auto, or remove the other keys", severity="warning")
        nics = got.pop("nics", ())
        return FabricSettings(nics=nics, ports=expect.get("ports"), rate=expect.get("rate"),
                              line=node.start_mark.line + 1, **got)

    def fabric_nics(self, node: Node, key: str) -> tuple[str, ...] | None:
        """`auto` (every RDMA device of the link layer) or a list of RDMA device names, each once."""
        if isinstance(node, ScalarNode) and node.value == "auto":
            return ()
        if not isinstance(node, SequenceNode) or not node.value:
            self.report(node, key, f"expected auto or a list of RDMA devices, got {_kind(node)}",
                        "write nics: auto, or nics: [mlx5_0, mlx5_1] (the names ibstat or rdma link show)")
            return None
        out: list[str] = []
        for i, item in enumerate(node.value[:64]):
            name = self.string(item, f"{key}[{i}]", _RDMA_DEVICE, "write an RDMA device's name, such as mlx5_0",
                               "RDMA device name")
            if name is None:
                return None
            if name in out:
                self.report(item, f"{key}[{i}]", f"{name} is listed twice", "list each device once")
                return None
            out.append(name)
        return tuple(out)

    def fabric_rate(self, node: Node, key: str) -> int | None:
        v = self.integer(node, key, 1, 1600)
        if v is not None and v not in FABRIC_RATES:
            self.report(node, key, f"{v} Gb/s is not a rate an InfiniBand or RoCE port reports",
                        f"write one of {', '.join(map(str, FABRIC_RATES))}")
            return None
        return v

    def driver(self, node: Node, key: str) -> DriverSettings | None:
        """`driver: {manage: bool, branch: "580", flavor: auto|open|proprietary, source: distro|nvidia}`; whether a
        flavour suits the node's GPUs is decided per host by preflight (gpuk8s/driver/rules.py), which sees them."""
        dm = versions.drivers()
        branches = ", ".join(f'"{b}"' for b in dm.branches)
        readers: dict[str, Callable[[Node, str], Any]] = {
            "manage": self.boolean,
            "branch": lambda n, k: self.branch(n, k, branches),
            "flavor": lambda n, k: self.choice(n, k, DRIVER_FLAVORS),
            "source": lambda n, k: self.choice(n, k, DRIVER_SOURCES),
        }
        read = self.whole(node, key, _DRIVER_KEYS, readers)
        if read is None:
            return None
        m, got = read
        branch = got.get("branch", "")
        if branch and got.get("flavor") == "open" and int(branch) < dm.open_modules_since:
            self.report(m["flavor"][1], f"{key}.flavor", f"driver branch {branch} has no open kernel modules "
                        f"(NVIDIA's open modules start with R{dm.open_modules_since})",
                        "write flavor: proprietary, or a newer branch")
            return None
        if not got.get("manage", False) and set(got) - {"manage"}:
            self.report(node, f"{key}.manage", "branch, flavor and source have no effect without manage: true "
                        "(gpuk8s then leaves the driver to you and only checks it)",
                        "add manage: true for gpuk8s to install the driver, or remove the other keys",
                        severity="warning")
        return DriverSettings(line=node.start_mark.line + 1, **got)

    def branch(self, node: Node, key: str, branches: str) -> str | None:
        """A driver branch: three digits, quoted or not (580 and "580" mean the same)."""
        v = self.value(node, key)
        if v is _MISSING:
            return None
        text = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
        if not isinstance(text, str) or not re.fullmatch(r"[0-9]{3}", text):
            self.report(node, key, f"{node.value!r} is not a driver branch (three digits, such as \"580\")",
                        f"write one of {branches}")
            return None
        dm = versions.drivers()
        if dm.branch(text) is None:
            self.report(node, key, f"gpuk8s does not install driver branch {text}",
                        f"write one of {branches} (the version matrix's branches: gpuk8s versions), or leave it "
                        f"out for the default, \"{dm.default_branch}\"")
            return None
        return text

    def mig(self, node: Node, key: str) -> MIGSettings | None:
        """`mig: {strategy: none|single|mixed, config: NAME | [{devices, mig-enabled, mig-devices}]}`."""
        m = self.mapping(node, key, _MIG_KEYS)
        if m is None:
            return None
        strategy = self.choice(m["strategy"][1], f"{key}.strategy", MIG_STRATEGIES) if "strategy" in m else None
        if "strategy" not in m:
            self.report(node, f"{key}.strategy", "no strategy given",
                        f"add strategy: one of {', '.join(MIG_STRATEGIES)} (the device plugin's MIG strategies)")
        if strategy is None:
            return None
        line = node.start_mark.line + 1
        cnode = m["config"][1] if "config" in m and not _is_null(m["config"][1]) else None
        if strategy == "none":
            if cnode is not None:
                self.report(cnode, f"{key}.config", "has no effect with strategy: none (MIG is turned off)",
                            "remove config, or choose strategy: single or mixed")
                return None
            return MIGSettings("none", line=line)
        if cnode is None:
            self.report(node, f"{key}.config", f"strategy {strategy} needs a layout",
                        "add config: all-1g.10gb (a named layout) or [{devices: all, mig-devices: {\"3g.40gb\": 2}}]")
            return None
        if isinstance(cnode, SequenceNode):
            layout = self.mig_entries(cnode, f"{key}.config")
        else:
            name = self.string(cnode, f"{key}.config")
            if name is None:
                return None
            try:
                layout = miglayout.named(name)
            except miglayout.LayoutError as e:
                self.report(cnode, f"{key}.config", e.message, e.fix)
                return None
        if layout is None:
            return None
        if strategy == "single":
            profiles = {p for e in layout.entries if e.enabled for p, _n in e.mig_devices}
            if layout.balanced or len(profiles) > 1 or any(not e.enabled for e in layout.entries):
                self.report(cnode, f"{key}.config", "the single strategy needs every GPU in MIG mode with one "
                            "profile", "use strategy: mixed for this layout, or one profile (e.g. all-1g.10gb)")
                return None
        return MIGSettings(strategy, layout.name, layout, line)

    def mig_entries(self, node: SequenceNode, key: str) -> miglayout.Layout | None:
        entries: list[miglayout.Entry] = []
        ok = True
        if not node.value:
            self.report(node, key, "the layout list is empty", "add [{devices: all, mig-devices: {\"1g.10gb\": 7}}]")
            return None
        for i, enode in enumerate(node.value):
            k = f"{key}[{i}]"
            before = len(self.problems)
            m = self.mapping(enode, k, _MIG_ENTRY_KEYS)
            if m is None:
                ok = False
                continue
            devices: Any = "all"
            if "devices" in m:
                dnode = m["devices"][1]
                if isinstance(dnode, SequenceNode):
                    got_idx = [self.integer(d, f"{k}.devices", 0, 63) for d in dnode.value]
                    idx = [n for n in got_idx if n is not None]
                    if len(idx) < len(got_idx) or not idx:
                        if not got_idx:
                            self.report(dnode, f"{k}.devices", "no GPU listed", "write devices: all or [0, 1]")
                        ok = False
                        continue
                    devices = tuple(sorted(set(idx)))
                elif self.value(dnode, f"{k}.devices") != "all":
                    self.report(dnode, f"{k}.devices", f"{dnode.value!r} is not a GPU list",
                                "write devices: all or a list of GPU indexes such as [0, 1]")
                    ok = False
                    continue
            enabled = True
            if "mig-enabled" in m:
                got = self.boolean(m["mig-enabled"][1], f"{k}.mig-enabled")
                if got is None:
                    ok = False
                    continue
                enabled = got
            counts: list[tuple[str, int]] = []
            if "mig-devices" in m:
                mnode = m["mig-devices"][1]
                if not isinstance(mnode, MappingNode):
                    self.report(mnode, f"{k}.mig-devices", "expected profile: count pairs",
                                'write mig-devices: {"3g.40gb": 2}')
                    ok = False
                    continue
                for pk, pv in mnode.value:
                    pname = self.string(pk, f"{k}.mig-devices")
                    n = self.integer(pv, f"{k}.mig-devices.{pname}", 1, 7)
                    if pname is None or n is None:
                        ok = False
                        continue
                    try:
                        miglayout.check_profile(pname)
                    except miglayout.LayoutError as e:
                        self.report(pk, f"{k}.mig-devices", e.message, e.fix)
                        ok = False
                        continue
                    if pname not in miglayout.known_profiles():
                        near = difflib.get_close_matches(pname, sorted(miglayout.known_profiles()), n=1, cutoff=0.6)
                        self.report(pk, f"{k}.mig-devices", f"no GPU gpuk8s knows has the MIG profile {pname}",
                                    f"did you mean {near[0]}?" if near else "see nvidia-smi mig -lgip on the host")
                        ok = False
                        continue
                    counts.append((pname, n))
            if len(self.problems) > before:
                ok = False
                continue
            if enabled and not counts:
                self.report(enode, f"{k}.mig-devices", "no MIG devices for these GPUs",
                            'add mig-devices: {"1g.10gb": 7}, or mig-enabled: false to leave them whole')
                ok = False
                continue
            entries.append(miglayout.Entry(devices, enabled, tuple(counts) if enabled else ()))
        return miglayout.explicit(entries) if ok else None

    def host_gpu(self, host_node: Node, key: str, gpu_node: bool, own: _Layer, group: _Layer,
                 defaults: _Layer) -> NodeGPUSettings:
        """A host's per-node GPU settings: its own keys, else its group's, else gpu_defaults."""
        if not gpu_node:
            for name, (_v, vnode) in {**group, **own}.items():
                self.report(vnode, f"{key}.{name}", "has no effect: this host is not a GPU node",
                            "remove it, or set gpus: N on the host", severity="warning")
            return NodeGPUSettings()
        chosen = {**defaults, **group, **own}
        settings = NodeGPUSettings(**{_NODE_GPU_FIELDS[k]: v for k, (v, _n) in chosen.items()})
        # Combinations across keys are checked here, on the settings a node really gets.
        if settings.sharing.strategy == "mps" and settings.mig.enabled:
            # the device plugin's MPS does not combine with MIG (k8s-device-plugin README, "Shared Access to GPUs")
            self.report(chosen["mig"][1], f"{key}.mig", "MPS sharing cannot be combined with MIG on one node",
                        "use gpu_sharing.strategy: time-slicing on MIG nodes (with mig.strategy: mixed), or "
                        "remove mig")
        if settings.sharing.strategy == "hami" and settings.mig.enabled:
            # NVIDIA's plugin serves MIG (migStrategy) and keeps off HAMi nodes (gpu=on): nothing would
            # advertise the MIG devices gpuk8s creates
            self.report(chosen["mig"][1], f"{key}.mig", "HAMi sharing cannot be combined with MIG on one node",
                        "use gpu_sharing.strategy: time-slicing on MIG nodes (with mig.strategy: mixed), or "
                        "remove mig")
        if settings.allocator.kind == "dra" and settings.driver.manage:
            branch = settings.driver.branch or versions.drivers().default_branch
            floor = versions.dra_driver().driver_floor[0]
            if int(branch) < floor:
                self.report(chosen["allocator"][1], f"{key}.allocator",
                            f"the DRA driver needs driver branch {floor} or newer; driver.branch is {branch}",
                            f"write driver.branch: \"{versions.drivers().default_branch}\", or allocator: "
                            "device-plugin")
        if settings.allocator.kind == "dra" and settings.sharing.strategy != "none":
            # NVIDIA's DRA driver shares GPUs only through claims' opaque configs behind its own feature gates;
            # gpuk8s's sharing settings configure the device plugin (or HAMi), which does not run on a dra node
            self.report(chosen["allocator"][1], f"{key}.allocator",
                        f"gpu_sharing.strategy {settings.sharing.strategy} needs the device plugin: a dra node "
                        "serves whole GPUs (and MIG devices) through claims",
                        "write allocator: device-plugin on this node, or remove its gpu_sharing")
        return settings

    def allocator_across(self, hosts: list[Host], cluster: Cluster) -> None:
        """A dra node needs the DRA driver's Kubernetes floor (versions.yaml dra_driver) and containerd (CDI)."""
        v = _K8S_VERSION.match(cluster.kubernetes_version or "")
        have = (1, int(v.group(2)), int(v.group(3) or 99)) if v else None  # "1.N": install takes its newest patch
        floor = versions.dra_driver().kubernetes_floor
        for i, h in enumerate(hosts):
            a = h.gpu.allocator
            if a.kind != "dra":
                continue
            where = f"hosts[{i}].allocator"
            if have is not None and not versions.at_least(have, floor):
                self.problems.append(Problem(
                    self.filename, a.line or h.line or 1, 1, where,
                    f"allocator dra needs Kubernetes {versions.fmt(floor)} or newer (Dynamic Resource "
                    f"Allocation, resource.k8s.io/v1); the cluster is {cluster.kubernetes_version}",
                    f"write cluster.kubernetes_version: \"{versions.default_minor()}\" (or {versions.fmt(floor)} and "
                    "newer), or allocator: device-plugin"))
            if cluster.container_runtime == "docker":
                self.problems.append(Problem(
                    self.filename, a.line or h.line or 1, 1, where,
                    "allocator dra needs containerd: the DRA driver hands GPUs to containers through CDI, which "
                    "gpuk8s sets up in containerd",
                    "write cluster.container_runtime: containerd, or allocator: device-plugin"))

    def sharing_across(self, hosts: list[Host], install: InstallSettings) -> None:
        """Sharing settings that must agree across nodes, or with the cluster's device plugin version."""
        hami: tuple[int, int] | None = None  # (replicas, line) of the first HAMi node
        plugin = re.match(r"v?(\d+)\.(\d+)", install.device_plugin_version or "")
        old_plugin = plugin is not None and (int(plugin.group(1)), int(plugin.group(2))) < (0, 20)
        for i, h in enumerate(hosts):
            sh = h.gpu.sharing
            if sh.strategy == "hami":
                if hami is None:
                    hami = (sh.replicas, sh.line)
                elif sh.replicas != hami[0]:
                    # HAMi's deviceSplitCount is one value in its device ConfigMap (charts/hami device-config.yaml)
                    self.problems.append(Problem(
                        self.filename, sh.line or 1, 1, f"hosts[{i}].gpu_sharing.replicas",
                        f"HAMi replicas {sh.replicas} differ from {hami[0]} (line {hami[1]}): HAMi's "
                        "deviceSplitCount is one value for the cluster",
                        f"write the same replicas for every HAMi node (e.g. replicas: {hami[0]})"))
            if sh.strategy == "mps" and not sh.fail_requests_greater_than_one and old_plugin:
                # k8s-device-plugin api/config/v1/config.go before v0.20.0: "We explicitly set
                # sharing.mps.failRequestsGreaterThanOne = true"; v0.20.0 keeps an explicit false
                self.problems.append(Problem(
                    self.filename, sh.line or 1, 1, f"hosts[{i}].gpu_sharing.fail_requests_greater_than_one",
                    "fail_requests_greater_than_one: false is ignored by the device plugin "
                    f"{install.device_plugin_version} (before v0.20.0 MPS always refuses requests above 1)",
                    "remove fail_requests_greater_than_one, or choose a Kubernetes minor whose device plugin is "
                    "v0.20.0 or later ('gpuk8s versions'), or set install.device_plugin_version to v0.20.0 or "
                    "later"))

    def hosts(self, node: Node, ssh: SSHSettings, defaults: _Layer | None = None,
              groups: dict[str, _Layer] | None = None) -> list[Host]:
        if not isinstance(node, SequenceNode):
            self.report(node, "hosts", f"expected a list of hosts, got {_kind(node)}",
                        "write each host as '- name: ...' under 'hosts:'")
            return []
        hosts: list[Host] = []
        names: dict[str, int] = {}
        addresses: dict[str, int] = {}
        for i, hnode in enumerate(node.value):
            key = f"hosts[{i}]"
            m = self.mapping(hnode, key, _HOST_KEYS)
            if m is None:
                continue
            readers: dict[str, Callable[[Node, str], Any]] = {
                "name": lambda n, k: self.string(
                    n, k, _NODE_NAME,
                    "a Kubernetes node name: lowercase letters, digits, '-' and '.', "
                    "starting and ending with a letter or digit (RFC 1123)", "node name"),
                "address": self.address,
                "role": lambda n, k: self.choice(n, k, ("control-plane", "worker")),
                "ssh": lambda n, k: self.ssh(n, k, ssh),
                "labels": self.labels,
                "taints": self.taints,
                "gpus": lambda n, k: self.integer(n, k, 0, 64),
                "gpu_group": lambda n, k: self.string(n, k),
                **{g: (lambda n, k: None) for g in _NODE_GPU_KEYS},  # read below, by node_gpu
            }
            got = self.fields(hnode, key, _HOST_KEYS, readers, m)
            own = self.node_gpu(hnode, key, m)
            group: _Layer = {}
            if "gpu_group" in got:
                if got["gpu_group"] in (groups or {}):
                    group = (groups or {})[got["gpu_group"]]
                else:
                    known = list(groups or {})
                    near = difflib.get_close_matches(got["gpu_group"], known, n=1, cutoff=0.6)
                    self.report(m["gpu_group"][1], f"{key}.gpu_group", f"no gpu_groups entry {got['gpu_group']!r}",
                                f"did you mean '{near[0]}'?" if near else
                                (f"write one of: {', '.join(known)}" if known else
                                 "define it under the top-level gpu_groups: key"))
            gpu_node = got["gpus"] > 0 if "gpus" in got else got.get("role", "worker") != "control-plane"
            got["gpu"] = self.host_gpu(hnode, key, gpu_node, own, group, defaults or {})
            line = hnode.start_mark.line + 1
            bad = False
            for required in ("name", "address"):
                if required not in got:
                    bad = True
                    if required not in m:
                        self.report(hnode, f"{key}.{required}", f"the host has no {required}",
                                    f"add '{required}: ...' to this host")
            if bad:
                continue
            name = got["name"]
            if len(name) > 63:
                self.report(m["name"][1], f"{key}.name", "a node name is at most 63 characters here",
                            "shorten the name")
                continue
            if name in names:
                self.report(m["name"][1], f"{key}.name", f"duplicate host name '{name}' (also on line {names[name]})",
                            "give every host its own name")
            else:
                names[name] = m["name"][1].start_mark.line + 1
            addr = _normal_address(got["address"])
            if addr in addresses:
                self.report(m["address"][1], f"{key}.address",
                            f"duplicate address '{got['address']}' (also on line {addresses[addr]})",
                            "give every host its own address")
            else:
                addresses[addr] = m["address"][1].start_mark.line + 1
            got.setdefault("role", "worker")
            got.setdefault("ssh", ssh)
            hosts.append(Host(line=line, **got))
        if not node.value:
            self.report(node, "hosts", "the host list is empty", "add at least one host with role: control-plane")
        elif hosts and not any(h.is_control_plane for h in hosts):
            self.report(node, "hosts", "no host has role: control-plane",
                        "set 'role: control-plane' on the host that should run the Kubernetes API server")
        cps = sum(1 for h in hosts if h.is_control_plane)
        if cps >= 2 and cps % 2 == 0:
            self.report(node, "hosts", f"{cps} stacked control planes: etcd needs a majority, so an even number "
                        "tolerates no more failures than one fewer", "use 1, 3 or 5 control planes",
                        severity="warning")
        return hosts


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _NULL_TAG


def _kind(node: Node | None) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, ScalarNode):
        tag = node.tag.rsplit(":", 1)[-1]
        return {"str": f"the text {node.value!r}", "null": "nothing (null)"}.get(tag, f"the {tag} {node.value!r}")
    return "nothing"


def _valid_address(s: str) -> bool:
    try:
        ipaddress.ip_address(s.strip("[]"))
        return True
    except ValueError:
        digits = s.replace(".", "")
        return len(s) <= 253 and bool(_HOSTNAME.match(s)) and not (digits.isascii() and digits.isdecimal())


def _normal_address(s: str) -> str:
    try:
        return str(ipaddress.ip_address(s.strip("[]")))
    except ValueError:
        return s.lower()


def _valid_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _NODE_NAME.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))
