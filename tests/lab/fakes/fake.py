"""Faked commands of a lab host, driven by the host's fleet spec and its own state.

Installed as /usr/bin/NAME wrappers inside each lab host's view (see `wrapper`): run by the lab's fake
server (server.py: one long-lived process, forked per command) or, as before it existed, as its own
process `fake.py NAME ARGS...`; the same code either way. Runs with the system python3 and the
standard library only. Every call records its argv, so tests can prove
what ran and that no secret was ever on a command line. Any command's stdout, stderr and exit
status can be replaced verbatim through the state's "overrides".
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import tomllib

STATE_DIR = Path("/var/lib/gpuk8s-lab")
LAB_ROOT = Path(__file__).resolve().parent.parent


class Host:
    def __init__(self, wait: bool = True) -> None:
        """The host's spec and its state, locked until release() or exit. wait=False: BlockingIOError at
        once if another fake holds the lock."""
        self.spec = json.loads((STATE_DIR / "host.json").read_text())
        self._lock = open(STATE_DIR / "state.json", "r+")  # noqa: SIM115 (held, locked, until exit)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError:
            self._lock.close()
            raise
        self.state = json.loads(self._lock.read() or "{}")

    def release(self) -> None:
        self._lock.close()

    def save(self) -> None:
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(json.dumps(self.state, indent=1))
        self._lock.flush()


def out(text: str) -> None:
    sys.stdout.write(text)


def err(text: str) -> None:
    sys.stderr.write(text)


def record(argv: list[str]) -> None:
    with open(STATE_DIR / "commands.log", "a") as f:
        f.write(json.dumps(argv) + "\n")


# -- GPUs -------------------------------------------------------------------
CUDA_FOR_DRIVER = ((580, "13.0"), (525, "12.0"), (450, "11.0"), (440, "10.2"), (418, "10.1"), (410, "10.0"))


def nvidia_smi(h: Host, args: list[str]) -> int:
    s = h.spec
    n = int(s["gpus"])
    driver = str(s["driver"])
    if n == 0:
        err("No devices were found\n")
        return 6
    major = int(driver.split(".")[0])
    cuda = next((c for d, c in CUDA_FOR_DRIVER if major >= d), "9.0")
    gpus = [(i, s["gpu_model"], f"GPU-{h.spec['name']}-{i:04d}-lab", s["gpu_memory_mib"], s["mig"]) for i in range(n)]
    if args and args[0] == "--version":
        out(f"NVIDIA-SMI version  : {driver}\nDRIVER version      : {driver}\nCUDA Version        : {cuda}\n")
        return 0
    if args and args[0] == "-L":
        for i, name, uid, _, _ in gpus:
            out(f"GPU {i}: {name} (UUID: {uid})\n")
        return 0
    q = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    if q is not None:
        fields = q.split(",")
        for i, name, uid, mem, mig in gpus:
            vals = {"index": str(i), "name": name, "uuid": uid, "driver_version": driver,
                    "memory.total": str(mem), "mig.mode.current": mig}
            if any(f not in vals for f in fields):
                bad = next(f for f in fields if f not in vals)
                out(f'Field "{bad}" is not a valid field to query.\n\n')
                return 2
            out(", ".join(vals[f] for f in fields) + "\n")
        return 0
    out(f"| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {cuda} |\n")
    for i, name, _, mem, _ in gpus:
        out(f"|   {i}  {name}  |  0MiB / {mem}MiB |\n")
    return 0


# -- kernel, swap, services -------------------------------------------------
BRIDGE_KEYS = ("net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables")


def lsmod(h: Host, args: list[str]) -> int:
    out("Module                  Size  Used by\n")
    for m in h.state["modules"]:
        out(f"{m:<24}{16384:>6}  0\n")
    return 0


def modprobe(h: Host, args: list[str]) -> int:
    for m in [a for a in args if not a.startswith("-")]:
        if m not in h.state["modules"]:
            h.state["modules"].append(m)
    h.save()
    return 0


def _sysctl_get(h: Host, key: str) -> str | None:
    if key in BRIDGE_KEYS and "br_netfilter" not in h.state["modules"]:
        return None
    return h.state["sysctl"].get(key, "1" if key in BRIDGE_KEYS else "0")


def _sysctl_file(h: Host, path: Path) -> None:
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            k, v = (x.strip() for x in line.split("=", 1))
            h.state["sysctl"][k] = v


def sysctl(h: Host, args: list[str]) -> int:
    rc = 0
    quiet = "-n" in args
    if "--system" in args:
        for d in ("/usr/lib/sysctl.d", "/etc/sysctl.d"):
            for f in sorted(Path(d).glob("*.conf")) if Path(d).is_dir() else []:
                _sysctl_file(h, f)
        h.save()
        return 0
    if "-p" in args:
        i = args.index("-p")
        _sysctl_file(h, Path(args[i + 1] if i + 1 < len(args) else "/etc/sysctl.conf"))
        h.save()
        return 0
    for a in args:
        if a.startswith("-"):
            continue
        if "=" in a:
            k, v = a.split("=", 1)
            h.state["sysctl"][k] = v
            h.save()
            out(f"{k} = {v}\n")
            continue
        v = _sysctl_get(h, a)
        if v is None:
            err(f"sysctl: cannot stat /proc/sys/{a.replace('.', '/')}: No such file or directory\n")
            rc = 255
        else:
            out(f"{v}\n" if quiet else f"{a} = {v}\n")
    return rc


def swapon(h: Host, args: list[str]) -> int:
    if "--show" in args or not args:
        for s in h.state["swap"]:
            out(f"{s} file 2G 0B -2\n")
    return 0


def swapoff(h: Host, args: list[str]) -> int:
    h.state["swap"] = []
    h.save()
    return 0


def systemctl(h: Host, args: list[str]) -> int:
    words = [a for a in args if not a.startswith("-")]
    if not words:
        return 0
    verb, units = words[0], [u.removesuffix(".service") for u in words[1:]]
    svc = h.state.setdefault("services", {})
    enabled = h.state.setdefault("enabled", [])
    quiet = "-q" in args or "--quiet" in args
    if verb in ("is-active", "is-enabled"):
        rc = 0
        for u in units:
            st = svc.get(u, "inactive") if verb == "is-active" else ("enabled" if u in enabled else "disabled")
            if not quiet:
                out(st + "\n")
            rc = rc or (0 if st in ("active", "enabled") else (3 if verb == "is-active" else 1))
        return rc
    if verb in ("start", "restart", "reload", "enable") :
        for u in units:
            if u in ("containerd", "docker", "kubelet") and not _installed(h, u):
                err(f"Failed to {verb} {u}.service: Unit {u}.service not found.\n")
                return 5
        if verb == "enable":
            enabled.extend(u for u in units if u not in enabled)
            if "--now" not in args:
                h.save()
                return 0
        for u in units:
            problem = _config_problem(u)
            if problem:
                svc[u] = "failed"
                h.save()
                err(f"Job for {u}.service failed because the control process exited with error code.\n"
                    f"See \"systemctl status {u}.service\" and \"journalctl -xeu {u}.service\" for details.\n")
                h.state.setdefault("journal", {})[u] = problem
                h.save()
                return 1
            svc[u] = "active"
    elif verb == "stop":
        for u in units:
            svc[u] = "inactive"
    h.save()
    return 0


def _config_problem(unit: str) -> str:
    """What the real daemon would refuse at start: containerd's config, checked by the real binary."""
    real = LAB_ROOT / "real" / "containerd"
    if unit == "containerd" and real.exists() and Path("/etc/containerd/config.toml").exists():
        p = subprocess.run([str(real), "config", "dump"], capture_output=True, text=True)
        return p.stderr.strip() if p.returncode else ""
    if unit == "docker" and Path("/etc/docker/daemon.json").exists():
        try:
            json.loads(Path("/etc/docker/daemon.json").read_text())
        except ValueError as e:
            return f"unable to configure the Docker daemon with file /etc/docker/daemon.json: {e}"
    return ""


