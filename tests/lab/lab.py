"""The lab: simulated GPU servers with real sshd, each in its own network, mount and UTS namespace.

Each host is an sshd process started as
    ip netns exec gk8s-NAME unshare --mount --uts --propagation private sh -c 'mounts; exec sshd -D'
whose mount namespace lays copy-on-write overlays over /etc, /usr, /var/lib, /root and /home (the
upper directories live under the lab root, so a test can read what gpuk8s wrote), and tmpfs over
/run and /tmp. Faked commands (nvidia-smi, apt-get, systemctl, kubeadm, ...) are small wrappers
in the host's /usr/bin; a command made absent is an overlay whiteout.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from tests.lab.fleet import Fleet, HostSpec, load_fleet

# an RDMA port's error counters as the kernel's sysfs names them (drivers/infiniband/core/sysfs.c PORT_PMA_ATTR)
ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
                  "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors", "VL15_dropped")


def _instance() -> int:
    """Which lab of this machine: 0 (the default), or N for GPUK8S_LAB_INSTANCE=N, or pytest-xdist's worker gwN
    + 1. Each instance has its own directory, bridge, subnet and names, so that labs run side by side (make test
    runs one per pytest worker) and never touch each other's hosts."""
    v = os.environ.get("GPUK8S_LAB_INSTANCE") or ""
    if not v and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
        v = str(int(os.environ["PYTEST_XDIST_WORKER"][2:] or 0) + 1)
    n = int(v) if v.isdigit() else 0
    if n > 30:
        raise ValueError(f"GPUK8S_LAB_INSTANCE={v}: at most 30 labs side by side (10.213-10.243.0.0/16)")
    return n


INSTANCE = _instance()
_SUFFIX = f"-{INSTANCE}" if INSTANCE else ""
LAB_ROOT = Path(os.environ.get("GPUK8S_LAB_DIR", f"/var/tmp/gpuk8s-lab{_SUFFIX}"))
BRIDGE = f"gk8s{INSTANCE}br" if INSTANCE else "gk8s0"
BRIDGE_MAC = f"02:67:6b:38:73:{INSTANCE + 1:02x}"  # locally administered
NS_PREFIX = f"gk8s{INSTANCE or ''}-"  # network namespaces gk8s-NAME (gk8s2-NAME for instance 2)
LINK_PREFIX = f"gk8s{INSTANCE or ''}-"  # the host's side of each wire: gk8s-vN (veth), gk8s-pN (its peer)
DEFAULT_SUBNET = f"10.{213 + INSTANCE}.0.0/16"
FAKES_SRC = Path(__file__).parent / "fakes"
REAL_OBJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "objects"  # its SOURCE.md
REAL_TOPO = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "fabric" / "topo"  # nvidia-smi topo -m
REAL_PCI = REAL_TOPO.parent / "pci"  # lspci -vvv
# a real ResourceSlice of NVIDIA's DRA driver (8x H100, chart 25.12.0): the lab's kubelet plugin publishes devices in
# its shape
REAL_SLICES = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "dra" / \
    "resourceslices-8xh100-25.12.0-eks-1.34.yaml"
REAL_SMI_Q = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "health" / \
    "smi-q-h100x8-535-hw-slowdown-gpud.txt"
LAB_USER, LAB_UID = "gpuk8s", 2742
DRIVER_PROC = "/var/lib/gpuk8s-lab/driver"  # what the host sees as /proc/driver/nvidia (start_sshd)
OVERLAYS = ("etc", "usr", "var/lib", "root", "home")
FAKED = ("nvidia-smi", "lsmod", "modprobe", "sysctl", "swapon", "swapoff", "systemctl", "uname", "nproc",
         "apt-get", "dpkg", "dpkg-query", "apt-mark", "dnf", "yum", "rpm", "curl", "gpg", "lspci", "update-initramfs",
         "dracut", "dmesg", "journalctl")
ALWAYS_ABSENT = ("usr/local/bin/docker", "usr/bin/docker", "usr/bin/kubectl", "usr/bin/kubeadm", "usr/bin/kubelet",
                 "usr/bin/nvidia-ctk")
STUB_TOOLS = ("conntrack", "socat", "ebtables", "ethtool")  # present (as stubs) only when the fleet lists them
# How faked commands run (tests/lab/README.md, "Cheap fakes"): 'server' (the default: one fake server for the
# lab, a compiled client per call, or the Python client without a C compiler), 'client' (the server with the
# Python client) or 'process' (a python3 process per call, as before the server existed: 40 ms of CPU each).
FAKES_MODE_ENV = "GPUK8S_LAB_FAKES"
# How a link delay is made (README, "Delay without netem"): 'netem' where the kernel has sch_netem, else
# 'relay' (a userspace wire of two TAP devices, linkrelay.py); this variable forces one or the other.
DELAY_ENV = "GPUK8S_LAB_DELAY"
RELAY_MIN_MS = 1.0  # a relayed delay below this is left to the veth pair itself (0.02-0.05 ms)
BUILD_CACHE = Path(os.environ.get("GPUK8S_LAB_BUILD_CACHE", "/var/tmp/gpuk8s-lab-build"))


class LabError(Exception):
    pass


def _run(cmd: list[str], input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(cmd, input=input, text=True, capture_output=True)
    if check and p.returncode != 0:
        raise LabError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts): run it as root")
    for tool in ("ip", "unshare", "tc", "ssh-keygen", "openssl"):
        if not shutil.which(tool):
            raise LabError(f"the lab needs {tool}: apt-get install -y iproute2 util-linux openssh-client openssl")
    if not Path("/usr/sbin/sshd").exists():
        raise LabError("the lab needs sshd: apt-get install -y openssh-server")


def _whiteout(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))


