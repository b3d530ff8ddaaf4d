"""RPM repository metadata for bundles (Alibaba Cloud Linux 3 and the RHEL 8 family): rpm's version order
(lib/rpmvercmp.c: alphanumeric segments, numbers above letters, `~` before anything, even the end, `^` after the
end but before anything else) and epoch:version-release comparison, as `rpm.vercmp` and dnf order them. Pure.
"""

from __future__ import annotations

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
