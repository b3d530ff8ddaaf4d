"""The lab's fake-command server: one long-lived process answers the faked commands of every lab host.

Why: a faked command used to be a fresh `python3 fake.py NAME ARGS` process, about 40 ms of CPU
each; a probe runs a dozen of them, so the lab's fakes, not gpuk8s, set the time of a 128-host run.
Now the command in a host's /usr/bin is a tiny client (`fakecmd`, compiled C, or `client.py` where no
C compiler exists) that connects to this server's Unix socket and hands over its argv, environment,
umask, groups, working directory and its stdin/stdout/stderr (the file descriptors themselves, with
SCM_RIGHTS). The server, which has fake.py and kube.py imported already, forks; the child joins the
client's network, UTS and mount namespaces (those of the client's process, from SO_PEERCRED: so the
host is whoever called), takes the client's credentials, directory and descriptors, and runs
fake.main() exactly as `python3 fake.py NAME ARGS` would. The child's wait status goes back to the
client, which exits with it (or dies of the same signal). Signals the client gets (timeout's TERM, a
HUP) are forwarded to the child; a client that dies (SIGKILL) takes its child with it.

Everything a fake observes or does is the same as before: same code, same files, same user, same
namespaces, same descriptors. Only the process that runs it differs (a fork of this server, whose
command line is this server's).

Protocol (client -> server, one stream connection per command):
    "GK8F" u32 len | payload (len bytes), with SCM_RIGHTS [cwd, fd0?, fd1?, fd2?] on the first bytes
    payload: u32 fdmask (bit i: fd i sent), u32 umask, u32 ngroups, u32 argc, u32 envc, ngroups x u32,
             then argc + envc NUL-terminated strings (argv[0] is the command's name)
server -> client: i32 pid of the child, then i32 wait status when it ends; or, for a command answered
without a process (below), i32 0, i32 wait status, then the writes the command made, in order, each
u8 fd (1 or 2) u32 length + bytes, ended by fd 255; the client makes them.

Commands that only read the host's spec and state (fake.read_only: uname, nvidia-smi, systemctl
is-active, sysctl reads, ...: most of a probe) are answered in this process, without a fork: the same
fake function runs with the host's state directory seen through /proc/CLIENT/root (the client's mount
namespace, so the state lock is the one the host's own fakes take), its writes to stdout and stderr
captured with the buffering a real process has (stdout block-buffered, stderr line-buffered) and
replayed by the client in the same order. A delay, or an override that sleeps or floods, takes the
process path.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import gc
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fake  # noqa: E402  (preloaded: the point of the server)
import kube  # noqa: E402,F401

MAGIC = b"GK8F"
HEAD = struct.Struct("=4sI")
FIXED = struct.Struct("=5I")
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
FORWARD_STOP = object()


def _setns(fd: int, nstype: int) -> None:
    if _libc.setns(fd, nstype) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _recv_request(conn: socket.socket) -> tuple[list[int], bytes]:
    fds: list[int] = []
    head = b""
    while len(head) < HEAD.size:
        data, anc, _flags, _addr = conn.recvmsg(HEAD.size - len(head), socket.CMSG_SPACE(8 * 4))
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(cdata[: len(cdata) - (len(cdata) % a.itemsize)])
                fds.extend(a)
        if not data:
            raise EOFError("client went away")
        head += data
    magic, length = HEAD.unpack(head)
    if magic != MAGIC or length > 64 << 20:
        raise ValueError("not a fake-command request")
    body = bytearray()
    while len(body) < length:
        chunk = conn.recv(min(length - len(body), 1 << 20))
        if not chunk:
            raise EOFError("client went away")
        body += chunk
    return fds, bytes(body)


def _parse(body: bytes) -> tuple[int, int, list[int], list[str], list[str]]:
    fdmask, umask, ngroups, argc, envc = FIXED.unpack_from(body)
    off = FIXED.size
    groups = list(struct.unpack_from(f"={ngroups}I", body, off))
    off += 4 * ngroups
    strings = body[off:].split(b"\0")
    argv = [os.fsdecode(s) for s in strings[:argc]]
    env = [os.fsdecode(s) for s in strings[argc:argc + envc]]
    return fdmask, umask, groups, argv, env


def _exit_code(code: object) -> int:
    """What `sys.exit(code)` makes the exit status of a Python process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{code}\n")
    return 1


