"""`gpuk8s bundle verify`'s integrity half: the manifest first, then every member's sha256 and size against it, in one
pass over the stream; every file that differs, is missing or was added is named. (Which hosts the bundle covers is
gpuk8s.bundle.coverage's.)"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from gpuk8s.bundle.archive import BundleError, open_tar
from gpuk8s.bundle.manifest import MAX_MANIFEST, NAME, Manifest, parse

MAX_PROBLEMS = 50  # named one by one; beyond that counted


@dataclass
class Verified:
    manifest: Manifest
    problems: list[str] = field(default_factory=list)
    more: int = 0  # problems beyond MAX_PROBLEMS
    files: int = 0
    bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
        else:
            self.more += 1


def verify(path: Path) -> Verified:
    """The bundle's manifest and what differs from it. A BundleError where the file cannot be read as a bundle at
    all (not zstd, corrupted, a hostile member, no manifest first)."""
    with open_tar(path) as tar:
        members = tar.members()
        first = next(members, None)
        if first is None or first.name != NAME or first.kind != "file":
            raise BundleError(f"{path}: its first member is not {NAME} (not a gpuk8s bundle)",
                              "pass a gpuk8s bundle (docs/airgap.md)")
        if first.size > MAX_MANIFEST:
            raise BundleError(f"{path}: {NAME} is {first.size} bytes (at most {MAX_MANIFEST >> 20} MiB)",
                              "rebuild the bundle")
        out = Verified(parse(b"".join(tar.read_member())))
        seen: set[str] = set()
        for m in members:
            if m.kind == "dir":
                continue
            entry = out.manifest.files.get(m.name)
            if entry is None:
                out.problem(f"{m.name}: in the bundle, not in its manifest")
                continue
            h = hashlib.sha256()
            for chunk in tar.read_member():
                h.update(chunk)
            seen.add(m.name)
            out.files += 1
            out.bytes += m.size
            if m.size != entry.size:
                out.problem(f"{m.name}: {m.size} bytes, the manifest says {entry.size}")
            elif h.hexdigest() != entry.sha256:
                out.problem(f"{m.name}: sha256 {h.hexdigest()}, the manifest says {entry.sha256} (corrupted or "
                            "changed)")
        for name in sorted(set(out.manifest.files) - seen):
            out.problem(f"{name}: in the manifest, not in the bundle")
    return out