def _installed(h: Host, name: str) -> bool:
    return h.spec["runtime"] == name or name in h.state.get("packages", {}) or name == "containerd"



def uname(h: Host, args: list[str]) -> int:
    s = h.spec
    parts = {"-s": "Linux", "-n": s["name"], "-r": s["kernel"] or "5.15.0-105-generic", "-m": s["arch"]}
    if not args:
        args = ["-s"]
    if "-a" in args:
        args = ["-s", "-n", "-r", "-m"]
    out(" ".join(parts.get(a, "unknown") for a in args) + "\n")
    return 0


def nproc(h: Host, args: list[str]) -> int:
    out(f"{h.spec['cpus']}\n")
    return 0


# -- container runtimes ------------------------------------------------------
def docker(h: Host, args: list[str]) -> int:
    v = h.spec["runtime_version"]
    if args[:1] == ["--version"]:
        out(f"Docker version {v}, build e6534b4\n")
        return 0
    if h.state["services"].get("docker") != "active":
        err("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n")
        return 1
    if args[:1] == ["version"]:
        out(f"{v}\n")
        return 0
    if args[:1] == ["info"]:
        try:
            cfg = json.loads(Path("/etc/docker/daemon.json").read_text())
        except (OSError, ValueError):
            cfg = {}
        driver = "systemd" if "native.cgroupdriver=systemd" in cfg.get("exec-opts", []) else "cgroupfs"
        out(f"Server Version: {v}\nCgroup Driver: {driver}\nDefault Runtime: {cfg.get('default-runtime', 'runc')}\n")
        return 0
    return 0


