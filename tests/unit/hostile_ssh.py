"""A scripted SSH server for tests: a host that answers whatever the test wants, hostile output included.

Built on paramiko's server side on a loopback socket. It accepts one client key (any user name), has its
own host key (written to a known_hosts file so gpuk8s's verification passes), answers each exec request
with the (stdout, stderr, exit status) that `answer(command)` returns once stdin ends, and records every
command with its stdin in `execs`. A `sudo -S -p PROMPT` command line is played like sudo: the prompt on
stderr, one password line read (checked against `sudo_password` when set), then the command. `version` is
the SSH version line it sends; `raw_banner`, when set, is sent instead of any SSH and the connection closed.
"""

from __future__ import annotations

import re
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paramiko.common import AUTH_FAILED, AUTH_SUCCESSFUL, OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED, OPEN_SUCCEEDED

PROBE = (Path(__file__).resolve().parent.parent / "fixtures" / "h200" / "probe.txt").read_text()

Answer = tuple[str | bytes, str | bytes, int]


def probe_answer(command: str) -> Answer:
    """The real H200 probe output for the fact probe; any other command is unknown."""
    if "@@gpuk8s-begin" in command:
        return PROBE, "", 0
    return "", f"sh: not scripted: {command[:60]}\n", 127


def new_key(path: Path) -> paramiko.Ed25519Key:
    """A fresh ed25519 key, written to `path` in OpenSSH format (mode 0600)."""
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    path.write_bytes(pem)
    path.chmod(0o600)
    return paramiko.Ed25519Key(filename=str(path))


# `sh -c "printf '%s\n' MARKER >&2; ..."`: the command tells gpuk8s on stderr that sudo let it run
_ANNOUNCE = re.compile(r"printf '%s\\n' (\S+) >&2; ")


def _recv(channel: paramiko.Channel, buf: bytearray, until: bytes | None = None) -> None:
    """Append stdin to `buf` until it holds `until`, or until end-of-file."""
    while until is None or until not in buf:
        chunk = channel.recv(65536)
        if not chunk:
            return
        buf += chunk


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: HostileSSH) -> None:
        self.server = server

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = key.asbytes() == self.server.client_key.asbytes()
        return AUTH_SUCCESSFUL if ok else AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return OPEN_SUCCEEDED
        return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        # answered on its own thread: the client sends stdin (and EOF) only after the request succeeds
        threading.Thread(target=self.server._exec, args=(channel, command.decode("utf-8", "replace")),
                         daemon=True).start()
        return True


class HostileSSH:
    """One scripted host on 127.0.0.1; `inventory` is an inventory file that reaches it (as root by default)."""

    def __init__(self, directory: Path, answer: Callable[[str], Answer] = probe_answer) -> None:
        self.answer = answer
        self.version = "SSH-2.0-OpenSSH_9.6"
        self.raw_banner: bytes | None = None
        self.sudo_password: str | None = None  # what `sudo -S` accepts; None: any
        self.sudo_asks = True  # False: like NOPASSWD or a cached timestamp, sudo runs the command at once
        self.execs: list[tuple[str, bytes]] = []
        self.exit_delay = 0.0  # seconds between the output's EOF and the exit status
        self.host_key = new_key(directory / "host_key")
        self.identity_file = directory / "id_ed25519"
        self.client_key = new_key(self.identity_file)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.known_hosts = directory / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_key.get_name()} "
                                    f"{self.host_key.get_base64()}\n")
        self.inventory = directory / "inventory.yaml"
        self.write_inventory()
        self._transports: list[paramiko.Transport] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def write_inventory(self, user: str = "root", sudo_password_env: str | None = None) -> Path:
        """(Re)write `inventory`: one control plane with one GPU, reached as `user` (any user is accepted);
        with `sudo_password_env`, sudo takes the password from that environment variable."""
        sudo = f"  sudo:\n    mode: password\n    password_env: {sudo_password_env}\n" if sudo_password_env else ""
        self.inventory.write_text(
            "cluster:\n  name: hostile\n  kubernetes_version: \"1.30\"\n"
            f"ssh:\n  user: {user}\n  port: {self.port}\n  identity_file: {self.identity_file}\n"
            f"  known_hosts: {self.known_hosts}\n  connect_timeout: 5\n  command_timeout: 20\n{sudo}"
            "hosts:\n  - name: cp-1\n    address: 127.0.0.1\n    role: control-plane\n    gpus: 1\n")
        return self.inventory

    def _accept(self) -> None:
        self._listener.settimeout(0.1)  # so that stop() is seen: close() does not wake a blocked accept()
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        if self.raw_banner is not None:
            sock.sendall(self.raw_banner)
            sock.close()
            return
        t = paramiko.Transport(sock)
        t.local_version = self.version
        t.add_server_key(self.host_key)
        self._transports.append(t)
        try:
            t.start_server(server=_Interface(self))
        except (paramiko.SSHException, EOFError, OSError):
            t.close()

    def _exec(self, channel: paramiko.Channel, command: str) -> None:
        channel.settimeout(20)
        received = bytearray()  # every byte of stdin, the password line sudo -S reads included
        try:
            try:
                argv = shlex.split(command)
            except ValueError:
                argv = []
            if argv[:1] == ["sudo"] and "-S" in argv and "-p" in argv:
                # like sudo: the prompt, one password line, then the command (which may announce itself)
                prompt = argv[argv.index("-p") + 1].encode()
                if self.sudo_asks:
                    channel.sendall_stderr(prompt)
                    _recv(channel, received, b"\n")
                given = bytes(received).split(b"\n")[0]
                if self.sudo_asks and self.sudo_password is not None and given != self.sudo_password.encode():
                    channel.sendall_stderr(b"Sorry, try again.\n" + prompt)
                    _recv(channel, received)
                    self.execs.append((command, bytes(received)))
                    channel.sendall_stderr(b"sudo: 1 incorrect password attempt\n")
                    channel.send_exit_status(1)
                    return
                if m := _ANNOUNCE.match(argv[-1]):
                    channel.sendall_stderr(m.group(1).encode() + b"\n")
            _recv(channel, received)
            self.execs.append((command, bytes(received)))
            out, err, status = self.answer(command)
            channel.sendall(out.encode() if isinstance(out, str) else out)
            channel.sendall_stderr(err.encode() if isinstance(err, str) else err)
            if self.exit_delay:  # EOF first, the exit status later (as a slow sshd or shell can)
                channel.shutdown_write()
                time.sleep(self.exit_delay)
            channel.send_exit_status(status)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            channel.close()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._listener.close()
        for t in self._transports:
            t.close()


@pytest.fixture
def hostile_host(tmp_path: Path) -> Iterator[HostileSSH]:
    """A running scripted host (answering the real H200 probe until told otherwise), stopped afterwards."""
    server = HostileSSH(tmp_path)
    try:
        yield server
    finally:
        server.stop()
