"""The apt repositories a Debian-family target needs, and copying what it needs of each into a bundle with the
repository's own signature intact (a partial mirror): the signing key, InRelease (or Release and Release.gpg), the
Packages indexes Release names for the target's architecture, and the .deb files resolution chose, each checked
against the sha256 its signed index names. On the site, apt on each host verifies the same signature with the same
key (pinned by its fingerprint), so the bundle's plain-http serving adds no trust: a changed file fails there as it
would from the internet.

The repositories and paths are the playbooks' own (playbooks/kubernetes-prerequisites.yaml,
nvidia-container-toolkit.yaml, containerd.yaml): under `repos/ROLE/` the bundle holds what is under the inventory's
URL for that role, at the same relative paths, so install points install.ROLE_repo at the served copy and changes
nothing else.
"""

from __future__ import annotations

import bz2
import fnmatch
import lzma
import re
import subprocess
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuk8s.bundle import debrepo, fetch
from gpuk8s.bundle.manifest import safe_path
from gpuk8s.errors import GpuK8sError
from gpuk8s.facts.model import UBUNTU_CODENAMES
from gpuk8s.inventory.model import Inventory

MAX_KEY = 1 << 20
MAX_RELEASE = 8 << 20
_DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_CODENAMES = {f"ubuntu-{v}": name for v, name in UBUNTU_CODENAMES.items()}
_KUBERNETES_PKGS = ("kubelet", "kubeadm", "kubectl")
TOOLKIT_PKGS = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                "libnvidia-container1")
_SHA_LINE = re.compile(r"^\s*([0-9a-f]{64})\s+(\d{1,15})\s+(\S+)\s*$")
def _bounded(make: Callable[[], Any]) -> Callable[[bytes], bytes]:
    """A decompressor that stops past debrepo.MAX_INDEX bytes (an index is only as trustworthy as its key, and a
    few MB can expand to gigabytes)."""
    def run(data: bytes) -> bytes:
        d = make()
        out = d.decompress(data, debrepo.MAX_INDEX + 1)
        if len(out) > debrepo.MAX_INDEX:
            raise SourceError(f"a repository index decompresses past {debrepo.MAX_INDEX} bytes",
                              "a repository index that large is refused")
        return bytes(out)
    return run


_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "": bytes, ".gz": _bounded(lambda: zlib.decompressobj(wbits=47)), ".xz": _bounded(lzma.LZMADecompressor),
    ".bz2": _bounded(bz2.BZ2Decompressor)}


class SourceError(GpuK8sError):
    kind = "bundle"


@dataclass(frozen=True)
class AptRepo:
    """One apt repository as a playbook writes its source line: `deb URL/DIST/ /` (flat: suite "") or
    `deb URL/DIST SUITE COMPONENT`, signed by the key at URL/KEY."""

    role: str  # kubernetes, toolkit, containerd: install.ROLE_repo in the inventory
    base: str  # the inventory's install.ROLE_repo
    dist: str  # "v1.NN/deb", "stable/deb/amd64", "ubuntu"
    suite: str  # "" for a flat repository, else "jammy"
    component: str  # "" for a flat repository, else "stable"
    key: str  # the signing key's path under base
    allow_http: bool
    fingerprint: str | None  # the inventory's pin
    wanted: tuple[tuple[str, str], ...]  # (package, the version as apt-get install asks for it: a glob)

    @property
    def url(self) -> str:
        return f"{self.base.rstrip('/')}/{self.dist}" if self.dist else self.base.rstrip("/")

    def under(self, rel: str) -> str:
        """A path under url as a path under base (what the bundle holds below repos/ROLE/)."""
        return f"{self.dist}/{rel}" if self.dist else rel

    def meta(self, name: str) -> str:
        """The path of a metadata file under url: InRelease, Release, an index."""
        return name if not self.suite else f"dists/{self.suite}/{name}"

    def index(self, arch: str) -> str:
        """Where Release lists this architecture's Packages (without the compression suffix)."""
        return "Packages" if not self.suite else f"{self.component}/binary-{arch}/Packages"


def deb_arch(arch: str) -> str:
    return _DEB_ARCH.get(arch, arch)


# Ubuntu's archive (arm64: its ports archive) over http, as Ubuntu's own sources name it: the signature is the trust
# (InRelease by the Ubuntu Archive Automatic Signing Key (2018); debootstrap: "Valid Release signature (key id
# F6ECB3762474EDA9D21B7022871920D1991BC93C)")
UBUNTU_ARCHIVE = {"x86_64": "http://archive.ubuntu.com/ubuntu", "aarch64": "http://ports.ubuntu.com/ubuntu-ports"}
UBUNTU_ARCHIVE_KEY = "F6ECB3762474EDA9D21B7022871920D1991BC93C"
UBUNTU_KEYRING = "/usr/share/keyrings/ubuntu-archive-keyring.gpg"


