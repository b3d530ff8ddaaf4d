"""Pure parsers: probe output (text) in, typed facts out. No I/O, no SSH.

Every parser accepts any text: it returns a value or raises ParseError, never anything else.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from gpuk8s.facts.model import (
    GPU,
    ContainerdConfig,
    DockerDaemon,
    GPUInfo,
    HostFacts,
    OSFamily,
    OSInfo,
    Runtime,
)
from gpuk8s.versions import release

_BEGIN = re.compile(r"^@@gpuk8s-begin (\S+)$")
_END = re.compile(r"^@@gpuk8s-end (\S+) (-?\d+)$")


class ParseError(ValueError):
    """Output that cannot be understood."""


@dataclass(frozen=True)
class Section:
    output: str
    rc: int

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def missing(self) -> bool:
        return self.rc == 127


def split_sections(text: str) -> dict[str, Section]:
    """Split the probe's framed output into named sections."""
    out: dict[str, Section] = {}
    name: str | None = None
    buf: list[str] = []
    for line in text.splitlines():
        m = _BEGIN.match(line)
        if m:
            name, buf = m.group(1), []
            continue
        m = _END.match(line)
        if m and name is not None and name == m.group(1):
            body = "\n".join(buf)
            out[name] = Section(body[:-1] if body.endswith("\n") else body.rstrip("\n"), int(m.group(2)))
            name = None
            continue
        if name is not None:
            buf.append(line)
    if not out and text.strip():
        raise ParseError("no probe sections found in the output")
    return out


def parse_os_release(text: str) -> OSInfo:
    values: dict[str, str] = {}
    for line in text.splitlines():
        if "=" not in line or line.lstrip().startswith("#"):
            continue
        key, _, raw = line.partition("=")
        try:
            parts = shlex.split(raw)
        except ValueError:
            parts = [raw.strip().strip("\"'")]
        values[key.strip()] = " ".join(parts)
    os_id = values.get("ID", "").lower()
    like = tuple(values.get("ID_LIKE", "").lower().split())
    family: OSFamily = "unknown"
    # ID first, then ID_LIKE; NAME is never used to decide.
    for candidate in (os_id, *like):
        if candidate in ("debian", "ubuntu"):
            family = "debian"
            break
        if candidate in ("rhel", "centos", "fedora", "rocky", "almalinux", "alinux", "anolis"):
            family = "rhel"
            break
    return OSInfo(os_id, like, values.get("VERSION_ID", ""), values.get("PRETTY_NAME", ""), family)


def parse_nvidia_smi(section: Section | None, version_section: Section | None = None) -> GPUInfo:
    """`nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,mig.mode.current
    --format=csv,noheader,nounits` and optionally `nvidia-smi --version`."""
    if section is None or section.missing:
        return GPUInfo("absent", error="nvidia-smi: command not found")
    text = section.output.strip()
    if section.rc != 0:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), f"exit status {section.rc}")
        return GPUInfo("failed", error=f"{first} (exit status {section.rc})")
    if text in ("", "No devices were found"):
        return GPUInfo("failed", error=text or "nvidia-smi listed no GPUs")
    gpus: list[GPU] = []
    driver = None
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 6 or not cols[0].isdigit():
            return GPUInfo("failed", error=f"unexpected nvidia-smi output: {line[:120]!r}")
        mem = cols[4].replace("MiB", "").strip()
        gpus.append(GPU(int(cols[0]), cols[1], cols[2], int(mem) if mem.isdigit() else None, cols[5]))
        driver = driver or cols[3]
    cuda = None
    if version_section is not None and version_section.ok:
        m = re.search(r"^CUDA Version\s*:\s*(\S+)", version_section.output, re.M)
        cuda = m.group(1) if m else None
    return GPUInfo("ok", driver, release(driver or ""), cuda, tuple(gpus))


