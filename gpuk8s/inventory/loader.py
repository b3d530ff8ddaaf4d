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
from gpuk8s.inventory.model import (
    Bastion,
    Cluster,
    Host,
    InstallSettings,
    Inventory,
    PreflightSettings,
    Problem,
    SSHSettings,
    Sudo,
    Taint,
)
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

_CLUSTER_KEYS = (
    "name", "kubernetes_version", "pod_cidr", "service_cidr", "cni", "container_runtime",
    "control_plane_endpoint",
)
_SSH_KEYS = (
    "user", "port", "identity_file", "known_hosts", "connect_timeout", "command_timeout",
    "host_key_policy", "bastion", "sudo",
)
_SUDO_KEYS = ("mode", "password_env", "prompt")
_BASTION_KEYS = ("address", "user", "port", "identity_file")
_HOST_KEYS = ("name", "address", "role", "ssh", "labels", "taints", "gpus")
_PREFLIGHT_KEYS = ("min_bandwidth_gbit", "max_rtt_ms", "max_clock_skew_s", "network_test_seconds", "ignore")
_INSTALL_KEYS = ("toolkit_version", "toolkit_repo", "kubernetes_repo", "package_lock_timeout",
                 "device_plugin_version", "calico_manifest", "flannel_manifest", "calico_manifest_sha256",
                 "flannel_manifest_sha256", "verify_image")
# A repository written as a mapping: a mirror without TLS is allowed only with the signing key pinned.
_REPO_KEYS = ("url", "insecure_http", "key_fingerprint")
_REPOS = ("toolkit_repo", "kubernetes_repo")
_MANIFESTS = ("calico_manifest", "flannel_manifest")
_IMAGE_TAG = re.compile(r"^v?[0-9][A-Za-z0-9._-]{0,63}$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[0-9]+)?(/[a-z0-9._-]+)*(:[A-Za-z0-9._-]{1,128})?$")
_TOP_KEYS = ("cluster", "ssh", "hosts", "preflight", "install")
# Repository URLs reach a shell and files on every host: a strict subset of URL syntax, no shell metacharacters.
_REPO_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~:/%+@=-]*)?$")
_PKG_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~-]{0,63}$")
_FINGERPRINT = re.compile(r"^[0-9A-F]{40}$")  # an OpenPGP v4 fingerprint, spaces and 0x removed
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# An inventory is a few kilobytes; this much is read at most (`-i /dev/zero` must not eat the memory).
MAX_BYTES = 4 << 20
_SECRET_KEYS = ("password", "sudo_password", "passphrase", "token")

_MISSING = object()


class InventoryError(Exception):
    """The inventory cannot be used; `problems` holds every error (and warning) found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if p.severity == "error"]
        super().__init__("\n".join(str(p) for p in errors) or "invalid inventory")


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
        v = self.value(node, key)
        if v is _MISSING:
            return None
        if not isinstance(v, str) or v not in options:
            near = difflib.get_close_matches(str(v), options, n=1, cutoff=0.5)
            fix = f"did you mean '{near[0]}'?" if near else f"write one of: {', '.join(options)}"
            self.report(node, key, f"{node.value!r} is not one of {', '.join(options)}", fix)
            return None
        return v

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
        hosts = self.hosts(top["hosts"][1], ssh)
        return Inventory(Path(self.filename), cluster, ssh, tuple(hosts), preflight, install)

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
        }
        return replace(base, **self.fields(node, key, _SSH_KEYS, readers))

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

    def hosts(self, node: Node, ssh: SSHSettings) -> list[Host]:
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
            }
            got = self.fields(hnode, key, _HOST_KEYS, readers, m)
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
