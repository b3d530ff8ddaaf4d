"""SSH to hosts: one connection per host, verified host keys, bounded output, sudo without prompts.

This module knows how to run commands, nothing about what they are for. Every failure
becomes a RemoteError with a stable `kind` and a message that never contains a secret.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import paramiko
from fabric import Config, Connection

from gpuk8s.errors import GpuK8sError
from gpuk8s.inventory import sshconfig
from gpuk8s.inventory.model import Host, SSHSettings
from gpuk8s.logs import mask
from gpuk8s.text import clean

log = logging.getLogger("gpuk8s.remote")

MAX_OUTPUT = 1 << 20  # bytes kept per stream by default; the rest is counted and dropped (Result.truncated)
SEND_CHUNK = 1 << 20  # bytes read from a streamed file at a time (Session.send)
T = TypeVar("T")


KEEPALIVE_S = 30  # seconds of silence after which the SSH transport sends a keepalive


class RemoteError(GpuK8sError):
    """A host could not be reached or a command could not be run. `kind` is stable for scripts."""

    def __init__(self, kind: str, message: str, remedy: str = "") -> None:
        # the message may quote a host (an SSH banner, a command's output): data, never terminal control
        super().__init__(message, remedy, kind)


@dataclass
class Result:
    """What a command returned. stdout/stderr are the host's text without control characters but
    otherwise unchanged (secrets are masked where text is shown or logged, never in the data)."""

    command: str  # as shown to people: secrets masked
    exit_status: int
    stdout: str
    stderr: str
    seconds: float
    truncated: bool = False  # a stream printed more than the run's max_output: the rest was dropped
    stdout_bytes: int = 0  # how many bytes stdout printed in all, those dropped included

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


def new_key() -> tuple[str, str]:
    """A new SSH key pair for a run's own use (verify --fabric's workers): the private key in PEM, as OpenSSH reads
    it, and the public key's line. RSA (3072 bits): what paramiko can make; OpenSSH signs with it by SHA-2."""
    key = paramiko.RSAKey.generate(3072)
    out = io.StringIO()
    key.write_private_key(out)
    return out.getvalue(), f"{key.get_name()} {key.get_base64()}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class KnownHosts(paramiko.MissingHostKeyPolicy):
    """Verifies server keys against one known_hosts file, loaded once and shared by all connections."""

    def __init__(self, path: str, accept_new: bool = False) -> None:
        self.path = Path(os.path.expanduser(path))
        self.accept_new = accept_new
        self._lock = threading.Lock()
        self.keys = paramiko.HostKeys()
        if self.path.exists():
            self.keys.load(str(self.path))

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        with self._lock:
            known = self.keys.lookup(hostname)
            if known and key.get_name() in known:
                if known[key.get_name()] == key:
                    return
                raise RemoteError(
                    "hostkey-changed",
                    f"the host key of {hostname} has CHANGED: it now offers {key.get_name()} {fingerprint(key)}, "
                    f"which differs from the key in {self.path}. This can mean a reinstalled host or an attack",
                    f"if the host was reinstalled, verify the new fingerprint out of band, then run "
                    f"ssh-keygen -f {shlex.quote(str(self.path))} -R {shlex.quote(hostname)} and connect again",
                )
            if self.accept_new and not known:
                self.keys.add(hostname, key.get_name(), key)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a") as f:
                    f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
                log.warning("trusted new host key for %s: %s %s (added to %s)",
                            hostname, key.get_name(), fingerprint(key), self.path)
                return
            raise RemoteError(
                "hostkey-unknown",
                f"the host key of {hostname} ({key.get_name()} {fingerprint(key)}) is not in {self.path}",
                f"verify the fingerprint, then add it: ssh-keyscan {_keyscan_args(hostname)} >> "
                f"{shlex.quote(str(self.path))}; or set ssh.host_key_policy: accept-new to trust hosts seen "
                "for the first time",
            )


def _keyscan_args(hostname: str) -> str:
    if hostname.startswith("[") and "]:" in hostname:
        host, port = hostname[1:].split("]:", 1)
        return f"-p {port} {shlex.quote(host)}"
    return shlex.quote(hostname)


