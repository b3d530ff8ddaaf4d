"""The log file (full detail) and the secret mask applied to everything gpuk8s shows or logs.

Masking is for display only: `mask` and `mask_json` return masked copies for the terminal, JSON output and
the log; data that is parsed or written (a command's output, a file's content) is never masked, so a sudo
password `ubuntu` cannot turn `ID=ubuntu` into `ID=********` before os-release is read.

The log file is created 0600 (never through a symbolic link), and every logger whose records reach it
(gpuk8s's own, paramiko's, invoke's and fabric's) goes through the masking formatter.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from gpuk8s.text import clean

_secrets: set[str] = set()
_lock = threading.Lock()
# (secrets masked wherever they occur, longest first; a regex of the short ones, or None)
_compiled: tuple[tuple[str, ...], re.Pattern[str] | None] = ((), None)
MASK = "********"

# A secret of 1 or 2 characters is masked only where it stands as a whole token: not preceded or followed
# by a letter, digit or '_'. Masking every 'a' or 'ok' in the output would make it unreadable (and would
# itself tell which characters the password has); as a token ("password: ok", "-p ok", "'ok'") it is
# masked. Longer secrets are masked wherever they occur, even inside a word.
SHORT = 2

# Loggers of the libraries gpuk8s drives, routed to gpuk8s's own (masking) handlers instead of Python's
# last-resort handler, which would print their warnings unmasked; with the level their records start at.
# They reach the log file, and stderr only with --verbose (paramiko logs every failed connection at ERROR,
# with a traceback: gpuk8s reports that failure itself, per host).
LIBRARY_LOGGERS = {"paramiko": logging.INFO, "invoke": logging.WARNING, "fabric": logging.WARNING}


def register_secret(value: str | None) -> None:
    """Remember a secret so that it is masked wherever gpuk8s shows or logs text (see SHORT)."""
    global _compiled
    if not value:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        long = tuple(sorted((s for s in _secrets if len(s) > SHORT), key=len, reverse=True))
        short = sorted((s for s in _secrets if len(s) <= SHORT), key=len, reverse=True)
        pattern = (re.compile(r"(?<!\w)(?:" + "|".join(re.escape(s) for s in short) + r")(?!\w)")
                   if short else None)
        _compiled = (long, pattern)


def mask(text: str) -> str:
    """`text` as it may be shown: every registered secret replaced by ********.

    One pass per secret (str.find) and one regex pass for all short ones; the matched spans are merged
    and the text rebuilt once, so overlapping secrets and a secret that contains another are masked whole,
    and the result does not depend on the order of registration.
    """
    long, short = _compiled
    if not long and short is None:
        return text
    spans: list[tuple[int, int]] = []
    for s in long:
        i = text.find(s)
        while i >= 0:
            spans.append((i, i + len(s)))
            i = text.find(s, i + 1)
    if short is not None:
        spans.extend(m.span() for m in short.finditer(text))
    if not spans:
        return text
    spans.sort()
    out: list[str] = []
    pos = 0
    start, end = spans[0]
    for a, b in spans[1:]:
        if a <= end:
            end = max(end, b)
            continue
        out += [text[pos:start], MASK]
        pos, start, end = end, a, b
    out += [text[pos:start], MASK, text[end:]]
    return "".join(out)


def mask_json(obj: Any) -> Any:
    """A masked copy of a JSON-able structure: every string in it (keys too) through `mask`.

    dicts, lists and tuples are copied (the argument is never changed); other values are returned as they are.
    """
    if isinstance(obj, str):
        return mask(obj)
    if isinstance(obj, dict):
        return {mask(k) if isinstance(k, str) else k: mask_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_json(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(mask_json(v) for v in obj)
    return obj


class MaskingFormatter(logging.Formatter):
    """Formats a record, then cleans and masks the whole text: message, arguments, traceback and stack.

    Control characters are removed (`text.clean`: a host's banner or output quoted in a message cannot
    drive the terminal that shows stderr or `tail -f`s the log), then secrets are masked. The record itself
    is not changed, so masking cannot leak into anything else that reads it.
    """

    def format(self, record: logging.LogRecord) -> str:
        return mask(clean(super().format(record)))


class _FileHandler(logging.StreamHandler):
    """A StreamHandler on a file gpuk8s opened itself (0600, no symlink); closing it closes the file."""

    def close(self) -> None:
        try:
            self.acquire()
            try:
                stream = self.stream
                if stream is not None and not stream.closed:
                    stream.close()
            finally:
                self.release()
        finally:
            super().close()


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpuk8s"


_log_path: Path | None = None
_log_problem: str | None = None


def log_path() -> Path | None:
    return _log_path


def log_problem() -> str | None:
    """Why there is no log file (a symbolic link refused, a directory not writable), or None."""
    return _log_problem


def open_log_file(path: Path) -> TextIO:
    """The log file opened for appending: created 0600 from the start, never through a symbolic link.

    Raises OSError (ELOOP for a symbolic link) when the path cannot be used; an existing file with a wider
    mode is narrowed to 0600.
    """
    if not path.parent.exists():
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
    # O_NOFOLLOW: a symbolic link is refused (ELOOP), not followed; O_NONBLOCK: a FIFO is refused (ENXIO
    # without a reader) instead of blocking; it is switched off again below for the regular file.
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file", str(path))
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding="utf-8", errors="replace")
    except BaseException:
        os.close(fd)
        raise


def _routed() -> Iterable[logging.Logger]:
    yield logging.getLogger("gpuk8s")
    for name in LIBRARY_LOGGERS:
        yield logging.getLogger(name)


def setup_logging(verbose: bool = False) -> None:
    """Full detail to the log file, warnings (or debug with --verbose) to stderr, both masked."""
    global _log_path, _log_problem
    root = logging.getLogger("gpuk8s")
    if root.handlers:
        return
    root.setLevel(logging.DEBUG)
    handlers: list[logging.Handler] = []
    path = Path(os.environ.get("GPUK8S_LOG_FILE") or state_dir() / "gpuk8s.log")
    _log_path, _log_problem = None, None
    try:
        fh = _FileHandler(open_log_file(path))
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handlers.append(fh)
        _log_path = path
    except OSError as e:
        reason = "it is a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
        _log_problem = f"not logging to {path}: {reason}"
        sys.stderr.write(f"gpuk8s: warning: {mask(clean(_log_problem))}\n")
    sh = logging.StreamHandler()
    sh.setLevel(logging.DEBUG if verbose else logging.ERROR)
    sh.setFormatter(MaskingFormatter("%(levelname)s: %(message)s"))
    handlers.append(sh)
    for lg in _routed():
        for h in handlers:
            if lg is root or h is not sh or verbose:
                lg.addHandler(h)
        if not lg.handlers:  # no log file and not verbose: dropped (never Python's unmasked last resort)
            lg.addHandler(logging.NullHandler())
        lg.propagate = False
        if lg is not root:
            lg.setLevel(LIBRARY_LOGGERS[lg.name])


def teardown_logging() -> None:
    """Undo setup_logging: the handlers removed and closed (for tests, and a process that logs again)."""
    global _log_path, _log_problem
    seen: list[logging.Handler] = []
    for lg in _routed():
        for h in list(lg.handlers):
            lg.removeHandler(h)
            if h not in seen:
                seen.append(h)
        lg.propagate = True
        if lg.name != "gpuk8s":
            lg.setLevel(logging.NOTSET)
    for h in seen:
        h.close()
    _log_path, _log_problem = None, None
