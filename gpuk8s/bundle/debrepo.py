"""Debian repository metadata for bundles: a `Packages` index read (RFC 822 stanzas, as apt-get update fetches them and
`apt-cache show` prints them), Debian version order (dpkg's), and the packages a set of wanted ones needs, resolved
against the target distribution's index (never the build machine's): Depends and Pre-Depends with their version
relations and alternatives, virtual packages through Provides. What the target host has already (its `dpkg-query`
list) is left out. Pure; linear in the index's size, which is bounded (MAX_INDEX).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuk8s.errors import GpuK8sError

MAX_INDEX = 256 << 20  # a distribution's main Packages index is ~10 MB, jammy's universe ~60 MB
MAX_FIELD = 1 << 20
_REL = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]*)(?::([a-z0-9-]+))?\s*(?:\(\s*(<<|<=|=|>=|>>|<|>)\s*([^)\s]+)\s*\))?"
                  r"\s*(?:\[[^\]]*\])?\s*(?:<[^>]*>\s*)*$")


class RepoError(GpuK8sError):
    kind = "bundle"


@dataclass(frozen=True)
class Rel:
    """One relation: `libc6 (>= 2.34)` -> Rel("libc6", ">=", "2.34"); no version: op and version ""."""

    name: str
    op: str = ""
    version: str = ""

    def __str__(self) -> str:
        return f"{self.name} ({self.op} {self.version})" if self.op else self.name


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    arch: str
    depends: tuple[tuple[Rel, ...], ...] = ()  # Pre-Depends and Depends: each an alternative of relations
    provides: tuple[Rel, ...] = ()
    filename: str = ""
    size: int = 0
    sha256: str = ""


# -- dpkg's version order ---------------------------------------------------------------------------------------

def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    """dpkg's lib/dpkg/version.c verrevcmp: non-digit runs by _order (~ before all, even the end; letters before
    other characters), digit runs numerically."""
    i = j = 0
    while i < len(a) or j < len(b):
        first = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first:
                first = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first:
            return first
    return 0


def _split(v: str) -> tuple[int, str, str]:
    epoch, _, rest = v.partition(":") if ":" in v else ("0", "", v)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return (int(epoch) if epoch.isdigit() and len(epoch) < 10 else 0), upstream, revision


def compare(a: str, b: str) -> int:
    """<0, 0, >0 as Debian version `a` sorts before, with or after `b` (dpkg --compare-versions)."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)


def satisfies(version: str, op: str, want: str) -> bool:
    if not op:
        return True
    c = compare(version, want)
    return {"<<": c < 0, "<": c <= 0, "<=": c <= 0, "=": c == 0, ">=": c >= 0, ">": c >= 0, ">>": c > 0}[op]


# -- the index ----------------------------------------------------------------------------------------------------

def relations(text: str, where: str) -> tuple[tuple[Rel, ...], ...]:
    """`a (>= 1), b | c:any` -> ((a>=1,), (b, c))."""
    out = []
    for group in text.split(","):
        if not group.strip():
            continue
        alts = []
        for part in group.split("|"):
            m = _REL.match(part)
            if m is None:
                raise RepoError(f"{where}: relation {part.strip()[:80]!r} is not one Debian writes",
                                "use the repository's own Packages index")
            alts.append(Rel(m.group(1), m.group(3) or "", m.group(4) or ""))
        out.append(tuple(alts))
    return tuple(out)


def stanzas(text: str) -> Iterable[dict[str, str]]:
    """The stanzas of a Packages index: field -> value (continuation lines joined with newlines)."""
    if len(text) > MAX_INDEX:
        raise RepoError(f"a Packages index larger than {MAX_INDEX >> 20} MiB", "split it by component")
    cur: dict[str, str] = {}
    last = ""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            if cur:
                yield cur
            cur, last = {}, ""
        elif line[0] in " \t":
            if not last:
                raise RepoError(f"Packages line {n}: a continuation line without a field", "use the real index")
            if len(cur[last]) + len(line) > MAX_FIELD:
                raise RepoError(f"Packages line {n}: field {last} longer than {MAX_FIELD >> 10} KiB",
                                "use the real index")
            cur[last] += "\n" + line.strip()
        else:
            key, sep, value = line.partition(":")
            if not sep or not key or " " in key:
                raise RepoError(f"Packages line {n}: not 'Field: value'", "use the repository's own index")
            last = key
            cur[key] = value.strip()
    if cur:
        yield cur