_known_hosts_cache: dict[tuple[str, bool], tuple[float, KnownHosts]] = {}
_cache_lock = threading.Lock()


def known_hosts_for(settings: SSHSettings, path: str | None = None) -> KnownHosts:
    """One parsed known_hosts per file for all connections; re-read only if the file changed on disk.

    `path` overrides settings.known_hosts (a UserKnownHostsFile of the ssh config)."""
    path = os.path.expanduser(path or settings.known_hosts)
    key = (path, settings.host_key_policy == "accept-new")
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        mtime = -1
    with _cache_lock:
        cached = _known_hosts_cache.get(key)
        if cached is None or (cached[0] != mtime and not cached[1].accept_new):
            cached = (mtime, KnownHosts(*key))
            _known_hosts_cache[key] = cached
        return cached[1]


def resolve(host: Host) -> sshconfig.Resolved:
    """How to reach the host: the inventory's ssh settings over the ssh config (gpuk8s/inventory/sshconfig.py)."""
    try:
        return sshconfig.resolve(host.address, host.ssh, host.ssh.alias)
    except sshconfig.SSHConfigError as e:
        raise RemoteError("ssh-config", e.message, e.remedy) from None


class Session:
    """One SSH connection to one host, used for every command of one gpuk8s run on that host."""

    def __init__(self, host: Host, sudo_password: str | None = None) -> None:
        self.host = host
        self.settings = host.ssh
        self.sudo_password = sudo_password
        self._conn: Connection | None = None
        self.round_trips = 0
        self.target: sshconfig.Hop | None = None  # where the last connection went (after the ssh config)

    @property
    def is_root(self) -> bool:
        return self.settings.user == "root"

    def _connection(self) -> Connection:
        s = self.settings
        # One per connection: invoke's Config merges its data lazily and is not safe to share between threads
        # (a shared one lost its keys under 32 concurrent connections). Lazy: Fabric loads no ssh config,
        # gpuk8s.inventory.sshconfig decided every value.
        cfg = Config(lazy=True)
        resolved = resolve(self.host)
        policy = known_hosts_for(s, resolved.known_hosts)
        conn: Connection | None = None
        for hop in resolved.target.chain():  # the first jump host first; each is the gateway of the next
            conn = Connection(
                hop.address, user=hop.user, port=hop.port, config=cfg, gateway=conn,
                connect_timeout=s.connect_timeout, connect_kwargs=hop.connect_kwargs(s.connect_timeout),
            )
            conn.client.set_missing_host_key_policy(policy)
        assert conn is not None
        self.target = resolved.target
        return conn

    def connect(self) -> None:
        if self._conn is not None:
            return
        conn = self._connection()
        s = self.settings
        t = self.target
        assert t is not None
        jumps = [h.address for h in t.chain()[:-1]]
        where = f"{t.address}:{t.port}" + (f" (through {', '.join(jumps)})" if jumps else "")
        keys = ", ".join(t.identity_files) or "(agent/default keys)"
        try:
            conn.open()
        except RemoteError:
            conn.close()
            raise
        except paramiko.AuthenticationException:
            conn.close()
            raise RemoteError(
                "auth", f"authentication as {t.user} refused by {where}",
                f"check that the key {keys} is in ~{t.user}/.ssh/authorized_keys "
                "on the host (and on each jump host) and that the user is right",
            ) from None
        except paramiko.BadHostKeyException as e:
            conn.close()
            raise RemoteError(
                "hostkey-changed", f"the host key of {where} has CHANGED (now {fingerprint(e.key)})",
                f"verify it, then remove the old key with ssh-keygen -R {shlex.quote(t.address)}",
            ) from None
        except TimeoutError:
            conn.close()
            raise RemoteError(
                "timeout", f"no answer from {where} within {s.connect_timeout:g} s",
                "check that the host is up and that no firewall drops SSH; raise ssh.connect_timeout for slow links",
            ) from None
        except paramiko.ssh_exception.NoValidConnectionsError as e:
            conn.close()
            refused = all(getattr(err, "errno", None) == 111 for err in e.errors.values())
            if refused:
                raise RemoteError("refused", f"connection refused by {where}",
                                  "start sshd on the host (systemctl start ssh) or fix ssh.port") from None
            reasons = "; ".join(sorted({os.strerror(no) if (no := getattr(err, "errno", None)) else str(err)
                                        for err in e.errors.values()}))
            raise RemoteError("unreachable", f"cannot connect to {where}: {reasons or e.strerror}",
                              "check the address and the route to the host") from None
        except ConnectionRefusedError:
            conn.close()
            raise RemoteError("refused", f"connection refused by {where}",
                              "start sshd on the host (systemctl start ssh) or fix ssh.port") from None
        except socket.gaierror as e:
            conn.close()
            raise RemoteError("dns", f"cannot resolve {t.address}: {e.strerror}",
                              "fix the address in the inventory") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            conn.close()
            raise RemoteError("ssh", f"SSH to {where} failed: {type(e).__name__}: {e}",
                              "check that sshd answers on that port (ssh -v)") from None
        # a command that prints nothing for a long while (dcgmi diag -r 3, a drain waiting for pods): keepalive
        # packets so that a firewall or bastion that drops idle connections does not drop this one
        if conn.transport is not None:
            conn.transport.set_keepalive(KEEPALIVE_S)
        self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sudo_wrap(self, command: str) -> tuple[str, SudoGate | None]:
        """The command line that runs `command` as root, and the gate that answers sudo's prompt, if any.

        With a password, sudo gets a one-time prompt marker (`-S -p`) and the command announces itself on
        stderr before it runs: the password is sent only when sudo asks for it, and the command's stdin only
        once the command runs. When sudo does not ask (NOPASSWD, a cached timestamp, !authenticate) the
        password is never sent, so it can never end up in the command's stdin.
        """
        if self.is_root:
            return f"sh -c {shlex.quote(command)}", None
        if self.settings.sudo.mode == "password":
            if self.sudo_password is None:
                raise RemoteError("sudo-password-missing", f"{self.host.name} needs a sudo password and none was given",
                                  f"export {self.settings.sudo.password_env}=... or set ssh.sudo.prompt: true")
            gate = SudoGate(self.sudo_password)
            inner = f"printf '%s\\n' {gate.ready} >&2; {command}"
            return f"sudo -S -p {gate.prompt} -- sh -c {shlex.quote(inner)}", gate
        return f"sudo -n -- sh -c {shlex.quote(command)}", None

    def run(self, command: str, *, sudo: bool = False, timeout: float | None = None,
            stdin: bytes | None = None, display: str | None = None,
            on_line: Callable[[str], None] | None = None, quiet: bool = False,
            max_output: int = MAX_OUTPUT) -> Result:
        """Run one command; never raises on a non-zero exit (see Result.exit_status).

        `on_line` sees each complete stdout line as it arrives (for live progress). `quiet` keeps the
        output out of the log (a kubeconfig carries a client key). `max_output`: bytes kept per stream; a
        caller that reads more than the default (kubectl's lists) says so, and must check Result.truncated.
        """
        self.connect()
        assert self._conn is not None
        line, gate = self.sudo_wrap(command) if sudo else (command, None)
        shown = mask(display or command)
        timeout = timeout or self.settings.command_timeout
        start = time.monotonic()
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError("cut", f"the connection to {self.host.name} was lost", "check the host and re-run")
        with self._remote_errors(shown, timeout, "raise ssh.command_timeout if the step is legitimately slow",
                                 "check the host and re-run; gpuk8s continues where it stopped"):
            chan = transport.open_session(timeout=self.settings.connect_timeout)
            chan.exec_command(line)
            if gate is not None:
                gate.payload = stdin or b""
            else:
                if stdin:
                    chan.sendall(stdin)
                send_eof(chan)
            out, err, truncated, total = _drain(chan, start + timeout, on_line, gate, max_output)
        self.round_trips += 1
        status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        chan.close()
        if status == -1:
            raise RemoteError("cut", f"the connection to {self.host.name} closed before '{shown}' finished",
                              "check the host and re-run")
        res = Result(shown, status, clean(out.decode("utf-8", "replace")), clean(err.decode("utf-8", "replace")),
                     time.monotonic() - start, truncated, total)
        log.debug("%s: $ %s -> %d in %.2fs\n%s%s", self.host.name, shown, status, res.seconds,
                  "    (output not logged)\n" if quiet else _indent(res.stdout), _indent(res.stderr))
        return res


    @contextlib.contextmanager
    def _remote_errors(self, shown: str, timeout: float, slow: str, cut: str) -> Iterator[None]:
        """A command's timeout and a broken connection as RemoteError, naming the host and the command."""
        try:
            yield
        except TimeoutError:
            raise RemoteError("command-timeout", f"'{shown}' on {self.host.name} did not finish within {timeout:g} s",
                              slow) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError("cut", f"the connection to {self.host.name} broke while running '{shown}': "
                              f"{type(e).__name__}", cut) from None

    def send(self, command: str, source: BinaryIO, *, display: str, timeout: float,
             on_bytes: Callable[[int], None] | None = None) -> Result:
        """Run `command` as root with `source` streamed to its stdin (a large file, never held in memory: the
        bundle's copy to its serving host), then its result as run() gives it. `on_bytes` sees each chunk's size."""
        self.connect()
        assert self._conn is not None
        line, gate = self.sudo_wrap(command)
        if gate is not None:
            gate.keep_stdin = True
        shown = mask(display)
        start = time.monotonic()
        deadline = start + timeout
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError("cut", f"the connection to {self.host.name} was lost", "check the host and re-run")
        with self._remote_errors(shown, timeout, "check the link to the host and re-run: the copy goes on where it "
                                 "stopped", "check the host and re-run; the copy goes on where it stopped"):
            chan = transport.open_session(timeout=self.settings.connect_timeout)
            chan.exec_command(line)
            err = bytearray()
            while gate is not None and not gate.open:  # sudo's prompt answered, the command started
                if time.monotonic() > deadline or chan.exit_status_ready():
                    break
                select.select([chan.fileno()], [], [], 0.5)
                while chan.recv_stderr_ready() and len(err) < 65536:
                    err += chan.recv_stderr(4096)
                gate.feed(chan, err)
            # a remote that stops reading blocks sendall: the channel's own timeout ends that wait
            chan.settimeout(max(1.0, min(120.0, deadline - time.monotonic())))
            while not chan.exit_status_ready() and (gate is None or gate.ready_seen):
                chunk = source.read(SEND_CHUNK)
                if not chunk:
                    break
                if time.monotonic() > deadline:
                    chan.close()
                    raise TimeoutError()
                try:
                    chan.sendall(chunk)
                except OSError:
                    break  # the command ended early (its stderr, below, says why)
                if on_bytes is not None:
                    on_bytes(len(chunk))
            with contextlib.suppress(OSError, paramiko.SSHException):
                send_eof(chan)
            chan.settimeout(None)
            out, err2, truncated, total = _drain(chan, deadline)
        self.round_trips += 1
        status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        chan.close()
        res = Result(shown, status, clean(out.decode("utf-8", "replace")),
                     clean((bytes(err) + err2).decode("utf-8", "replace")), time.monotonic() - start, truncated, total)
        log.debug("%s: $ %s (with %s streamed) -> %d in %.2fs\n%s", self.host.name, shown, "a file", status,
                  res.seconds, _indent(res.stderr))
        return res

    def hold(self, command: str, *, until: str, display: str, timeout: float = 30) -> tuple[Held | None, str]:
        """Start `command` as root and keep it running, its stdin open, until Held.release().

        The command prints the line `until` when it holds what it came for (then waits on stdin: when
        gpuk8s releases it, exits or loses the connection, stdin ends and so does the hold) or exits.
        Returns the holder and the output so far, or None and the output when the command ended.
        """
        self.connect()
        assert self._conn is not None
        line, gate = self.sudo_wrap(command)
        if gate is not None:
            gate.keep_stdin = True
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError("cut", f"the connection to {self.host.name} was lost", "check the host and re-run")
        shown = mask(display)
        try:
            chan = transport.open_session(timeout=self.settings.connect_timeout)
            chan.exec_command(line)
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while until.encode() + b"\n" not in out:
                if time.monotonic() > deadline:
                    chan.close()
                    raise RemoteError("command-timeout", f"'{shown}' on {self.host.name} did not answer within "
                                      f"{timeout:g} s", "check the host and re-run")
                select.select([chan.fileno()], [], [], 0.5)
                while chan.recv_ready() and len(out) < 65536:
                    out += chan.recv(4096)
                while chan.recv_stderr_ready() and len(err) < 65536:
                    err += chan.recv_stderr(4096)
                if gate is not None and not gate.open:
                    gate.feed(chan, err)
                if chan.exit_status_ready() and not chan.recv_ready():
                    chan.close()
                    return None, clean((out + err).decode("utf-8", "replace"))
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError("cut", f"the connection to {self.host.name} broke while running '{shown}': "
                              f"{type(e).__name__}", "check the host and re-run") from None
        self.round_trips += 1
        text = clean(out.decode("utf-8", "replace"))
        log.debug("%s: holding '%s'", self.host.name, shown)
        return Held(chan), text


