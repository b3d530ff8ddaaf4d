"""Measure the links between the control plane and each worker: ping RTT and iperf3 throughput.

Parsing is pure; `measure` drives the already-open SSH sessions. The test is bounded in time:
one parallel ping run, then one short iperf3 run per worker (at most `max_workers` workers).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from gpuk8s.preflight.result import CheckResult, failed, passed, skipped
from gpuk8s.remote import RemoteError, Session

IPERF_PORT = 5201
_PING_RTT = re.compile(r"= [0-9.]+/([0-9]{1,9}(?:\.[0-9]{1,9})?)/[0-9.]+/[0-9.]+ ms")

# The iperf3 server's pid file lives in a fresh mktemp -d directory (never a fixed path in /tmp that
# another local user could plant), and the pid read back is killed only if it is a number and names an
# iperf3 process: whatever the file holds, nothing else is killed.
START_SERVER = ("command -v iperf3 >/dev/null || exit 127; d=$(mktemp -d /tmp/gpuk8s-iperf3.XXXXXXXXXX) || exit 1; "
                f"iperf3 -s -D -p {IPERF_PORT} -I \"$d/pid\" || {{ rm -rf \"$d\"; exit 1; }}; printf '%s\\n' \"$d\"")
_SERVER_DIR = re.compile(r"/tmp/gpuk8s-iperf3\.[A-Za-z0-9]{10}")


def server_dir_of(text: str) -> str | None:
    """The directory START_SERVER printed, if it is exactly what mktemp makes; a host's other text is refused."""
    lines = text.strip().splitlines()
    return lines[-1] if lines and _SERVER_DIR.fullmatch(lines[-1]) else None


# When the directory line is not recognised, the server START_SERVER started (if it did) is found by its exact
# command line, which names a directory of the form mktemp makes, and only this user's processes are looked at.
def stop_unknown(port: int = IPERF_PORT) -> str:
    return (f"pkill -u \"$(id -u)\" -x -f 'iperf3 -s -D -p {int(port)} -I /tmp/gpuk8s-iperf3\\.[A-Za-z0-9]"
            "{10}/pid'; true")  # its directory is left: another run's may have the same form


def stop_server(server_dir: str) -> str:
    if not _SERVER_DIR.fullmatch(server_dir):
        raise ValueError("not an iperf3 server directory")
    d = shlex.quote(server_dir)
    return (f"p=$(cat {d}/pid 2>/dev/null); case \"$p\" in ''|*[!0-9]*) ;; *) "
            f"[ \"$(cat /proc/$p/comm 2>/dev/null)\" = iperf3 ] && kill \"$p\";; esac; rm -rf {d}; true")


@dataclass
class Link:
    worker: str
    rtt_ms: float | None = None
    gbit: float | None = None
    note: str = ""


def parse_ping(text: str) -> float | None:
    """Average RTT in ms from `ping -q` output, or None (all lost, or not ping output)."""
    m = _PING_RTT.search(text)
    return float(m.group(1)) if m else None


def parse_iperf3(text: str) -> float | None:
    """Received throughput in Gbit/s from `iperf3 -J`, or None."""
    try:
        data = json.loads(text)
        bps = data["end"]["sum_received"]["bits_per_second"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return float(bps) / 1e9 if isinstance(bps, (int, float)) and not isinstance(bps, bool) else None


def _ping_all(cp: Session, workers: dict[str, Session]) -> dict[str, float | None]:
    """Ping every worker at once from the control plane; each result is printed only after all finish,
    so that parallel outputs never interleave."""
    names = list(workers)
    pings = " ".join(f"(ping -n -q -c 5 -i 0.2 -W 1 {shlex.quote(workers[n].host.address)} >\"$d/{i}\" 2>&1) &"
                     for i, n in enumerate(names))
    show = " ".join(f"printf '@@ping %s\\n' {shlex.quote(n)}; cat \"$d/{i}\";" for i, n in enumerate(names))
    res = cp.run(f'd=$(mktemp -d) || exit 1; {pings} wait; {show} rm -rf "$d"', timeout=30,
                 display="ping each worker (5 packets)")
    out: dict[str, float | None] = {}
    for block in res.stdout.split("@@ping ")[1:]:
        name, _, body = block.partition("\n")
        out[name.strip()] = parse_ping(body)
    return out


def measure(cp: Session, workers: dict[str, Session], seconds: float, max_workers: int = 16) -> list[Link]:
    links = {name: Link(name) for name in workers}
    try:
        has_ping = cp.run("command -v ping", display="command -v ping").ok
        if has_ping:
            for name, rtt in _ping_all(cp, workers).items():
                if name in links:
                    links[name].rtt_ms = rtt
                    if rtt is None:
                        links[name].note = "no ping reply"
        else:
            for link in links.values():
                link.note = "ping not installed on the control plane"
        if seconds <= 0:
            return list(links.values())
        start = cp.run(START_SERVER, display="start iperf3 server")
        server_dir = server_dir_of(start.stdout) if start.ok else None
        if server_dir is None:
            if start.exit_status != 127:  # it may have started (a start cut off after the fork too): stop it
                cp.run(stop_unknown(), display="stop iperf3 server")
            why = ("iperf3 not available on the control plane" if start.exit_status == 127 or not start.ok
                   else "iperf3 started but printed no server directory: stopped")
            for link in links.values():
                link.note = (link.note + "; " if link.note else "") + why
            return list(links.values())
        try:
            for i, (name, s) in enumerate(workers.items()):
                if i >= max_workers:
                    links[name].note = f"bandwidth sampled on the first {max_workers} workers only"
                    continue
                addr = shlex.quote(cp.host.address)
                cmd = (f"iperf3 -c {addr} -p {IPERF_PORT} -t {seconds:g} -J --connect-timeout 3000")
                try:
                    r = s.run(cmd, timeout=seconds + 15)
                except RemoteError as e:
                    links[name].note = e.message
                    continue
                if r.exit_status == 127:
                    links[name].note = "iperf3 not installed on the worker"
                links[name].gbit = parse_iperf3(r.stdout)
        finally:
            cp.run(stop_server(server_dir), display="stop iperf3 server")
    except RemoteError as e:
        for link in links.values():
            link.note = link.note or e.message
    return list(links.values())


def link_checks(links: list[Link], max_rtt_ms: float, min_gbit: float) -> list[CheckResult]:
    out: list[CheckResult] = []
    for link in links:
        if link.rtt_ms is None:
            out.append(skipped("net.rtt", f"{link.worker}: {link.note or 'not measured'}"))
        elif link.rtt_ms > max_rtt_ms:
            out.append(failed("net.rtt", f"{link.worker}: RTT {link.rtt_ms:.2f} ms to the control plane "
                              f"(above {max_rtt_ms:g} ms)", "put the nodes on one low-latency network"))
        else:
            out.append(passed("net.rtt", f"{link.worker}: RTT {link.rtt_ms:.2f} ms"))
        if link.gbit is None:
            out.append(skipped("net.bandwidth", f"{link.worker}: {link.note or 'not measured'}",
                               "install iperf3 on the nodes to measure bandwidth"))
        elif link.gbit < min_gbit:
            out.append(failed("net.bandwidth", f"{link.worker}: {link.gbit:.2f} Gbit/s to the control plane "
                              f"(10 GbE recommended; threshold {min_gbit:g} Gbit/s)",
                              "use 10 GbE or faster links between nodes"))
        else:
            out.append(passed("net.bandwidth", f"{link.worker}: {link.gbit:.2f} Gbit/s"))
    return out
