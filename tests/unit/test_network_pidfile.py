"""The iperf3 server is stopped by a pid that gpuk8s checked: a number naming an iperf3 process, in a
directory of this run; whatever a host or a local user puts in the pid file, nothing else is killed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpuk8s.preflight.network import server_dir_of, stop_server


@pytest.mark.parametrize("text", [
    "", "/tmp/gpuk8s-iperf3.pid", "/tmp/gpuk8s-iperf3.abc; rm -rf /", "/tmp/gpuk8s-iperf3.AAAAAAAAAA/../..",
    "/etc", "-9 -1", "/tmp/gpuk8s-iperf3.AAAAAAAAA", "/tmp/gpuk8s-iperf3.AAAAAAAAAA\n/etc",
])
def test_a_server_directory_other_than_what_mktemp_makes_is_refused(text: str) -> None:
    assert server_dir_of(text) is None


def test_the_directory_mktemp_made_is_accepted() -> None:
    assert server_dir_of("/tmp/gpuk8s-iperf3.Ab3dE6gH9k\n") == "/tmp/gpuk8s-iperf3.Ab3dE6gH9k"
    with pytest.raises(ValueError):
        stop_server("/tmp/x; reboot")


@pytest.fixture
def server_dir():
    d = tempfile.mkdtemp(prefix="gpuk8s-iperf3.", dir="/tmp")
    if server_dir_of(d) is None:  # mkdtemp's suffix is 8 characters: make the 10 that mktemp makes
        os.rmdir(d)
        d = "/tmp/gpuk8s-iperf3." + os.urandom(5).hex()
        os.mkdir(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("planted", ["{victim}", "-9 {victim}", "-9 -1", "1", "$(touch /tmp/gpuk8s-pwned)"])
def test_a_planted_pid_kills_nothing(server_dir: str, planted: str) -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        with open(f"{server_dir}/pid", "w") as f:
            f.write(planted.format(victim=victim.pid) + "\n")
        subprocess.run(["sh", "-c", stop_server(server_dir)], check=True, timeout=10)
        assert victim.poll() is None, "the planted pid was killed"
        assert not os.path.exists("/tmp/gpuk8s-pwned")
        assert not os.path.exists(server_dir)
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 is not installed (make lab-deps installs it)")
def test_the_iperf3_server_it_started_is_stopped(server_dir: str) -> None:
    # below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default): a port inside it can be held
    # for a moment by any outgoing connection of the machine (CI runs the lab's SSH beside this), and the daemon,
    # failing to bind, wrote no pid file (CI, once)
    port = "25917"
    subprocess.run(["iperf3", "-s", "-D", "-B", "127.0.0.1", "-p", port, "-I", f"{server_dir}/pid"], check=True)
    pid = _pid_in(server_dir)
    subprocess.run(["sh", "-c", stop_server(server_dir)], check=True, timeout=10)
    _gone(pid)


def _pid_in(d: str) -> int:
    for _ in range(400):  # the daemon writes its pid file after forking: slow on a busy machine
        if os.path.exists(f"{d}/pid") and Path(f"{d}/pid").read_text().strip():
            break
        time.sleep(0.05)
    return int(Path(f"{d}/pid").read_text().split()[0])


def _gone(pid: int) -> None:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail("the iperf3 server was not stopped")


def test_a_started_server_whose_directory_line_is_not_recognised_is_stopped_all_the_same() -> None:
    from types import SimpleNamespace as NS

    from gpuk8s.preflight import network

    ran: list[str] = []

    class CP:
        host = NS(address="10.0.0.1")

        def run(self, cmd: str, **_: object) -> object:
            ran.append(cmd)
            if cmd == network.START_SERVER:  # the server started, then the host printed something else last
                return NS(ok=True, stdout="/tmp/gpuk8s-iperf3.Ab3dE6gH9k\nWelcome!\n", exit_status=0)
            return NS(ok=True, stdout="", exit_status=0)

    w = NS(host=NS(address="10.0.0.2"), run=lambda *a, **k: NS(ok=True, stdout="", exit_status=0))
    links = network.measure(CP(), {"w": w}, seconds=1)  # type: ignore[arg-type, dict-item]
    assert ran[-1] == network.stop_unknown()
    assert links[0].note == "iperf3 started but printed no server directory: stopped"
    # no iperf3 on the control plane (exit 127): nothing started, nothing to stop
    ran.clear()

    class NoServer(CP):
        def run(self, cmd: str, **_: object) -> object:
            ran.append(cmd)
            return NS(ok=cmd != network.START_SERVER, stdout="", exit_status=0 if cmd != network.START_SERVER else 127)

    links = network.measure(NoServer(), {"w": w}, seconds=1)  # type: ignore[arg-type, dict-item]
    assert network.stop_unknown() not in ran and "iperf3 not available on the control plane" in links[0].note


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 is not installed (make lab-deps installs it)")
def test_stop_unknown_stops_only_a_server_started_as_gpuk8s_starts_it(server_dir: str) -> None:
    port = 52918
    ours = subprocess.run(["iperf3", "-s", "-D", "-p", str(port), "-I", f"{server_dir}/pid"], check=True)
    assert ours.returncode == 0
    other_dir = tempfile.mkdtemp(prefix="other-iperf3.")
    subprocess.run(["iperf3", "-s", "-D", "-B", "127.0.0.1", "-p", str(port + 1), "-I", f"{other_dir}/pid"],
                   check=True)
    mine, theirs = _pid_in(server_dir), _pid_in(other_dir)
    try:
        from gpuk8s.preflight.network import stop_unknown

        subprocess.run(["sh", "-c", stop_unknown(port)], check=True, timeout=10)
        _gone(mine)
        os.kill(theirs, 0)  # another iperf3 server (not ours) is alive
    finally:
        for p in (mine, theirs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, 15)
        shutil.rmtree(other_dir, ignore_errors=True)