class Held:
    """A command kept running on a host (see Session.hold); release() ends it by closing its stdin."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan

    def release(self, wait: float = 5.0) -> None:
        try:
            send_eof(self.chan)
            deadline = time.monotonic() + wait
            while not self.chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.02)
        except (paramiko.SSHException, OSError, EOFError):
            pass
        finally:
            self.chan.close()


class SudoGate:
    """Answers sudo's prompt once, then lets the command's stdin through once the command has started.

    Both markers are random per command, so no earlier output can forge them; they are removed from
    the stderr the caller sees.
    """

    def __init__(self, password: str, keep_stdin: bool = False) -> None:
        tag = os.urandom(8).hex()
        self.keep_stdin = keep_stdin
        self.prompt = f"@@gpuk8s-sudo-prompt-{tag}@@"
        self.ready = f"@@gpuk8s-sudo-ready-{tag}@@"
        self.password = password
        self.payload = b""
        self.answered = False
        self.open = False
        self.ready_seen = False  # the command started (not: sudo gave up on a wrong password)

    def feed(self, chan: paramiko.Channel, err: bytearray) -> None:
        """Look at the stderr seen so far; answer the prompt or open the gate. Markers are cut out of `err`."""
        if self.open:
            return
        prompt, ready = self.prompt.encode(), self.ready.encode() + b"\n"
        if prompt in err:
            del err[err.index(prompt):err.index(prompt) + len(prompt)]
            if self.answered:
                # asked again: the password was wrong; end-of-file makes sudo give up instead of waiting
                send_eof(chan)
                self.open = True
                return
            chan.sendall(self.password.encode() + b"\n")
            self.answered = True
        if ready in err:
            del err[err.index(ready):err.index(ready) + len(ready)]
            self.open = True
            self.ready_seen = True
            if self.payload:
                chan.sendall(self.payload)
            if not self.keep_stdin:
                send_eof(chan)


def in_one_piece(script: str) -> str:
    """`script` wrapped so that its stdout reaches the client in one piece when it ends, not as one SSH packet
    per write. The fact probe prints ~100 small writes; each is a packet that paramiko decrypts, checks and
    hands over in Python (about 0.1 ms of client CPU apiece): 10 of the ~18 ms a host's probe cost the client
    (docs/performance.md). The output is held in the remote shell (a command substitution), so only scripts
    whose output is bounded (the probe's sections are cut at 256 KiB each) and that need no live progress use
    this. The exit status is the script's; the trailing newlines the substitution drops come back as one.

    The held output goes through dd, which gathers it (iflag=fullblock, up to 4 MiB) into one write: bash makes its
    stdout line-buffered, so its printf alone writes each line apart (dash writes once), and a reader woken between
    two writes gets the output in pieces. Where dd is missing or refuses those GNU flags (an old coreutils, a
    BusyBox), which it says before reading anything, printf writes it."""
    return (f"gk_out=$(\n{script}\n)\ngk_rc=$?\n"
            "if dd if=/dev/null bs=4M iflag=fullblock status=none 2>/dev/null; then printf '%s\\n' \"$gk_out\" | "
            "dd bs=4M iflag=fullblock status=none\nelse printf '%s\\n' \"$gk_out\"\nfi\nexit $gk_rc\n")


def send_eof(chan: paramiko.Channel) -> None:
    """End the channel's stdin (SSH_MSG_CHANNEL_EOF), never after the channel's close.

    paramiko's shutdown_write() builds the EOF under the channel's lock but sends it after releasing it; a
    command that ends at that moment has its close answered by paramiko's own thread in between, and the EOF
    then follows the CLOSE: OpenSSH's sshd has freed the channel and drops the whole connection ("ieof packet
    referred to nonexistent channel"; paramiko issues 1115, 1705, still open). Sent under the lock, the close
    waits for it. Locks in paramiko's own order (the transport's send lock, then the channel's; paramiko never
    takes them the other way), and only once no key exchange is under way, so nothing waits while holding the
    channel's lock; a key exchange that does not end within 30 s is the transport's own SSHException.
    """
    t: Any = chan.transport
    if t is None:
        return
    if not all(hasattr(t, a) for a in ("clear_to_send", "clear_to_send_lock", "_send_message")) or not hasattr(
            chan, "_send_eof"):
        chan.shutdown_write()  # a paramiko without these internals: its own way (the race above may remain)
        return
    deadline = time.monotonic() + 30
    while True:
        t.clear_to_send.wait(0.1)
        if not t.active:
            return
        with t.clear_to_send_lock:
            if t.clear_to_send.is_set():
                with chan.lock:
                    if chan.closed or chan.eof_sent:
                        return
                    m = chan._send_eof()  # paramiko's own EOF message and state
                    if m is not None:
                        t._send_message(m)
                return
        if time.monotonic() > deadline:
            raise paramiko.SSHException("Key-exchange timed out waiting for key negotiation")


def _drain(chan: paramiko.Channel, deadline: float, on_line: Callable[[str], None] | None = None,
           gate: SudoGate | None = None, cap: int = MAX_OUTPUT) -> tuple[bytes, bytes, bool, int]:
    """stdout, stderr (each at most `cap` bytes), whether either was cut, and stdout's whole size."""
    out, err = bytearray(), bytearray()
    truncated = False
    total = err_total = 0
    pending = b""
    fd = chan.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            chan.close()
            raise TimeoutError()
        if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
            # From EOF on, paramiko keeps the channel's pipe readable for good: select would return at once and
            # this loop spin (~150 turns a command) until the exit status arrives. Wait for that instead.
            chan.status_event.wait(min(left, 1.0))
        else:
            select.select([fd], [], [], min(left, 1.0))
        while chan.recv_ready():
            chunk = chan.recv(65536)
            if on_line is not None:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                pending = pending[-65536:]  # a line that never ends must not grow without bound
                for ln in lines:
                    on_line(ln.decode("utf-8", "replace"))
            total += len(chunk)
            if len(out) < cap:
                out += chunk[: cap - len(out)]
            truncated |= total > cap
        while chan.recv_stderr_ready():
            chunk = chan.recv_stderr(65536)
            err_total += len(chunk)
            if len(err) < cap:
                err += chunk[: cap - len(err)]
            truncated |= err_total > cap
        if gate is not None and not gate.open:
            gate.feed(chan, err)
        drained = not chan.recv_ready() and not chan.recv_stderr_ready()
        if chan.exit_status_ready() and drained and (chan.eof_received or chan.closed):
            return bytes(out), bytes(err), truncated, total
        if chan.closed and not chan.recv_ready():
            return bytes(out), bytes(err), truncated, total


def _indent(text: str) -> str:
    text = text[-4000:]
    return "".join(f"    {ln}\n" for ln in text.splitlines())


def for_each_host(hosts: Iterable[Host], fn: Callable[[Host], T], concurrency: int,
                  on_done: Callable[[Host, T | None, BaseException | None], None] | None = None,
                  ) -> dict[str, T | BaseException]:
    """Run fn on every host, at most `concurrency` at a time; one host's failure never stops another."""
    results: dict[str, T | BaseException] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="host")
    try:
        futures = {pool.submit(fn, h): h for h in hosts}
        for fut in as_completed(futures):
            h = futures[fut]
            try:
                value = fut.result()
                results[h.name] = value
                if on_done:
                    on_done(h, value, None)
            except Exception as e:  # collected per host and reported together
                results[h.name] = e
                if on_done:
                    on_done(h, None, e)
    except BaseException:
        # interrupted: do not wait for hosts still connecting; queued hosts are never started
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results
