"""Downloads for `gpuk8s bundle create`, on the connected machine: one URL to memory or to a file, bounded in size,
over https unless the inventory allowed a repository's plain http, never downgraded from https to http by a
redirect, the sha256 computed on the way (and checked where the index names one). Python's urllib with the
system's CA store: no dependency beyond the standard library.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from gpuk8s.errors import GpuK8sError

CHUNK = 1 << 20
TIMEOUT = 60  # seconds without a byte before a download is given up
USER_AGENT = "gpuk8s-bundle"


class FetchError(GpuK8sError):
    kind = "bundle"


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """Redirects followed as curl --proto-redir does in the playbooks: https stays https."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if req.full_url.startswith("https://") and not newurl.startswith("https://"):
            raise FetchError(f"{req.full_url} redirects to {newurl[:200]}, which is not https",
                             "mirror the repository over https, or allow http for it in the inventory")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_NoDowngrade)


def _open(url: str, allow_http: bool) -> IO[bytes]:
    if not (url.startswith("https://") or (allow_http and url.startswith("http://"))):
        raise FetchError(f"{url[:200]}: only https is fetched here",
                         "use an https URL, or set the repository's insecure_http with its key fingerprint")
    try:
        return _OPENER.open(urllib.request.Request(url, headers={"User-Agent": USER_AGENT}), timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{url[:200]}: HTTP {e.code}", "check the URL and that the source serves it") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise FetchError(f"{url[:200]}: {str(reason)[:200]}",
                         "check that this machine reaches the source (bundle create runs where the internet is)"
                         ) from None


def missing(url: str, allow_http: bool) -> bool:
    """Whether the source answers 404 for `url` (an optional file: InRelease where a repository has Release)."""
    try:
        with _open(url, allow_http):
            return False
    except FetchError as e:
        if ": HTTP 404" in e.message or ": HTTP 410" in e.message:
            return True
        raise


def get(url: str, limit: int, allow_http: bool = False) -> bytes:
    """The body of `url`, at most `limit` bytes (more is refused)."""
    with _open(url, allow_http) as r:
        data = r.read(limit + 1)
    if len(data) > limit:
        raise FetchError(f"{url[:200]} is larger than {limit} bytes", "check that the URL names what it should")
    return data


def download(url: str, dest: Path, size: int, sha256: str, allow_http: bool = False) -> None:
    """`url` into `dest`, which must be `size` bytes with `sha256` (the index's): else nothing is left at `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    got = 0
    try:
        with _open(url, allow_http) as r, part.open("wb") as f:
            while chunk := r.read(CHUNK):
                got += len(chunk)
                if got > size:
                    raise FetchError(f"{url[:200]} is larger than the {size} bytes its index names",
                                     "the source changed under its index: run bundle create again")
                h.update(chunk)
                f.write(chunk)
        if got != size or h.hexdigest() != sha256:
            raise FetchError(f"{url[:200]}: {got} bytes with sha256 {h.hexdigest()}, its index names {size} bytes "
                             f"with {sha256}", "the source changed under its index, or the download was altered: "
                             "run bundle create again")
        part.replace(dest)
    finally:
        part.unlink(missing_ok=True)
