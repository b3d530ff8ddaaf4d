"""Versions: the version matrix gpuk8s installs from, and numeric version extraction.

The matrix (gpuk8s/data/versions.yaml, read by `matrix()`) is the one place where gpuk8s names the
versions it installs: Kubernetes minors with their end-of-life dates, kubeadm API and containerd floor,
and per minor the device plugin, container toolkit, CNI manifests (URL and sha256), DCGM exporter; and the
GPU test images. `gpuk8s versions` prints it; docs/versions.md explains it.

Numeric extraction is for the non-PEP 440 strings that drivers and runtimes print: `19.03.5` equals
19.3.5, `1.6.20~ds1` is 1.6.20, `v1.7.2` is 1.7.2, `20.10.24+dfsg1` is 20.10.24. The raw string is kept
by callers for messages; only the numeric release is compared.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import date
from importlib import resources
from typing import Any, Literal, TypedDict

import yaml

from gpuk8s.errors import GpuK8sError

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


class MatrixError(GpuK8sError):
    """gpuk8s/data/versions.yaml is malformed: a bug in gpuk8s (tests/unit/test_versions.py catches it)."""

    kind = "matrix"


# -- CUDA and the driver: versions.yaml's `cuda` section (NVIDIA's CUDA Toolkit release notes tables) ------------

MATRIX_FILE = "data/versions.yaml"
# gpuk8s's own file, read by every command: libyaml's loader where PyYAML has it (3 ms against 35 ms in Python)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_matrix_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader: CSafeLoader or SafeLoader)


@functools.lru_cache(maxsize=1)
def _document() -> Any:
    """versions.yaml as parsed data, read once per run for every section's reader (each read it again, in
    Python's YAML loader, 35 ms apiece, one of them at import). Readers must not change what it returns."""
    return _load_matrix_yaml(resources.files("gpuk8s").joinpath(MATRIX_FILE).read_text(encoding="utf-8"))


def _cuda_section() -> dict[str, dict[str, str]]:
    """versions.yaml's cuda.driver_per_minor and cuda.driver_per_major (CUDA version -> driver version as NVIDIA
    writes it: "560.28.03"), newest first; MatrixError when malformed."""
    data = _document()
    cuda = data.get("cuda") if isinstance(data, dict) else None
    out: dict[str, dict[str, str]] = {}
    for key, shape in (("driver_per_minor", r"[0-9]{1,2}\.[0-9]{1,2}"), ("driver_per_major", r"[0-9]{1,2}")):
        table = cuda.get(key) if isinstance(cuda, dict) else None
        if not isinstance(table, dict) or not table:
            raise MatrixError(f"cuda.{key}: a mapping of CUDA version to driver version expected")
        for k, v in table.items():
            if not isinstance(k, str) or not re.fullmatch(shape, k) or not isinstance(v, str) \
                    or not re.fullmatch(r"[0-9]{3}(\.[0-9]{1,3}){0,2}", v):
                raise MatrixError(f"cuda.{key}.{k}: {v!r} is not a quoted CUDA version and driver version")
        out[key] = dict(sorted(table.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(".")), reverse=True))
    return out


def _driver(text: str) -> Release:
    return tuple(int(x) for x in text.split(".")) + ((0,) if "." not in text else ())


@dataclass(frozen=True)
class _CudaTables:
    # The oldest driver per CUDA minor (Table 3 of the release notes: the GA release's row), newest minor first
    minor_floors: tuple[tuple[str, Release], ...]
    driver_text: dict[str, str]  # CUDA minor -> the driver as NVIDIA writes it
    # The oldest driver per CUDA major through minor version compatibility, then the 10.x and 9.0 minors (which
    # have no minor version compatibility): what preflight's gpu.cuda and the GPU test image go by, as before
    driver_floors: tuple[tuple[str, Release], ...]


