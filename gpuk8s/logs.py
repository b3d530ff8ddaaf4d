"""The log file (full detail) and the secret mask applied to everything gpuk8s emits."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

_secrets: set[str] = set()
_lock = threading.Lock()
MASK = "********"


def register_secret(value: str | None) -> None:
    """Remember a secret so that it is masked wherever gpuk8s writes text."""
    if value and len(value) >= 3:
        with _lock:
            _secrets.add(value)


def mask(text: str) -> str:
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, MASK)
    return text


class _MaskFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = mask(record.getMessage())
        record.args = ()
        return True


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpuk8s"


_log_path: Path | None = None


def log_path() -> Path | None:
    return _log_path


def setup_logging(verbose: bool = False) -> None:
    """Full detail to the log file, warnings (or debug with --verbose) to stderr, both masked."""
    global _log_path
    root = logging.getLogger("gpuk8s")
    if root.handlers:
        return
    root.setLevel(logging.DEBUG)
    root.propagate = False
    flt = _MaskFilter()
    path = Path(os.environ.get("GPUK8S_LOG_FILE") or state_dir() / "gpuk8s.log")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(path, encoding="utf-8")
        os.chmod(path, 0o600)
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        fh.addFilter(flt)
        root.addHandler(fh)
        _log_path = path
    except OSError:
        _log_path = None
    sh = logging.StreamHandler()
    sh.setLevel(logging.DEBUG if verbose else logging.ERROR)
    sh.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    sh.addFilter(flt)
    root.addHandler(sh)
    # paramiko logs connection chatter we do not want on stderr
    logging.getLogger("paramiko").setLevel(logging.WARNING)
