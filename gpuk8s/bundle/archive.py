"""Reading a bundle file: a zstd-compressed POSIX tar (ustar with pax headers), read as a stream, member by member.

The tar reader is gpuk8s's own, small and strict, instead of Python's tarfile: a bundle comes from elsewhere, and
tarfile reads a pax header of any size into memory and follows links. Here every member is a regular file or a
directory with a plain relative name (gpuk8s.bundle.manifest.safe_path); a link, a device, an absolute name, '..',
a name seen twice, a header that does not check, a member over MAX_MEMBER, more than MAX_MEMBERS members or more
than MAX_TOTAL bytes in all stop the read with a BundleError naming the member. Nothing is ever written where a
member's name points: members are hashed (verify) or copied by the caller into a directory of its choosing.

Decompression is the `zstd` program's (`zstd -dc`), present on every distribution gpuk8s supports and on the
machine that builds the bundle; the stream it writes is bounded by the caps above (a small file that decompresses
to terabytes is stopped at MAX_TOTAL).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpuk8s.bundle.manifest import MAX_FILES, safe_path
from gpuk8s.errors import GpuK8sError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BLOCK = 512
MAX_MEMBER = 64 << 30  # one file: a driver's kernel modules are ~100 MB, the largest image layer a few GB
MAX_TOTAL = 512 << 30  # everything a bundle holds, decompressed
MAX_MEMBERS = MAX_FILES + 20_000  # files and directories
MAX_PAX = 64 << 10  # a pax extended header (gpuk8s writes path and size at most)
CHUNK = 1 << 20


class BundleError(GpuK8sError):
    kind = "bundle"


@dataclass(frozen=True)
class Member:
    name: str  # relative, checked; no trailing slash
    kind: str  # "file" or "dir"
    size: int


def _octal(field: bytes, what: str, where: str) -> int:
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not all(48 <= c <= 55 for c in text):  # base-256 (GNU) and anything else: not what gpuk8s writes
        raise BundleError(f"{where}: the tar header's {what} is not an octal number", "rebuild the bundle")
    return int(text, 8)


def _pax(data: bytes, where: str) -> dict[str, str]:
    """The records of a pax extended header ('LEN key=value\\n' each)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(data):
        sp = data.find(b" ", i, i + 24)
        if sp < 0 or not data[i:sp].isdigit():
            raise BundleError(f"{where}: a pax header record is malformed", "rebuild the bundle")
        n = int(data[i:sp])
        rec = data[sp + 1:i + n]
        if n <= sp - i or i + n > len(data) or not rec.endswith(b"\n") or b"=" not in rec:
            raise BundleError(f"{where}: a pax header record is malformed", "rebuild the bundle")
        k, _, v = rec[:-1].partition(b"=")
        try:
            out[k.decode()] = v.decode()
        except UnicodeDecodeError:
            raise BundleError(f"{where}: a pax header record is not UTF-8", "rebuild the bundle") from None
        i += n
    return out