class LabHost:
    """One simulated server: paths, state and faults, from outside its namespaces."""

    def __init__(self, lab: Lab, spec: HostSpec, index: int) -> None:
        self.lab = lab
        self.spec = spec
        self.name = spec.name
        self.address = spec.address
        self.index = index
        self.dir = lab.root / "hosts" / spec.name
        self.netns = f"{NS_PREFIX}{spec.name}"[:40]
        self.veth = f"{LINK_PREFIX}v{index}"

    # -- files as the host sees them ------------------------------------
    def upper(self, path: str) -> Path:
        path = path.lstrip("/")
        for ov in sorted(OVERLAYS, key=len, reverse=True):
            if path == ov or path.startswith(ov + "/"):
                return self.dir / "upper" / ov.replace("/", "_") / path[len(ov):].lstrip("/")
        raise LabError(f"{path} is not in an overlaid directory")

    def read(self, path: str) -> str | None:
        """A file's content as the host sees it (its own change, else the machine's), or None."""
        up = self.upper(path)
        if up.exists() and not up.is_char_device():
            return up.read_text()
        if up.is_char_device():
            return None
        real = Path("/") / path.lstrip("/")
        return real.read_text() if real.is_file() else None

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        p = self.upper(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_char_device():
            p.unlink()
        p.write_text(text)
        p.chmod(mode)

    @property
    def state_path(self) -> Path:
        return self.upper("/var/lib/gpuk8s-lab/state.json")

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())

    def update_state(self, **changes: Any) -> None:
        st = self.state()
        st.update(changes)
        self.state_path.write_text(json.dumps(st, indent=1))

    def commands(self) -> list[list[str]]:
        """Every faked command's argv recorded on this host."""
        log = self.upper("/var/lib/gpuk8s-lab/commands.log")
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    def _hold(self, code: str) -> subprocess.Popen[bytes]:
        """Run python `code` in the host's namespaces until killed; returns once it printed its first line."""
        pid = self.sshd_pid()
        if pid is None:
            raise LabError(f"{self.name}: sshd is not running")
        p = subprocess.Popen(["nsenter", "-t", str(pid), "-n", "-m", "-u", "python3", "-c", code],
                             stdout=subprocess.PIPE, start_new_session=True)
        assert p.stdout is not None
        p.stdout.readline()
        return p

    def hold_dpkg_lock(self) -> subprocess.Popen[bytes]:
        """Hold dpkg's frontend lock from a process inside the host, as unattended-upgrades would."""
        return self._hold("import fcntl, os, sys, time; f = open('/var/lib/dpkg/lock-frontend', 'a'); "
                          "fcntl.lockf(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(3600)")

    def hold_rpm_lock(self) -> subprocess.Popen[bytes]:
        """A process in the host that holds dnf's lock (its pid in /var/lib/dnf/rpmdb_lock.pid), as a dnf would."""
        return self._hold("import os, time; os.makedirs('/var/lib/dnf', exist_ok=True); "
                          "open('/var/lib/dnf/rpmdb_lock.pid', 'w').write(str(os.getpid())); "
                          "print('held', flush=True); time.sleep(3600)")

    def set_override(self, command: str, stdout: str = "", stderr: str = "", exit: int = 0, repeat: int = 1,
                     sleep: float = 0) -> None:
        """Replace a faked command: `stdout` written `repeat` times (a flood), after `sleep` seconds."""
        st = self.state()
        st.setdefault("overrides", {})[command] = {"stdout": stdout, "stderr": stderr, "exit": exit,
                                                   "repeat": repeat, "sleep": sleep}
        self.update_state(overrides=st["overrides"])

    def set_delay(self, command: str, seconds: float) -> None:
        """Make a faked command wait `seconds` before it does its work (0: no delay)."""
        delays = self.state().get("delays", {})
        delays[command] = seconds
        self.update_state(delays={k: v for k, v in delays.items() if v})

    def clear_override(self, command: str) -> None:
        st = self.state()
        st.get("overrides", {}).pop(command, None)
        self.update_state(overrides=st.get("overrides", {}))

    # -- GPUs (MIG) ------------------------------------------------------
    def hold_gpu(self, index: int, pid: int = 4242, name: str = "python3") -> None:
        """A faked CUDA process on GPU `index`: listed by --query-compute-apps; a GPU reset is refused."""
        procs = self.state().get("gpu_procs", {})
        procs.setdefault(str(index), []).append([pid, name])
        self.update_state(gpu_procs=procs)

    def release_gpus(self) -> None:
        self.update_state(gpu_procs={})

    def mig_state(self) -> dict[str, Any]:
        """The faked GPUs' MIG state: {index: {current, pending, gis: [...]}} (tests/lab/fakes/fake.py)."""
        return self.state().get("mig", {})

    def reboot(self, timeout: float = 30.0) -> None:
        """The lab's simulated reboot, as `systemctl reboot` on the host makes it (fakes/fake.py _reboot): the
        pending MIG mode becomes current, every GPU and compute instance is gone (they do not persist), faked
        GPU processes end; every SSH connection drops and sshd is away for a while; the enabled oneshot unit
        gpuk8s-mig.service runs its ExecStart, as systemd would at boot. Returns once sshd answers again."""
        old = self.sshd_pid()
        self.exec("systemctl reboot")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.sshd_pid()
            if pid is not None and pid != old:
                break
            time.sleep(0.05)
        else:
            raise LabError(f"{self.name}: sshd did not come back within {timeout:g} s of the simulated reboot")
        self.wait_ready(max(1.0, deadline - time.monotonic()))

    # -- processes and network ------------------------------------------
    def exec(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside the host's namespaces (as root), as a test would on the console."""
        pid = self.sshd_pid()
        if pid is None:
            raise LabError(f"{self.name}: sshd is not running")
        return _run(["nsenter", "-t", str(pid), "-n", "-m", "-u", "sh", "-c", command], check=check)

    def cpu_of(self, command: str, stdin: str | None = None) -> tuple[float, float, subprocess.CompletedProcess[str]]:
        """Run `command` with sh inside the host (as root) and measure it: (wall seconds, CPU seconds, result).

        The CPU is user + system time of the command's whole process tree plus what the lab's fake server
        spent meanwhile on the fakes it ran (nothing else may run in the lab during the measurement)."""
        import resource

        pid = self.sshd_pid()
        if pid is None:
            raise LabError(f"{self.name}: sshd is not running")
        r0, s0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), self.lab.fake_server_cpu(), time.monotonic()
        p = subprocess.run(["nsenter", "-t", str(pid), "-n", "-m", "-u", "sh", "-c", command], input=stdin,
                           text=True, capture_output=True)
        wall = time.monotonic() - t0
        r1, s1 = resource.getrusage(resource.RUSAGE_CHILDREN), self.lab.fake_server_cpu()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime) + (s1 - s0)
        return wall, cpu, p

    def sshd_pid(self) -> int | None:
        """The host's sshd listener (or the command that becomes it), only while that pid is still it: with
        pid_max 32768 and labs side by side, a dead sshd's pid is soon another process's, and nsenter into it or
        a SIGTERM to it would reach another host."""
        try:
            pid = int((self.dir / "sshd.pid").read_text())
            if f"{self.dir}/sshd_config".encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return None
            return pid
        except (OSError, ValueError):
            return None

    def start_sshd(self) -> None:
        if self.sshd_pid():
            return
        d = self.dir
        mounts = []
        for ov in OVERLAYS:
            key = ov.replace("/", "_")
            mounts.append(f"mount -t overlay overlay -o lowerdir=/{ov},upperdir={d}/upper/{key},"
                          f"workdir={d}/work/{key} /{ov}")
        mounts += ["mount -t tmpfs -o mode=755 tmpfs /run", "mkdir -p /run/sshd /run/lock",
                   "mount -t tmpfs -o mode=1777 tmpfs /tmp", f"hostname {self.name}",
                   # the loaded driver's /proc/driver/nvidia: a link into the host's state, which the fakes change
                   # (a reboot after a driver upgrade loads the new module); absent where no module is loaded
                   "mount -t tmpfs -o mode=755 tmpfs /proc/driver",
                   f"ln -s {DRIVER_PROC} /proc/driver/nvidia"]
        # the cgroup version the host shows (`stat -fc %T /sys/fs/cgroup/`): cgroup2fs for v2, tmpfs for v1, as
        # the fleet says; ip netns exec gives the host a fresh sysfs, where it would read "sysfs" (unknown)
        cgroup = self.spec.spec.get("cgroup", 2)
        if cgroup in (1, 2):
            fs = "cgroup2 cgroup2" if cgroup == 2 else "tmpfs -o mode=755 tmpfs"
            mounts.append(f"{{ mount -t {fs} /sys/fs/cgroup || true; }}")
        if self.spec.spec.get("rdma"):
            # RDMA ports (issue 43): sysfs cannot hold a directory it did not make, so /sys/class becomes a tmpfs
            # of links into the namespace's own sysfs (mounted again under /run), beside infiniband: a link to the
            # host's files (write_rdma), which tests change to bring a port down
            mounts += ["mkdir -p /run/gk-sys", "mount -t sysfs sysfs /run/gk-sys",
                       "mount -t tmpfs -o mode=755 tmpfs /sys/class",
                       "for e in /run/gk-sys/class/*; do ln -s \"$e\" /sys/class/; done",
                       f"ln -s {self.RDMA} /sys/class/infiniband"]
        script = " && ".join(mounts) + f" && exec /usr/sbin/sshd -D -e -f {d}/sshd_config"
        log = open(d / "sshd.log", "ab")  # noqa: SIM115 (handed to the sshd process)
        p = subprocess.Popen(["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts",
                              "--propagation", "private", "sh", "-c", script],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        (d / "sshd.pid").write_text(str(p.pid))

    RDMA = "/var/lib/gpuk8s-lab/rdma"  # the host's RDMA ports' sysfs files; /sys/class/infiniband links here

    def write_rdma(self, ports: list[dict[str, Any]]) -> None:
        """The host's RDMA ports as sysfs files (RDMA/DEV/ports/N/{state,phys_state,rate,link_layer,sm_lid}): what
        the probe reads through /sys/class/infiniband. A test calls it again to change a port."""
        for p in ports:
            d = f"{self.RDMA}/{p['device']}/ports/{p.get('port', 1)}"
            for key in ("state", "phys_state", "rate", "link_layer", "sm_lid"):
                self.write(f"{d}/{key}", str(p.get(key, "")) + "\n")
            # the port's error counters (counters/NAME, drivers/infiniband/core/sysfs.c): 0 unless the test says
            for c in ERROR_COUNTERS:
                self.write(f"{d}/counters/{c}", f"{int((p.get('counters') or {}).get(c, 0))}\n")
            # a RoCE port's GID table: gids/N, gid_attrs/types/N ("IB/RoCE v1" or "RoCE v2"), gid_attrs/ndevs/N, as
            # the kernel's sysfs holds them; entries are added or overwritten (the files sit under an overlay: a
            # directory removed beneath it would not be seen again)
            for g in p.get("gids", []):
                self.write(f"{d}/gids/{g['index']}", g["gid"] + "\n")
                self.write(f"{d}/gid_attrs/types/{g['index']}", g["type"] + "\n")
                self.write(f"{d}/gid_attrs/ndevs/{g['index']}", g["ndev"] + "\n")

    FABRIC = "/var/lib/gpuk8s-lab/fabric.json"  # the lab's model of what sysfs does not show (fakes/kube.py)

    def write_fabric(self, model: dict[str, Any]) -> None:
        """What the fabric's tests measure beyond the ports' sysfs files: {"nccl": factor of the node's all-reduce
        (an NVLink down), "throughput": {"DEV/PORT": factor of the port's RDMA bandwidth (a link with errors, its
        rate still reading full)}}."""
        self.write(self.FABRIC, json.dumps(model))

    def stop_sshd(self) -> None:
        pid = self.sshd_pid()
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if self.sshd_pid() is None:
                    break
                time.sleep(0.02)
            self._reap(pid)

    @staticmethod
    def _reap(pid: int) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.address, 22), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                time.sleep(0.05)
        log = (self.dir / "sshd.log").read_text(errors="replace")[-500:]
        raise LabError(f"{self.name}: sshd did not answer on {self.address}:22 within {timeout:g} s: {log}")

    def shape(self, rate: str | None = None, delay_ms: float | None = None) -> None:
        """Set the link's properties on both ends of the host's link.

        The delay is `delay_ms` in each direction (a round trip through the link takes 2 x delay_ms
        more). With sch_netem in the kernel, netem adds it and limits the rate. Without it (as on our CI
        machines) the link becomes a wire of two TAP devices held by the lab's relay (linkrelay.py),
        which delays every frame, and tbf limits the rate; delays under RELAY_MIN_MS are then left to
        the veth pair. `lab.delay_method` says which ('netem' or 'relay').
        """
        method = self.lab.delay_method_in(self.netns)
        relayed = bool(delay_ms) and method == "relay" and float(delay_ms or 0) >= RELAY_MIN_MS
        if relayed and not self.wired:
            self.lab._rewire(self, tap=True)
        for prefix, dev in ((["ip", "netns", "exec", self.netns], "eth0"), ([], self.veth)):
            _run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], check=False)
            if delay_ms and method == "netem":
                args = ["netem", "delay", f"{delay_ms}ms"] + (["rate", rate] if rate else [])
                if _run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", *args], check=False).returncode == 0:
                    continue
            if rate:
                _run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "64kb",
                      "latency", "50ms"])
        if self.wired:
            self.lab._set_wire(self, float(delay_ms or 0) if method == "relay" else 0.0)

    @property
    def wired(self) -> bool:
        """Whether the host's link is a relay wire (two TAP devices) rather than a veth pair."""
        return self.name in self.lab._links().get("links", {})

    def drop_packets(self, on: bool = True) -> None:
        """Drop every packet the host sends: a connect to it hangs, as behind a firewall that drops.

        A token bucket whose burst is smaller than any frame can never send one. A permanent neighbour
        entry on the bridge keeps ARP out of the way, as on a real network where ARP still works.
        """
        link = self.spec.spec["link"] or {}
        if on:
            mac = _run(["ip", "-n", self.netns, "-o", "link", "show", "eth0"]).stdout.split("link/ether ")[1].split()[0]
            _run(["ip", "neigh", "replace", self.address, "lladdr", mac, "dev", BRIDGE, "nud", "permanent"])
            _run(["ip", "netns", "exec", self.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                  "rate", "1kbit", "burst", "10", "limit", "1"])
        else:
            _run(["ip", "neigh", "del", self.address, "dev", BRIDGE], check=False)
            self.shape(link.get("rate"), link.get("delay_ms"))


    def cut_connections(self) -> int:
        """Kill the host's per-connection sshd processes (not the listener): every SSH session to it breaks
        at once, as when a link or a middlebox drops the connection. Commands those sessions started go on
        running without a reader. Returns how many processes were killed."""
        listener = self.sshd_pid()
        pids = _run(["ip", "netns", "pids", self.netns]).stdout.split()
        killed = 0
        for pid in map(int, pids):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if pid != listener and comm in ("sshd", "sshd-session"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        return killed

    def block(self, address: str, on: bool = True) -> None:
        """Make `address` unreachable from this host (a route of type unreachable), or reachable again."""
        verb = "replace" if on else "del"
        _run(["ip", "-n", self.netns, "route", verb, "unreachable", f"{address}/32"], check=on)

    def lock_free(self) -> bool:
        """Whether gpuk8s's host lock (/var/lib/gpuk8s/lock) can be taken now."""
        lock = "/var/lib/gpuk8s/lock"
        return self.exec(f"[ ! -e {lock} ] || flock -n {lock} true", check=False).returncode == 0


class Lab:
    def __init__(self, root: Path = LAB_ROOT) -> None:
        self.root = root
        self._delay_method: str | None = os.environ.get(DELAY_ENV) or None  # netem or relay; probed when needed
        self._links_lock = threading.Lock()
        self._defer_links = False  # while up() makes hosts: the relay takes all wires at once, at the end
        self.hosts: dict[str, LabHost] = {}
        self.fleet: Fleet | None = None
        meta = root / "lab.json"
        if meta.exists():
            data = json.loads(meta.read_text())
            self.fleet = load_fleet(data["fleet"], data.get("subnet"))
            for i, spec in enumerate(self.fleet.hosts):
                self.hosts[spec.name] = LabHost(self, spec, i)

    # -- link delay -----------------------------------------------------------
    @property
    def delay_supported(self) -> bool:
        """Whether links can be given a delay: always, with netem or with the relay."""
        return True

    @property
    def delay_method(self) -> str:
        """'netem' (the kernel has sch_netem) or 'relay' (linkrelay.py's TAP wires)."""
        if self._delay_method is None:
            ns = f"{NS_PREFIX}probe-{os.getpid()}"
            _run(["ip", "netns", "add", ns])
            try:
                return self.delay_method_in(ns)
            finally:
                _run(["ip", "netns", "del", ns], check=False)
        return self._delay_method

    def delay_method_in(self, netns: str) -> str:
        """delay_method, probed (once) in an existing namespace: can netem be put on its loopback?"""
        if self._delay_method is None:
            ok = _run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                       "1ms"], check=False).returncode == 0
            if ok:
                _run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", "lo", "root"], check=False)
            self._delay_method = "netem" if ok else "relay"
        return self._delay_method

    def _links(self) -> dict[str, Any]:
        try:
            return json.loads((self.root / "links.json").read_text())
        except (OSError, ValueError):
            return {"gen": 0, "links": {}}

    def _set_wire(self, h: LabHost, delay_ms: float | None, apply: bool = True) -> None:
        """Add, change (delay_ms) or remove (None) the relay wire of `h` in links.json; apply it now."""
        with self._links_lock:
            conf = self._links()
            if delay_ms is None:
                conf["links"].pop(h.name, None)
            else:
                conf["links"][h.name] = {"netns": h.netns, "host_dev": "eth0", "bridge_dev": h.veth,
                                         "delay_ms": delay_ms}
            conf["gen"] = int(conf.get("gen", 0)) + 1
            tmp = self.root / "links.json.tmp"
            tmp.write_text(json.dumps(conf, indent=1))
            tmp.replace(self.root / "links.json")
        if apply and not self._defer_links:
            self._apply_links()

    def _apply_links(self) -> None:
        """Make the relay (started if needed) take links.json as it is now; wait until it has."""
        with self._links_lock:
            conf = self._links()
            if not conf["links"] and not self._relay_pid():
                return
            pid = self._relay_pid()
            if pid is None:
                log = open(self.root / "linkrelay.log", "ab")  # noqa: SIM115 (handed to the relay)
                p = subprocess.Popen(["/usr/bin/python3", str(Path(__file__).parent / "linkrelay.py"), str(self.root)],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                                     start_new_session=True)
                log.close()
                (self.root / "linkrelay.pid").write_text(str(p.pid))
            else:
                os.kill(pid, signal.SIGHUP)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError, ValueError):
                    if int((self.root / "links.applied").read_text()) >= conf["gen"]:
                        return
                time.sleep(0.005)
            raise LabError(f"the link relay did not take links.json: {self.root / 'linkrelay.log'}")

    def _relay_pid(self) -> int | None:
        try:
            pid = int((self.root / "linkrelay.pid").read_text())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def _rewire(self, h: LabHost, tap: bool) -> None:
        """Replace the host's veth pair by a relay wire (tap=True), keeping eth0's MAC and address."""
        mac = None
        with contextlib.suppress(LabError, IndexError):
            mac = _run(["ip", "-n", h.netns, "-o", "link", "show", "eth0"]).stdout.split("link/ether ")[1].split()[0]
        _run(["ip", "link", "del", h.veth], check=False)
        _run(["ip", "-n", h.netns, "link", "del", "eth0"], check=False)
        self._plumb(h, tap, mac)

    def _plumb(self, h: LabHost, tap: bool, mac: str | None = None) -> None:
        """Create the host's link: a veth pair, or two TAP devices that the relay joins; eth0 addressed, up."""
        prefix = self.fleet.subnet.prefixlen if self.fleet else 16
        peer = f"{LINK_PREFIX}p{h.index}"
        if tap:
            _run(["ip", "tuntap", "add", "dev", h.veth, "mode", "tap"])
            _run(["ip", "-n", h.netns, "tuntap", "add", "dev", "eth0", "mode", "tap"])
            _run(["ip", "-batch", "-"], input=f"link set {h.veth} master {BRIDGE}\nlink set {h.veth} up\n")
            setup = ""
        else:
            _run(["ip", "-batch", "-"], input=(
                f"link add {h.veth} type veth peer name {peer} netns {h.netns}\n"
                f"link set {h.veth} master {BRIDGE}\nlink set {h.veth} up\n"))
            setup = f"link set {peer} name eth0\n"
        if mac:
            setup += f"link set eth0 address {mac}\n"
        _run(["ip", "-n", h.netns, "-batch", "-"], input=(
            f"{setup}addr add {h.address}/{prefix} dev eth0\nlink set eth0 up\nlink set lo up\n"))
        if tap:
            self._set_wire(h, 0.0, apply=False)

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yaml"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def key(self) -> Path:
        return self.root / "id_ed25519"

    def host(self, name: str) -> LabHost:
        return self.hosts[name]

    # -- up ---------------------------------------------------------------
    def up(self, fleet_path: str | Path, subnet: str | None = None) -> Path:
        require_root()
        if (self.root / "lab.json").exists() or _run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
            self.down()
        # a lab beside others (INSTANCE > 0) always takes its own subnet: two bridges on one subnet would break both
        fleet = load_fleet(fleet_path, subnet or (DEFAULT_SUBNET if INSTANCE else None))
        self.fleet = fleet
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(FAKES_SRC, self.root / "fakes", ignore=shutil.ignore_patterns("__pycache__"))
        if REAL_OBJECTS.is_dir():  # real Node and Pod objects: the simulated API server serves objects in their shape
            shutil.copytree(REAL_OBJECTS, self.root / "fakes" / "real")
            # a real 8x H100 `nvidia-smi -q`: the fake's -q prints its GPU block, with each host's health in it
            shutil.copy2(REAL_SMI_Q, self.root / "fakes" / "real" / "smi-q.txt")
            shutil.copy2(REAL_SLICES, self.root / "fakes" / "real" / "resourceslices.yaml")
        self._start_fake_server()
        (self.root / "cluster").mkdir()
        (self.root / "real").mkdir()
        # the real binaries, for hosts whose command is faked: containerd (config checks), gpg and gpgv (the real keys
        # and signatures of a repository served from a bundle, tests/lab/fakes/fake.py: _real_index)
        for tool in ("containerd", "gpg", "gpgv"):
            if Path(f"/usr/bin/{tool}").exists():
                try:
                    os.link(f"/usr/bin/{tool}", self.root / "real" / tool)
                except OSError:
                    shutil.copy2(f"/usr/bin/{tool}", self.root / "real" / tool)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuk8s-lab", "-f", str(self.key)])
        (self.root / "lab.json").write_text(json.dumps(
            {"fleet": str(Path(fleet_path).resolve()), "subnet": str(fleet.subnet), "created": time.time()}))
        gw = f"{fleet.subnet.network_address + 1}/{fleet.subnet.prefixlen}"
        # The bridge's MAC set once: a bridge otherwise takes the lowest MAC of its ports, and a change of its
        # address flushes every neighbour entry on it, the permanent ones too (the kernel's neigh_changeaddr). A host
        # plumbed after a drop-packets host then took that host's static entry away, and its connects failed at
        # once with "No route to host" instead of hanging (tests/labtests/test_preflight.py, seen once in CI-like runs).
        _run(["ip", "-batch", "-"], input=f"link add {BRIDGE} type bridge\nlink set {BRIDGE} address {BRIDGE_MAC}\n"
             f"addr add {gw} dev {BRIDGE}\nlink set {BRIDGE} up\n")
        self.hosts = {s.name: LabHost(self, s, i) for i, s in enumerate(fleet.hosts)}
        self._neighbour_room(len(self.hosts))
        pub = (self.root / "id_ed25519.pub").read_text()
        self._defer_links = True
        try:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda h: self._make_host(h, pub), self.hosts.values()))
        finally:
            self._defer_links = False
        self._apply_links()
        with ThreadPoolExecutor(max_workers=16) as pool:
            unanswering = {"sshd-stopped", "drop-packets"}
            list(pool.map(lambda h: None if unanswering & set(h.spec.spec["faults"]) else h.wait_ready(),
                          self.hosts.values()))
        self._write_known_hosts()
        self._write_inventory()
        return self.inventory

    # -- the fake server -----------------------------------------------------
    @property
    def fakes_mode(self) -> str:
        """'fakecmd', 'client' (the fake server with the compiled or the Python client) or 'process'."""
        try:
            return (self.root / "fakes" / "mode").read_text().strip()
        except OSError:
            return "process"

    def _start_fake_server(self) -> None:
        """Start the one process that runs every faked command of the lab (fakes/server.py), and pick the
        client the hosts' wrappers use: fakecmd where a C compiler builds it, else client.py."""
        fakes = self.root / "fakes"
        mode = "process"
        want = os.environ.get(FAKES_MODE_ENV, "server")
        if want != "process":
            sock = self.root / "fake.sock"
            log = open(self.root / "fakesrv.log", "ab")  # noqa: SIM115 (handed to the server)
            p = subprocess.Popen(["/usr/bin/python3", str(fakes / "server.py"), str(sock)], stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=log, cwd="/", start_new_session=True)
            log.close()
            (self.root / "fakesrv.pid").write_text(str(p.pid))
            binary = build_fakecmd() if want != "client" else None
            if binary is not None:
                shutil.copy2(binary, fakes / "fakecmd")
            deadline = time.monotonic() + 10
            while not sock.exists() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if sock.exists():
                mode = "fakecmd" if binary is not None else "client"
            else:
                self._stop_fake_server()
        (fakes / "mode").write_text(mode + "\n")

    def _stop_fake_server(self) -> None:
        # the socket goes first: a fake forked by the server may still hold the listening socket, and a
        # client that connects to it would wait for an answer nobody gives; without the file it falls back
        with contextlib.suppress(OSError):
            (self.root / "fake.sock").unlink()
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.root / "fakesrv.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            LabHost._reap(pid)

    def fake_server_cpu(self) -> float:
        """CPU seconds (user + system) the fake server and the fakes it ran (reaped children) used so far."""
        try:
            pid = int((self.root / "fakesrv.pid").read_text())
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            return 0.0
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def _make_host(self, h: LabHost, pub: str) -> None:
        spec = h.spec.spec
        for ov in OVERLAYS:
            key = ov.replace("/", "_")
            (h.dir / "upper" / key).mkdir(parents=True, exist_ok=True)
            (h.dir / "work" / key).mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(h.dir / "ssh_host_ed25519_key")])
        (h.dir / "sshd_config").write_text(
            f"Port 22\nListenAddress {h.address}\nHostKey {h.dir}/ssh_host_ed25519_key\n"
            f"PidFile /run/sshd.pid\nAuthorizedKeysFile .ssh/authorized_keys\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\nStrictModes no\n"
            "UseDNS no\nMaxStartups 200:30:400\nMaxSessions 64\nLogLevel ERROR\nSubsystem sftp internal-sftp\n"
            "AcceptEnv LANG LC_*\n")
        self._write_etc(h)
        self._write_usr(h)
        state = {
            "modules": list(spec["modules"]), "sysctl": dict(spec["sysctl"]),
            "swap": ["/swap.img"] if spec["swap"] else [],
            "services": {spec["runtime"]: "active" if spec["runtime_active"] else "inactive"},
            "packages": {}, "overrides": dict(spec["overrides"] or {}),
            "enabled": [spec["runtime"]] if spec["runtime_active"] else [],
            "health": copy.deepcopy(spec["health"] or {}),
            # 'repo-unreachable': NVIDIA's and Kubernetes' package repositories cannot be resolved
            "unreachable_hosts": ["nvidia.github.io", "pkgs.k8s.io"] if "repo-unreachable" in spec["faults"] else [],
        }
        self._write_driver(h, state)
        h.write("/var/lib/gpuk8s-lab/host.json", json.dumps({"name": h.name, "address": h.address, **spec,
                                                               "kernel": h.spec.kernel}, indent=1))
        # world-writable: fakes run as the login user too, and record every call
        h.write("/var/lib/gpuk8s-lab/state.json", json.dumps(state, indent=1), 0o666)
        h.write("/var/lib/gpuk8s-lab/commands.log", "", 0o666)
        if "auth-refused" not in spec["faults"]:
            h.write("/root/.ssh/authorized_keys", pub, 0o600)
            h.write(f"/home/{LAB_USER}/.ssh/authorized_keys", pub, 0o600)
        home = h.upper(f"/home/{LAB_USER}")
        home.mkdir(parents=True, exist_ok=True)
        for p in [home, *home.rglob("*")]:
            os.chown(p, LAB_UID, LAB_UID)
        self._make_netns(h)
        if spec.get("rdma"):
            h.write_rdma(spec["rdma"])
        if spec.get("topo"):  # a real board's nvidia-smi topo -m (fakes/fake.py prints it)
            h.write("/var/lib/gpuk8s-lab/topo.txt", (REAL_TOPO / f"{spec['topo']}.txt").read_text())
        if spec.get("lspci_vvv"):  # a real device's lspci -vvv (fakes/fake.py prints it after the host's GPUs)
            h.write("/var/lib/gpuk8s-lab/lspci-vvv.txt", (REAL_PCI / f"{spec['lspci_vvv']}.txt").read_text())
        if "sshd-stopped" not in spec["faults"]:
            h.start_sshd()

    @staticmethod
    def _write_driver(h: LabHost, state: dict[str, Any]) -> None:
        """A GPU host's driver as a well-kept server has it: the module loaded (/proc/driver/nvidia/version, in the
        format the real proprietary and open modules print), its NVML library, nvidia-persistenced running, and
        on Ubuntu the archive's driver package, held. The fleet's driver_held: false and persistenced: false
        leave those out; driver: null (or gpus: 0) is a host without a driver."""
        spec = h.spec.spec
        v = str(spec["driver"] or "")
        if not v or not spec["gpus"]:
            return
        flavor = spec.get("driver_flavor") or "proprietary"
        libs = str(spec.get("driver_libraries") or v)  # another version: upgraded packages, the old module loaded
        state["driver"] = {"loaded": v, "libraries": libs, "disk": libs, "flavor": flavor}
        h.write(f"{DRIVER_PROC}/version", _fake_module().proc_driver_version(v, flavor, spec["arch"]))
        arch = "aarch64" if spec["arch"] == "aarch64" else "x86_64"
        lib = f"/usr/lib/{arch}-linux-gnu" if spec["os"].startswith("ubuntu") else "/usr/lib64"
        h.write(f"{lib}/libnvidia-ml.so.{libs}", "")
        if spec.get("persistenced", True):
            state["services"]["nvidia-persistenced"] = "active"
            state["enabled"].append("nvidia-persistenced")
        if spec["os"].startswith("ubuntu"):
            pkg = f"nvidia-driver-{v.split('.')[0]}-server" + ("-open" if flavor == "open" else "")
            state["packages"][pkg] = f"{libs}-0ubuntu0.22.04.1"
            if spec.get("driver_held", True):
                state["holds"] = [pkg]
        if spec.get("fabricmanager") and spec.get("nvswitches"):  # an HGX server kept as its vendor ships it
            state["driver"]["fabricmanager"] = v
            state["services"]["nvidia-fabricmanager"] = "active"
            state["enabled"].append("nvidia-fabricmanager")
            if spec["os"].startswith("ubuntu"):
                state["packages"][f"nvidia-fabricmanager-{v.split('.')[0]}"] = f"{libs}-0ubuntu0.22.04.1"

    def _write_etc(self, h: LabHost) -> None:
        spec = h.spec.spec
        h.write("/etc/os-release", h.spec.os_release)
        h.write("/etc/hostname", h.name + "\n")
        h.write("/etc/machine-id", uuid.uuid4().hex + "\n")
        h.write("/etc/hosts", f"127.0.0.1 localhost\n{h.address} {h.name}\n")
        passwd = Path("/etc/passwd").read_text() + f"{LAB_USER}:x:{LAB_UID}:{LAB_UID}::/home/{LAB_USER}:/bin/bash\n"
        group = Path("/etc/group").read_text() + f"{LAB_USER}:x:{LAB_UID}:\n"
        pw_hash = "*"
        if spec["sudo"] == "password":
            pw_hash = _run(["openssl", "passwd", "-6", "-stdin"], input=spec["sudo_password"] or "").stdout.strip()
        shadow = Path("/etc/shadow").read_text() + f"{LAB_USER}:{pw_hash}:20000:0:99999:7:::\n"
        h.write("/etc/passwd", passwd)
        h.write("/etc/group", group)
        h.write("/etc/shadow", shadow, 0o640)
        rule = "NOPASSWD: ALL" if spec["sudo"] == "nopasswd" else "ALL"
        h.write(f"/etc/sudoers.d/{LAB_USER}", f"{LAB_USER} ALL=(ALL) {rule}\n", 0o440)
        fstab = "# /etc/fstab: static file system information.\nUUID=1b2c / ext4 errors=remount-ro 0 1\n"
        if spec["swap"]:
            fstab += "/swap.img\tnone\tswap\tsw\t0\t0\n"
        h.write("/etc/fstab", fstab)
        if spec["containerd_config"] is not None:
            h.write("/etc/containerd/config.toml", spec["containerd_config"])
        else:
            _whiteout(h.upper("/etc/containerd/config.toml"))
        for d in ("/etc/apt/sources.list.d", "/etc/yum.repos.d", "/etc/sysctl.d", "/etc/modules-load.d"):
            h.upper(d).mkdir(parents=True, exist_ok=True)

    def _write_usr(self, h: LabHost) -> None:
        spec = h.spec.spec
        fake = _fake_module()
        names = list(FAKED) + [t for t in STUB_TOOLS if t in spec["tools"]]
        if (spec.get("health") or {}).get("dcgm"):  # DCGM installed (its version): dcgmi answers its diagnostic
            names.append("dcgmi")
        if spec["runtime"] == "docker":
            names.append("docker")
        if spec["runtime_version"] != "debian":
            names.append("containerd")
        for name in names:
            for d in ("/usr/bin", "/usr/sbin"):  # both: PATH order differs between root and users
                h.write(f"{d}/{name}", fake.wrapper(name, self.root), 0o755)
        # merged /usr: /bin and /sbin are links into /usr, so one whiteout hides a command everywhere
        for rel in ALWAYS_ABSENT:
            # /usr/local/bin comes first in PATH: a machine's own docker client there must never answer
            if rel.rsplit("/", 1)[-1] not in names or rel.startswith("usr/local/"):
                _whiteout(h.upper("/" + rel))
        for tool in STUB_TOOLS:
            if tool not in spec["tools"]:
                _whiteout(h.upper(f"/usr/bin/{tool}"))
                _whiteout(h.upper(f"/usr/sbin/{tool}"))
        # a host without GPUs, or a bare server (driver: null), has no nvidia-smi
        if (spec["gpus"] == 0 or not spec["driver"]) and "nvidia-smi" not in (spec["overrides"] or {}):
            _whiteout(h.upper("/usr/bin/nvidia-smi"))
            _whiteout(h.upper("/usr/sbin/nvidia-smi"))

    def _make_netns(self, h: LabHost) -> None:
        _run(["ip", "netns", "add", h.netns])
        link = h.spec.spec["link"] or {}
        delay = float(link.get("delay_ms") or 0)
        self._plumb(h, tap=delay >= RELAY_MIN_MS and self.delay_method_in(h.netns) == "relay")
        h.shape(link.get("rate"), link.get("delay_ms"))
        if "drop-packets" in h.spec.spec["faults"]:
            h.drop_packets(True)

    def _write_known_hosts(self) -> None:
        lines = []
        for h in self.hosts.values():
            faults = h.spec.spec["faults"]
            if "unknown-hostkey" in faults:
                continue
            key = (h.dir / "ssh_host_ed25519_key.pub").read_text().split()
            if "changed-hostkey" in faults:
                other = h.dir / "old_host_key"
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)])
                key = (h.dir / "old_host_key.pub").read_text().split()
            lines.append(f"{h.address} {key[0]} {key[1]}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def _write_inventory(self) -> None:
        assert self.fleet is not None
        hosts = []
        for h in self.hosts.values():
            spec = h.spec.spec
            entry: dict[str, Any] = {"name": h.name, "address": h.address, "role": spec["role"]}
            if spec["role"] == "worker" or spec["gpus"]:
                entry["gpus"] = spec.get("inventory_gpus", spec["gpus"])
            if spec.get("gpu_sharing"):
                entry["gpu_sharing"] = spec["gpu_sharing"]
            if spec.get("mig_layout"):
                entry["mig"] = spec["mig_layout"]
            if spec.get("allocator"):
                entry["allocator"] = spec["allocator"]
            if spec.get("driver_inventory"):
                entry["driver"] = spec["driver_inventory"]
            user = spec["login"]
            if user != "gpuk8s" or spec["sudo"] == "password":
                entry["ssh"] = {"user": user}
                if spec["sudo"] == "password":
                    entry["ssh"]["sudo"] = {"mode": "password", "password_env": "GPUK8S_LAB_SUDO_PASSWORD"}
            hosts.append(entry)
        cluster = {"name": "lab", "kubernetes_version": "1.30", **self.fleet.cluster}
        if cluster["kubernetes_version"] == "default":  # a fleet that wants what a user gets: the matrix's default
            del cluster["kubernetes_version"]
        inv = {
            "cluster": cluster,
            # config_file none: the lab's runs never depend on the ~/.ssh/config of the machine running them
            "ssh": {"user": LAB_USER, "identity_file": str(self.key), "known_hosts": str(self.known_hosts),
                    "connect_timeout": 5, "config_file": "none"},
            "preflight": {"network_test_seconds": 1},
            "install": {**cni_stand_ins(), **cri_dockerd_stand_in(self.root)},
            "hosts": hosts,
        }
        self.inventory.write_text("# written by the gpuk8s lab (python -m tests.lab up)\n"
                                  + yaml.safe_dump(inv, sort_keys=False))

    # -- down / status ------------------------------------------------------
    def down(self) -> None:
        require_root()
        netns = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
        names = [line.split()[0] for line in netns if line.startswith(NS_PREFIX)]
        for ns in names:
            pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        # sshd listeners of this lab whose namespace is already gone (a run killed half-way) go too
        # so do the fake server, any fake of this lab still running and the link relay
        self._stop_fake_server()
        relay = self._relay_pid()
        if relay:
            os.kill(relay, signal.SIGKILL)
            LabHost._reap(relay)
        markers = (f"{self.root}/hosts/".encode(), f"{self.root}/fakes/".encode())
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, ValueError):
                cmdline = (proc / "cmdline").read_bytes()
                if any(m in cmdline for m in markers) and int(proc.name) != os.getpid():
                    os.kill(int(proc.name), signal.SIGKILL)
        for ns in names:
            for _ in range(50):
                if not _run(["ip", "netns", "pids", ns], check=False).stdout.strip():
                    break
                time.sleep(0.02)
            _run(["ip", "netns", "del", ns], check=False)
        links = _run(["ip", "-o", "link", "show"], check=False).stdout
        for line in links.splitlines():
            dev = line.split(":")[1].strip().split("@")[0]
            if dev == BRIDGE or dev.startswith(f"{LINK_PREFIX}v"):
                _run(["ip", "link", "del", dev], check=False)
        self._neighbour_room_back()
        if self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
        self.hosts = {}

    # The kernel's neighbour (ARP, NDP) tables are one for all network namespaces, with a hard limit of 1024
    # entries by default (gc_thresh3). Every lab host's namespace, the control plane's (one entry per node that
    # talks to its API server) and the bridge's side hold entries: at 512 hosts the table overflows ("neighbour:
    # arp_cache: neighbor table overflow!" in the kernel log) and joins fail with "no route to host" or time out.
    # up raises the limits to what the fleet needs (never lowers them); down puts back what was there.
    _NEIGH = tuple(f"/proc/sys/net/{v}/neigh/default/gc_thresh{i}" for v in ("ipv4", "ipv6") for i in (1, 2, 3))

    def _neighbour_room(self, hosts: int) -> None:
        want = {1: 2 * hosts, 2: 4 * hosts, 3: 8 * hosts}
        before = {}
        for path in self._NEIGH:
            with contextlib.suppress(OSError, ValueError):
                now = int(Path(path).read_text())
                need = want[int(path[-1])]
                if need > now:
                    before[path] = now
                    Path(path).write_text(f"{need}\n")
        if before:
            (self.root / "neigh.json").write_text(json.dumps(before))

    def _neighbour_room_back(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for path, value in json.loads((self.root / "neigh.json").read_text()).items():
                with contextlib.suppress(OSError):
                    Path(path).write_text(f"{value}\n")

    def status(self) -> list[dict[str, Any]]:
        return [{"name": h.name, "address": h.address, "role": h.spec.spec["role"],
                 "sshd": "running" if h.sshd_pid() else "stopped"} for h in self.hosts.values()]


def new_secret() -> str:
    return secrets.token_urlsafe(12)


def build_fakecmd() -> Path | None:
    """The compiled client of faked commands (fakes/fakecmd.c), built once per source version with the
    machine's C compiler (static where libc.a exists); None without a compiler (the Python client then)."""
    src = FAKES_SRC / "fakecmd.c"
    out = BUILD_CACHE / f"fakecmd-{hashlib.sha256(src.read_bytes()).hexdigest()[:16]}"
    if out.exists():
        return out
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None:
        return None
    BUILD_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    for extra in (["-static"], []):
        if _run([cc, "-O2", *extra, "-o", str(tmp), str(src)], check=False).returncode == 0:
            tmp.replace(out)
            return out
    return None


_fake_mod: Any = None
_fake_mod_lock = threading.Lock()


def _fake_module() -> Any:
    """fakes/fake.py as a module (the lab uses its wrapper text and CNI manifests)."""
    global _fake_mod
    with _fake_mod_lock:
        if _fake_mod is None:
            import importlib.util

            spec = importlib.util.spec_from_file_location("lab_fake", FAKES_SRC / "fake.py")
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _fake_mod = mod
        return _fake_mod


def cri_dockerd_stand_in(root: Path) -> dict[str, Any]:
    """install.cri_dockerd_sha256 for the archive the lab serves in place of cri-dockerd's release
    (fakes/fake.py: cri_dockerd_archive; gpuk8s checks the archive's sha256 before unpacking it, and the real
    archives' sha256 are pinned in gpuk8s/data/versions.yaml). The lab's hosts are x86_64 or aarch64."""
    from gpuk8s import versions

    fake, pin = _fake_module(), versions.cri_dockerd()
    return {"cri_dockerd_sha256": {arch: hashlib.sha256(fake.cri_dockerd_archive(pin.version, arch, root)).hexdigest()
                                   for arch in pin.sha256}}


def cni_stand_ins() -> dict[str, str]:
    """The inventory keys that point gpuk8s at the lab's small CNI manifests, pinned by their sha256
    (gpuk8s checks a manifest's sha256 before it applies it; the real projects' files are pinned in
    gpuk8s/versions.py)."""
    fake = _fake_module()
    out = {}
    for cni, name in (("calico", "calico.yaml"), ("flannel", "kube-flannel.yml")):
        out[f"{cni}_manifest"] = f"https://cni.lab.invalid/{cni}/{name}"
        out[f"{cni}_manifest_sha256"] = hashlib.sha256(fake.CNI_MANIFESTS[cni].encode()).hexdigest()
    return out
