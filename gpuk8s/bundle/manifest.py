"""The bundle's manifest (`manifest.json`, the archive's first member): what the bundle holds and for which hosts.

    {"schema_version": 1, "kind": "gpuk8s-bundle", "created_by": "gpuk8s 0.x", "kubernetes": "1.36.5",
     "targets": [{"os": "ubuntu-22.04", "arch": "x86_64", "runtime": "containerd",
                  "kernels": ["5.15.0-105-generic"], "driver_branches": ["580"]}],
     "images": ["registry.k8s.io/kube-apiserver:v1.36.5", ...],
     "files": {"packages/ubuntu-22.04/x86_64/kubeadm_1.36.5-1.1_amd64.deb": {"sha256": "...", "size": 12345}, ...}}

Parsed strictly (unknown keys refused, every value typed and bounded): the manifest is the root of a bundle's
trust, and its text came with the bundle. Pure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpuk8s.errors import GpuK8sError

NAME = "manifest.json"
KIND = "gpuk8s-bundle"
SCHEMA_VERSION = 1
MAX_MANIFEST = 8 << 20  # bytes: ~40,000 files' entries
MAX_FILES = 50_000
MAX_IMAGES = 5_000
MAX_TARGETS = 64
MAX_PATH = 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_OS = re.compile(r"^[a-z][a-z0-9]{0,31}-[0-9][0-9.]{0,15}$")  # "ubuntu-22.04", "alinux-3"
_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}$")  # an arch, a kernel release, a branch, a runtime
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._:/@-]{0,511}$")
_FINGERPRINT = re.compile(r"^[0-9A-F]{40}$")
ROLES = ("containerd", "driver", "driver_apt", "kubernetes", "toolkit")  # install.ROLE_repo
_VERSION = re.compile(r"^1\.\d{1,3}\.\d{1,3}$")
_PATH_PART = re.compile(r"^[A-Za-z0-9._+~-]{1,255}$")


class ManifestError(GpuK8sError):
    kind = "bundle"


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int


@dataclass(frozen=True)
class Target:
    """One kind of host the bundle serves: an OS release, an architecture, a container runtime; the kernels it has
    driver modules for and the driver branches it holds (none: the hosts bring their own driver)."""

    os: str
    arch: str
    runtime: str
    kernels: tuple[str, ...] = ()
    driver_branches: tuple[str, ...] = ()


@dataclass(frozen=True)
class RepoKey:
    """The key that signs a repository the bundle carries (install.ROLE_repo: kubernetes, toolkit, containerd):
    install from the bundle pins it, so that apt on each host verifies the served copy as it would the original."""

    role: str
    fingerprint: str


@dataclass(frozen=True)
class Manifest:
    created_by: str
    kubernetes: str
    targets: tuple[Target, ...]
    images: tuple[str, ...]
    files: dict[str, FileEntry] = field(default_factory=dict)
    repos: tuple[RepoKey, ...] = ()

    @property
    def minor(self) -> str:
        return self.kubernetes.rsplit(".", 1)[0]

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": KIND, "created_by": self.created_by,
                "kubernetes": self.kubernetes,
                "targets": [{"os": t.os, "arch": t.arch, "runtime": t.runtime, "kernels": list(t.kernels),
                             "driver_branches": list(t.driver_branches)} for t in self.targets],
                "images": list(self.images),
                "repos": {r.role: {"fingerprint": r.fingerprint} for r in self.repos},
                "files": {p: {"sha256": f.sha256, "size": f.size} for p, f in sorted(self.files.items())}}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n"


def safe_path(path: object) -> str | None:
    """`path` as a bundle member's relative path ("a/b/c"), or None when it is not one: empty, absolute, with '.'
    or '..' parts, a backslash, a control character, or a part outside the portable file name characters."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH:
        return None
    parts = path.split("/")
    if any(p in ("", ".", "..") or not _PATH_PART.match(p) for p in parts):
        return None
    return path


