"""The sudo password goes to sudo only when sudo asks for it, and masking never touches data.

Against the scripted SSH server (tests/unit/hostile_ssh.py), which plays `sudo -S -p PROMPT` as sudo does:
asking (the prompt on stderr, then one line read) or not (NOPASSWD, a cached timestamp). The lab test
tests/labtests/test_hostile_hosts.py proves the same with the real sudo.
"""

from __future__ import annotations

import dataclasses

from gpuk8s.inventory.loader import load
from gpuk8s.inventory.model import Host
from gpuk8s.logs import mask, register_secret
from gpuk8s.preflight.runner import gather
from gpuk8s.remote import Session
from tests.unit import hostile_ssh
from tests.unit.hostile_ssh import HostileSSH

hostile_host = hostile_ssh.hostile_host  # the fixture
PAYLOAD = b"apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\n\x00\xff no newline at the end"


def _sudo_host(server: HostileSSH) -> Host:
    server.write_inventory(user="ops", sudo_password_env="UNUSED_HERE")
    h = load(server.inventory).hosts[0]
    assert h.ssh.sudo.mode == "password"
    return dataclasses.replace(h)


def test_when_sudo_does_not_ask_the_command_gets_exactly_its_stdin(hostile_host: HostileSSH) -> None:
    hostile_host.sudo_asks = False
    hostile_host.answer = lambda command: ("done\n", "", 0)
    with Session(_sudo_host(hostile_host), "pw-never-sent") as s:
        res = s.run("cat > /etc/kubernetes/x.yaml", sudo=True, stdin=PAYLOAD)
    assert res.ok and res.stdout == "done\n"
    (command, stdin), = hostile_host.execs
    assert command.startswith("sudo -S -p ")
    assert stdin == PAYLOAD  # byte for byte: no password in front of it


def test_when_sudo_asks_it_gets_the_password_once_then_the_command_its_stdin(hostile_host: HostileSSH) -> None:
    hostile_host.sudo_password = "pw-Right-1"
    hostile_host.answer = lambda command: ("done\n", "", 0)
    with Session(_sudo_host(hostile_host), "pw-Right-1") as s:
        res = s.run("cat > /etc/kubernetes/x.yaml", sudo=True, stdin=PAYLOAD)
        assert res.ok and "@@gpuk8s-sudo" not in res.stderr
        no_stdin = s.run("true", sudo=True)
    assert no_stdin.ok
    (_, first), (_, second) = hostile_host.execs
    assert first == b"pw-Right-1\n" + PAYLOAD
    assert second == b"pw-Right-1\n"


def test_a_wrong_password_is_sent_once_and_the_command_never_runs(hostile_host: HostileSSH) -> None:
    hostile_host.sudo_password = "pw-Right-1"
    ran: list[str] = []
    hostile_host.answer = lambda command: (ran.append(command), ("ran\n", "", 0))[1]
    with Session(_sudo_host(hostile_host), "pw-Wrong-2") as s:
        res = s.run("echo ran", sudo=True, stdin=PAYLOAD)
    assert not res.ok and not ran
    (_, stdin), = hostile_host.execs
    assert stdin == b"pw-Wrong-2\n"  # asked again, gpuk8s closed stdin: neither a second try nor the payload


def test_a_sudo_password_that_is_a_word_of_os_release_changes_no_fact(hostile_host: HostileSSH) -> None:
    register_secret("ubuntu")  # the password: the same word as ID=ubuntu in /etc/os-release
    with Session(_sudo_host(hostile_host), "ubuntu") as s:
        facts, checks, _ = gather(s)
    assert facts.os.id == "ubuntu" and facts.os.family == "debian"
    assert "Ubuntu" in facts.os.pretty_name
    assert [c.status for c in checks] == ["pass", "pass"]
    assert mask("ID=ubuntu") == "ID=********"  # what is shown is masked; the data above is not


def test_short_secrets_are_masked_when_shown_but_not_in_data(hostile_host: HostileSSH) -> None:
    register_secret("q7")  # the log file's masking of short secrets: tests/unit/test_logs.py
    hostile_host.answer = lambda command: ("q7 is the answer\n", "", 0)
    h = load(hostile_host.inventory).hosts[0]
    with Session(h) as s:
        res = s.run("echo")
    assert res.stdout == "q7 is the answer\n"
    assert mask(res.stdout) == "******** is the answer\n"
