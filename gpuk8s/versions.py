"""Numeric version extraction for the non-PEP 440 strings that drivers and runtimes print.

`19.03.5` equals 19.3.5, `1.6.20~ds1` is 1.6.20, `v1.7.2` is 1.7.2, `20.10.24+dfsg1` is 20.10.24.
The raw string is kept by callers for messages; only the numeric release is compared.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuk8s.inventory.model import Inventory

_RELEASE = re.compile(r"(?<![\w.])v?([0-9]+(?:\.[0-9]+)+)")  # ASCII digits: \d also matches "٣"

Release = tuple[int, ...]


def release(text: str) -> Release | None:
    """The first dotted numeric release in text, as a tuple of ints, or None."""
    m = _RELEASE.search(text)
    if not m:
        return None
    parts = m.group(1).split(".")
    if any(len(p) > 9 for p in parts):
        return None
    return tuple(int(p) for p in parts)


def at_least(found: Release, floor: Release) -> bool:
    n = max(len(found), len(floor))
    return found + (0,) * (n - len(found)) >= floor + (0,) * (n - len(floor))


def fmt(r: Release) -> str:
    return ".".join(str(p) for p in r)


# Minimum Linux driver per CUDA major version (NVIDIA's compatibility tables).
CUDA_DRIVER_FLOORS: tuple[tuple[str, Release], ...] = (
    ("13", (580, 0)),
    ("12", (525, 60, 13)),
    ("11", (450, 80, 2)),
    ("10.2", (440, 33)),
    ("10.1", (418, 39)),
    ("10.0", (410, 48)),
    ("9.0", (384, 81)),
)


def cuda_versions_supported(driver: Release) -> list[str]:
    """CUDA versions (majors, and the 10.x/9.0 minors) whose images this driver can run, newest first."""
    return [cuda for cuda, floor in CUDA_DRIVER_FLOORS if at_least(driver, floor)]


# sha256 of the CNI manifests gpuk8s applies by default (InstallSettings.calico_manifest and
# .flannel_manifest), keyed by their exact URL: a manifest at a pinned URL whose sha256 differs is not
# applied. A URL that is not listed here and has no install.*_manifest_sha256 in the inventory is
# applied as https delivers it.
DEFAULT_MANIFEST_SHA256: dict[str, str] = {
    # the file at the tag, as raw.githubusercontent.com serves it
    "https://raw.githubusercontent.com/projectcalico/calico/v3.28.0/manifests/calico.yaml":
        "93e7f39c3f93f9dc67ee2386aa7240d8d13ff62e54535a2f5f6432e8c6c0f24f",
    # the release asset (kustomize output of Documentation/kustomization/kube-flannel at the tag)
    "https://github.com/flannel-io/flannel/releases/download/v0.25.5/kube-flannel.yml":
        "a15d73cbe14e96287f42ffb16d5995930f92b263f4794797e3a2fa30ec885803",
}


def manifest_sha256(inv: Inventory, cni: str) -> str | None:
    """The sha256 the `cni` ("calico" or "flannel") manifest must have, or None when nothing pins it.

    The inventory's install.<cni>_manifest_sha256 wins; else the pin of the manifest's URL in
    DEFAULT_MANIFEST_SHA256 (for the default URL, or a mirror someone listed there).
    """
    if cni not in ("calico", "flannel"):
        raise ValueError(f"unknown CNI {cni!r}")
    pinned: str | None = getattr(inv.install, f"{cni}_manifest_sha256")
    if pinned:
        return pinned
    url: str = getattr(inv.install, f"{cni}_manifest")
    return DEFAULT_MANIFEST_SHA256.get(url)