class TarReader:
    """The members of a tar stream, in order; `read_member` hands out the current file's bytes in chunks."""

    def __init__(self, stream: IO[bytes], what: str) -> None:
        self.stream, self.what = stream, what
        self.total = 0
        self.count = 0
        self.seen: set[str] = set()
        self._left = 0  # bytes of the current member not yet read
        self._pad = 0

    def _read(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise BundleError(f"{self.what} ends in the middle of its tar stream (truncated or corrupted)",
                              "copy the bundle again and compare its sha256 with the one it was built with")
        return data

    def _skip_current(self) -> None:
        for _ in self.read_member():
            pass

    def members(self) -> Iterator[Member]:
        pax: dict[str, str] = {}
        while True:
            self._skip_current()
            header = self._read(BLOCK)
            if header == b"\0" * BLOCK:
                return  # the end (a second zero block follows; nothing after it is read)
            where = f"{self.what}: member {self.count + 1}"
            if _octal(header[148:156], "checksum", where) != sum(header[:148]) + 256 + sum(header[156:]):
                raise BundleError(f"{where}: the tar header's checksum does not match (corrupted)",
                                  "copy the bundle again")
            if header[257:262] != b"ustar":
                raise BundleError(f"{where}: not a POSIX (ustar) tar header", "rebuild the bundle")
            size = _octal(header[124:136], "size", where)
            flag = header[156:157]
            name = (header[345:500].split(b"\0", 1)[0] + b"/" if header[345] else b"") + \
                header[0:100].split(b"\0", 1)[0]
            if flag in (b"x", b"g"):
                if size > MAX_PAX:
                    raise BundleError(f"{where}: a pax header of {size} bytes (at most {MAX_PAX})",
                                      "rebuild the bundle")
                data = self._read(size)
                self._read(-size % BLOCK)
                if flag == b"x":
                    pax = _pax(data, where)
                continue
            if "path" in pax:
                raw = pax["path"]
            else:
                try:
                    raw = name.decode()
                except UnicodeDecodeError:
                    raise BundleError(f"{where}: a member name that is not UTF-8", "rebuild the bundle") from None
            if "size" in pax:
                if not pax["size"].isdigit() or len(pax["size"]) > 16:
                    raise BundleError(f"{where}: a pax size that is not a number", "rebuild the bundle")
                size = int(pax["size"])
            pax = {}
            kind = {b"0": "file", b"\0": "file", b"5": "dir"}.get(flag)
            shown = raw[:120]
            if kind is None:
                what = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device",
                        b"4": "a block device", b"6": "a FIFO"}.get(flag, f"a member of type {flag!r}")
                raise BundleError(f"{self.what}: {shown!r} is {what}; a bundle holds files and directories only",
                                  "do not use this file: gpuk8s never writes such a member")
            clean = safe_path(raw.rstrip("/") if kind == "dir" else raw)
            if clean is None:
                raise BundleError(f"{self.what}: member name {shown!r} is not a plain relative path (absolute, "
                                  "'..', or characters a bundle never uses)",
                                  "do not use this file: gpuk8s never writes such a member")
            if clean in self.seen:
                raise BundleError(f"{self.what}: {clean!r} appears twice", "rebuild the bundle")
            self.count += 1
            if self.count > MAX_MEMBERS:
                raise BundleError(f"{self.what}: more than {MAX_MEMBERS} members", "rebuild the bundle")
            if kind == "dir":
                size = 0
            if size > MAX_MEMBER:
                raise BundleError(f"{self.what}: {clean!r} is {size} bytes, more than a bundle's member may be "
                                  f"({MAX_MEMBER >> 30} GiB)", "rebuild the bundle")
            self.total += size
            if self.total > MAX_TOTAL:
                raise BundleError(f"{self.what}: more than {MAX_TOTAL >> 30} GiB in all", "rebuild the bundle")
            self.seen.add(clean)
            self._left, self._pad = size, -size % BLOCK
            yield Member(clean, kind, size)

    def read_member(self) -> Iterator[bytes]:
        """The current member's bytes, in chunks (nothing once read)."""
        while self._left:
            chunk = self._read(min(CHUNK, self._left))
            self._left -= len(chunk)
            yield chunk
        if self._pad:
            self._read(self._pad)
            self._pad = 0


def zstd() -> str:
    found = shutil.which("zstd")
    if found is None:
        raise BundleError("the zstd program is not installed here (a bundle is a zstd-compressed tar)",
                          "install it: apt-get install zstd, or dnf install zstd")
    return found


@contextlib.contextmanager
def open_tar(path: Path) -> Iterator[TarReader]:
    """The bundle at `path` as a TarReader over `zstd -dc`'s output. A file that is not zstd, or that zstd cannot
    decompress to its end, is a BundleError naming it."""
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise BundleError(f"{path}: {e.strerror}", "check the path") from None
    if magic != ZSTD_MAGIC:
        raise BundleError(f"{path} is not a zstd-compressed file, so not a bundle",
                          "pass a gpuk8s bundle (docs/airgap.md)")
    proc = subprocess.Popen([zstd(), "-dc", "--no-progress", "--", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stderr is not None
    finished = False
    try:
        try:
            yield TarReader(proc.stdout, str(path))
            finished = True
        except BundleError as e:
            # a stream cut short (its end reached: zstd has stopped writing) is zstd's failure more often than the
            # tar's: say what zstd said. Any other refusal: zstd is killed below, not waited for.
            if "truncated or corrupted" in e.message:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            if proc.returncode not in (0, None) and "truncated or corrupted" in e.message:
                said = proc.stderr.read(2000).decode(errors="replace").strip().splitlines()
                raise BundleError(f"{path} is corrupted: zstd: {said[-1][:300] if said else 'failed'}",
                                  "copy the bundle again and compare its sha256 with the one it was built "
                                  "with") from None
            raise
    finally:
        trailing = False
        if finished:  # after the end-of-archive blocks: tar's padding (zeros) only, then zstd's own end
            rest = proc.stdout.read(1 << 20)
            trailing = bool(rest.strip(b"\0")) or bool(proc.stdout.read(1))
        if proc.poll() is None and (trailing or not finished):
            proc.kill()
        proc.wait()
        proc.stdout.close()
        err = proc.stderr.read(2000).decode(errors="replace").strip()
        proc.stderr.close()
    if trailing:
        raise BundleError(f"{path} holds data after the end of its tar stream", "rebuild the bundle")
    if proc.returncode != 0:
        raise BundleError(f"{path} is corrupted: zstd: {err.splitlines()[-1][:300] if err else 'failed'}",
                          "copy the bundle again and compare its sha256 with the one it was built with")
