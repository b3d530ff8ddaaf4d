"""gpuk8s's own wheel, and its dependencies', for a bundle: rebuilt from what pip installed on the machine that runs
`bundle create`, so that the site runs the very gpuk8s that built the bundle (docs/airgap.md).

A wheel is a zip of the files pip unpacked plus its .dist-info (PEP 427); pip's RECORD in the installed .dist-info
lists every file with its sha256. Each file is checked against RECORD (a file changed after pip installed it is
refused, not carried), files outside the install root (console scripts, which pip writes again from
entry_points.txt) and bytecode are left out, and RECORD is written anew. Written reproducibly (entries in name
order, fixed times and modes): the same installed files give the same bytes. The dependencies are those gpuk8s
requires (its METADATA's Requires-Dist, markers evaluated here), transitively; a binary one keeps its tags (this
machine's Python and platform: WHEEL's Tag lines), which is what a site installs them on.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

import gpuk8s
from gpuk8s.errors import GpuK8sError

DIR = "wheel"  # where the wheels are in a bundle
_SKIPPED = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")  # pip's own, of this install only
_TAG = re.compile(r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+$")
_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: the same files give the same bytes
MAX_FILE = 256 << 20  # one installed file read into memory


class WheelError(GpuK8sError):
    """Why a distribution's wheel cannot be rebuilt (bundle create carries no wheels then, and says why)."""

    kind = "bundle"


@dataclass(frozen=True)
class Wheels:
    built: dict[str, Path]  # bundle path (wheel/NAME-VERSION-TAG.whl) -> file
    missing: list[str]  # what could not be carried, with why


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def rebuild(dist: md.Distribution, out_dir: Path) -> Path:
    """The wheel of an installed distribution, from its files as pip's RECORD lists them (WheelError: why not)."""
    name, version = dist.metadata["Name"], dist.version
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    if isinstance(direct, dict) and isinstance(direct.get("dir_info"), dict) and direct["dir_info"].get("editable"):
        raise WheelError(f"{name}: installed editable, from a source checkout (pip install -e): its files are "
                         "there, not installed (python -m build there makes its wheel)")
    files = list(dist.files or [])
    info = next((f.parent for f in files if f.name == "METADATA" and f.parent.name.endswith(".dist-info")), None)
    if not name or info is None:
        raise WheelError(f"{name or '?'}: no pip RECORD of its installed files here (run from a source checkout, or "
                         "installed by the OS's package manager)")
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [t.strip() for line in wheel_meta.splitlines() if line.startswith("Tag:") for t in [line[4:]]]
    if not tags or not all(_TAG.match(t) for t in tags):
        raise WheelError(f"{name}: its WHEEL file names no tag")
    entries: list[tuple[str, bytes]] = []
    package_files = 0
    root = Path(str(dist.locate_file(""))).resolve()
    for f in files:
        path = str(f).replace("\\", "/")
        parts = path.split("/")
        if path.startswith(("../", "/")) or "__pycache__" in parts or path.endswith(".pyc"):
            continue  # outside the install root (console scripts, .data's files: pip writes them again), bytecode
        if ".." in parts or "" in parts or "." in parts:
            raise WheelError(f"{name}: RECORD names {path[:200]!r}, which is not a plain path under its root")
        if f.parent == info and f.name in _SKIPPED:
            continue
        if f.parent.name.endswith(".dist-info") and f.parent != info:
            continue
        local = Path(str(f.locate()))
        if root not in local.resolve().parents:
            raise WheelError(f"{name}: {path} lies outside its install root (a link?)")
        try:
            if local.stat().st_size > MAX_FILE:
                raise WheelError(f"{name}: {path} is larger than {MAX_FILE >> 20} MiB")
            data = local.read_bytes()
        except OSError as e:
            raise WheelError(f"{name}: cannot read {path}: {e.strerror}") from None
        if f.hash is not None:
            if f.hash.mode != "sha256" or _b64(hashlib.sha256(data).digest()) != f.hash.value:
                raise WheelError(f"{name}: {path} is not the file pip installed (its sha256 differs from RECORD)")
        elif f.parent != info:
            raise WheelError(f"{name}: RECORD has no sha256 for {path}")
        entries.append((path, data))
        package_files += f.parent != info
    if not package_files:
        raise WheelError(f"{name}: none of its files are installed here (an editable install, from a source "
                         "checkout?)")
    record = f"{info}/RECORD"
    lines = [f"{p},sha256={_b64(hashlib.sha256(d).digest())},{len(d)}" for p, d in entries] + [f"{record},,"]
    entries.append((record, ("\n".join(lines) + "\n").encode()))
    # the .dist-info last and its RECORD at the very end (as PEP 427 and bdist_wheel have it), else name order
    entries.sort(key=lambda e: (e[0].startswith(f"{info}/"), e[0] == record, e[0]))
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / f"{canonicalize_name(name).replace('-', '_')}-{version}-{tags[0]}.whl"
    if len(tags) > 1:  # a compressed tag set: py2.py3-none-any
        split = [t.split("-") for t in tags]
        dest = out_dir / (f"{canonicalize_name(name).replace('-', '_')}-{version}-"
                          + "-".join(".".join(dict.fromkeys(p[i] for p in split)) for i in range(3)) + ".whl")
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for path, data in entries:
            zi = zipfile.ZipInfo(path, _DATE)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return dest


