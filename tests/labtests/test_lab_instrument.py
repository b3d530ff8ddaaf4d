"""The lab as a measuring instrument: cheap fakes that behave as before, and link delay without netem.

Bounds here are generous guards against regressions (a fake back to a process per call, a delay that
does nothing), never timing goals: speed is shown by `make bench` (docs/performance.md).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from gpuk8s.inventory import load
from gpuk8s.remote import Session

ROOT = Path(__file__).resolve().parents[2]
PROBE = (ROOT / "gpuk8s" / "facts" / "probe.sh").read_text()

ONE = """
hosts:
  - name: one-1
    role: control-plane
    gpus: 4
"""

MIXED = """
hosts:
  - name: m-cp
    role: control-plane
  - name: m-al
    os: alinux-3
    gpus: 2
    runtime: docker
    runtime_version: "24.0.7"
    tools: [ethtool, conntrack]
    overrides: {lsmod: {stdout: "Module Size\\n", stderr: "lsmod: partial\\n", exit: 3}}
"""

# Read-only queries (answered by the fake server itself), state changes (a process per call), errors,
# stdin, an override, umask and ownership, stdout and stderr interleaved on one pipe.
BATTERY = [
    "uname -r; uname -a; uname -m -n; nproc; echo rc=$?",
    "nvidia-smi -L; echo rc=$?; nvidia-smi --query-gpu=index,bogus --format=csv; echo rc=$?; nvidia-smi --version",
    "sysctl net.ipv4.ip_forward nope.key 2>&1; echo rc=$?; sysctl -n net.ipv4.ip_forward",
    "systemctl is-active containerd docker firewalld; echo rc=$?; systemctl is-enabled -q containerd; echo rc=$?",
    "swapon --show --noheadings --raw; lsmod; echo rc=$?; lsmod 2>&1 | head -c 3; echo",
    "containerd --version; docker --version; docker version; echo rc=$?",
    "dpkg-query -W -f='${Version}' kubelet; echo rc=$?; rpm -q kubelet; echo rc=$?; apt-mark showhold; ethtool eth0",
    "sudo -n modprobe br_netfilter; sudo -n sysctl -w net.ipv4.ip_forward=1; sysctl net.bridge.bridge-nf-call-iptables;"
    " sudo -n swapoff -a; swapon --show; echo rc=$?",
    "sudo -n systemctl restart containerd; echo rc=$?; sudo -n systemctl enable --now kubelet; echo rc=$?",
    "cd /tmp && umask 027 && curl -fsSL -o k https://nvidia.github.io/libnvidia-container/gpgkey && "
    "gpg --dearmor < k > k.gpg; echo rc=$?; stat -c '%U %a %s' k k.gpg; echo junk | gpg --dearmor; echo rc=$?",
    "sudo -n apt-get update; echo rc=$?; sudo -n apt-get install -y kubelet=1.30.2-1.1; echo rc=$?",
    "uname -z; systemctl; sysctl 2>&1 >/dev/null; echo rc=$?",
]


def _ssh(lab, host, command: str) -> tuple[int, str, str]:
    r = subprocess.run(["ssh", "-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "BatchMode=yes",
                        f"gpuk8s@{host.address}", command], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       timeout=60)
    return r.returncode, r.stdout, r.stderr


def test_fake_server_behaves_as_a_process_per_fake(lab_up, monkeypatch):
    """The same commands, as the login user, give the same output, exit status, commands.log and state
    with the fake server (compiled client) as with a python3 process per faked command."""
    seen = {}
    for mode in ("process", "server"):
        monkeypatch.setenv("GPUK8S_LAB_FAKES", mode)
        lab = lab_up(MIXED)
        assert lab.fakes_mode == ("process" if mode == "process" else "fakecmd"), lab.fakes_mode
        got = {}
        for h in lab.hosts.values():
            for i, cmd in enumerate(BATTERY):
                got[h.name, i] = _ssh(lab, h, cmd)
            got[h.name, "log"] = h.commands()
            got[h.name, "state"] = h.state()
        seen[mode] = got
    for key, before in seen["process"].items():
        assert seen["server"][key] == before, key


def test_python_client_where_no_compiler_built_fakecmd(lab_up, monkeypatch):
    monkeypatch.setenv("GPUK8S_LAB_FAKES", "client")
    lab = lab_up(ONE)
    assert lab.fakes_mode == "client"
    h = lab.host("one-1")
    rc, out, err = _ssh(lab, h, "nvidia-smi -L | wc -l; sudo -n modprobe br_netfilter; lsmod | grep -c br_netfilter;"
                               " uname -z; echo rc=$?")
    assert (rc, out) == (0, "4\n1\nunknown\nrc=0\n"), (out, err)
    assert ["modprobe", "br_netfilter"] in h.commands()


def test_probe_cpu_on_one_lab_host_is_small(lab_up, monkeypatch):
    """Guards against a return to a process per faked command (about 0.5 s of CPU for one probe then);
    today's figure is in docs/performance.md."""
    monkeypatch.delenv("GPUK8S_LAB_FAKES", raising=False)
    lab = lab_up(ONE)
    h = lab.host("one-1")
    runs = [h.cpu_of(PROBE) for _ in range(3)]
    assert all(p.returncode == 0 and "@@gpuk8s-end time 0" in p.stdout for _, _, p in runs)
    cpu = min(c for _, c, _ in runs)
    assert cpu < 0.3, f"one probe took {cpu:.3f} s of CPU (fakes: {lab.fakes_mode})"
    # every fake still recorded: 3 probes x 5 nvidia-smi (GPU query, --version, compute_cap, MIG modes,
    # compute apps; the MIG lists run only where a GPU is in MIG mode)
    assert sum(1 for c in h.commands() if c[0] == "nvidia-smi") == 15