@functools.lru_cache(maxsize=1)
def _cuda_tables() -> _CudaTables:
    """Read on first use, not at import: every command (--help too) imports this module."""
    cuda = _cuda_section()
    minor = tuple((k, _driver(v)) for k, v in cuda["driver_per_minor"].items())
    return _CudaTables(minor, dict(cuda["driver_per_minor"]), (
        *((k, _driver(v)) for k, v in cuda["driver_per_major"].items()),
        *((k, v) for k, v in minor if k in ("10.2", "10.1", "10.0", "9.0")),
    ))


def __getattr__(name: str) -> object:
    """CUDA_MINOR_FLOORS, CUDA_DRIVER_TEXT and CUDA_DRIVER_FLOORS, computed on first use (PEP 562)."""
    attr = {"CUDA_MINOR_FLOORS": "minor_floors", "CUDA_DRIVER_TEXT": "driver_text",
            "CUDA_DRIVER_FLOORS": "driver_floors"}.get(name)
    if attr is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_cuda_tables(), attr)


def cuda_versions_supported(driver: Release) -> list[str]:
    """CUDA versions (majors, and the 10.x/9.0 minors) whose images this driver can run, newest first."""
    return [cuda for cuda, floor in _cuda_tables().driver_floors if at_least(driver, floor)]


@dataclass(frozen=True)
class CudaFloor:
    """The oldest driver for a CUDA version as nvidia-container-cli's requirement check needs it."""

    cuda: str  # the CUDA version asked for ("12.6")
    driver: Release  # the floor; a lower bound only when `exact` is False
    known: str  # the CUDA minor of the matrix the floor is that of ("12.6"; the newest known one when not exact)
    exact: bool  # the matrix has this minor (else: a newer minor than the matrix knows, `driver` a lower bound)

    @property
    def text(self) -> str:
        """The floor as NVIDIA writes it ("560.28.03", not 560.28.3)."""
        return _cuda_tables().driver_text[self.known]


def cuda_driver_floor(cuda: str) -> CudaFloor | None:
    """The oldest Linux driver whose CUDA version is at least `cuda` ("12.6", or "12" for 12.0), from the
    matrix's per-minor table; None for a version older than the table or not a version."""
    parts = cuda.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isascii() and p.isdigit() and len(p) <= 3 for p in parts):
        return None
    want = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    shown = f"{want[0]}.{want[1]}"
    for minor, floor in _cuda_tables().minor_floors:  # newest first
        have = tuple(int(x) for x in minor.split("."))
        if have == want:
            return CudaFloor(shown, floor, minor, True)
        if have < want:  # a minor newer than the table knows: the newest older one's floor is a lower bound
            return CudaFloor(shown, floor, minor, False)
    return None


def cuda_of_driver(driver: Release) -> str | None:
    """The newest CUDA minor of the matrix whose floor this driver meets ("12.2" for 535.104.05)."""
    return next((minor for minor, floor in _cuda_tables().minor_floors if at_least(driver, floor)), None)


# -- the version matrix: gpuk8s/data/versions.yaml --------------------------------------------------------
#
# Every version gpuk8s installs (Kubernetes minors, their end-of-life dates and kubeadm API, the containerd
# floor, the device plugin, the container toolkit, the CNI manifests with their sha256, the DCGM exporter,
# the GPU test images) is written once, in gpuk8s/data/versions.yaml, and read here. Inventory defaults,
# preflight, the kubeadm configurations, the CNI pins and `gpuk8s versions` use these functions; no
# version string of the matrix is written anywhere else in gpuk8s/ or playbooks/
# (tests/unit/test_versions.py).