# GPUK8S_LAB_FAKES_CPU=FILE (in the environment of `python -m tests.lab up`): the server appends one JSON line per
# forked fake to FILE, [CPU seconds of the fake and its children, argv]: what each command costs the lab (the
# in-process answers cost ~0.3 ms each and are not listed)
CPU_LOG = os.environ.get("GPUK8S_LAB_FAKES_CPU")
_ARGV: dict[int, list[str]] = {}  # forked fake -> its argv, while CPU_LOG is set
FAST_MAX = 64 << 10  # bytes of output a command answered without a process may produce


class _Capture(io.RawIOBase):
    """A raw stream that records each write (what reached the descriptor) in order."""

    def __init__(self, fd: int, writes: list[tuple[int, bytes]]) -> None:
        self.fd = fd
        self.writes = writes

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.writes.append((self.fd, bytes(b)))
        return len(b)


def _answer(pid: int, fds: list[int], body: bytes) -> tuple[int, list[tuple[int, bytes]]] | None:
    """Run a read-only fake in this process for the client `pid`: (exit code, writes), or None when the
    command needs a process of its own."""
    fdmask, _umask, _groups, argv, _env = _parse(body)
    name, args = argv[0], argv[1:]
    if fdmask != 7 or name not in fake.COMMANDS or not fake.read_only(name, args):
        return None
    saved = fake.STATE_DIR, sys.stdout, sys.stderr
    fake.STATE_DIR = Path(f"/proc/{pid}/root/var/lib/gpuk8s-lab")
    try:
        h = fake.Host(wait=False)  # never wait here: a fake holding the lock for long would stall every host
    except (OSError, ValueError):
        fake.STATE_DIR = saved[0]
        return None
    writes: list[tuple[int, bytes]] = []
    try:
        ov = h.state.get("overrides", {}).get(name)
        if float(h.state.get("delays", {}).get(name, 0)):
            return None
        if ov is not None and (float(ov.get("sleep", 0))
                               or len(ov.get("stdout", "")) * int(ov.get("repeat", 1)) > FAST_MAX):
            return None
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(_Capture(1, writes)), encoding="utf-8",
                                      errors="surrogateescape", line_buffering=os.isatty(fds[2]))
        sys.stderr = io.TextIOWrapper(io.BufferedWriter(_Capture(2, writes)), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        fake.record([name, *args])
        try:
            if ov is not None:
                for _ in range(int(ov.get("repeat", 1))):
                    fake.out(ov.get("stdout", ""))
                fake.err(ov.get("stderr", ""))
                code = int(ov.get("exit", 0))
            else:
                code = _exit_code(fake.COMMANDS[name](h, args))
        except Exception:  # noqa: BLE001  (as the interpreter would: a traceback and status 1)
            etype, value, tb = sys.exc_info()
            traceback.print_exception(etype, value, tb.tb_next if tb else None)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        return code, writes
    finally:
        h.release()
        fake.STATE_DIR, sys.stdout, sys.stderr = saved


def _send_answer(conn: socket.socket, code: int, writes: list[tuple[int, bytes]]) -> None:
    parts = [struct.pack("=ii", 0, (code & 0xFF) << 8)]
    for fd, data in writes:
        parts.append(struct.pack("=BI", fd, len(data)))
        parts.append(data)
    parts.append(struct.pack("=BI", 255, 0))
    conn.sendall(b"".join(parts))


def _child(conn: socket.socket, pid: int, uid: int, gid: int, fds: list[int], body: bytes) -> None:
    """In the forked child: become the client's process (namespaces, user, descriptors) and run the fake."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in any Python process
    fdmask, umask, groups, argv, env = _parse(body)
    ns = [(os.open(f"/proc/{pid}/ns/{n}", os.O_RDONLY | os.O_CLOEXEC), t)
          for n, t in (("net", CLONE_NEWNET), ("uts", CLONE_NEWUTS), ("mnt", CLONE_NEWNS))]
    for fd, t in ns:
        if os.fstat(fd).st_ino != os.stat(f"/proc/self/ns/{_NSNAME[t]}").st_ino:
            _setns(fd, t)
        os.close(fd)
    cwd, rest = fds[0], fds[1:]
    os.fchdir(cwd)
    os.close(cwd)
    for n in range(3):
        if fdmask & (1 << n):
            src = rest.pop(0)
            if src != n:
                os.dup2(src, n)  # inheritable, as a command's 0-2 are
                os.close(src)
        else:
            with contextlib.suppress(OSError):
                os.close(n)
    conn.close()
    os.umask(umask)
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    os.environ.clear()
    for kv in env:
        k, sep, v = kv.partition("=")
        if sep and k:
            os.environ[k] = v
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8",
                                 errors="surrogateescape") if fdmask & 1 else None  # type: ignore[assignment]
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8",
                                  errors="surrogateescape", line_buffering=os.isatty(1)) if fdmask & 2 else None  # type: ignore[assignment]
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True) if fdmask & 4 else None  # type: ignore[assignment]
    sys.argv = [fake.__file__, *argv]
    code = 0
    try:
        code = _exit_code(fake.main())
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001  (as the interpreter does: traceback, status 1)
        etype, value, tb = sys.exc_info()
        traceback.print_exception(etype, value, tb.tb_next if tb else None)
        code = 1
    if not _flush():
        code = 120
    os._exit(code)


def _flush() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            ok = False
    return ok


_NSNAME = {CLONE_NEWNET: "net", CLONE_NEWUTS: "uts", CLONE_NEWNS: "mnt"}


def serve(sock_path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path + ".new")
    os.chmod(sock_path + ".new", 0o666)  # fakes run as the login user too
    srv.listen(4096)
    os.rename(sock_path + ".new", sock_path)
    rpipe, wpipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wpipe)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, "accept")
    sel.register(rpipe, selectors.EVENT_READ, "signal")
    running: dict[int, socket.socket] = {}  # child pid -> its client's connection
    by_conn: dict[int, int] = {}  # connection fd -> child pid
    gc.collect()
    gc.freeze()  # what the children inherit is never touched by their collector
    while True:
        for key, _ in sel.select():
            what = key.data
            if what == "accept":
                try:
                    conn, _ = srv.accept()
                except OSError:
                    continue
                _start(conn, srv, sel, running, by_conn, rpipe, wpipe)
            elif what == "signal":
                with contextlib.suppress(BlockingIOError):
                    os.read(rpipe, 4096)
                _reap(sel, running, by_conn)
            else:  # a client's connection is readable: it died (EOF) before its command ended
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    gone = conn.recv(1) == b""
                except OSError:
                    gone = True
                if gone:
                    pid = by_conn.get(conn.fileno())
                    sel.unregister(conn)
                    if pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)  # as the fake would have died with its process


def _start(conn: socket.socket, srv: socket.socket, sel: selectors.BaseSelector, running: dict[int, socket.socket],
           by_conn: dict[int, int], rpipe: int, wpipe: int) -> None:
    fds: list[int] = []
    try:
        conn.settimeout(5)
        fds, body = _recv_request(conn)
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", cred)
        if not fds:
            raise ValueError("no working directory sent")
        answer = _answer(pid, fds, body)
        if answer is not None:
            for fd in fds:
                os.close(fd)
            fds = []
            _send_answer(conn, *answer)
            conn.close()
            return
    except (OSError, ValueError, EOFError, struct.error):
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    child = os.fork()
    if child == 0:
        try:
            srv.close()
            os.close(rpipe)
            os.close(wpipe)
            for c in running.values():
                c.close()
            conn.settimeout(None)
            _child(conn, pid, uid, gid, fds, body)
        except BaseException:  # noqa: BLE001
            try:
                traceback.print_exc()
            finally:
                os._exit(1)
        os._exit(1)
    for fd in fds:
        os.close(fd)
    if CPU_LOG:
        with contextlib.suppress(Exception):
            _ARGV[child] = _parse(body)[3]
    with contextlib.suppress(OSError):
        conn.sendall(struct.pack("=i", child))
    conn.setblocking(False)
    running[child] = conn
    by_conn[conn.fileno()] = child
    sel.register(conn, selectors.EVENT_READ, "client")


def _reap(sel: selectors.BaseSelector, running: dict[int, socket.socket], by_conn: dict[int, int]) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        argv = _ARGV.pop(pid, None)
        if CPU_LOG and argv is not None:
            with contextlib.suppress(OSError), open(CPU_LOG, "a") as log:
                log.write(json.dumps([round(usage.ru_utime + usage.ru_stime, 4), argv]) + "\n")
        conn = running.pop(pid, None)
        if conn is None:
            continue
        by_conn.pop(conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        try:
            conn.setblocking(True)
            conn.settimeout(1)
            conn.sendall(struct.pack("=i", status))
        except OSError:
            pass
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
