"""RPM repository metadata for bundles (Alibaba Cloud Linux 3 and the RHEL 8 family): rpm's version order
(lib/rpmvercmp.c: alphanumeric segments, numbers above letters, `~` before anything, even the end, `^` after the
end but before anything else) and epoch:version-release comparison, as `rpm.vercmp` and dnf order them;
repodata/repomd.xml and primary.xml read (streamed, bounded: Python's expat refuses entity expansion bombs and
ElementTree resolves no external entity), and the packages a wanted set needs resolved against the target's
index: requires met by a package's name, its provides or a file it lists. Pure.
"""

from __future__ import annotations

import functools
import io
import re
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuk8s.errors import GpuK8sError


class RpmError(GpuK8sError):
    kind = "bundle"


def _digit(c: str) -> bool:  # rpm's risdigit/risalpha: ASCII only
    return "0" <= c <= "9"


def _alpha(c: str) -> bool:
    return "a" <= c <= "z" or "A" <= c <= "Z"


def vercmp(a: str, b: str) -> int:
    """-1, 0 or 1 as rpm orders version (or release) strings `a` and `b` (rpmvercmp)."""
    if a == b:
        return 0
    i = j = 0
    while i < len(a) or j < len(b):
        while i < len(a) and not (_digit(a[i]) or _alpha(a[i])) and a[i] not in "~^":
            i += 1
        while j < len(b) and not (_digit(b[j]) or _alpha(b[j])) and b[j] not in "~^":
            j += 1
        # tilde: sorts before everything else, the end included
        if (i < len(a) and a[i] == "~") or (j < len(b) and b[j] == "~"):
            if not (i < len(a) and a[i] == "~"):
                return 1
            if not (j < len(b) and b[j] == "~"):
                return -1
            i += 1
            j += 1
            continue
        # caret: like the end, but after it when the other string has ended
        if (i < len(a) and a[i] == "^") or (j < len(b) and b[j] == "^"):
            if i >= len(a):
                return -1
            if j >= len(b):
                return 1
            if a[i] != "^":
                return 1
            if b[j] != "^":
                return -1
            i += 1
            j += 1
            continue
        if not (i < len(a) and j < len(b)):
            break
        si, sj = i, j
        numeric = _digit(a[i])
        if numeric:
            while i < len(a) and _digit(a[i]):
                i += 1
            while j < len(b) and _digit(b[j]):
                j += 1
        else:
            while i < len(a) and _alpha(a[i]):
                i += 1
            while j < len(b) and _alpha(b[j]):
                j += 1
        x, y = a[si:i], b[sj:j]
        if not y:  # different kinds: a number is newer than letters
            return 1 if numeric else -1
        if numeric:
            x, y = x.lstrip("0"), y.lstrip("0")
            if len(x) != len(y):
                return 1 if len(x) > len(y) else -1
        if x != y:
            return 1 if x > y else -1
    if i >= len(a) and j >= len(b):
        return 0
    return -1 if i >= len(a) else 1


def evr(text: str) -> tuple[int, str, str]:
    """'1:2.2.6-3.1.el8' -> (1, '2.2.6', '3.1.el8'); no epoch: 0; no release: ''."""
    epoch, sep, rest = text.partition(":")
    if not sep:
        epoch, rest = "0", text
    if not epoch.isdigit() or len(epoch) > 9:
        raise RpmError(f"{text[:64]!r}: the epoch is not a number", "use the repository's own metadata")
    version, _, release = rest.partition("-") if "-" in rest else (rest, "", "")
    return int(epoch), version, release