def containerd(h: Host, args: list[str]) -> int:
    v = h.spec["runtime_version"]
    if args[:1] in (["--version"], ["-v"]):
        if v.startswith("v"):
            out(f"containerd github.com/containerd/containerd {v} 0cae528dd6cb557f7201036e9f43420650207b58\n")
        else:
            out(f"containerd containerd.io {v} 3dce8eb055cbb6872793272b4f20ed16117344f8\n")
        return 0
    real = LAB_ROOT / "real" / "containerd"
    if real.exists():
        os.execv(str(real), [str(real), *args])
    err("containerd: not available in the lab for these arguments\n")
    return 1


# -- package repositories and packages ------------------------------------------
# Packages each repository serves, by URL fragment: what the real repositories hold, in small.
TOOLKIT_PKGS = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                "libnvidia-container1")
TOOLKIT_VERSIONS = ("1.17.7-1", "1.17.8-1", "1.18.0-1")
K8S_PKGS = ("kubelet", "kubeadm", "kubectl", "cri-tools", "kubernetes-cni")
BINARIES = {"nvidia-container-toolkit-base": "nvidia-ctk", "kubeadm": "kubeadm", "kubelet": "kubelet",
            "kubectl": "kubectl"}


def _url_host(url: str) -> str:
    return re.sub(r"^[a-z]+://", "", url).split("/", 1)[0].split(":", 1)[0]


def _unreachable(h: Host, url: str) -> bool:
    return _url_host(url) in h.state.get("unreachable_hosts", [])


def _serves(url: str) -> dict[str, list[str]]:
    """Package name -> versions (oldest first) that a repository URL serves."""
    if "libnvidia-container" in url:
        return {p: list(TOOLKIT_VERSIONS) for p in TOOLKIT_PKGS}
    m = re.search(r"/v1\.(\d+)/(deb|rpm)", url)
    if m:
        minor = int(m.group(1))
        deb = m.group(2) == "deb"
        return {p: [f"1.{minor}.{z}-1.1" if deb else f"1.{minor}.{z}-150500.1.1" for z in range(6)] for p in K8S_PKGS}
    return {}


def _apt_sources() -> list[tuple[str, str]]:
    """(url, signed-by keyring) of every deb line in sources.list.d."""
    out = []
    d = Path("/etc/apt/sources.list.d")
    for f in sorted(d.glob("*.list")) if d.is_dir() else []:
        for line in f.read_text().splitlines():
            m = re.match(r"^deb\s+(?:\[([^]]*)\]\s+)?(\S+)", line.strip())
            if m:
                key = re.search(r"signed-by=(\S+)", m.group(1) or "")
                out.append((m.group(2), key.group(1) if key else ""))
    return out


def _yum_repos() -> list[tuple[str, str]]:
    out = []
    d = Path("/etc/yum.repos.d")
    for f in sorted(d.glob("*.repo")) if d.is_dir() else []:
        name = ""
        for line in f.read_text().splitlines():
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                name = line[1:-1]
            elif line.startswith("baseurl="):
                out.append((name, line.split("=", 1)[1]))
    return out


def _dpkg_lock(h: Host, args: list[str]) -> object | None:
    """Take dpkg's frontend lock as apt does (fcntl), waiting up to DPkg::Lock::Timeout; None if held."""
    timeout = 0.0
    for i, a in enumerate(args):
        if a == "-o" and i + 1 < len(args) and args[i + 1].startswith("DPkg::Lock::Timeout="):
            timeout = float(args[i + 1].split("=", 1)[1])
    path = "/var/lib/dpkg/lock-frontend"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a")  # noqa: SIM115 (held until the process exits, as apt holds it)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except OSError:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
    pid = "unknown"
    try:
        st = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        pid = str(struct.unpack("hhqqi4x", st)[4])
    except OSError:
        pass
    err(f"E: Could not get lock {path}. It is held by process {pid} (apt-get)\n"
        f"E: Unable to acquire the dpkg frontend lock ({path}), is another process using it?\n")
    return None


