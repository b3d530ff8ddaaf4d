"""Faked commands of a lab host, driven by the host's fleet spec and its own state.

Installed as /usr/bin/NAME wrappers inside each lab host's view: `fake.py NAME ARGS...`. Runs with
the system python3 and the standard library only. Every call records its argv, so tests can prove
what ran and that no secret was ever on a command line. Any command's stdout, stderr and exit
status can be replaced verbatim through the state's "overrides".
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
from pathlib import Path

STATE_DIR = Path("/var/lib/gpuk8s-lab")
LAB_ROOT = Path(__file__).resolve().parent.parent


class Host:
    def __init__(self) -> None:
        self.spec = json.loads((STATE_DIR / "host.json").read_text())
        self._lock = open(STATE_DIR / "state.json", "r+")  # noqa: SIM115 (held, locked, until exit)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.state = json.loads(self._lock.read() or "{}")

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
    if verb == "is-active":
        rc = 0
        for u in units:
            st = svc.get(u, "inactive")
            out(st + "\n")
            rc = rc or (0 if st == "active" else 3)
        return rc
    if verb in ("start", "restart", "reload") or (verb == "enable" and "--now" in args):
        for u in units:
            if u == "containerd" and not _installed(h, "containerd"):
                err(f"Failed to {verb} {u}.service: Unit {u}.service not found.\n")
                return 5
            svc[u] = "active"
    elif verb == "stop":
        for u in units:
            svc[u] = "inactive"
    h.save()
    return 0


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
        out(f"Server Version: {v}\nDefault Runtime: {cfg.get('default-runtime', 'runc')}\n")
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


# -- packages ------------------------------------------------------------------
def _install(h: Host, pkgs: list[str]) -> None:
    for p in pkgs:
        name = re.split(r"[=<>]", p, maxsplit=1)[0]
        h.state.setdefault("packages", {})[name] = p
    h.save()


def apt_get(h: Host, args: list[str]) -> int:
    words = [a for a in args if not a.startswith("-")]
    if words[:1] == ["install"]:
        _install(h, words[1:])
    return 0


def dnf(h: Host, args: list[str]) -> int:
    return apt_get(h, args)


def dpkg_query(h: Host, args: list[str]) -> int:
    rc = 0
    for p in [a for a in args if not a.startswith("-")]:
        if p in h.state.get("packages", {}):
            out(f"{p}\t{h.state['packages'][p]}\n")
        else:
            err(f"dpkg-query: no packages found matching {p}\n")
            rc = 1
    return rc


def noop(h: Host, args: list[str]) -> int:
    return 0


COMMANDS = {
    "nvidia-smi": nvidia_smi, "lsmod": lsmod, "modprobe": modprobe, "sysctl": sysctl, "swapon": swapon,
    "swapoff": swapoff, "systemctl": systemctl, "uname": uname, "nproc": nproc, "docker": docker,
    "containerd": containerd, "apt-get": apt_get, "dnf": dnf, "yum": dnf, "dpkg-query": dpkg_query,
    "dpkg": noop, "apt-mark": noop, "rpm": dpkg_query,
    "conntrack": noop, "socat": noop, "ebtables": noop, "ethtool": noop,
}


def main() -> int:
    name, args = sys.argv[1], sys.argv[2:]
    record([name, *args])
    h = Host()
    ov = h.state.get("overrides", {}).get(name)
    if ov is not None:
        out(ov.get("stdout", ""))
        err(ov.get("stderr", ""))
        return int(ov.get("exit", 0))
    return COMMANDS[name](h, args)


if __name__ == "__main__":
    sys.exit(main())