def repos_for(inv: Inventory, os: str, arch: str, runtime: str, gpu: bool, debs: tuple[str, ...] = (),
              keyring: str = UBUNTU_KEYRING) -> list[AptRepo]:
    """The repositories install reads for hosts of this OS release and architecture, with what it installs from
    each at the inventory's pins (the playbooks' apt-get install lines); with `debs` (what the managed-driver
    hosts' driver steps install: the branch's packages and each kernel's precompiled modules) Ubuntu's archive,
    CODENAME-updates restricted (install.driver_apt_repo, else Ubuntu's own), verified with `keyring`."""
    i, c = inv.install, inv.cluster
    minor = ".".join(c.kubernetes_version.split(".")[:2])
    patch = c.kubernetes_version if c.kubernetes_version.count(".") == 2 else ""
    kube_glob = f"{patch}-*" if patch else "*"
    out = [AptRepo("kubernetes", i.kubernetes_repo, f"v{minor}/deb", "", "", f"v{minor}/deb/Release.key",
                   i.kubernetes_repo_insecure_http, i.kubernetes_repo_key_fingerprint,
                   tuple((p, kube_glob) for p in _KUBERNETES_PKGS))]
    if gpu:
        out.append(AptRepo("toolkit", i.toolkit_repo, f"stable/deb/{deb_arch(arch)}", "", "", "gpgkey",
                           i.toolkit_repo_insecure_http, i.toolkit_repo_key_fingerprint,
                           tuple((p, i.toolkit_version) for p in TOOLKIT_PKGS)))
    if runtime == "containerd":
        if os not in _CODENAMES:
            raise SourceError(f"{os}: no Docker repository codename known for it", "use Ubuntu 22.04 or 24.04")
        out.append(AptRepo("containerd", i.containerd_repo, "ubuntu", _CODENAMES[os], "stable", "ubuntu/gpg",
                           i.containerd_repo_insecure_http, i.containerd_repo_key_fingerprint,
                           (("containerd.io", f"{i.containerd_version}*"),)))
    if gpu and debs:
        if os not in _CODENAMES:
            raise SourceError(f"{os}: no Ubuntu codename known for it", "use Ubuntu 22.04 or 24.04")
        own = not i.driver_apt_repo
        out.append(AptRepo("driver_apt", i.driver_apt_repo or UBUNTU_ARCHIVE.get(arch, UBUNTU_ARCHIVE["x86_64"]),
                           "", f"{_CODENAMES[os]}-updates", "restricted", keyring,
                           own or i.driver_apt_repo_insecure_http,
                           i.driver_apt_repo_key_fingerprint or UBUNTU_ARCHIVE_KEY, tuple((p, "*") for p in debs)))
    return out


def release_files(text: str) -> dict[str, tuple[str, int]]:
    """The SHA256 section of a Release file: path -> (sha256, size). Linear, bounded by the caller's cap."""
    out: dict[str, tuple[str, int]] = {}
    inside = False
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            inside = line.rstrip() == "SHA256:"
            continue
        m = _SHA_LINE.match(line) if inside else None
        if m:
            out[m.group(3)] = (m.group(1), int(m.group(2)))
    return out


_HASHES = ("MD5Sum", "SHA1", "SHA256", "SHA512")  # Release's sections, and apt's by-hash directory names
_ANY_LINE = re.compile(r"^\s*([0-9a-f]{32,128})\s+(\d{1,15})\s+(\S+)\s*$")


def release_hashes(text: str) -> dict[str, dict[str, str]]:
    """Every hash section of a Release file: algorithm -> path -> hash (apt asks by-hash for the strongest)."""
    out: dict[str, dict[str, str]] = {}
    section = ""
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            name = line.rstrip().rstrip(":")
            section = name if name in _HASHES and line.rstrip().endswith(":") else ""
            continue
        m = _ANY_LINE.match(line) if section else None
        if m:
            out.setdefault(section, {})[m.group(3)] = m.group(1)
    return out


def release_field(text: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}:[ \t]*(.*)$", text[:1 << 16], re.M)
    return m.group(1).strip() if m else ""


def key_fingerprints(key: Path) -> list[str]:
    """The primary keys' fingerprints of an OpenPGP key file, as the playbooks' repo-key step reads them
    (gpg --show-keys --with-colons: the fpr record after each pub record, field 10)."""
    r = subprocess.run(["gpg", "--no-keyring", "--trust-model", "always", "--show-keys", "--with-colons", str(key)],
                       capture_output=True, text=True, timeout=60)
    out, pub = [], False
    for line in r.stdout.splitlines():
        f = line.split(":")
        if f[0] == "pub":
            pub = True
        elif pub and f[0] == "fpr" and len(f) > 9:
            out.append(f[9])
            pub = False
    return out