_MINOR = re.compile(r"^1\.([0-9]{1,3})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_KUBEADM_API = re.compile(r"^kubeadm\.k8s\.io/v1beta[0-9]+$")


@dataclass(frozen=True)
class ManifestPin:
    """A CNI manifest: its project version, the URL gpuk8s fetches, and the sha256 it must have."""

    version: str
    url: str
    sha256: str


@dataclass(frozen=True)
class Pins:
    """One set of component pins; each Kubernetes minor names the set it installs."""

    name: str
    device_plugin: str  # image tag of nvcr.io/nvidia/k8s-device-plugin
    toolkit: str  # package version of the four nvidia-container-toolkit packages
    calico: ManifestPin
    flannel: ManifestPin
    dcgm_exporter: str  # image tag of nvcr.io/nvidia/k8s/dcgm-exporter

    def cni(self, name: str) -> ManifestPin:
        if name not in ("calico", "flannel"):
            raise ValueError(f"unknown CNI {name!r}")
        pin: ManifestPin = getattr(self, name)
        return pin


@dataclass(frozen=True)
class Minor:
    """A Kubernetes minor gpuk8s accepts, with what gpuk8s installs for it."""

    minor: str  # "1.N"
    end_of_life: date
    latest_patch: str  # "1.N.P": the newest patch release in the material the matrix was checked with
    kubeadm_api: str  # "kubeadm.k8s.io/v1betaN"
    containerd_floor: str  # below this containerd release the kubelet cannot run
    containerd_tested: tuple[str, ...]  # containerd releases containerd recommends for this minor
    pins: Pins

    @property
    def number(self) -> int:
        return int(self.minor.split(".")[1])

    @property
    def patch_releases(self) -> int:
        """How many patch releases the minor has had (1.N.4: four)."""
        return int(self.latest_patch.split(".")[2])

    def end_of_life_reached(self, on: date | None = None) -> bool:
        return (on or today()) >= self.end_of_life


@dataclass(frozen=True)
class Matrix:
    checked: date
    default: str
    minors: dict[str, Minor]  # newest first
    cuda_test_images: tuple[str, ...]  # newest CUDA first
    containerd_installable: int = 1  # the newest containerd major install can bring a host to
    containerd_package: str = "containerd.io"  # what install installs when containerd is below the floor
    containerd_version: str = ""  # its pinned package version ("" in a matrix without a containerd section)
    cgroup_v2_from: str = ""  # the first minor whose kubelet refuses cgroup v1 ("" when none does)
    node_bound_tokens_from: str = ""  # the first minor whose pod tokens name their node, with VAP v1 ("" none)

    def pin_sets(self) -> dict[str, Pins]:
        out: dict[str, Pins] = {}
        for m in self.minors.values():
            out.setdefault(m.pins.name, m.pins)
        return out


def today() -> date:
    """The date end of life is judged on (a function, so that tests can fix it)."""
    return date.today()


def _need(d: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise MatrixError(f"{where}: {key} is missing")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise MatrixError(f"{where}.{key}: expected {kind.__name__}, got {v!r}")
    return v


def _manifest(d: Any, where: str) -> ManifestPin:
    pin = ManifestPin(_need(d, "version", str, where), _need(d, "url", str, where), _need(d, "sha256", str, where))
    if not pin.url.startswith("https://") or f"/{pin.version}/" not in pin.url:
        raise MatrixError(f"{where}.url: {pin.url!r} must be an https URL of version {pin.version}")
    if not _SHA256.match(pin.sha256):
        raise MatrixError(f"{where}.sha256: not 64 lowercase hexadecimal digits")
    return pin


def parse_matrix(text: str) -> Matrix:
    """The matrix from the text of versions.yaml, checked; MatrixError names what is wrong."""
    return _matrix_of(_load_matrix_yaml(text))


def _matrix_of(data: Any) -> Matrix:
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise MatrixError("versions.yaml: schema: 1 expected")
    k8s = _need(data, "kubernetes", dict, "versions.yaml")
    sets: dict[str, Pins] = {}
    for name, p in _need(data, "pins", dict, "versions.yaml").items():
        where = f"pins.{name}"
        sets[name] = Pins(str(name), _need(p, "device_plugin", str, where), _need(p, "toolkit", str, where),
                          _manifest(_need(p, "calico", dict, where), f"{where}.calico"),
                          _manifest(_need(p, "flannel", dict, where), f"{where}.flannel"),
                          _need(p, "dcgm_exporter", str, where))
    minors: dict[str, Minor] = {}
    for key, m in _need(k8s, "minors", dict, "kubernetes").items():
        where = f"kubernetes.minors.{key}"
        if not isinstance(key, str) or not _MINOR.match(key):
            raise MatrixError(f"{where}: a minor is written as a quoted \"1.N\"")
        patch = _need(m, "latest_patch", str, where)
        if not re.fullmatch(re.escape(key) + r"\.[0-9]{1,3}", patch):
            raise MatrixError(f"{where}.latest_patch: {patch!r} is not a patch release of {key}")
        api = _need(m, "kubeadm_api", str, where)
        if not _KUBEADM_API.match(api):
            raise MatrixError(f"{where}.kubeadm_api: {api!r} is not a kubeadm configuration API (kubeadm.k8s.io/...)")
        floor = _need(m, "containerd_floor", str, where)
        tested = _need(m, "containerd_tested", list, where)
        if release(floor) is None or not all(isinstance(t, str) and release(t) for t in tested):
            raise MatrixError(f"{where}: containerd versions are dotted numbers")
        pins = _need(m, "pins", str, where)
        if pins not in sets:
            raise MatrixError(f"{where}.pins: no pin set {pins!r} (known: {', '.join(sets)})")
        minors[key] = Minor(key, _need(m, "end_of_life", date, where), patch, api, floor, tuple(tested), sets[pins])
    if not minors:
        raise MatrixError("kubernetes.minors: empty")
    minors = dict(sorted(minors.items(), key=lambda kv: -kv[1].number))
    default = _need(k8s, "default", str, "kubernetes")
    if default not in minors:
        raise MatrixError(f"kubernetes.default: {default} is not in kubernetes.minors")
    images = tuple(_need(data, "cuda_test_images", list, "versions.yaml"))
    for img in images:
        if not isinstance(img, str) or _image_cuda(img) is None:
            raise MatrixError(f"cuda_test_images: {img!r} names no CUDA version with a driver floor")
    installable = _need(k8s, "containerd_installable", int, "kubernetes")
    cgroup_v2_from = str(k8s.get("cgroup_v2_from") or "")
    if cgroup_v2_from and not _MINOR.match(cgroup_v2_from):
        raise MatrixError("kubernetes.cgroup_v2_from: a minor is written as a quoted \"1.N\"")
    node_bound = str(k8s.get("node_bound_tokens_from") or "")
    if node_bound and not _MINOR.match(node_bound):
        raise MatrixError("kubernetes.node_bound_tokens_from: a minor is written as a quoted \"1.N\"")
    cd = data.get("containerd") or {}
    cd_package = _need(cd, "package", str, "containerd") if cd else "containerd.io"
    cd_version = _need(cd, "version", str, "containerd") if cd else ""
    if cd and release(cd_version) is None:
        raise MatrixError(f"containerd.version: {cd_version!r} is not a package version")
    return Matrix(_need(data, "checked", date, "versions.yaml"), default, minors, images, installable,
                  cd_package, cd_version, cgroup_v2_from, node_bound)


@functools.lru_cache(maxsize=1)
def matrix() -> Matrix:
    """The matrix shipped in the package (read once)."""
    return _matrix_of(_document())


def minor_of(version: str) -> str:
    """"1.N.P" -> "1.N"; "v1.N" -> "1.N"."""
    return ".".join(version.lstrip("v").split(".")[:2])


def supported_minors() -> list[str]:
    """Every minor gpuk8s accepts (end of life or not), newest first."""
    return list(matrix().minors)


def default_minor() -> str:
    return matrix().default


def kubernetes(version: str) -> Minor | None:
    """The matrix entry of the minor of `version` ("1.N" or "1.N.P"), or None when gpuk8s does not know it."""
    return matrix().minors.get(minor_of(version))


def kubernetes_or_default(version: str) -> Minor:
    """As `kubernetes`, falling back to the default minor (the inventory loader has refused unknown minors)."""
    m = matrix()
    return m.minors.get(minor_of(version)) or m.minors[m.default]


def pins(version: str | None = None) -> Pins:
    """The component pins for the minor of `version` (default: the default minor)."""
    return kubernetes_or_default(version or default_minor()).pins


class InstallPins(TypedDict):
    """The InstallSettings fields whose defaults are pins of the matrix."""

    toolkit_version: str
    device_plugin_version: str
    calico_manifest: str
    flannel_manifest: str


def install_defaults(version: str | None = None) -> InstallPins:
    """The inventory's install.* defaults for the minor of `version` (default: the default minor)."""
    p = pins(version)
    return {"toolkit_version": p.toolkit, "device_plugin_version": p.device_plugin,
            "calico_manifest": p.calico.url, "flannel_manifest": p.flannel.url}


# containerd's CRI plugin injects CDI devices from 1.7 when its config says enable_cdi = true, by default from the
# first 2.x release (containerd docs/cri/config.md; NVIDIA's device plugin README: "containerd 1.7 and newer"). The
# DRA driver hands its devices to containers as CDI devices only.
CDI_FROM, CDI_BY_DEFAULT_FROM = (1, 7), (2, 0)


def containerd_floor(minor: str, dra: bool = False, have: Release | None = None,
                     enable_cdi: bool | None = None) -> Release:
    """The containerd a node needs: the kubelet's floor of the minor (the matrix), and on a DRA node one with CDI on:
    2.x, unless the node already runs 1.7+ with enable_cdi = true. Install and preflight both ask here."""
    floor = release(kubernetes_or_default(minor).containerd_floor) or (0,)
    if dra and not (enable_cdi and have is not None and at_least(have, CDI_FROM)):
        floor = max(floor, CDI_BY_DEFAULT_FROM)
    return floor


def containerd_install_release() -> Release:
    """The containerd release install brings a host to (the matrix's containerd.io pin), e.g. (2, 2, 6)."""
    return release(matrix().containerd_version.split("-")[0]) or (0,)


def needs_cgroup_v2(version: str) -> bool:
    """Whether the kubelet of this minor ("1.N" or "1.N.P") refuses to start on cgroup v1 by default."""
    first = matrix().cgroup_v2_from
    return bool(first) and int(minor_of(version).split(".")[1]) >= int(first.split(".")[1])


def end_of_life_minors(on: date | None = None) -> list[Minor]:
    return [m for m in matrix().minors.values() if m.end_of_life_reached(on)]


def default_by_rule(m: Matrix) -> str:
    """What kubernetes.default must be: the newest minor that has had at least two patch releases and whose
    containerd floor install can meet on the supported OSes (a default that preflight refuses on a stock
    Ubuntu 22.04, containerd 1.7, would be no default)."""
    return next(k for k, v in m.minors.items()
                if v.patch_releases >= 2 and (release(v.containerd_floor) or (0,))[0] <= m.containerd_installable)


def _image_cuda(image: str) -> str | None:
    """The key of CUDA_DRIVER_FLOORS an nvidia/cuda image needs: "13" for 13.0.0-base-..., "10.1" for 10.1-base."""
    tag = image.rpartition(":")[2]
    v = tag.split("-", 1)[0]
    if v in dict(_cuda_tables().driver_floors):
        return v
    major = v.split(".", 1)[0]
    return major if major in dict(_cuda_tables().driver_floors) else None


def cuda_test_image(driver: Release | None) -> str:
    """The newest GPU test image the driver can run; the oldest one when the driver is unknown or older."""
    images = matrix().cuda_test_images
    if driver is not None:
        floors = dict(_cuda_tables().driver_floors)
        for img in images:
            cuda = _image_cuda(img)
            if cuda is not None and at_least(driver, floors[cuda]):
                return img
    return images[-1]


def _manifest_pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for p in matrix().pin_sets().values():
        for pin in (p.calico, p.flannel):
            out[pin.url] = pin.sha256
    return out


# sha256 of the CNI manifests gpuk8s applies by default (the calico and flannel pins of every set in the
# matrix), keyed by their exact URL: a manifest at a pinned URL whose sha256 differs is not applied. A URL
# that is not listed here and has no install.*_manifest_sha256 in the inventory is applied as https
# delivers it.
DEFAULT_MANIFEST_SHA256: dict[str, str] = _manifest_pins()


DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter"  # the tag is each pin set's dcgm_exporter


@functools.lru_cache(maxsize=1)
def monitoring_images() -> dict[str, str]:
    """versions.yaml's monitoring_images (prometheus, grafana): image references with their tags."""
    data = _document()
    images = data.get("monitoring_images") if isinstance(data, dict) else None
    if not isinstance(images, dict) or not all(isinstance(v, str) and ":" in v for v in images.values()):
        raise MatrixError("monitoring_images: a mapping of name to image:tag expected")
    return {str(k): v for k, v in images.items()}


def monitoring_image(name: str) -> str:
    """The pinned image of a monitoring component: "prometheus" or "grafana"."""
    images = monitoring_images()
    if name not in images:
        raise MatrixError(f"monitoring_images.{name} is missing")
    return images[name]


def dcgm_exporter_image(version: str | None = None) -> str:
    """The DCGM exporter image gpuk8s runs with the Kubernetes minor of `version`."""
    return f"{DCGM_EXPORTER_IMAGE}:{pins(version).dcgm_exporter}"


CRI_DOCKERD_ARCHES = ("amd64", "arm64")  # the architectures cri-dockerd publishes a Linux archive for


@dataclass(frozen=True)
class CriDockerdPin:
    """cri-dockerd as install sets it up on Docker hosts: the release archive per architecture."""

    version: str  # "0.N.P", as the archive's name and `cri-dockerd --version` spell it
    url: str  # the release's download directory; the archive is URL/cri-dockerd-VERSION.ARCH.tgz
    sha256: dict[str, str]  # architecture (amd64, arm64) -> sha256 of the archive

    def archive(self, arch: str) -> str:
        return f"cri-dockerd-{self.version}.{arch}.tgz"


def parse_cri_dockerd(data: Any) -> CriDockerdPin:
    """versions.yaml's cri_dockerd section, checked; MatrixError names what is wrong."""
    d = _need(data, "cri_dockerd", dict, "versions.yaml")
    version, url = _need(d, "version", str, "cri_dockerd"), _need(d, "url", str, "cri_dockerd")
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", version):
        raise MatrixError(f"cri_dockerd.version: {version!r} is not a release number (0.N.P)")
    if not url.startswith("https://") or not url.endswith(f"/v{version}"):
        raise MatrixError(f"cri_dockerd.url: {url!r} must be the https download directory of v{version}")
    sums = _need(d, "sha256", dict, "cri_dockerd")
    if set(sums) != set(CRI_DOCKERD_ARCHES) or not all(isinstance(v, str) and _SHA256.match(v) for v in sums.values()):
        raise MatrixError(f"cri_dockerd.sha256: one sha256 (64 lowercase hex digits) for each of "
                          f"{', '.join(CRI_DOCKERD_ARCHES)}")
    return CriDockerdPin(version, url, {a: sums[a] for a in CRI_DOCKERD_ARCHES})


@functools.lru_cache(maxsize=1)
def cri_dockerd() -> CriDockerdPin:
    """The cri-dockerd pin shipped in the package (read once)."""
    return parse_cri_dockerd(_document())


def to_json(on: date | None = None) -> dict[str, Any]:
    """The matrix as `gpuk8s versions -o json` prints it."""
    m = matrix()
    day = on or today()

    def cni(p: ManifestPin) -> dict[str, str]:
        return {"version": p.version, "url": p.url, "sha256": p.sha256}

    return {
        "checked": m.checked.isoformat(),
        "today": day.isoformat(),
        "default": m.default,
        "end_of_life": [k.minor for k in end_of_life_minors(day)],
        "minors": [{
            "minor": k.minor, "default": k.minor == m.default, "latest_patch": k.latest_patch,
            "end_of_life": k.end_of_life.isoformat(), "end_of_life_reached": k.end_of_life_reached(day),
            "kubeadm_api": k.kubeadm_api, "containerd_floor": k.containerd_floor,
            "containerd_tested": list(k.containerd_tested), "pins": k.pins.name,
            "device_plugin": k.pins.device_plugin, "toolkit": k.pins.toolkit, "calico": cni(k.pins.calico),
            "flannel": cni(k.pins.flannel), "dcgm_exporter": k.pins.dcgm_exporter,
        } for k in m.minors.values()],
        "cuda_test_images": list(m.cuda_test_images),
        "cri_dockerd": {"version": cri_dockerd().version, "url": cri_dockerd().url, "sha256": cri_dockerd().sha256},
    }


@dataclass(frozen=True)
class HamiPin:
    """HAMi as gpuk8s deploys it on nodes that ask for memory-based sharing (docs/sharing.md)."""

    chart_version: str  # the Helm chart whose objects gpuk8s/data/hami.yaml.j2 renders
    image: str  # its scheduler extender and device plugin image, with tag


@functools.lru_cache(maxsize=1)
def hami() -> HamiPin:
    """versions.yaml's hami section."""
    data = _document()
    h = data.get("hami") if isinstance(data, dict) else None
    if not isinstance(h, dict) or not isinstance(h.get("image"), str) or ":" not in h["image"]:
        raise MatrixError("hami: chart_version and image (with its tag) expected")
    return HamiPin(str(h.get("chart_version", "")), h["image"])


@dataclass(frozen=True)
class FabricPin:
    """What gpuk8s deploys and runs for a node's RDMA fabric (docs/fabric.md)."""

    rdma_device_plugin: str  # the RDMA shared device plugin's image, with tag
    test_image: str  # verify --fabric's image: nccl-tests and perftest


@functools.lru_cache(maxsize=1)
def fabric() -> FabricPin:
    """versions.yaml's fabric section."""
    data = _document()
    f = data.get("fabric") if isinstance(data, dict) else None
    if not isinstance(f, dict) or not all(isinstance(f.get(k), str) and ":" in f[k]
                                          for k in ("rdma_device_plugin", "test_image")):
        raise MatrixError("fabric: rdma_device_plugin and test_image (each an image with its tag) expected")
    return FabricPin(f["rdma_device_plugin"], f["test_image"])


@dataclass(frozen=True)
class DraDriverPin:
    """NVIDIA's DRA driver as gpuk8s deploys it where a node says allocator: dra (docs/dra.md)."""

    chart_version: str  # the Helm chart whose GPU objects gpuk8s/data/dra-driver.yaml.j2 renders
    image: str  # its image, with tag
    driver_floor: Release  # the NVIDIA driver it needs (565)
    kubernetes_floor: Release  # the Kubernetes release it needs (1.34.2)
    extended_resource_since: int  # the minor from which DeviceClass gpu.nvidia.com names nvidia.com/gpu (37)


@functools.lru_cache(maxsize=1)
def dra_driver() -> DraDriverPin:
    """versions.yaml's dra_driver section."""
    data = _document()
    d = data.get("dra_driver") if isinstance(data, dict) else None
    try:
        assert isinstance(d, dict) and isinstance(d["image"], str) and ":" in d["image"]
        floors = release(str(d["driver_floor"])), release(str(d["kubernetes_floor"]))
        since = str(d["extended_resource_since"]).split(".")
        assert floors[0] is not None and floors[1] is not None and len(since) == 2
        return DraDriverPin(str(d["chart_version"]), d["image"], floors[0], floors[1], int(since[1]))
    except (AssertionError, KeyError, ValueError) as e:
        raise MatrixError("dra_driver: chart_version, image (with its tag), driver_floor, kubernetes_floor and "
                          "extended_resource_since (1.N) expected") from e


@functools.lru_cache(maxsize=1)
def _cni_images() -> dict[str, tuple[str, ...]]:
    data = _document()
    out: dict[str, tuple[str, ...]] = {}
    for pins in (data.get("pins") or {}).values():
        for cni in ("calico", "flannel"):
            pin = pins.get(cni) or {}
            imgs = pin.get("images")
            if isinstance(imgs, list) and all(isinstance(i, str) and ":" in i for i in imgs):
                out[str(pin.get("url"))] = tuple(imgs)
    return out


def cni_images(url: str) -> list[str]:
    """The images inside the pinned CNI manifest at `url` (versions.yaml pins' `images`), [] for another URL:
    gpuk8s does not know what an unpinned manifest runs (docs/mirrors.md)."""
    return list(_cni_images().get(url, ()))


DriverDesignation = Literal["long-term-support", "production"]


@dataclass(frozen=True)
class DriverBranch:
    """One NVIDIA data center driver branch gpuk8s installs (versions.yaml `driver.branches`)."""

    branch: str  # "580"
    designation: DriverDesignation
    end_of_life: date

    def end_of_life_reached(self, on: date) -> bool:
        return on > self.end_of_life


@dataclass(frozen=True)
class DriverMatrix:
    """versions.yaml's driver section: the branches gpuk8s installs and the rules by GPU architecture."""

    default_branch: str
    branches: dict[str, DriverBranch]
    open_modules_since: int  # the first branch with open kernel modules
    last_branch_before_turing: int  # the newest branch that still serves GPUs before Turing
    blackwell_since: int  # the first branch that serves Blackwell

    def branch(self, name: str) -> DriverBranch | None:
        return self.branches.get(name)


_BRANCH = re.compile(r"[0-9]{3}")
_DESIGNATIONS = ("long-term-support", "production")


def parse_drivers(data: Any) -> DriverMatrix:
    """versions.yaml's driver section, checked; MatrixError names what is wrong."""
    d = _need(data, "driver", dict, "versions.yaml")
    raw = _need(d, "branches", dict, "driver")
    branches: dict[str, DriverBranch] = {}
    for name, b in raw.items():
        if not isinstance(name, str) or not _BRANCH.fullmatch(name) or not isinstance(b, dict):
            raise MatrixError(f"driver.branches: {name!r} must be a quoted three-digit branch with its fields")
        designation, eol = b.get("designation"), b.get("end_of_life")
        if designation not in _DESIGNATIONS or not isinstance(eol, date):
            raise MatrixError(f"driver.branches.{name}: designation ({' or '.join(_DESIGNATIONS)}) and "
                              "end_of_life (a date) expected")
        branches[name] = DriverBranch(name, designation, eol)
    default = _need(d, "default_branch", str, "driver")
    if default not in branches:
        raise MatrixError(f"driver.default_branch: {default!r} is not one of driver.branches")
    rules = {}
    for key in ("open_modules_since", "last_branch_before_turing", "blackwell_since"):
        v = _need(d, key, str, "driver")
        if not _BRANCH.fullmatch(v):
            raise MatrixError(f"driver.{key}: {v!r} is not a three-digit branch")
        rules[key] = int(v)
    return DriverMatrix(default, branches, **rules)


@functools.lru_cache(maxsize=1)
def drivers() -> DriverMatrix:
    """The driver section shipped in the package (read once)."""
    return parse_drivers(_document())