def parse_runtime_version(name: str, section: Section | None, active: Section | None) -> Runtime | None:
    if section is None or section.missing or not section.ok:
        return None
    text = section.output.strip()
    if name == "containerd":
        # "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3": the
        # version is the third field; the package path must not be read as one.
        fields = text.split()
        text_v = fields[2] if len(fields) >= 3 else text
    else:
        text_v = text.split(",")[0]
    return Runtime(name, text.splitlines()[0] if text else "", release(text_v), _active(active))


def _active(section: Section | None) -> bool | None:
    if section is None or section.missing:
        return None
    return section.output.strip() == "active"


_TABLE = re.compile(r"^\s*\[\[?\s*(.+?)\s*\]\]?\s*(#.*)?$")
_KEYVAL = re.compile(r"^\s*([A-Za-z0-9_\-\".]+)\s*=\s*(.*)$")
_QUOTED = re.compile(r"\"((?:[^\"\\]|\\.)*)\"|'([^']*)'")


def _toml_scalar(raw: str) -> object:
    raw = raw.strip()
    if raw.startswith("["):
        return [a or b for a, b in _QUOTED.findall(raw)]
    m = _QUOTED.match(raw)
    if m:
        return m.group(1) if m.group(1) is not None else m.group(2)
    word = raw.split("#", 1)[0].strip()
    if word in ("true", "false"):
        return word == "true"
    try:
        return int(word)
    except ValueError:
        return word


def toml_tables(text: str) -> dict[str, dict[str, object]]:
    """The tables of a machine-written TOML file (containerd's), table name without quotes."""
    tables: dict[str, dict[str, object]] = {"": {}}
    current = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _TABLE.match(line)
        if m and "=" not in m.group(1):
            current = m.group(1).replace('"', "").replace("'", "")
            tables.setdefault(current, {})
            continue
        m = _KEYVAL.match(line)
        if not m:
            continue
        value = m.group(2)
        if value.strip().startswith("[") and value.count("[") > value.count("]"):
            while i < len(lines) and value.count("[") > value.count("]"):
                value += " " + lines[i]
                i += 1
        tables.setdefault(current, {})[m.group(1).replace('"', "")] = _toml_scalar(value)
    return tables


def parse_containerd_config(section: Section | None, dropins: Section | None = None) -> ContainerdConfig:
    if section is None or not section.ok:
        return ContainerdConfig(False)
    text = section.output
    if dropins is not None and dropins.ok:
        text += "\n" + dropins.output
    tables = toml_tables(text)
    top = tables.get("", {})
    disabled = top.get("disabled_plugins", [])
    imports = top.get("imports", [])
    default_rt: str | None = None
    systemd: bool | None = None
    nvidia = False
    for name, kv in tables.items():
        if not ("cri" in name and "containerd" in name):
            continue
        rt_name = kv.get("default_runtime_name")
        if name.endswith(".containerd") and isinstance(rt_name, str):
            default_rt = rt_name
        cgroup = kv.get("SystemdCgroup")
        if name.endswith(".runtimes.runc.options") and isinstance(cgroup, bool):
            systemd = cgroup
        if ".runtimes.nvidia" in name:
            nvidia = True
    return ContainerdConfig(
        True,
        tuple(str(x) for x in disabled) if isinstance(disabled, list) else (),
        default_rt,
        systemd,
        nvidia,
        tuple(str(x) for x in imports) if isinstance(imports, list) else (),
    )


def parse_daemon_json(section: Section | None) -> DockerDaemon:
    if section is None or not section.ok:
        return DockerDaemon(False)
    try:
        data = json.loads(section.output or "{}")
    except (ValueError, RecursionError) as e:
        return DockerDaemon(True, error=f"daemon.json is not valid JSON: {str(e)[:100]}")
    if not isinstance(data, dict):
        return DockerDaemon(True, error="daemon.json is not a JSON object")
    runtimes = data.get("runtimes")
    driver = None
    opts = data.get("exec-opts")
    if isinstance(opts, list):
        for o in opts:
            if isinstance(o, str) and o.startswith("native.cgroupdriver="):
                driver = o.split("=", 1)[1]
    default = data.get("default-runtime")
    return DockerDaemon(True, default if isinstance(default, str) else None,
                        isinstance(runtimes, dict) and "nvidia" in runtimes, driver)