def wrapper(name: str, lab_root: Path = LAB_ROOT) -> str:
    """The text of the faked command NAME in a host's /usr/bin, as the lab's mode (fakes/mode) wants it:
    'fakecmd': the compiled client as the interpreter; 'client': the Python client; 'process' (or no
    mode file): a python3 process per command, running this file."""
    fakes = lab_root / "fakes"
    try:
        mode = (fakes / "mode").read_text().strip()
    except OSError:
        mode = "process"
    if mode == "fakecmd":
        return f"#!{fakes}/fakecmd {name}\n# a faked command of the gpuk8s lab: tests/lab/fakes/server.py\n"
    if mode == "client":
        return f"#!/bin/sh\nexec /usr/bin/python3 -I -S {fakes}/client.py {name} \"$@\"\n"
    return f"#!/bin/sh\nexec /usr/bin/python3 {fakes}/fake.py {name} \"$@\"\n"


def _install_binaries(pkg: str) -> None:
    binary = BINARIES.get(pkg)
    if binary:
        for d in ("/usr/bin", "/usr/sbin"):
            p = Path(d) / binary
            if p.is_char_device():
                p.unlink()
            p.write_text(wrapper(binary))
            p.chmod(0o755)


def apt_get(h: Host, args: list[str]) -> int:
    words = [a for i, a in enumerate(args) if not a.startswith("-") and not (i and args[i - 1] == "-o")]
    verb = words[0] if words else ""
    if verb not in ("update", "install"):
        return 0
    lock = _dpkg_lock(h, args)
    if lock is None:
        return 100
    if verb == "update":
        index: dict[str, dict[str, list[str]]] = {}
        for n, (url, key) in enumerate(_apt_sources(), 1):
            if _unreachable(h, url):
                out(f"Err:{n} {url} InRelease\n  Could not resolve '{_url_host(url)}'\n")
                err(f"W: Failed to fetch {url}/InRelease  Could not resolve '{_url_host(url)}'\n")
                continue
            if key and not Path(key).is_file():
                err(f"W: GPG error: {url} InRelease: The following signatures couldn't be verified because the "
                    f"public key is not available: NO_PUBKEY 0123456789ABCDEF\n")
                continue
            out(f"Get:{n} {url} InRelease [1,484 B]\n")
            index[url] = _serves(url)
        if any(_unreachable(h, u) for u, _ in _apt_sources()):
            err("W: Some index files failed to download. They have been ignored, or old ones used instead.\n")
        h.state["apt_index"] = index
        h.save()
        out("Reading package lists... Done\n")
        return 0
    available: dict[str, list[str]] = {}
    for served in h.state.get("apt_index", {}).values():
        for p, vs in served.items():
            available.setdefault(p, []).extend(vs)
    chosen = {}
    for spec in words[1:]:
        name, _, want = spec.partition("=")
        if name not in available:
            err(f"E: Unable to locate package {name}\n")
            return 100
        ok = [v for v in available[name] if not want or fnmatch.fnmatchcase(v, want)]
        if not ok:
            err(f"E: Version '{want}' for '{name}' was not found\n")
            return 100
        chosen[name] = ok[-1]
    held = [p for p in chosen if p in h.state.get("holds", []) and h.state["packages"].get(p) != chosen[p]]
    if held and "--allow-change-held-packages" not in args:
        err("E: Held packages were changed and -y was used without --allow-change-held-packages.\n")
        return 100
    for name, v in chosen.items():
        out(f"Setting up {name} ({v}) ...\n")
        h.state.setdefault("packages", {})[name] = v
        _install_binaries(name)
    h.save()
    return 0


