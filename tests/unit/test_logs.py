"""The log file and the secret mask: 0600 from the start, no symlink, every logger masked, display-only."""

from __future__ import annotations

import copy
import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s import logs
from gpuk8s.logs import MASK, mask, mask_json, register_secret, setup_logging, teardown_logging


@pytest.fixture(autouse=True)
def clean_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A fresh secret registry and no handlers; the log file under tmp_path."""
    monkeypatch.setattr(logs, "_secrets", set())
    monkeypatch.setattr(logs, "_compiled", ((), None))
    path = tmp_path / "state" / "gpuk8s.log"
    monkeypatch.setenv("GPUK8S_LOG_FILE", str(path))
    teardown_logging()
    yield path
    teardown_logging()


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p, follow_symlinks=False).st_mode)


def read_log(path: Path) -> str:
    teardown_logging()  # closes (and so flushes) the file
    return path.read_text()


def test_log_file_is_0600_from_creation_even_with_umask_0(clean_state: Path, monkeypatch) -> None:
    """No chmod after the fact: whatever mode the file ever has before any later change is 0600 at most."""
    seen: list[int] = []
    real_chmod, real_fchmod = os.chmod, os.fchmod

    def chmod(path, m, *a, **k):
        if os.path.exists(path):
            seen.append(mode(Path(path)))
        return real_chmod(path, m, *a, **k)

    def fchmod(fd, m):
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_fchmod(fd, m)

    monkeypatch.setattr(os, "chmod", chmod)
    monkeypatch.setattr(os, "fchmod", fchmod)
    old = os.umask(0)
    try:
        setup_logging()
    finally:
        os.umask(old)
    assert logs.log_path() == clean_state
    assert mode(clean_state) == 0o600
    assert all(m & 0o077 == 0 for m in seen), [oct(m) for m in seen]
    assert mode(clean_state.parent) == 0o700


def test_an_existing_wider_log_file_is_narrowed(clean_state: Path) -> None:
    clean_state.parent.mkdir()
    clean_state.write_text("old line\n")
    os.chmod(clean_state, 0o644)
    setup_logging()
    logging.getLogger("gpuk8s.test").info("new line")
    assert mode(clean_state) == 0o600
    assert read_log(clean_state).startswith("old line\n")  # appended, not truncated


def test_a_symlink_log_path_is_refused(clean_state: Path, tmp_path: Path, capsys) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.chmod(victim, 0o644)
    clean_state.parent.mkdir()
    clean_state.symlink_to(victim)
    setup_logging()
    logging.getLogger("gpuk8s.test").warning("something to log")
    teardown_logging()
    assert victim.read_text() == "precious\n" and mode(victim) == 0o644
    assert clean_state.is_symlink()
    assert "symbolic link" in capsys.readouterr().err


def test_paramiko_records_reach_the_file_masked(clean_state: Path) -> None:
    register_secret("hunter2-sudo")
    setup_logging()
    logging.getLogger("paramiko.transport").info("Authentication (password) with hunter2-sudo failed")
    logging.getLogger("paramiko").warning("banner: hunter2-sudo")
    text = read_log(clean_state)
    assert "paramiko.transport: Authentication (password) with ******** failed" in text
    assert "paramiko: banner: ********" in text
    assert "hunter2-sudo" not in text


def test_tracebacks_are_masked_too(clean_state: Path) -> None:
    register_secret("tok3n-abcdef")
    setup_logging()
    try:
        raise RuntimeError("kubeadm said tok3n-abcdef")
    except RuntimeError:
        logging.getLogger("gpuk8s.test").exception("failed")
    text = read_log(clean_state)
    assert "RuntimeError: kubeadm said ********" in text and "tok3n-abcdef" not in text


def test_a_two_character_secret_is_masked_in_the_log(clean_state: Path) -> None:
    register_secret("q7")
    setup_logging()
    log = logging.getLogger("gpuk8s.test")
    log.info("sudo -S with q7")
    log.info("password='q7'")
    text = read_log(clean_state)
    assert "sudo -S with ********" in text and "password='********'" in text
    assert "q7" not in text


def test_short_secrets_are_masked_as_tokens_only() -> None:
    register_secret("ab")
    register_secret("x")
    assert mask("ab") == MASK
    assert mask("pw=ab;") == f"pw={MASK};"
    assert mask("x x") == f"{MASK} {MASK}"
    # inside a word a 1-2 character secret is left alone: the output stays readable
    assert mask("abstract xray") == "abstract xray"


def test_overlapping_and_nested_secrets_are_masked_whole() -> None:
    register_secret("abcd")
    register_secret("cdef")
    register_secret("abcdefgh-long")
    assert mask("abcdef") == MASK
    assert mask("[abcdefgh-long]") == f"[{MASK}]"
    assert mask("no secret here") == "no secret here"


def test_masking_is_display_only(clean_state: Path) -> None:
    """mask_json returns a masked copy; logging masks the file but changes neither the record nor its args."""
    register_secret("ubuntu-pass")
    data = {"stdout": "ID=ubuntu-pass\n", "list": ["ubuntu-pass", 3, None, True], "t": ("ubuntu-pass",),
            "ubuntu-pass": {"n": 1.5}}
    before = copy.deepcopy(data)
    shown = mask_json(data)
    assert data == before  # the data itself is never masked
    assert shown == {"stdout": f"ID={MASK}\n", "list": [MASK, 3, None, True], "t": (MASK,), MASK: {"n": 1.5}}

    setup_logging()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    logging.getLogger("gpuk8s").addHandler(keep)
    payload = {"os_release": "ID=ubuntu-pass"}
    logging.getLogger("gpuk8s.test").info("facts %s", payload)
    logging.getLogger("gpuk8s").removeHandler(keep)
    assert payload == {"os_release": "ID=ubuntu-pass"}
    assert records and records[0].getMessage() == "facts {'os_release': 'ID=ubuntu-pass'}"
    assert "facts {'os_release': 'ID=********'}" in read_log(clean_state)


def test_many_secrets_do_not_slow_masking_down() -> None:
    for i in range(500):
        register_secret(f"secret-{i:04d}-{'x' * 20}")
    text = ("harmless output line 0123456789\n" * 6000) + "secret-0499-" + "x" * 20
    t = time.monotonic()
    out = mask(text)
    assert time.monotonic() - t < 2.0
    assert out.endswith(MASK) and out.count(MASK) == 1


def test_library_errors_reach_the_file_not_stderr_and_control_characters_are_removed(clean_state: Path,
                                                                                      capsys) -> None:
    setup_logging()
    logging.getLogger("paramiko.transport").error("Incompatible version (\x1b]0;pwned\x07[/red] instead of 2.0)")
    logging.getLogger("gpuk8s.test").error("host said \x1b[2Jhello")
    text = read_log(clean_state)
    assert "paramiko.transport: Incompatible version (]0;pwned[/red] instead of 2.0)" in text
    assert "\x1b" not in text and "\x07" not in text
    err = capsys.readouterr().err
    assert "Incompatible version" not in err  # paramiko's own report of a failed connection: the file only
    assert "ERROR: host said [2Jhello" in err and "\x1b" not in err


def test_verbose_shows_library_records_on_stderr(clean_state: Path, capsys) -> None:
    register_secret("hunter2-sudo")
    setup_logging(verbose=True)
    logging.getLogger("paramiko.transport").info("auth hunter2-sudo")
    assert "INFO: auth ********" in capsys.readouterr().err


def test_without_a_log_file_library_records_are_dropped_not_printed_unmasked(clean_state: Path, tmp_path: Path,
                                                                             capsys) -> None:
    register_secret("hunter2-sudo")
    clean_state.parent.mkdir()
    clean_state.symlink_to(tmp_path / "victim")
    setup_logging()
    capsys.readouterr()
    logging.getLogger("paramiko.transport").error("auth hunter2-sudo")
    assert "hunter2-sudo" not in capsys.readouterr().err
    assert not (tmp_path / "victim").exists()
