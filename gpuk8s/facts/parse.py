"""Pure parsers: probe output (text) in, typed facts out. No I/O, no SSH.

Every parser accepts any text: it returns a value or raises ParseError, never anything else, in time
linear in the text's size (a host controls that text: up to 1 MiB of it). Numbers are ASCII digits only
("²".isdigit() is True, and int("²") raises).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any

from gpuk8s.errors import ParseError
from gpuk8s.facts.driver import parse_driver
from gpuk8s.facts.fabric import parse_ibstatus, parse_lspci_acs, parse_net_mtu, parse_show_gids, parse_topo
from gpuk8s.facts.mig import parse_section as parse_mig_section
from gpuk8s.facts.model import (
    GPU,
    ContainerdConfig,
    DockerDaemon,
    GPUInfo,
    HostFacts,
    MigFacts,
    OSFamily,
    OSInfo,
    Runtime,
    SourceReach,
)
from gpuk8s.text import ascii_int
from gpuk8s.versions import release

_BEGIN = re.compile(r"^@@gpuk8s-begin (\S+)$")
_END = re.compile(r"^@@gpuk8s-end (\S+) (-?[0-9]{1,9})$")


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
        if not line.startswith("@@gpuk8s-"):
            if name is not None:
                buf.append(line)
            continue
        # Inside a section, a begin line is text (a file's content): it cannot hijack the sections.
        m = _BEGIN.match(line) if name is None else None
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


def _ascii_int(text: str, max_digits: int = 18) -> int | None:
    return ascii_int(text.strip(), max_digits)


_SHELL_ESCAPE = re.compile(r"\\(.)", re.S)


def _unquote(raw: str) -> str:
    """An os-release value: "double-quoted" with backslash escapes, 'single-quoted', or bare."""
    v = raw.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return _SHELL_ESCAPE.sub(r"\1", v[1:-1]) if v[0] == '"' else v[1:-1]
    return v


def parse_os_release(text: str) -> OSInfo:
    values: dict[str, str] = {}
    for line in text.splitlines():
        if "=" not in line or line.lstrip().startswith("#"):
            continue
        key, _, raw = line.partition("=")
        values[key.strip()] = _unquote(raw)
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
        first = next((ln.strip()[:300] for ln in text.splitlines() if ln.strip()), f"exit status {section.rc}")
        return GPUInfo("failed", error=f"{first} (exit status {section.rc})")
    if text in ("", "No devices were found"):
        return GPUInfo("failed", error=text or "nvidia-smi listed no GPUs")
    gpus: list[GPU] = []
    driver = None
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        index = _ascii_int(cols[0], 6) if len(cols) == 6 else None
        if index is None:
            return GPUInfo("failed", error=f"unexpected nvidia-smi output: {line[:120]!r}")
        gpus.append(GPU(index, cols[1], cols[2], _ascii_int(cols[4].replace("MiB", ""), 12), cols[5]))
        driver = driver or cols[3]
    return GPUInfo("ok", driver, release(driver or ""), _cuda_version(version_section), tuple(gpus))


_CUDA_VERSION = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")


def _cuda_version(section: Section | None) -> str | None:
    """The CUDA version `nvidia-smi --version` reports: `CUDA Version : 13.1` up to R595; from R610 on that line
    reads `CUDA version : Deprecated, see "CUDA UMD version" instead` and `CUDA UMD version : 13.3` carries the
    number (real captures: tests/fixtures/real/nvidia-smi/version-*)."""
    if section is None or not section.ok:
        return None
    found: dict[str, str] = {}
    for ln in section.output.splitlines():
        key, sep, value = ln.partition(":")
        words = value.split()
        if sep and words and _CUDA_VERSION.fullmatch(words[0]):
            found.setdefault(" ".join(key.split()).lower(), words[0])
    return found.get("cuda umd version") or found.get("cuda version")


def parse_compute_caps(section: Section | None) -> tuple[str, ...]:
    """`nvidia-smi --query-gpu=compute_cap --format=csv,noheader`: one "M.m" per GPU; () when nvidia-smi fails
    or does not know the field (drivers before R510: 'Field "compute_cap" is not a valid field to query.')."""
    if section is None or not section.ok:
        return ()
    out = []
    for line in section.output.splitlines():
        if not line.strip():
            continue
        if not re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", line.strip()):
            return ()
        out.append(line.strip())
    return tuple(out)


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
    return Runtime(name, text.splitlines()[0][:200] if text else "", release(text_v), _active(active))


def _active(section: Section | None) -> bool | None:
    if section is None or section.missing:
        return None
    return section.output.strip() == "active"


CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROPINS = "/etc/containerd/conf.d/*.toml"
# The probe sends at most this much of a section (head -c); more can only come from a forged probe.
SECTION_CAP = 262144
TOO_LARGE = f"is larger than the {SECTION_CAP // 1024} KiB the probe reads"
# The CRI plugin's id in containerd config version 1, 2 and 3.
_CRI_PLUGINS = ("cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
# Dots outside strings on one line; containerd's deepest keys have 5. tomllib builds a key as a tuple
# part by part, so a key of n parts costs n**2: a 256 KiB key would take minutes and gigabytes.
_MAX_DOTS = 64
_MAX_NESTING = 64

_TOML_STOP = re.compile(r"""[.#"']|\n+""")
_WS = re.compile(r"[ \t]*")
_BLANK = re.compile(r"(?:[ \t\r\n]|#[^\n]*)*")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# Every alternation below starts with disjoint characters: no backtracking, linear time.
_BASIC = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_LITERAL = re.compile(r"'([^'\n]*)'")
_ML_BASIC = re.compile(r'"""\n?((?:[^"\\]|\\.|"(?!""))*)"""("{0,2})', re.S)
_ML_LITERAL = re.compile(r"'''\n?((?:[^']|'(?!''))*)'''('{0,2})")
_SCALAR = re.compile(r"[0-9A-Za-z_+\-.:]+(?: [0-9]{2}:[0-9A-Za-z_+\-.:]*)?")
_INT = re.compile(r"[+-]?[0-9]+|0x[0-9A-Fa-f]+|0o[0-7]+|0b[01]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|inf|nan)")
_DATETIME = re.compile(r"(?:[0-9]{4}-[0-9]{2}-[0-9]{2})?(?:(?<=[0-9])[Tt ])?"
                       r"(?:[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?)?(?:(?<=[0-9])(?:[Zz]|[+-][0-9]{2}:[0-9]{2}))?")
_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|[btnfr\"\\]|[ \t]*\r?\n[ \t\r\n]*)")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def _scan_toml_dots(text: str) -> str | None:
    """An error if a line has more than _MAX_DOTS dots outside strings and comments, else None.

    Keys never span lines, so this bounds every key tomllib will build. Strings are skipped as TOML
    reads them (a multi-line string's closing quotes may be followed by two more of its content).
    """
    pos, line, dots, n = 0, 1, 0, len(text)
    while pos < n:
        m = _TOML_STOP.search(text, pos)
        if m is None:
            return None
        c, pos = m.group(), m.end()
        if c == ".":
            dots += 1
            if dots > _MAX_DOTS:
                return f"line {line} has more than {_MAX_DOTS} dotted key parts: gpuk8s does not read keys that deep"
        elif c[0] == "\n":
            line, dots = line + len(c), 0
        elif c == "#":
            nl = text.find("\n", pos)
            pos = n if nl < 0 else nl
        else:
            if text.startswith(c * 2, pos):
                end = (_ML_BASIC if c == '"' else _ML_LITERAL).match(text, pos - 1)
            else:
                end = (_BASIC if c == '"' else _LITERAL).match(text, pos - 1)
            if end is None:
                return None  # unterminated: the TOML reader stops with an error here and reads nothing after
            line += text.count("\n", pos, end.end())
            pos = end.end()
    return None


class _TomlError(ValueError):
    pass


def _unescape(raw: str) -> str:
    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "uU":
            code = int(e[1:], 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise _TomlError(f"invalid unicode escape \\{e}")
            return chr(code)
        return _ESCAPES.get(e, "")  # else a line-ending backslash: it eats the newline and the indent

    return _ESCAPE.sub(one, raw)


class _MiniToml:
    """The TOML that containerd and nvidia-ctk write, read in linear time, for Python 3.10 (no tomllib).

    Strict about syntax (a broken file is an error, as with tomllib), a little more lenient about
    semantics (digit separators, leading zeros). Dates and times stay strings: gpuk8s reads none.
    """

    def __init__(self, src: str) -> None:
        self.src, self.pos = src, 0
        self.headers: set[int] = set()  # the tables that a [header] defined, by id

    def fail(self, what: str) -> _TomlError:
        line = self.src.count("\n", 0, self.pos) + 1
        return _TomlError(f"{what} (at line {line})")

    def skip(self, pattern: re.Pattern[str]) -> None:
        m = pattern.match(self.src, self.pos)
        if m:
            self.pos = m.end()

    def at(self, token: str) -> bool:
        return self.src.startswith(token, self.pos)

    def eat(self, token: str) -> None:
        self.skip(_WS)
        if not self.at(token):
            raise self.fail(f"expected {token!r}")
        self.pos += len(token)

    def document(self) -> dict[str, Any]:
        root: dict[str, Any] = {}
        table = root
        while True:
            self.skip(_BLANK)
            if self.pos >= len(self.src):
                return root
            if self.at("[["):
                self.pos += 2
                key = self.key()
                self.eat("]]")
                items = self.walk(root, key[:-1]).setdefault(key[-1], [])
                if not isinstance(items, list):
                    raise self.fail(f"{'.'.join(key)} is not an array of tables")
                table = {}
                items.append(table)
            elif self.at("["):
                self.pos += 1
                key = self.key()
                self.eat("]")
                table = self.walk(root, key)
                if id(table) in self.headers:
                    raise self.fail(f"table {'.'.join(key)} is defined twice")
                self.headers.add(id(table))
            else:
                self.assign(table, self.key(), self.value_after_equals(0))
            self.skip(_WS)
            if self.at("#"):
                self.pos = len(self.src) if (nl := self.src.find("\n", self.pos)) < 0 else nl
            if not (self.pos >= len(self.src) or self.at("\n") or self.at("\r\n")):
                raise self.fail("expected the end of the line")

    def key(self) -> list[str]:
        parts: list[str] = []
        while True:
            self.skip(_WS)
            if m := _BARE_KEY.match(self.src, self.pos):
                parts.append(m.group())
            elif m := _BASIC.match(self.src, self.pos):
                parts.append(_unescape(m.group(1)))
            elif m := _LITERAL.match(self.src, self.pos):
                parts.append(m.group(1))
            else:
                raise self.fail("expected a key")
            self.pos = m.end()
            self.skip(_WS)
            if not self.at("."):
                return parts
            self.pos += 1

    def walk(self, table: dict[str, Any], key: list[str]) -> dict[str, Any]:
        for part in key:
            nxt = table.setdefault(part, {})
            if isinstance(nxt, list) and nxt and isinstance(nxt[-1], dict):
                nxt = nxt[-1]
            if not isinstance(nxt, dict):
                raise self.fail(f"{part} is not a table")
            table = nxt
        return table

    def assign(self, table: dict[str, Any], key: list[str], value: object) -> None:
        parent = self.walk(table, key[:-1])
        if key[-1] in parent:
            raise self.fail(f"{'.'.join(key)} is defined twice")
        parent[key[-1]] = value

    def value_after_equals(self, depth: int) -> object:
        self.eat("=")
        self.skip(_WS)
        return self.value(depth)

    def value(self, depth: int) -> object:
        if depth > _MAX_NESTING:
            raise self.fail("arrays or inline tables nested too deeply")
        src, pos = self.src, self.pos
        c = src[pos] if pos < len(src) else ""
        if c == "[":
            self.pos += 1
            items: list[object] = []
            while True:
                self.skip(_BLANK)
                if self.at("]"):
                    self.pos += 1
                    return items
                items.append(self.value(depth + 1))
                self.skip(_BLANK)
                if self.at(","):
                    self.pos += 1
                elif not self.at("]"):
                    raise self.fail("expected ',' or ']'")
        if c == "{":
            self.pos += 1
            table: dict[str, Any] = {}
            self.skip(_WS)
            if self.at("}"):
                self.pos += 1
                return table
            while True:
                self.assign(table, self.key(), self.value_after_equals(depth + 1))
                self.skip(_WS)
                if self.at("}"):
                    self.pos += 1
                    return table
                self.eat(",")
        if c and c in "\"'":
            multi = src.startswith(c * 3, pos)
            pattern = (_ML_BASIC if multi else _BASIC) if c == '"' else (_ML_LITERAL if multi else _LITERAL)
            m = pattern.match(src, pos)
            if m is None:
                raise self.fail("unterminated string")
            self.pos = m.end()
            text = _unescape(m.group(1)) if c == '"' else m.group(1)
            return text + m.group(2) if multi else text
        m = _SCALAR.match(src, pos)
        if m is None:
            raise self.fail("expected a value")
        self.pos = m.end()
        word = m.group()
        if word in ("true", "false"):
            return word == "true"
        plain = word.replace("_", "")  # digit separators (tomllib is stricter about where they stand)
        if len(plain) <= 4000 and _INT.fullmatch(plain):
            return int(plain, 0) if plain[1:2] in ("x", "o", "b") else int(plain)
        if len(plain) <= 4000 and _FLOAT.fullmatch(plain):
            return float(plain)
        if word and _DATETIME.fullmatch(word):
            return word
        raise self.fail(f"invalid value {word[:40]!r}")


def parse_toml(text: str, limit: int = SECTION_CAP) -> dict[str, Any]:
    """A TOML document as nested dicts: tomllib, or a linear-time reader on Python 3.10.

    Any text gives a value or ParseError, in time linear in its size (at most `limit` characters)."""
    if len(text) > limit:
        raise ParseError(f"more than {limit} characters")
    problem = _scan_toml_dots(text)
    if problem:
        raise ParseError(problem)
    try:
        if sys.version_info >= (3, 11):
            import tomllib

            return tomllib.loads(text)
        return _MiniToml(text).document()
    except RecursionError:
        raise ParseError("arrays or inline tables nested too deeply") from None
    except ValueError as e:  # TOMLDecodeError, _TomlError, an integer of more than 4300 digits
        raise ParseError(str(e)[:200]) from None


def _dropin_files(text: str) -> list[tuple[str, str]]:
    """The probe frames each drop-in with a line '@@file PATH', which no TOML file can hold. Text
    before the first frame (as an older probe sent it: the files concatenated) counts as one file."""
    files: list[tuple[str, list[str]]] = [(CONTAINERD_DROPINS, [])]
    for line in text.split("\n"):
        if line.startswith("@@file "):
            files.append((line[7:].strip(), []))
        else:
            files[-1][1].append(line)
    if not any(ln.strip() for ln in files[0][1]):
        files.pop(0)
    return [(path, "\n".join(lines)) for path, lines in files]


def _dig(data: object, *keys: str) -> object:
    for k in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(k)
    return data


def _strings(value: object) -> list[str]:
    return [str(x) for x in value if isinstance(x, (str, int))] if isinstance(value, list) else []


def parse_containerd_config(section: Section | None, dropins: Section | None = None) -> ContainerdConfig:
    """config.toml, then each drop-in in order, merged as containerd merges imports: a later value wins,
    tables merge, disabled_plugins and imports accumulate. A file that is not valid TOML is an error."""
    if section is None or not (section.ok or section.rc == 141):
        return ContainerdConfig(False)
    files = [(CONTAINERD_CONFIG, section)]
    if dropins is not None and (dropins.ok or dropins.rc == 141):
        files.append((CONTAINERD_DROPINS, dropins))
    docs: list[tuple[str, str]] = []
    for path, sec in files:
        if sec.rc == 141 or len(sec.output) > SECTION_CAP:  # 141: cut off by the probe's head -c
            return ContainerdConfig(True, error=f"{path} {TOO_LARGE}", error_file=path)
        docs += [(path, sec.output)] if path == CONTAINERD_CONFIG else _dropin_files(sec.output)
    disabled: dict[str, None] = {}  # ordered sets
    imports: dict[str, None] = {}
    default_rt: str | None = None
    systemd: bool | None = None
    nvidia = False
    cdi: bool | None = None
    for path, text in docs:
        try:
            data = parse_toml(text)
        except ParseError as e:
            return ContainerdConfig(True, error=f"{path} is not valid TOML: {e}; containerd does not start with it",
                                    error_file=path)
        disabled.update(dict.fromkeys(_strings(data.get("disabled_plugins"))))
        imports.update(dict.fromkeys(_strings(data.get("imports"))))
        for plugin in _CRI_PLUGINS:
            # CDI (containerd docs/cri/config.md): plugins."io.containerd.grpc.v1.cri".enable_cdi in a version 2
            # config, plugins."io.containerd.cri.v1.runtime".enable_cdi in version 3
            enable = _dig(data, "plugins", plugin, "enable_cdi")
            if isinstance(enable, bool):
                cdi = enable
            cri = _dig(data, "plugins", plugin, "containerd")
            rt_name = _dig(cri, "default_runtime_name")
            if isinstance(rt_name, str):
                default_rt = rt_name
            runtimes = _dig(cri, "runtimes")
            cgroup = _dig(runtimes, "runc", "options", "SystemdCgroup")
            if isinstance(cgroup, bool):
                systemd = cgroup
            if isinstance(runtimes, dict) and any(k.startswith("nvidia") for k in runtimes):
                nvidia = True
    return ContainerdConfig(True, tuple(disabled), default_rt, systemd, nvidia, tuple(imports), cdi)


def parse_cgroup_version(section: Section | None) -> int | None:
    """`stat -fc %T /sys/fs/cgroup/`: cgroup2fs is cgroup v2; tmpfs is v1 (or hybrid, which the kubelet treats as
    v1); anything else (no stat, no mount) is unknown."""
    if section is None or not section.ok:
        return None
    kind = section.output.strip()
    return {"cgroup2fs": 2, "tmpfs": 1}.get(kind)


def parse_configd(section: Section | None) -> tuple[str, ...]:
    """The *.toml files the probe found in /etc/containerd/config.d/, one path a line (at most 32 kept)."""
    if section is None or not section.ok:
        return ()
    paths = [ln.strip() for ln in section.output.splitlines()
             if ln.startswith("/etc/containerd/config.d/") and ln.strip().endswith(".toml") and len(ln) < 300]
    return tuple(paths[:32])


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


_MEMTOTAL = re.compile(r"MemTotal:[ \t]+([0-9]{1,15})[ \t]*kB")


def parse_meminfo_mb(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            m = _MEMTOTAL.match(line)
            return int(m.group(1)) // 1024 if m else None
    return None


def parse_listening_ports(section: Section | None) -> frozenset[int] | None:
    """`ss -Htln`: State Recv-Q Send-Q Local:Port Peer:Port."""
    if section is None or not section.ok:
        return None
    ports = set()
    for line in section.output.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            port = _ascii_int(parts[3].rpartition(":")[2], 5)
            if port is not None:
                ports.add(port)
    return frozenset(ports)


_MAC = re.compile(r"link/ether ([0-9a-f]{2}(?::[0-9a-f]{2}){5})")


def parse_macs(text: str) -> tuple[str, ...]:
    macs = []
    for line in text.splitlines():
        if "link/ether " not in line or " lo:" in line:
            continue
        m = _MAC.search(line)
        if m and m.group(1) != "00:00:00:00:00:00":
            macs.append(m.group(1))
    return tuple(macs)


def _int(text: str) -> int | None:
    return _ascii_int(text, 11)


def _epoch(text: str) -> float | None:
    """`date +%s.%N` (a date without %N prints it literally: then None)."""
    whole, dot, frac = text.strip().partition(".")
    if _ascii_int(whole, 12) is None or (dot and _ascii_int(frac, 12) is None):
        return None
    return float(f"{whole}.{frac or 0}")


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
        compute_caps=parse_compute_caps(s.get("nvidia-smi-cc")),
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
        time=_epoch(out("time")),
        raw_errors=errors,
        mig=parse_mig_section(s["mig"].output, s["mig"].rc) if "mig" in s else MigFacts(),
        cgroup_version=parse_cgroup_version(s.get("cgroupfs")),
        containerd_configd=parse_configd(s.get("containerd-configd")),
        sources=parse_sources(out("sources")),
        driver=parse_driver(out("driver"), out("nvidia-proc")),
        rdma=parse_ibstatus(s["rdma"].output) if "rdma" in s and s["rdma"].ok else None,
        gids=parse_show_gids(s["gids"].output) if "gids" in s and s["gids"].ok else None,
        netdev_mtu=parse_net_mtu(s["netmtu"].output) if "netmtu" in s and s["netmtu"].ok else None,
        topo=parse_topo(s["topo"].output) if "topo" in s and s["topo"].ok else None,
        acs=parse_lspci_acs(s["acs"].output) if "acs" in s and s["acs"].ok else None,
    )


_SOURCE_LINE = re.compile(r"^([0-9]{1,3}) ([0-9]{3}) (https?://\S{1,2000})$")


def parse_sources(text: str) -> tuple[SourceReach, ...]:
    """The probe's `sources` lines, "CURL_EXIT HTTP_CODE URL"; other lines are left out (host output is hostile:
    the check only reads the URLs it asked for)."""
    out = []
    for line in text.splitlines():
        m = _SOURCE_LINE.match(line.strip())
        if m:
            out.append(SourceReach(m.group(3), int(m.group(1)), int(m.group(2))))
    return tuple(out)