def _dnf_lock_holder() -> int | None:
    try:
        pid = int(Path("/var/lib/dnf/rpmdb_lock.pid").read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None  # no lock file, or a stale one: dnf takes the lock over


def dnf(h: Host, args: list[str]) -> int:
    words = [a for a in args if not a.startswith("-")]
    if words[:1] != ["install"]:
        return 0
    holder = _dnf_lock_holder()
    if holder is not None:  # dnf 4 waits for the other dnf as long as it runs
        h.release()
        out(f"Waiting for process with pid {holder} to finish.\n")
        sys.stdout.flush()
        while _dnf_lock_holder() is not None:
            time.sleep(0.2)
        h = Host()
    available: dict[str, list[str]] = {}
    for name, url in _yum_repos():
        if _unreachable(h, url):
            err(f"Errors during downloading metadata for repository '{name}':\n"
                f"  - Curl error (6): Couldn't resolve host name for {url}repodata/repomd.xml\n"
                f"Error: Failed to download metadata for repo '{name}': Cannot download repomd.xml\n")
            return 1
        for p, vs in _serves(url).items():
            available.setdefault(p, []).extend(vs)
    chosen = {}
    for spec in words[1:]:
        name = next((p for p in sorted(available, key=len, reverse=True) if spec == p or spec.startswith(p + "-")),
                    None)
        if name is None:
            err(f"No match for argument: {spec}\nError: Unable to find a match: {spec}\n")
            return 1
        want = spec[len(name) + 1:]
        ok = [v for v in available[name] if not want or v == want or v.startswith(want + "-")
              or v.startswith(want + ".")]
        if not ok:
            err(f"No match for argument: {spec}\nError: Unable to find a match: {spec}\n")
            return 1
        chosen[name] = ok[-1]
    for name, v in chosen.items():
        h.state.setdefault("packages", {})[name] = v
        _install_binaries(name)
    h.save()
    out("Complete!\n")
    return 0


def dpkg_query(h: Host, args: list[str]) -> int:
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith(("--showformat=", "-f="))), None)
    if "-f" in args:
        fmt = args[args.index("-f") + 1]
    names = [a for i, a in enumerate(args) if not a.startswith("-") and not (i and args[i - 1] == "-f")]
    rc = 0
    for p in names:
        v = h.state.get("packages", {}).get(p)
        if v is None:
            err(f"dpkg-query: no packages found matching {p}\n")
            rc = 1
        elif fmt is not None:
            out(fmt.replace("${Version}", v).replace("${Package}", p).replace("\\n", "\n"))
        else:
            out(f"{p}\t{v}\n")
    return rc


def rpm(h: Host, args: list[str]) -> int:
    fmt = args[args.index("--qf") + 1] if "--qf" in args else "%{NAME}-%{VERSION}-%{RELEASE}.x86_64\n"
    names = [a for i, a in enumerate(args) if not a.startswith("-") and not (i and args[i - 1] == "--qf")]
    rc = 0
    for p in names:
        v = h.state.get("packages", {}).get(p)
        if v is None:
            out(f"package {p} is not installed\n")
            rc = 1
            continue
        ver, _, rel = v.partition("-")
        out(fmt.replace("%{NAME}", p).replace("%{VERSION}", ver).replace("%{RELEASE}", rel).replace("\\n", "\n"))
    return rc


def apt_mark(h: Host, args: list[str]) -> int:
    words = [a for a in args if not a.startswith("-")]
    holds = h.state.setdefault("holds", [])
    if words[:1] == ["hold"]:
        for p in words[1:]:
            if p not in holds:
                holds.append(p)
            out(f"{p} set on hold.\n")
        h.save()
    elif words[:1] == ["showhold"]:
        for p in sorted(holds):
            if len(words) == 1 or p in words[1:]:
                out(p + "\n")
    return 0


# -- signing keys -------------------------------------------------------------------------------------------
# A key served in the lab is armored text naming its fingerprint(s); gpg --dearmor keeps that text inside
# the "binary" keyring, so gpg --show-keys reads the fingerprint from whatever file it is given.
KEY_FPR = re.compile(rb"^lab-fingerprint: ([0-9A-F]{40})$", re.M)


def lab_key_fingerprint(url_host: str) -> str:
    """The fingerprint of the signing key the lab serves at a repository host: sha1 of the host name."""
    return hashlib.sha1(url_host.encode()).hexdigest().upper()


def served_key_fingerprints(h: Host, url_host: str) -> list[str]:
    """What the key file at a host holds: the host's own lab key, unless the state's "served_keys"
    ({url host: fingerprint or a list of them}) makes that host serve another key (or several)."""
    got = h.state.get("served_keys", {}).get(url_host)
    if got is None:
        return [lab_key_fingerprint(url_host)]
    return [got] if isinstance(got, str) else list(got)


