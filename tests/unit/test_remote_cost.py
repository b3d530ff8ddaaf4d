"""What a command costs the client, counted rather than timed: the SSH layer must not spin while it waits, and
the fact probe's output comes in one piece, not one SSH packet per write (docs/performance.md, issue 27).

Against the scripted SSH server (tests/unit/hostile_ssh.py) and the local POSIX shells.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import types

import pytest

from gpuk8s import remote
from gpuk8s.inventory.loader import load
from gpuk8s.preflight.runner import PROBE, gather
from gpuk8s.remote import Session, in_one_piece
from tests.unit import hostile_ssh
from tests.unit.hostile_ssh import HostileSSH

hostile_host = hostile_ssh.hostile_host  # the fixture
SHELLS = [sh for sh in ("dash", "bash", "sh") if shutil.which(sh)]
# 60 writes with a pause between them: unwrapped, a reader gets them one at a time
CHATTY = "i=0; while [ $i -lt 60 ]; do printf 'line %s\\n' $i; sleep 0.002; i=$((i+1)); done; exit 3"


def _reads(cmd: list[str]) -> tuple[int, bytes, int]:
    """How many reads of the pipe returned data, all of it, and the exit status."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert p.stdout is not None
    n, out = 0, b""
    while chunk := os.read(p.stdout.fileno(), 1 << 20):
        n += 1
        out += chunk
    return n, out, p.wait()


@pytest.mark.parametrize("sh", SHELLS)
def test_in_one_piece_gives_the_same_output_and_status_in_one_write(sh: str) -> None:
    n_plain, plain, rc_plain = _reads([sh, "-c", CHATTY])
    n_one, whole, rc_one = _reads([sh, "-c", in_one_piece(CHATTY)])
    assert (whole, rc_one) == (plain, rc_plain) == (b"".join(b"line %d\n" % i for i in range(60)), 3)
    assert n_plain > 1  # the writes arrive apart (60 reads on an idle machine, fewer under load) ...
    assert n_one <= 2  # ... and wrapped, as one (bash's printf may write its trailing newline apart)


@pytest.mark.parametrize("sh", SHELLS)
def test_the_probe_parses_the_same_in_one_piece(sh: str) -> None:
    """The probe itself (read-only, on this machine): its sections survive the wrapping, case ... ) included."""
    from gpuk8s.facts.parse import parse_probe

    plain = subprocess.run([sh, "-c", PROBE], capture_output=True, text=True, timeout=120)
    whole = subprocess.run([sh, "-c", in_one_piece(PROBE)], capture_output=True, text=True, timeout=120)
    assert whole.returncode == plain.returncode
    a, b = parse_probe(plain.stdout).to_json(), parse_probe(whole.stdout).to_json()
    # what does not move between two runs on a busy machine (the clock, free memory, listening ports and loaded
    # modules may)
    for key in ("uid", "hostname", "os", "kernel", "arch", "cpus", "gpu", "containerd", "tools", "machine_id",
                "cgroup_version", "mig"):
        assert a[key] == b[key], key
    assert whole.stdout.count("@@gpuk8s-begin") == plain.stdout.count("@@gpuk8s-begin") > 25


def test_gather_sends_the_probe_in_one_piece(hostile_host: HostileSSH) -> None:
    with Session(load(hostile_host.inventory).hosts[0]) as s:
        facts, _, _ = gather(s)
    (command, _), = hostile_host.execs
    assert facts.gpu.state == "ok"
    assert command.startswith("sh -c ") and "gk_out=$(" in command


def test_waiting_for_the_exit_status_after_eof_does_not_spin(hostile_host: HostileSSH,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """paramiko keeps a channel's pipe readable from EOF on: a select loop on it turns thousands of times
    until the exit status comes. The wait must be a wait."""
    hostile_host.answer = lambda command: ("done\n", "", 0)
    hostile_host.exit_delay = 0.5
    calls = [0]
    real = remote.select.select

    def counted(*args: object) -> object:
        calls[0] += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(remote, "select", types.SimpleNamespace(select=counted))
    with Session(load(hostile_host.inventory).hosts[0]) as s:
        res = s.run("true")
    assert res.ok and res.stdout == "done\n"
    assert calls[0] < 20, calls[0]


def test_connections_do_not_share_fabric_s_config(hostile_host: HostileSSH) -> None:
    """invoke's Config merges its data lazily and is not thread-safe: one shared by all connections (to save ~0.7 ms
    a host) lost its keys under 32 concurrent connections ("No attribute or config key found for 'gateway'")."""
    h = load(hostile_host.inventory).hosts[0]
    assert Session(h)._connection().config is not Session(h)._connection().config


@pytest.mark.parametrize("sh", SHELLS)
def test_in_one_piece_keeps_the_output_where_dd_refuses_its_flags(sh: str, tmp_path) -> None:
    """A dd that refuses iflag=fullblock/status=none (an old coreutils, a BusyBox): printf writes the output."""
    fake = tmp_path / "dd"
    fake.write_text("#!/bin/sh\necho 'dd: invalid input flag' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    p = subprocess.run([sh, "-c", in_one_piece("echo one; echo two; exit 4")], capture_output=True, env=env)
    assert (p.stdout, p.returncode) == (b"one\ntwo\n", 4)
