"""Images into a bundle: every image of `gpuk8s images` copied by skopeo from where the inventory takes it (the
registry mirror's name where `registry:` sets one) into one OCI image layout (`images/` in the bundle), each under
its upstream name (`org.opencontainers.image.ref.name` = "registry.k8s.io/pause:3.10"), for the architectures of
the bundle's targets. skopeo checks every blob against its digest as it copies; the layout's files then go into the
bundle's manifest with their sha256 like any file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuk8s import mirrors
from gpuk8s.bundle.manifest import safe_path
from gpuk8s.errors import GpuK8sError
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube import images

LAYOUT = "images"  # the OCI layout's directory in the bundle
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}


class ImageCopyError(GpuK8sError):
    kind = "bundle"


@dataclass(frozen=True)
class ImageSource:
    name: str  # the upstream name, as the layout names it
    source: str  # where skopeo takes it from


def sources(inv: Inventory) -> list[ImageSource]:
    return [ImageSource(n.upstream, n.image) for n in images.needed_images(inv)]


def skopeo() -> str:
    path = shutil.which("skopeo")
    if path is None:
        raise ImageCopyError("skopeo is not installed on this machine; bundle create copies images with it",
                             "apt-get install skopeo (dnf install skopeo), then run bundle create again")
    return path


def _argv(inv: Inventory, img: ImageSource, layout: Path, arches: list[str], authfile: Path | None) -> list[str]:
    argv = [skopeo(), "copy", "--quiet", "--retry-times", "2", "--dest-oci-accept-uncompressed-layers"]
    if len(arches) == 1:
        argv += ["--override-os", "linux", "--override-arch", _GOARCH.get(arches[0], arches[0])]
    else:
        argv += ["--multi-arch", "all"]
    registry = mirrors.parse(img.source).registry
    if inv.registry.insecure_http and registry in mirrors.own_hosts(inv.registry):
        argv.append("--src-tls-verify=false")
    if authfile is not None and registry in mirrors.own_hosts(inv.registry):
        argv += ["--src-authfile", str(authfile)]
    return [*argv, f"docker://{img.source}", f"oci:{layout}:{img.name}"]


def copy(inv: Inventory, wanted: Iterable[ImageSource], layout: Path, arches: Iterable[str]) -> list[str]:
    """Each image into the layout at `layout` (created); the upstream names copied, in order."""
    arch = sorted(set(arches))
    layout.mkdir(parents=True, exist_ok=True)
    creds = mirrors.credentials(inv)
    done: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpuk8s-auth-") as tmp:
        authfile = None
        if creds is not None:  # never on a command line, where ps shows it
            authfile = Path(tmp) / "auth.json"
            fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": {h: {"auth": mirrors.basic(creds)} for h in mirrors.own_hosts(inv.registry)}}, f)
        for img in wanted:
            r = subprocess.run(_argv(inv, img, layout, arch, authfile), capture_output=True, text=True,
                               timeout=3600)
            if r.returncode != 0:
                tail = (r.stderr.strip().splitlines() or ["skopeo failed"])[-1]
                raise ImageCopyError(f"{img.source}: skopeo could not copy it: {tail[:300]}",
                                     "check that this machine reaches the registry (and the mirror's credentials)")
            done.append(img.name)
    return done


def alias(layout: Path, name: str, other: str) -> None:
    """`name` in the layout also under `other` (the same manifest: no blob is copied twice)."""
    r = subprocess.run([skopeo(), "copy", "--quiet", f"oci:{layout}:{name}", f"oci:{layout}:{other}"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise ImageCopyError(f"{name}: skopeo could not name it {other} in the layout: "
                             f"{(r.stderr.strip().splitlines() or ['failed'])[-1][:300]}", "a gpuk8s bug: report it")


def kubeadm_alias(ref: str) -> str | None:
    """The name kubeadm pulls `ref` by from a repository of its own (imageRepository: the bundle's server): kubeadm
    drops coredns' own path there (`REPO/coredns:TAG` for registry.k8s.io/coredns/coredns:TAG, docs/mirrors.md)."""
    p = mirrors.parse(ref)
    if p.registry == mirrors.KUBEADM_REGISTRY and p.path == "coredns/coredns":
        return f"{p.registry}/coredns{p.tag}"
    return None


def layout_files(layout: Path) -> dict[str, Path]:
    """The layout's files as bundle members (images/oci-layout, images/index.json, images/blobs/sha256/...)."""
    out = {}
    for p in sorted(layout.rglob("*")):
        if p.is_file():
            name = f"{LAYOUT}/{p.relative_to(layout).as_posix()}"
            if safe_path(name) is None:
                raise ImageCopyError(f"the image layout holds {name[:120]!r}", "a gpuk8s bug: report it")
            out[name] = p
    return out