def _protocols(value: str | None, default: set[str]) -> set[str]:
    """curl's --proto / --proto-redir syntax: `=a,b` exactly these; `+a`, `-a`, `all` change the set."""
    if value is None:
        return set(default)
    allowed: set[str] = set(default)
    for tok in value.split(","):
        tok = tok.strip().lower()
        op = tok[0] if tok[:1] in "=+-" else "+"
        name = tok.lstrip("=+-")
        names = {"http", "https", "ftp", "ftps", "file"} if name == "all" else {name}
        if op == "=":
            allowed = set(names)
        elif op == "+":
            allowed |= names
        else:
            allowed -= names
    return allowed


def _opt(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args[:-1] else None


def curl(h: Host, args: list[str]) -> int:
    url = next((a for a in args if re.match(r"^https?://", a)), "")
    dest = _opt(args, "-o")
    follow = "-L" in args or "--location" in args or any(
        a.startswith("-") and not a.startswith("--") and "L" in a for a in args)
    # curl >= 7.65.2 follows redirects to http, https, ftp and ftps unless --proto-redir says otherwise
    proto = _protocols(_opt(args, "--proto"), {"http", "https", "ftp", "ftps", "file"})
    proto_redir = _protocols(_opt(args, "--proto-redir"), {"http", "https", "ftp", "ftps"}) & proto
    scheme = url.split("://", 1)[0]
    if scheme not in proto:
        err(f'curl: (1) Protocol "{scheme}" not supported or disabled in libcurl\n')
        return 1
    if _unreachable(h, url):
        err(f"curl: (6) Could not resolve host: {_url_host(url)}\n")
        return 6
    # the state's "redirects" ({url host: base URL}): that host answers 302 to the same path under the base
    to = h.state.get("redirects", {}).get(_url_host(url))
    if to:
        if not follow:
            if dest:
                Path(dest).write_text("")
            return 0
        url = to.rstrip("/") + "/" + re.sub(r"^[a-z]+://[^/]*/?", "", url)
        scheme = url.split("://", 1)[0]
        if scheme not in proto_redir:
            err(f'curl: (1) Protocol "{scheme}" not supported or disabled in libcurl\n')
            return 1
        if _unreachable(h, url):
            err(f"curl: (6) Could not resolve host: {_url_host(url)}\n")
            return 6
    body = "".join(f"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nlab signing key served at {url}\n"
                   f"lab-fingerprint: {fpr}\n-----END PGP PUBLIC KEY BLOCK-----\n"
                   for fpr in served_key_fingerprints(h, _url_host(url)))
    if url.endswith((".yaml", ".yml")):
        body = CNI_MANIFESTS["flannel" if "flannel" in url else "calico"]
    if dest:
        Path(dest).write_text(body)
    else:
        out(body)
    return 0


# What the CNI projects publish, in small: the objects that matter to gpuk8s and to the lab's cluster.
CNI_MANIFESTS = {
    "calico": """apiVersion: apps/v1
kind: DaemonSet
metadata: {name: calico-node, namespace: kube-system}
spec:
  selector: {matchLabels: {k8s-app: calico-node}}
  template:
    metadata: {labels: {k8s-app: calico-node}}
    spec:
      containers:
        - name: calico-node
          image: docker.io/calico/node:v3.28.0
          env:
            # - name: CALICO_IPV4POOL_CIDR
            #   value: "192.168.0.0/16"
            - {name: FELIX_IPV6SUPPORT, value: "false"}
""",
    "flannel": """apiVersion: v1
kind: ConfigMap
metadata: {name: kube-flannel-cfg, namespace: kube-flannel}
data:
  net-conf.json: |
    {
      "Network": "10.244.0.0/16",
      "Backend": {
        "Type": "vxlan"
      }
    }
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-flannel-ds, namespace: kube-flannel}
spec:
  selector: {matchLabels: {app: flannel}}
  template:
    metadata: {labels: {app: flannel}}
    spec:
      containers: [{name: kube-flannel, image: "docker.io/flannel/flannel:v0.25.5"}]
""",
}


_GPG_VALUE_OPTS = {"--trust-model", "--homedir", "-o", "--output", "--keyring", "--import-options",
                   "--list-options", "--status-fd", "--logger-fd"}


def gpg(h: Host, args: list[str]) -> int:
    h.release()  # gpg needs no state; holding its lock while reading a `curl | gpg` pipe would deadlock
    if "--dearmor" in args:
        data = sys.stdin.buffer.read()
        if not data.startswith(b"-----BEGIN PGP"):
            err("gpg: no valid OpenPGP data found.\n")
            return 2
        sys.stdout.buffer.write(b"\x99\x01lab-keyring\x00" + data)
        return 0
    if "--show-keys" not in args:
        return 0
    files = [a for i, a in enumerate(args) if not a.startswith("-") and not (i and args[i - 1] in _GPG_VALUE_OPTS)]
    datas = []
    for f in files or ["-"]:
        try:
            datas.append(sys.stdin.buffer.read() if f == "-" else Path(f).read_bytes())
        except OSError as e:
            err(f"gpg: can't open '{f}': {e.strerror}\n")
            return 2
    fprs = [m.decode() for d in datas for m in KEY_FPR.findall(d)]
    if not fprs:
        err("gpg: no valid OpenPGP data found.\n")
        return 2
    created = 1700000000
    for fpr in fprs:
        sub = hashlib.sha1(f"subkey of {fpr}".encode()).hexdigest().upper()
        uid = f"lab repository signing key {fpr[-8:]}"
        uid_hash = hashlib.sha1(uid.encode()).hexdigest().upper()
        if "--with-colons" in args:
            # GnuPG's colon listing, doc/DETAILS "Format of the colon listings" (gpg/gnupg):
            #   pub:f:1024:17:6C7EE1B8621CC013:899817715:1055898235::m:::scESC:
            #   fpr:::::::::ECAF7590EB3443B5C7CF3ACB6C7EE1B8621CC013:
            # field 10 of an fpr record is the fingerprint of the (sub)key record just before it; the
            # fields below are as gpg 2.2.40 prints them for `--show-keys --with-colons` of an ed25519 key
            out(f"pub:-:255:22:{fpr[-16:]}:{created}:::-:::scSC:::::ed25519:::0:\n"
                f"fpr:::::::::{fpr}:\n"
                f"uid:-::::{created}::{uid_hash}::{uid}::::::::::0:\n"
                f"sub:-:255:18:{sub[-16:]}:{created}::::::e:::::cv25519::\n"
                f"fpr:::::::::{sub}:\n")
        else:
            out(f"pub   ed25519 2023-11-14 [SC]\n      {fpr}\nuid                      {uid}\n"
                "sub   cv25519 2023-11-14 [E]\n\n")
    return 0


# -- the NVIDIA container toolkit CLI -------------------------------------------------
def _toml_key(k: str) -> str:
    return k if re.match(r"^[A-Za-z0-9_-]+$", k) else json.dumps(k)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def toml_dump(d: dict, prefix: tuple[str, ...] = ()) -> str:
    """A TOML writer for containerd's config (tables, scalars, arrays), as nvidia-ctk rewrites the file."""
    lines = []
    scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in d.items() if isinstance(v, dict)}
    if prefix:
        lines.append("")
        lines.append("[" + ".".join(_toml_key(k) for k in prefix) + "]")
    for k, v in scalars.items():
        lines.append(f"{'  ' * len(prefix)}{_toml_key(k)} = {_toml_value(v)}")
    text = "\n".join(lines) + ("\n" if lines else "")
    for k, v in tables.items():
        text += toml_dump(v, (*prefix, k))
    return text


