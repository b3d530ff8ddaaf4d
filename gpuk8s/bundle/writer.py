"""Writing a bundle file: the manifest first, then every file in path order, as a pax tar compressed by the `zstd`
program, and nothing a reader would refuse (gpuk8s/bundle/archive.py): regular files and directories only, plain
relative names. Reproducible: the same files give the same bytes (mtime 0, owner 0:0, mode 0644 or 0755, no user
or group names), so a bundle's sha256 says what it holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path

from gpuk8s.bundle.archive import BundleError, zstd
from gpuk8s.bundle.manifest import NAME, FileEntry, Manifest, safe_path

CHUNK = 1 << 20


def digest(path: Path) -> FileEntry:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return FileEntry(h.hexdigest(), size)


def _info(name: str, size: int, directory: bool = False) -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.size, i.mtime, i.uid, i.gid, i.uname, i.gname = size, 0, 0, 0, "", ""
    i.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    i.mode = 0o755 if directory else 0o644
    return i


def write(out: Path, manifest: Manifest, files: Mapping[str, Path], level: int = 19,
          known: Mapping[str, FileEntry] | None = None) -> Manifest:
    """The bundle of `files` (bundle path -> a file here) at `out`, with `manifest`'s fields and the files' sha256
    and size (`known`: those already computed, by the caller that just wrote the files); returns the manifest
    written."""
    for name in files:
        if safe_path(name) is None or name == NAME:
            raise BundleError(f"{name[:120]!r} is not a plain relative path for a bundle member", "a gpuk8s bug")
    entries = {name: (known or {}).get(name) or digest(files[name]) for name in sorted(files)}
    m = dataclasses.replace(manifest, files=entries)
    text = m.dumps().encode()
    # written beside `out` and renamed once whole: a build that fails or is killed never leaves a truncated file
    # under the bundle's name, nor replaces a good one there
    part = out.with_name(out.name + ".part")
    proc = subprocess.Popen([zstd(), "-q", "-f", f"-{level}", "-T0", "-o", str(part)], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as t:
            t.addfile(_info(NAME, len(text)), io.BytesIO(text))
            for name, entry in entries.items():
                with files[name].open("rb") as f:
                    t.addfile(_info(name, entry.size), f)
    except BaseException:
        proc.kill()
        proc.wait()
        part.unlink(missing_ok=True)
        raise
    finally:
        proc.stdin.close()
        err = proc.stderr.read(2000).decode(errors="replace").strip() if proc.stderr else ""
        proc.wait()
    if proc.returncode != 0:
        part.unlink(missing_ok=True)
        raise BundleError(f"zstd could not write {out}: {err[:300]}", "check the disk and the path")
    part.replace(out)
    return m
