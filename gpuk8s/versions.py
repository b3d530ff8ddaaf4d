"""Numeric version extraction for the non-PEP 440 strings that drivers and runtimes print.

`19.03.5` equals 19.3.5, `1.6.20~ds1` is 1.6.20, `v1.7.2` is 1.7.2, `20.10.24+dfsg1` is 20.10.24.
The raw string is kept by callers for messages; only the numeric release is compared.
"""

from __future__ import annotations

import re

_RELEASE = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+)")

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