def nvidia_ctk(h: Host, args: list[str]) -> int:
    if args[:1] == ["--version"]:
        v = h.state.get("packages", {}).get("nvidia-container-toolkit-base", "1.17.8-1").split("-")[0]
        out(f"NVIDIA Container Toolkit CLI version {v}\ncommit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d\n")
        return 0
    if args[:2] != ["runtime", "configure"]:
        err("nvidia-ctk: only 'runtime configure' and --version exist in the lab\n")
        return 1
    opts = dict(a[2:].split("=", 1) for a in args[2:] if a.startswith("--") and "=" in a)
    default = "--set-as-default" in args
    rt = opts.get("runtime", "docker")
    if rt == "containerd":
        path = Path(opts.get("config", "/etc/containerd/config.toml"))
        cfg = tomllib.loads(path.read_text()) if path.exists() else {}
        version = cfg.get("version", 1)
        plugin = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}.get(version, "cri")
        c = cfg.setdefault("plugins", {}).setdefault(plugin, {}).setdefault("containerd", {})
        runc = c.get("runtimes", {}).get("runc", {})
        nv = {"runtime_type": "io.containerd.runc.v2", "privileged_without_host_devices": False,
              "options": {**runc.get("options", {}), "BinaryName": "/usr/bin/nvidia-container-runtime"}}
        c.setdefault("runtimes", {})["nvidia"] = nv
        if default:
            c["default_runtime_name"] = "nvidia"
        path.write_text(toml_dump(cfg))
        err(f"INFO[0000] Wrote updated config to {path}\n")
        return 0
    path = Path(opts.get("config", "/etc/docker/daemon.json"))
    d = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
    d.setdefault("runtimes", {})["nvidia"] = {"path": "nvidia-container-runtime", "args": []}
    if default:
        d["default-runtime"] = "nvidia"
    path.write_text(json.dumps(d, indent=4) + "\n")
    return 0