def parse_lsmod(section: Section | None) -> frozenset[str] | None:
    if section is None or not section.ok:
        return None
    mods = set()
    for line in section.output.splitlines()[1:]:
        parts = line.split()
        if parts:
            mods.add(parts[0])
    return frozenset(mods)


def parse_sysctl(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_meminfo_mb(text: str) -> int | None:
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.M)
    return int(m.group(1)) // 1024 if m else None


def parse_listening_ports(section: Section | None) -> frozenset[int] | None:
    """`ss -Htln`: State Recv-Q Send-Q Local:Port Peer:Port."""
    if section is None or not section.ok:
        return None
    ports = set()
    for line in section.output.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            _, _, port = parts[3].rpartition(":")
            if port.isdigit():
                ports.add(int(port))
    return frozenset(ports)


def parse_macs(text: str) -> tuple[str, ...]:
    macs = []
    for line in text.splitlines():
        if " lo:" in line or "link/loopback" in line:
            continue
        m = re.search(r"link/ether ([0-9a-f]{2}(?::[0-9a-f]{2}){5})", line)
        if m and m.group(1) != "00:00:00:00:00:00":
            macs.append(m.group(1))
    return tuple(macs)


def _int(text: str) -> int | None:
    t = text.strip()
    return int(t) if t.isdigit() and len(t) < 12 else None


def _first_line(section: Section | None) -> str | None:
    if section is None or not section.ok:
        return None
    line = section.output.strip().splitlines()
    return line[0].strip() if line else None


def parse_probe(text: str) -> HostFacts:
    s = split_sections(text)

    def out(name: str) -> str:
        sec = s.get(name)
        return sec.output if sec is not None and sec.ok else ""

    time_text = out("time").strip()
    try:
        when: float | None = float(time_text) if time_text else None
    except ValueError:
        when = None
    errors = {k: v.output.strip()[:300] for k, v in s.items() if not v.ok}
    return HostFacts(
        uid=_int(out("uid")),
        hostname=out("hostname").strip(),
        os=parse_os_release(out("os-release")),
        kernel=out("kernel").strip(),
        arch=out("arch").strip(),
        cpus=_int(out("nproc")),
        memory_mb=parse_meminfo_mb(out("meminfo")),
        swap=tuple(ln.split()[0] for ln in out("swap").splitlines() if ln.strip()),
        modules=parse_lsmod(s.get("lsmod")),
        sysctl=parse_sysctl(s["sysctl"].output) if "sysctl" in s else {},
        gpu=parse_nvidia_smi(s.get("nvidia-smi"), s.get("nvidia-smi-version")),
        containerd=parse_runtime_version("containerd", s.get("containerd-version"), s.get("containerd-active")),
        containerd_config=parse_containerd_config(s.get("containerd-config"), s.get("containerd-dropins")),
        docker=parse_runtime_version("docker", s.get("docker-version"), s.get("docker-active")),
        docker_daemon=parse_daemon_json(s.get("docker-daemon")),
        nvidia_ctk=_first_line(s.get("nvidia-ctk")),
        kubeadm=_first_line(s.get("kubeadm")),
        kubelet=_first_line(s.get("kubelet")),
        firewalld_active=_active(s.get("firewalld")) is True,
        tools=frozenset(out("tools").split()),
        listening_ports=parse_listening_ports(s.get("listening")),
        macs=parse_macs(out("links")),
        product_uuid=out("product-uuid").strip().lower() or None,
        machine_id=out("machine-id").strip() or None,
        kube_files=tuple(out("kube-files").split()),
        time=when,
        raw_errors=errors,
    )