def _requires(dist: md.Distribution, extras: frozenset[str] = frozenset()) -> list[tuple[str, frozenset[str]]]:
    """What `dist` requires here with the extras asked of it (markers evaluated on this Python): (name, extras)."""
    out = []
    for line in dist.requires or []:
        try:
            r = Requirement(line)
        except InvalidRequirement:
            continue
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *sorted(extras))):
            out.append((r.name, frozenset(r.extras)))
    return out


def _running(root: str) -> md.Distribution:
    """`root`'s installed distribution, which must be the code running now (not an older wheel installed beside a
    checkout on PYTHONPATH): WheelError otherwise."""
    dist = md.distribution(root)
    mine = Path(gpuk8s.__file__).resolve()
    there = Path(str(dist.locate_file("gpuk8s/__init__.py"))).resolve()
    if root == "gpuk8s" and (dist.version != gpuk8s.__version__ or there != mine):
        raise WheelError(f"gpuk8s runs from {mine.parent}, not from the gpuk8s {dist.version} installed at "
                         f"{there.parent}: the wheel would not be the gpuk8s that builds the bundle")
    return dist


def wheels(out_dir: Path, root: str = "gpuk8s") -> Wheels:
    """`root`'s wheel and those of everything it requires, transitively, rebuilt into out_dir. None at all where
    `root`'s own cannot be rebuilt (run from a source checkout): its dependencies are carried for its sake."""
    try:
        dist = _running(root)
        first = rebuild(dist, out_dir)
    except md.PackageNotFoundError:
        return Wheels({}, [f"{root}: not installed here"])
    except WheelError as e:
        return Wheels({}, [e.message])
    built: dict[str, Path] = {f"{DIR}/{first.name}": first}
    missing: list[str] = []
    seen: dict[str, frozenset[str]] = {canonicalize_name(root): frozenset()}
    todo = _requires(dist)
    while todo:
        raw, extras = todo.pop()
        name = canonicalize_name(raw)
        if name in seen and extras <= seen[name]:
            continue
        again = name in seen  # asked again with more extras: only what they add
        seen[name] = seen.get(name, frozenset()) | extras
        try:
            dep = md.distribution(name)
        except md.PackageNotFoundError:
            missing.append(f"{name}: not installed here")
            continue
        if not again:
            try:
                whl = rebuild(dep, out_dir)
            except WheelError as e:
                missing.append(e.message)
            else:
                built[f"{DIR}/{whl.name}"] = whl
        todo += _requires(dep, seen[name])
    return Wheels(dict(sorted(built.items())), sorted(set(missing)))
