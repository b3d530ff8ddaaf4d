"""The lab's delay wires: link delay without sch_netem (python3 linkrelay.py LAB_ROOT).

A host whose link has a delay (and a kernel without sch_netem) gets, instead of a veth pair, two
persistent TAP devices: `eth0` in the host's network namespace and `gk8s-vN` on the lab bridge. This
process holds both ends and is the wire between them: every Ethernet frame read from one end is
written to the other `delay_ms` later (the same delay each way, as netem on both ends of a link
gives: a round trip through the wire takes 2 x delay_ms longer). ARP, ICMP, TCP handshakes and data
are all delayed, so ping, SSH and kubeadm see the same RTT. Frames keep their order. Rate shaping
stays with tbf on both TAP devices; a wire without its relay has no carrier (the host is cut off).

One process serves every wire of the lab. Its configuration is LAB_ROOT/links.json:
    {"gen": N, "links": {"NAME": {"netns": "gk8s-NAME", "host_dev": "eth0", "bridge_dev": "gk8s-v3",
                                  "delay_ms": 10.0}}}
On SIGHUP it re-reads the file (attaches new wires, changes delays, lets go of removed ones) and then
writes N to LAB_ROOT/links.applied, which the lab waits for.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import heapq
import json
import os
import select
import signal
import struct
import sys
import time
from pathlib import Path

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
MAX_FRAME = 65536
QUEUE_LIMIT = 10000  # frames held per direction; more are dropped, as a full netem queue drops


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _attach(dev: str, netns: str | None, home_ns: int) -> int:
    """Open the persistent TAP device `dev` (inside network namespace `netns`, if given)."""
    ns_fd = os.open(f"/run/netns/{netns}", os.O_RDONLY) if netns else -1
    try:
        if ns_fd >= 0:
            _setns(ns_fd)
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", dev.encode(), IFF_TAP | IFF_NO_PI))
        except OSError:
            os.close(fd)
            raise
    finally:
        if ns_fd >= 0:
            _setns(home_ns)
            os.close(ns_fd)
    os.set_blocking(fd, False)
    return fd


class Wire:
    def __init__(self, name: str, host_fd: int, bridge_fd: int, delay_ms: float) -> None:
        self.name = name
        self.fds = (host_fd, bridge_fd)
        self.delay = delay_ms / 1000.0
        self.queued = {host_fd: 0, bridge_fd: 0}

    def other(self, fd: int) -> int:
        return self.fds[1] if fd == self.fds[0] else self.fds[0]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def main(root: Path) -> None:
    home_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    conf = root / "links.json"
    rpipe, wpipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wpipe)
    signal.signal(signal.SIGHUP, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ep = select.epoll()
    ep.register(rpipe, select.EPOLLIN)
    wires: dict[str, Wire] = {}
    by_fd: dict[int, Wire] = {}
    heap: list[tuple[float, int, int, bytes, Wire]] = []  # (due, seq, out fd, frame, wire)
    seq = 0

    def reload() -> None:
        try:
            data = json.loads(conf.read_text())
        except (OSError, ValueError):
            return
        links = data.get("links", {})
        for name in [n for n in wires if n not in links]:
            w = wires.pop(name)
            for fd in w.fds:
                ep.unregister(fd)
                by_fd.pop(fd, None)
            w.close()
        for name, spec in links.items():
            w = wires.get(name)
            if w is None:
                try:
                    host_fd = _attach(spec["host_dev"], spec["netns"], home_ns)
                    bridge_fd = _attach(spec["bridge_dev"], None, home_ns)
                except OSError as e:
                    print(f"linkrelay: {name}: {e}", file=sys.stderr, flush=True)
                    continue
                w = wires[name] = Wire(name, host_fd, bridge_fd, float(spec.get("delay_ms", 0)))
                for fd in w.fds:
                    by_fd[fd] = w
                    ep.register(fd, select.EPOLLIN)
            w.delay = float(spec.get("delay_ms", 0)) / 1000.0
        tmp = root / "links.applied.tmp"
        tmp.write_text(str(data.get("gen", 0)))
        tmp.replace(root / "links.applied")

    def send(fd: int, frame: bytes) -> None:
        try:  # noqa: SIM105 (the hot path)
            os.write(fd, frame)
        except (BlockingIOError, OSError):
            pass  # the other end's queue is full or it went away: the frame is lost, as on a wire

    reload()
    while True:
        timeout = -1.0
        if heap:
            timeout = max(0.0, heap[0][0] - time.monotonic())
        for fd, _ev in ep.poll(timeout):
            if fd == rpipe:
                with contextlib.suppress(BlockingIOError):
                    os.read(rpipe, 4096)
                reload()
                continue
            w = by_fd.get(fd)
            if w is None:
                continue
            out = w.other(fd)
            for _ in range(64):
                try:
                    frame = os.read(fd, MAX_FRAME)
                except (BlockingIOError, OSError):
                    break
                if not frame:
                    break
                if w.delay <= 0 and not w.queued[out]:
                    send(out, frame)
                elif w.queued[out] < QUEUE_LIMIT:
                    seq += 1
                    w.queued[out] += 1
                    heapq.heappush(heap, (time.monotonic() + w.delay, seq, out, frame, w))
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _due, _seq, out, frame, w = heapq.heappop(heap)
            w.queued[out] -= 1
            if out in by_fd:
                send(out, frame)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
