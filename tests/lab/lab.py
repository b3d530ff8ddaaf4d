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
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from tests.lab.fleet import Fleet, HostSpec, load_fleet

LAB_ROOT = Path(os.environ.get("GPUK8S_LAB_DIR", "/var/tmp/gpuk8s-lab"))
BRIDGE = "gk8s0"
NS_PREFIX = "gk8s-"
FAKES_SRC = Path(__file__).parent / "fakes"
LAB_USER, LAB_UID = "gpuk8s", 2742
OVERLAYS = ("etc", "usr", "var/lib", "root", "home")
FAKED = ("nvidia-smi", "lsmod", "modprobe", "sysctl", "swapon", "swapoff", "systemctl", "uname", "nproc",
         "apt-get", "dpkg", "dpkg-query", "apt-mark", "dnf", "yum", "rpm", "curl", "gpg")
ALWAYS_ABSENT = ("usr/local/bin/docker", "usr/bin/docker", "usr/bin/kubectl", "usr/bin/kubeadm", "usr/bin/kubelet",
                 "usr/bin/nvidia-ctk")
STUB_TOOLS = ("conntrack", "socat", "ebtables", "ethtool")  # present (as stubs) only when the fleet lists them


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
        self.veth = f"gk8s-v{index}"

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

    # -- processes and network ------------------------------------------
    def exec(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside the host's namespaces (as root), as a test would on the console."""
        pid = self.sshd_pid()
        if pid is None:
            raise LabError(f"{self.name}: sshd is not running")
        return _run(["nsenter", "-t", str(pid), "-n", "-m", "-u", "sh", "-c", command], check=check)

    def sshd_pid(self) -> int | None:
        try:
            pid = int((self.dir / "sshd.pid").read_text())
            os.kill(pid, 0)
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
                   "mount -t tmpfs -o mode=1777 tmpfs /tmp", f"hostname {self.name}"]
        script = " && ".join(mounts) + f" && exec /usr/sbin/sshd -D -e -f {d}/sshd_config"
        log = open(d / "sshd.log", "ab")  # noqa: SIM115 (handed to the sshd process)
        p = subprocess.Popen(["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts",
                              "--propagation", "private", "sh", "-c", script],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        (d / "sshd.pid").write_text(str(p.pid))

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

        With sch_netem in the kernel, netem adds `delay_ms` in each direction and limits the rate.
        Without it (as on our CI machines), tbf limits the rate and the delay cannot be emulated:
        `lab.delay_supported` says which, and tests that need a delay skip with that reason.
        """
        for prefix, dev in ((["ip", "netns", "exec", self.netns], "eth0"), ([], self.veth)):
            _run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], check=False)
            if delay_ms and self.lab.delay_supported:
                args = ["netem", "delay", f"{delay_ms}ms"] + (["rate", rate] if rate else [])
                if _run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", *args], check=False).returncode == 0:
                    continue
                self.lab.delay_supported = False
            if rate:
                _run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "64kb",
                      "latency", "50ms"])

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
        self.delay_supported = True  # becomes False at the first netem failure (no sch_netem)
        self.hosts: dict[str, LabHost] = {}
        self.fleet: Fleet | None = None
        meta = root / "lab.json"
        if meta.exists():
            data = json.loads(meta.read_text())
            self.fleet = load_fleet(data["fleet"], data.get("subnet"))
            for i, spec in enumerate(self.fleet.hosts):
                self.hosts[spec.name] = LabHost(self, spec, i)

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
        fleet = load_fleet(fleet_path, subnet)
        self.fleet = fleet
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(FAKES_SRC, self.root / "fakes", ignore=shutil.ignore_patterns("__pycache__"))
        (self.root / "cluster").mkdir()
        (self.root / "real").mkdir()
        if Path("/usr/bin/containerd").exists():  # the real binary, for hosts whose containerd is faked
            try:
                os.link("/usr/bin/containerd", self.root / "real" / "containerd")
            except OSError:
                shutil.copy2("/usr/bin/containerd", self.root / "real" / "containerd")
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuk8s-lab", "-f", str(self.key)])
        (self.root / "lab.json").write_text(json.dumps(
            {"fleet": str(Path(fleet_path).resolve()), "subnet": str(fleet.subnet), "created": time.time()}))
        gw = f"{fleet.subnet.network_address + 1}/{fleet.subnet.prefixlen}"
        _run(["ip", "-batch", "-"], input=f"link add {BRIDGE} type bridge\naddr add {gw} dev {BRIDGE}\n"
             f"link set {BRIDGE} up\n")
        self.hosts = {s.name: LabHost(self, s, i) for i, s in enumerate(fleet.hosts)}
        pub = (self.root / "id_ed25519.pub").read_text()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda h: self._make_host(h, pub), self.hosts.values()))
        with ThreadPoolExecutor(max_workers=16) as pool:
            unanswering = {"sshd-stopped", "drop-packets"}
            list(pool.map(lambda h: None if unanswering & set(h.spec.spec["faults"]) else h.wait_ready(),
                          self.hosts.values()))
        self._write_known_hosts()
        self._write_inventory()
        return self.inventory

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
            # 'repo-unreachable': NVIDIA's and Kubernetes' package repositories cannot be resolved
            "unreachable_hosts": ["nvidia.github.io", "pkgs.k8s.io"] if "repo-unreachable" in spec["faults"] else [],
        }
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
        if "sshd-stopped" not in spec["faults"]:
            h.start_sshd()

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
        fake = self.root / "fakes" / "fake.py"
        names = list(FAKED) + [t for t in STUB_TOOLS if t in spec["tools"]]
        if spec["runtime"] == "docker":
            names.append("docker")
        if spec["runtime_version"] != "debian":
            names.append("containerd")
        for name in names:
            for d in ("/usr/bin", "/usr/sbin"):  # both: PATH order differs between root and users
                h.write(f"{d}/{name}", f"#!/bin/sh\nexec /usr/bin/python3 {fake} {name} \"$@\"\n", 0o755)
        # merged /usr: /bin and /sbin are links into /usr, so one whiteout hides a command everywhere
        for rel in ALWAYS_ABSENT:
            # /usr/local/bin comes first in PATH: a machine's own docker client there must never answer
            if rel.rsplit("/", 1)[-1] not in names or rel.startswith("usr/local/"):
                _whiteout(h.upper("/" + rel))
        for tool in STUB_TOOLS:
            if tool not in spec["tools"]:
                _whiteout(h.upper(f"/usr/bin/{tool}"))
                _whiteout(h.upper(f"/usr/sbin/{tool}"))
        if spec["gpus"] == 0 and "nvidia-smi" not in (spec["overrides"] or {}):
            _whiteout(h.upper("/usr/bin/nvidia-smi"))
            _whiteout(h.upper("/usr/sbin/nvidia-smi"))

    def _make_netns(self, h: LabHost) -> None:
        prefix = self.fleet.subnet.prefixlen if self.fleet else 16
        peer = f"gk8s-p{h.index}"
        _run(["ip", "netns", "add", h.netns])
        _run(["ip", "-batch", "-"], input=(
            f"link add {h.veth} type veth peer name {peer} netns {h.netns}\n"
            f"link set {h.veth} master {BRIDGE}\nlink set {h.veth} up\n"))
        _run(["ip", "-n", h.netns, "-batch", "-"], input=(
            f"link set {peer} name eth0\naddr add {h.address}/{prefix} dev eth0\n"
            "link set eth0 up\nlink set lo up\n"))
        link = h.spec.spec["link"] or {}
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
            user = spec["login"]
            if user != "gpuk8s" or spec["sudo"] == "password":
                entry["ssh"] = {"user": user}
                if spec["sudo"] == "password":
                    entry["ssh"]["sudo"] = {"mode": "password", "password_env": "GPUK8S_LAB_SUDO_PASSWORD"}
            hosts.append(entry)
        inv = {
            "cluster": {"name": "lab", "kubernetes_version": "1.30", **self.fleet.cluster},
            "ssh": {"user": LAB_USER, "identity_file": str(self.key), "known_hosts": str(self.known_hosts),
                    "connect_timeout": 5},
            "preflight": {"network_test_seconds": 1},
            "install": cni_stand_ins(),
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
        marker = f"{self.root}/hosts/".encode()
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, ValueError):
                if marker in (proc / "cmdline").read_bytes():
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
            if dev == BRIDGE or dev.startswith("gk8s-v"):
                _run(["ip", "link", "del", dev], check=False)
        if self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
        self.hosts = {}

    def status(self) -> list[dict[str, Any]]:
        return [{"name": h.name, "address": h.address, "role": h.spec.spec["role"],
                 "sshd": "running" if h.sshd_pid() else "stopped"} for h in self.hosts.values()]


def new_secret() -> str:
    return secrets.token_urlsafe(12)


def cni_stand_ins() -> dict[str, str]:
    """The inventory keys that point gpuk8s at the lab's small CNI manifests, pinned by their sha256
    (gpuk8s checks a manifest's sha256 before it applies it; the real projects' files are pinned in
    gpuk8s/versions.py)."""
    import hashlib
    import importlib.util

    spec = importlib.util.spec_from_file_location("lab_fake", Path(__file__).parent / "fakes" / "fake.py")
    assert spec is not None and spec.loader is not None
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    out = {}
    for cni, name in (("calico", "calico.yaml"), ("flannel", "kube-flannel.yml")):
        out[f"{cni}_manifest"] = f"https://cni.lab.invalid/{cni}/{name}"
        out[f"{cni}_manifest_sha256"] = hashlib.sha256(fake.CNI_MANIFESTS[cni].encode()).hexdigest()
    return out