def parse(text: str) -> list[DebPackage]:
    out = []
    for s in stanzas(text):
        name, version = s.get("Package", ""), s.get("Version", "")
        if not name or not version:
            continue  # a stanza of another kind (a Release file's) has neither
        where = f"{name} {version}"
        deps = relations(s.get("Pre-Depends", ""), where) + relations(s.get("Depends", ""), where)
        provides = tuple(r for g in relations(s.get("Provides", ""), where) for r in g)
        size = s.get("Size", "0")
        out.append(DebPackage(name, version, s.get("Architecture", ""), deps, provides, s.get("Filename", ""),
                              int(size) if size.isdigit() and len(size) < 16 else 0, s.get("SHA256", "")))
    return out


# -- resolution -----------------------------------------------------------------------------------------------------

@dataclass
class Resolution:
    chosen: dict[str, DebPackage] = field(default_factory=dict)  # name -> the package the bundle carries
    missing: list[str] = field(default_factory=list)  # what nothing in the index satisfies, with who asked


class Index:
    """A target's packages by name and by what they provide, for one architecture (and `all`)."""

    def __init__(self, packages: Iterable[DebPackage], arch: str) -> None:
        self.by_name: dict[str, list[DebPackage]] = {}
        self.providers: dict[str, list[tuple[DebPackage, Rel]]] = {}
        for p in packages:
            if p.arch not in (arch, "all"):
                continue
            self.by_name.setdefault(p.name, []).append(p)
            for r in p.provides:
                self.providers.setdefault(r.name, []).append((p, r))
        for ps in self.by_name.values():  # newest first
            ps.sort(key=_Key, reverse=True)

    def candidates(self, rel: Rel) -> list[DebPackage]:
        """The packages that satisfy `rel`, real ones newest first, then providers (a versioned relation is met
        by a versioned Provides only, as apt does)."""
        out = [p for p in self.by_name.get(rel.name, []) if satisfies(p.version, rel.op, rel.version)]
        out += [p for p, pr in self.providers.get(rel.name, [])
                if not rel.op or (pr.op == "=" and satisfies(pr.version, rel.op, rel.version))]
        return out


class _Key:
    def __init__(self, p: DebPackage) -> None:
        self.v = p.version

    def __lt__(self, other: _Key) -> bool:
        return compare(self.v, other.v) < 0


def resolve(index: Index, wanted: Iterable[Rel], installed: Mapping[str, str] | None = None) -> Resolution:
    """What the bundle must carry for `wanted` on a host of this index's distribution: each wanted relation and,
    transitively, each dependency not met by `installed` (name -> version, the host's dpkg list) nor by a package
    already chosen. For an alternative, the first of its relations that can be met. Newest satisfying version."""
    have = dict(installed or {})
    out = Resolution()
    todo: deque[tuple[tuple[Rel, ...], str]] = deque(((r,), "asked for") for r in wanted)
    while todo:
        alts, why = todo.popleft()
        if any(_met(r, have, out.chosen) for r in alts):
            continue
        pick = next((c for r in alts for c in index.candidates(r)), None)
        if pick is None:
            out.missing.append(f"{' | '.join(map(str, alts))} ({why}): not in the index")
            continue
        out.chosen[pick.name] = pick
        todo += [(g, f"needed by {pick.name} {pick.version}") for g in pick.depends]
    return out


def _met(rel: Rel, have: Mapping[str, str], chosen: Mapping[str, DebPackage]) -> bool:
    if rel.name in have and satisfies(have[rel.name], rel.op, rel.version):
        return True
    p = chosen.get(rel.name)
    if p is not None and satisfies(p.version, rel.op, rel.version):
        return True
    return any(r.name == rel.name and (not rel.op or (r.op == "=" and satisfies(r.version, rel.op, rel.version)))
               for c in chosen.values() for r in c.provides)