def compare(a: str, b: str) -> int:
    """-1, 0, 1 as EVR `a` sorts before, with or after `b`; a release missing on either side is not compared (rpm's
    rule for a requirement that names no release)."""
    ea, va, ra = evr(a)
    eb, vb, rb = evr(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return vercmp(va, vb) or (vercmp(ra, rb) if ra and rb else 0)


# -- repository metadata: repodata/repomd.xml and primary.xml (createrepo_c's format) ------------------------------

MAX_PRIMARY = 512 << 20  # bytes of primary.xml, decompressed (a distribution's BaseOS is ~30 MB)
MAX_PACKAGES = 200_000
_COMMON = "{http://linux.duke.edu/metadata/common}"
_RPM = "{http://linux.duke.edu/metadata/rpm}"
_REPO = "{http://linux.duke.edu/metadata/repo}"
_FLAGS = {"EQ": "=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
_HEX = re.compile(r"^[0-9a-f]{32,128}$")


@dataclass(frozen=True)
class Dep:
    """A requires or provides entry: `name`, and where versioned its relation and EVR ("2:2.74-1.el8")."""

    name: str
    op: str = ""  # "", "=", "<", "<=", ">", ">="
    evr: str = ""

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.evr}" if self.op else self.name


@dataclass(frozen=True)
class RpmPackage:
    name: str
    arch: str
    evr: str  # "epoch:version-release", epoch 0 left out
    sha256: str
    size: int
    href: str  # the file's path under the repository's root
    provides: tuple[Dep, ...] = ()
    requires: tuple[Dep, ...] = ()
    files: tuple[str, ...] = ()  # the files primary.xml lists (the ones a require may name: /usr/bin/..., /etc/...)

    @property
    def version(self) -> str:
        return evr(self.evr)[1]

    @property
    def release(self) -> str:
        return evr(self.evr)[2]


def _evr_of(e: Any) -> str:
    epoch, ver, rel = e.get("epoch") or "0", e.get("ver") or "", e.get("rel") or ""
    if not ver:
        return ""
    return (f"{epoch}:" if epoch != "0" else "") + ver + (f"-{rel}" if rel else "")


def repomd(data: bytes) -> dict[str, tuple[str, str]]:
    """repodata/repomd.xml: data type -> (location href, sha256 of the file as it is served)."""
    out: dict[str, tuple[str, str]] = {}
    try:
        root = ET.fromstring(data[:8 << 20])
    except ET.ParseError as e:
        raise RpmError(f"repomd.xml is not XML: {str(e)[:120]}", "check the repository URL") from None
    for d in root.iter(f"{_REPO}data"):
        loc, ck = d.find(f"{_REPO}location"), d.find(f"{_REPO}checksum")
        if loc is None or ck is None or ck.get("type") != "sha256" or not _HEX.match((ck.text or "").strip()):
            continue
        out[str(d.get("type"))] = (str(loc.get("href")), (ck.text or "").strip())
    return out


def parse_primary(data: bytes) -> list[RpmPackage]:
    """primary.xml's packages, streamed (linear; the document at most MAX_PRIMARY bytes, MAX_PACKAGES packages)."""
    if len(data) > MAX_PRIMARY:
        raise RpmError(f"primary.xml is larger than {MAX_PRIMARY >> 20} MiB", "a repository index that large is "
                       "refused")
    out: list[RpmPackage] = []
    try:
        for _, el in ET.iterparse(io.BytesIO(data), events=("end",)):
            if el.tag != f"{_COMMON}package":
                continue
            if el.get("type") == "rpm":
                out.append(_package(el))
                if len(out) > MAX_PACKAGES:
                    raise RpmError(f"primary.xml lists more than {MAX_PACKAGES} packages", "check the repository")
            el.clear()
    except ET.ParseError as e:
        raise RpmError(f"primary.xml is not XML: {str(e)[:120]}", "check the repository URL") from None
    return out


def _package(el: Any) -> RpmPackage:
    def text(tag: str) -> str:
        x = el.find(f"{_COMMON}{tag}")
        return (x.text or "").strip() if x is not None else ""

    version = el.find(f"{_COMMON}version")
    ck = el.find(f"{_COMMON}checksum")
    size = el.find(f"{_COMMON}size")
    loc = el.find(f"{_COMMON}location")
    fmt = el.find(f"{_COMMON}format")

    def deps(kind: str) -> tuple[Dep, ...]:
        box = fmt.find(f"{_RPM}{kind}") if fmt is not None else None
        return tuple(Dep(str(e.get("name")), _FLAGS.get(str(e.get("flags")), ""), _evr_of(e))
                     for e in (box.iter(f"{_RPM}entry") if box is not None else ()) if e.get("name"))

    sha = (ck.text or "").strip() if ck is not None and ck.get("type") == "sha256" else ""
    raw_size = size.get("package", "0") if size is not None else "0"
    files = tuple((f.text or "").strip() for f in fmt.iter(f"{_COMMON}file")) if fmt is not None else ()
    return RpmPackage(text("name"), text("arch"), _evr_of(version) if version is not None else "",
                      sha if _HEX.match(sha) else "", int(raw_size) if raw_size.isdigit() and len(raw_size) < 16 else 0,
                      str(loc.get("href", "")) if loc is not None else "", deps("provides"), deps("requires"), files)


def _satisfies(have: str, op: str, want: str) -> bool:
    if not op or not have:
        return True  # an unversioned side overlaps any version (rpm's rpmdsCompare)
    c = compare(have, want)
    return {"=": c == 0, "<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op]


def _by_evr(a: RpmPackage, b: RpmPackage) -> int:
    return compare(a.evr, b.evr)


_NEWEST = functools.cmp_to_key(_by_evr)


class RpmIndex:
    """A target's packages for one architecture (and noarch): by name, by what they provide, by the files listed."""

    def __init__(self, packages: Iterable[RpmPackage], arch: str) -> None:
        self.by_name: dict[str, list[RpmPackage]] = {}
        self.providers: dict[str, list[tuple[RpmPackage, Dep]]] = {}
        for p in packages:
            if p.arch not in (arch, "noarch"):
                continue
            self.by_name.setdefault(p.name, []).append(p)
            for d in (Dep(p.name, "=", p.evr), *p.provides, *(Dep(f) for f in p.files)):
                self.providers.setdefault(d.name, []).append((p, d))
        for ps in self.by_name.values():
            ps.sort(key=_NEWEST, reverse=True)

    def candidates(self, d: Dep) -> list[RpmPackage]:
        """Newest first, each once."""
        seen: dict[str, RpmPackage] = {}
        for p, prov in self.providers.get(d.name, []):
            if _satisfies(prov.evr if prov.op else "", d.op, d.evr):
                seen.setdefault(f"{p.name}-{p.evr}.{p.arch}", p)
        return sorted(seen.values(), key=_NEWEST, reverse=True)


@dataclass
class RpmResolution:
    chosen: dict[str, RpmPackage] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def resolve(index: RpmIndex, wanted: Iterable[RpmPackage]) -> RpmResolution:
    """What the bundle carries for `wanted` (packages of the index) on a host of its distribution: each, then
    transitively every requirement no chosen package provides, by the newest provider; rpmlib() and what nothing
    in the index provides are named in `missing` (the distribution's own repositories serve them)."""
    out = RpmResolution()
    todo: deque[tuple[RpmPackage | Dep, str]] = deque((p, "asked for") for p in wanted)
    while todo:
        item, why = todo.popleft()
        if isinstance(item, RpmPackage):
            pick = item
        else:
            if item.name.startswith("rpmlib(") or any(
                    _satisfies(prov.evr if prov.op else "", item.op, item.evr)
                    for c in out.chosen.values() for prov in (Dep(c.name, "=", c.evr), *c.provides, *(
                        Dep(f) for f in c.files)) if prov.name == item.name):
                continue
            found = index.candidates(item)
            if not found:
                out.missing.append(f"{item} ({why}): not in the bundle's repositories")
                continue
            pick = found[0]
        if pick.name in out.chosen:
            continue
        out.chosen[pick.name] = pick
        todo += [(d, f"needed by {pick.name}-{pick.evr}") for d in pick.requires]
    return out