def _str(doc: dict[str, Any], key: str, pattern: re.Pattern[str], where: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or not pattern.match(v):
        raise ManifestError(f"{NAME}: {where}{key} is missing or not valid", "rebuild the bundle")
    return v


def _strs(doc: dict[str, Any], key: str, pattern: re.Pattern[str], where: str, cap: int) -> tuple[str, ...]:
    v = doc.get(key, [])
    if not isinstance(v, list) or len(v) > cap or not all(isinstance(x, str) and pattern.match(x) for x in v):
        raise ManifestError(f"{NAME}: {where}{key} is not a list of valid values (at most {cap})",
                            "rebuild the bundle")
    return tuple(v)


def _keys(doc: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(k for k in doc if k not in allowed)
    if extra:
        raise ManifestError(f"{NAME}: {where}unknown key {str(extra[0])[:64]!r}",
                            "rebuild the bundle with this gpuk8s version")


def parse(text: str | bytes) -> Manifest:
    """The manifest of `text`; ManifestError naming the first problem."""
    if len(text) > MAX_MANIFEST:
        raise ManifestError(f"{NAME} is larger than {MAX_MANIFEST >> 20} MiB", "rebuild the bundle")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"{NAME} is not JSON: {str(e)[:200]}", "rebuild the bundle") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ManifestError(f"{NAME} is not a gpuk8s bundle's manifest", "pass a gpuk8s bundle (docs/airgap.md)")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ManifestError(f"{NAME}: schema_version {str(doc.get('schema_version'))[:16]!r}, this gpuk8s reads "
                            f"{SCHEMA_VERSION}", "build the bundle with the gpuk8s version that installs from it")
    _keys(doc, {"schema_version", "kind", "created_by", "kubernetes", "targets", "images", "files", "repos"}, "")
    created = doc.get("created_by")
    if not isinstance(created, str) or len(created) > 128:
        raise ManifestError(f"{NAME}: created_by is missing or too long", "rebuild the bundle")
    kube = _str(doc, "kubernetes", _VERSION, "")
    raw_targets = doc.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets or len(raw_targets) > MAX_TARGETS:
        raise ManifestError(f"{NAME}: targets must list 1 to {MAX_TARGETS} targets", "rebuild the bundle")
    targets = []
    for i, t in enumerate(raw_targets):
        where = f"targets[{i}]."
        if not isinstance(t, dict):
            raise ManifestError(f"{NAME}: targets[{i}] is not a mapping", "rebuild the bundle")
        _keys(t, {"os", "arch", "runtime", "kernels", "driver_branches"}, where)
        targets.append(Target(_str(t, "os", _OS, where), _str(t, "arch", _WORD, where),
                              _str(t, "runtime", _WORD, where), _strs(t, "kernels", _WORD, where, 256),
                              _strs(t, "driver_branches", _WORD, where, 16)))
    images = _strs(doc, "images", _IMAGE, "", MAX_IMAGES)
    raw_files = doc.get("files")
    if not isinstance(raw_files, dict) or len(raw_files) > MAX_FILES:
        raise ManifestError(f"{NAME}: files must map at most {MAX_FILES} paths to their sha256 and size",
                            "rebuild the bundle")
    files: dict[str, FileEntry] = {}
    for path, entry in raw_files.items():
        shown = str(path)[:120]
        if safe_path(path) is None or path == NAME:
            raise ManifestError(f"{NAME}: files names {shown!r}, which is not a plain relative path",
                                "rebuild the bundle")
        if not isinstance(entry, dict) or set(entry) != {"sha256", "size"} or not isinstance(
                entry["sha256"], str) or not _SHA256.match(entry["sha256"]) or type(entry["size"]) is not int \
                or not 0 <= entry["size"] < 1 << 40:
            raise ManifestError(f"{NAME}: the entry of {shown!r} is not {{sha256, size}}", "rebuild the bundle")
        files[path] = FileEntry(entry["sha256"], entry["size"])
    return Manifest(created, kube, tuple(targets), images, files, _repos(doc.get("repos", {})))


def _repos(raw: object) -> tuple[RepoKey, ...]:
    if not isinstance(raw, dict) or len(raw) > len(ROLES):
        raise ManifestError(f"{NAME}: repos must map a repository's role to its key", "rebuild the bundle")
    out = []
    for role, entry in raw.items():
        if role not in ROLES or not isinstance(entry, dict) or set(entry) != {"fingerprint"} or not isinstance(
                entry["fingerprint"], str) or not _FINGERPRINT.match(entry["fingerprint"]):
            raise ManifestError(f"{NAME}: repos: the entry of {str(role)[:32]!r} is not {{fingerprint: 40 upper-case "
                                "hex digits}} of a known repository", "rebuild the bundle")
        out.append(RepoKey(role, entry["fingerprint"]))
    return tuple(sorted(out, key=lambda r: r.role))