# -- Kubernetes binaries (their cluster behaviour is faked elsewhere) ------------------
def _k8s_version(h: Host, pkg: str) -> str:
    return "v" + h.state.get("packages", {}).get(pkg, "1.30.0-1.1").split("-")[0]


def kubelet(h: Host, args: list[str]) -> int:
    out(f"Kubernetes {_k8s_version(h, 'kubelet')}\n")
    return 0


def kubeadm(h: Host, args: list[str]) -> int:
    import kube  # the simulated cluster, next to this file

    return kube.kubeadm(h, args)


def kubectl(h: Host, args: list[str]) -> int:
    import kube

    return kube.kubectl(h, args)


def noop(h: Host, args: list[str]) -> int:
    return 0


COMMANDS = {
    "nvidia-smi": nvidia_smi, "lsmod": lsmod, "modprobe": modprobe, "sysctl": sysctl, "swapon": swapon,
    "swapoff": swapoff, "systemctl": systemctl, "uname": uname, "nproc": nproc, "docker": docker,
    "containerd": containerd, "apt-get": apt_get, "dnf": dnf, "yum": dnf, "dpkg-query": dpkg_query,
    "dpkg": noop, "apt-mark": apt_mark, "rpm": rpm, "curl": curl, "gpg": gpg, "nvidia-ctk": nvidia_ctk,
    "kubelet": kubelet, "kubeadm": kubeadm, "kubectl": kubectl,
    "conntrack": noop, "socat": noop, "ebtables": noop, "ethtool": noop,
}


def read_only(name: str, args: list[str]) -> bool:
    """Whether `name ARGS` only reads host.json and state.json: no other file, no change, no network, no
    child process. The lab's fake server answers these in its own process (server.py); the others, and
    any command with a delay or a slow or huge override, run as a process of their own. Keep this in step
    with the functions above: a command listed here that touches anything else would see the wrong host."""
    words = [a for a in args if not a.startswith("-")]
    if name in ("nvidia-smi", "lsmod", "swapon", "uname", "nproc", "dpkg-query", "rpm", "conntrack", "socat",
                "ebtables", "ethtool", "dpkg"):
        return True
    if name == "sysctl":
        return not any("=" in a or a in ("-w", "--write", "-p", "--load", "--system") or a.startswith("-p")
                       for a in args)
    if name == "systemctl":
        return words[:1] in (["is-active"], ["is-enabled"], [])
    if name == "containerd":
        return args[:1] in (["--version"], ["-v"])
    if name in ("docker", "kubelet", "nvidia-ctk"):
        return args[:1] == ["--version"]
    if name == "apt-mark":
        return words[:1] == ["showhold"]
    return False


def main() -> int:
    name, args = sys.argv[1], sys.argv[2:]
    if name == "kube-apiserver":  # started by the fake kubeadm init; not a command of the host
        import kube

        return kube.apiserver(args[0])
    record([name, *args])
    h = Host()
    ov = h.state.get("overrides", {}).get(name)
    delay = float(h.state.get("delays", {}).get(name, 0))
    if ov is not None or delay:
        h.release()  # a slow or huge command must not hold the state lock that other fakes need
    if delay:
        time.sleep(delay)
        h = Host()
    if ov is not None:
        time.sleep(float(ov.get("sleep", 0)))
        text = ov.get("stdout", "")
        for _ in range(int(ov.get("repeat", 1))):  # a huge output, written as it is made
            out(text)
        err(ov.get("stderr", ""))
        return int(ov.get("exit", 0))
    return COMMANDS[name](h, args)


if __name__ == "__main__":
    sys.exit(main())