class RepoCopy:
    """One repository copied into `staging/repos/ROLE/`: the key, the signed Release and the indexes once, then the
    packages each target's resolution chose (a package two targets need, once)."""

    def __init__(self, repo: AptRepo, staging: Path) -> None:
        self.repo = repo
        self.root = staging / "repos" / repo.role
        self.files: dict[str, Path] = {}
        self.fingerprint = ""
        self.release = ""
        self._work = Path(tempfile.mkdtemp(prefix="gpuk8s-gpg-", dir=staging))

    def _add(self, rel: str, data: bytes) -> Path:
        """`data` at `rel` under the inventory's URL (base), as a bundle file."""
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def _path(self, rel: str) -> Path:
        name = f"repos/{self.repo.role}/{rel}"
        if safe_path(name) is None:
            raise SourceError(f"{self.repo.url}: the repository names {rel[:120]!r}, which a bundle cannot hold "
                              "as a plain path", "report it: gpuk8s cannot mirror this repository yet")
        self.files[name] = self.root / rel
        return self.root / rel

    def _keyring(self, key: Path) -> Path:
        """The repository's key, checked against the inventory's pin, as a keyring gpgv reads."""
        r = self.repo
        fprs = key_fingerprints(key)
        if len(fprs) != 1:
            raise SourceError(f"{r.base}/{r.key} holds {len(fprs)} keys, not one",
                              "mirror the repository with its one signing key")
        if r.fingerprint and fprs[0] != r.fingerprint:
            raise SourceError(f"{r.base}/{r.key} has fingerprint {fprs[0]}; the inventory pins {r.fingerprint}",
                              f"check install.{r.role}_repo_key_fingerprint")
        self.fingerprint = fprs[0]
        keyring = self._work / "keyring.gpg"
        data = key.read_bytes()
        if data.lstrip().startswith(b"-----BEGIN"):
            subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(key)], check=True,
                           capture_output=True, timeout=60)
        else:
            keyring.write_bytes(data)
        return keyring

    def _gpgv(self, keyring: Path, argv: list[Path], what: str, output: Path | None = None) -> None:
        r = self.repo
        v = subprocess.run(["gpgv", "--status-fd", "1", "--keyring", str(keyring),
                            *(["--output", str(output)] if output else []), *map(str, argv)],
                           capture_output=True, text=True, timeout=60)
        where = r.key if r.key.startswith("/") else f"{r.base}/{r.key}"
        if v.returncode != 0:
            said = v.stderr.strip().splitlines()[-1][:200] if v.stderr.strip() else "gpgv failed"
            raise SourceError(f"{r.url}: its {what} is not signed by the key at {where} ({said})",
                              "check the repository URL and its key; do not build from an unsigned source")
        # the primary key of each good signature (VALIDSIG's last field): a keyring of several keys (Ubuntu's)
        # must have signed with the pinned one
        signers = [ln.split()[-1] for ln in v.stdout.splitlines() if ln.startswith("[GNUPG:] VALIDSIG ")]
        if r.fingerprint and r.fingerprint not in signers:
            raise SourceError(f"{r.url}: its {what} is signed by {', '.join(signers) or 'no key'}, not by the "
                              f"pinned {r.fingerprint}", f"check install.{r.role}_repo_key_fingerprint")

    def _local_keyring(self, path: Path) -> Path:
        """A keyring of this machine (Ubuntu's archive keys: /usr/share/keyrings/ubuntu-archive-keyring.gpg), as gpgv
        reads it; which of its keys must have signed is the pin's to say (_gpgv)."""
        if not path.is_file():
            raise SourceError(f"{path}: no such keyring on this machine (Ubuntu's archive keys, to verify its "
                              "Release)", "apt-get install ubuntu-keyring (Debian has it too), or pass "
                              "--ubuntu-keyring FILE")
        keyring = self._work / "local-keyring.gpg"
        if path.read_bytes()[:64].lstrip().startswith(b"-----BEGIN"):
            subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(path)], check=True,
                           capture_output=True, timeout=60)
        else:
            keyring.write_bytes(path.read_bytes()[:MAX_KEY * 4])
        self.fingerprint = self.repo.fingerprint or ""
        return keyring

    def signed(self) -> None:
        """The key (checked against the pin) and Release, verified with it by gpgv."""
        r = self.repo
        if r.key.startswith("/"):  # the hosts verify with their own copy of this keyring: none in the bundle
            keyring = self._local_keyring(Path(r.key))
        else:
            keyring = self._keyring(self._add(r.key, fetch.get(f"{r.base.rstrip('/')}/{r.key}", MAX_KEY,
                                                                r.allow_http)))
        inrelease = f"{r.url}/{r.meta('InRelease')}"
        plain = self._work / "Release"
        if not fetch.missing(inrelease, r.allow_http):
            signed = self._add(r.under(r.meta('InRelease')), fetch.get(inrelease, MAX_RELEASE, r.allow_http))
            self._gpgv(keyring, [signed], "Release", output=plain)
        else:
            rel = self._add(r.under(r.meta('Release')), fetch.get(f"{r.url}/{r.meta('Release')}", MAX_RELEASE,
                                                                      r.allow_http))
            sig = self._add(r.under(r.meta('Release.gpg')), fetch.get(f"{r.url}/{r.meta('Release.gpg')}",
                                                                          MAX_KEY, r.allow_http))
            self._gpgv(keyring, [sig, rel], "Release")
            plain.write_bytes(rel.read_bytes())
        self.release = plain.read_text(errors="replace")

    def index(self, arch: str) -> debrepo.Index:
        """This architecture's Packages index: every variant Release lists, each against its sha256 (apt on the
        host may ask for any of them), the first readable one parsed."""
        r, listed = self.repo, release_files(self.release)
        by_hash = release_field(self.release, "Acquire-By-Hash").lower() == "yes"
        text = None
        for sfx in ("", ".xz", ".gz", ".bz2"):
            name = r.index(arch) + sfx
            if name not in listed:
                continue
            sha, size = listed[name]
            if size > debrepo.MAX_INDEX:
                raise SourceError(f"{r.url}: {name} is {size} bytes", "a repository index that large is refused")
            dest = self._path(r.under(r.meta(name)))
            fetch.download(f"{r.url}/{r.meta(name)}", dest, size, sha, r.allow_http)
            if by_hash:  # apt asks for .../by-hash/ALGO/HASH where Release says Acquire-By-Hash: yes, by the
                # strongest hash Release lists: a copy under every algorithm Release names
                where = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
                for algo, hashes in release_hashes(self.release).items():
                    if name in hashes:
                        hashed = self._path(r.under(r.meta(f"{where}by-hash/{algo}/{hashes[name]}")))
                        hashed.parent.mkdir(parents=True, exist_ok=True)
                        hashed.write_bytes(dest.read_bytes())
            if text is None:
                data = _DECOMPRESS[sfx](dest.read_bytes())
                if len(data) > debrepo.MAX_INDEX:
                    raise SourceError(f"{r.url}: {name} decompresses past {debrepo.MAX_INDEX} bytes",
                                      "a repository index that large is refused")
                text = data.decode("utf-8", errors="replace")
        if text is None:
            raise SourceError(f"{r.url}: its Release lists no {r.index(arch)} for {arch}",
                              f"the repository has no packages for {arch}")
        return debrepo.Index(debrepo.parse(text), arch)

    def fetch_file(self, rel: str, size: int, sha256: str, what: str) -> str:
        """A package file at `rel` under the repository's URL into the copy (once), checked against the size and
        sha256 its index names; its bundle path."""
        rel = rel[2:] if rel.startswith("./") else rel
        dest = self._path(self.repo.under(rel))
        if not dest.is_file():
            if not re.fullmatch(r"[0-9a-f]{64}", sha256):
                raise SourceError(f"{self.repo.url}: {what} has no sha256 in its index",
                                  "a package without its sha256 is not mirrored")
            fetch.download(f"{self.repo.url}/{rel}", dest, size, sha256, self.repo.allow_http)
        return f"repos/{self.repo.role}/{self.repo.under(rel)}"

    def package(self, p: debrepo.DebPackage) -> str:
        """The package into the copy (once); its bundle path."""
        return self.fetch_file(p.filename, p.size, p.sha256, f"{p.name} {p.version}")


def wanted_rels(index: debrepo.Index, repo: AptRepo) -> list[debrepo.Rel]:
    """What apt-get install NAME=GLOB picks: the newest version of NAME matching the glob."""
    out = []
    for name, glob in repo.wanted:
        hits = [p for p in index.by_name.get(name, []) if fnmatch.fnmatchcase(p.version, glob)]
        if not hits:
            raise SourceError(f"{repo.url}: no {name} version matching {glob}",
                              f"check the version the inventory pins (install.{repo.role}_repo and its version)")
        out.append(debrepo.Rel(name, "=", hits[0].version))  # newest first
    return out