def test_signals_reach_a_faked_command_and_its_death_is_the_commands(lab_up):
    lab = lab_up(ONE)
    h = lab.host("one-1")
    h.set_delay("uname", 5)
    t0 = time.monotonic()
    r = h.exec("timeout 1 uname -r; echo rc=$?")
    assert r.stdout == "rc=124\n" and time.monotonic() - t0 < 4
    # a faked command killed (SIGKILL) before it did its work never does it
    h.set_delay("modprobe", 1.5)
    h.exec("modprobe killed_mod & p=$!; sleep 0.4; kill -9 $p; wait $p; echo rc=$?")
    time.sleep(2)
    assert "killed_mod" not in h.state()["modules"]
    h.set_delay("modprobe", 0)
    h.exec("modprobe kept_mod")
    assert "kept_mod" in h.state()["modules"]


def test_without_the_fake_server_a_faked_command_is_its_own_process(lab_up):
    lab = lab_up(ONE)
    h = lab.host("one-1")
    lab._stop_fake_server()
    assert h.exec("uname -r; nproc").stdout == "5.15.0-105-generic\n16\n"
    assert h.commands()[-2:] == [["uname", "-r"], ["nproc"]]


def _rtt(session: Session, n: int = 9) -> float:
    """The fastest of `n` SSH round trips (a global request the server must answer), in seconds: every one carries
    the link's delay, and under make test's load the time the lab's relay and sshd wait for a core only adds (the
    median went 20 ms over the delay once on a loaded 2-core machine)."""
    session.connect()
    assert session._conn is not None
    transport = session._conn.client.get_transport()
    assert transport is not None
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        transport.global_request("keepalive@openssh.com", wait=True)
        samples.append(time.perf_counter() - t0)
    return min(samples)


def _login(lab, host, n: int = 5) -> float:
    """The fastest of `n` OpenSSH logins that run `true`, in seconds: a login is ~0.1 s of CPU, and under make test's
    load the time it waits for a core varies by more than the 80 ms a delay adds; the fastest is the one that
    waited least (the median of 3 failed the delay test once on a loaded 2-core machine)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        rc, _, err = _ssh(lab, host, "true")
        assert rc == 0, err
        times.append(time.perf_counter() - t0)
    return min(times)


def test_link_delay_adds_to_every_ssh_round_trip_and_goes_away(lab_up):
    """delay_ms: 10 each way (a 20 ms RTT): every SSH round trip takes 20 ms more, a login some RTTs
    more; back to 0 and it is gone. With netem where the kernel has it, else with the relay's wire."""
    lab = lab_up(ONE)
    h = lab.host("one-1")
    inv = load(lab.inventory)
    with Session(inv.host("one-1")) as s:
        base_rtt = _rtt(s)
    base_login = _login(lab, h)
    h.shape("10gbit", 10)
    assert lab.delay_method in ("netem", "relay")
    with Session(inv.host("one-1")) as s:
        rtt = _rtt(s)
    login = _login(lab, h)
    # every round trip carries the 20 ms: the fastest is at least that (not base + 20 ms: under make test's load
    # even the fastest undelayed round trip once took 4 ms, and the delayed one 20.7 ms)
    assert rtt >= 0.020, (base_rtt, rtt)
    assert rtt < base_rtt + 0.035, (base_rtt, rtt)
    assert login - base_login >= 4 * 0.020, (base_login, login)  # TCP, key exchange, auth, channel: >= 4 RTTs
    h.shape("10gbit", 0)
    with Session(inv.host("one-1")) as s:
        back = _rtt(s)
    assert back < base_rtt + 0.005, (base_rtt, back)


def test_a_fleet_link_delay_is_seen_by_ping_and_ssh(lab_up):
    lab = lab_up("""
hosts:
  - name: dl-a
    role: control-plane
    link: {delay_ms: 10}
  - name: dl-b
""")
    from gpuk8s.preflight.network import parse_ping

    r = lab.host("dl-b").exec(f"ping -q -c 4 -i 0.2 {lab.host('dl-a').address}")
    rtt = parse_ping(r.stdout)
    assert rtt is not None and 19 <= rtt < 40, r.stdout
    with Session(load(lab.inventory).host("dl-a")) as s:
        assert _rtt(s, 5) >= 0.020
