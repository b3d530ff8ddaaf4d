"""The operator's OpenSSH client config (~/.ssh/config): which address, user, port, keys and jump hosts
one host is reached with.

Parsing and matching are paramiko's SSHConfig (OpenSSH's rules: sections apply in file order, the first
value obtained for each keyword wins, IdentityFile accumulates). Before paramiko sees the text, this
module reads it line by line so that nothing in it is ever executed and every keyword gpuk8s does not
honour can be reported with its file:line:
  - `Match exec` (paramiko would run the command) and Match criteria paramiko does not know are turned
    into a section that never matches, with a warning;
  - `Include` is expanded here (globs, relative to ~/.ssh), with the enclosing section restored after it;
  - the values of keywords gpuk8s reads only to report them (ProxyCommand, LocalCommand, HostKeyAlias,
    ...) and of ProxyJump are replaced by a marker naming their line, so that a lookup says which line
    supplied them (and whether ProxyJump or ProxyCommand came first: OpenSSH uses whichever is first);
  - UserKnownHostsFile is tagged the same way: a /dev/null (or any file that is not a regular readable file)
    is ignored with a warning at its line, and the inventory's known_hosts is kept.
Host patterns are matched case-insensitively with only `*` and `?` as wildcards, as OpenSSH does.
The inventory's explicit ssh values win over the file (SSHSettings.explicit says which were written).
Nothing here touches the network.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import paramiko
from paramiko.config import SSHConfig

from gpuk8s.errors import GpuK8sError
from gpuk8s.inventory.model import SSHSettings

DEFAULT_FILE = "~/.ssh/config"
MAX_HOPS = 8
MAX_INCLUDE_DEPTH = 16
MAX_BYTES = 1 << 20

_SETTING = re.compile(r"(\w+)(?:\s*=\s*|\s+)(.+)")
_TAG = re.compile(r"^gpuk8s-line-(\d+)$")
# Read only to report them (or, for ProxyJump, to know its line): their values are replaced by a marker.
_TAGGED = ("proxyjump", "proxycommand", "localcommand", "knownhostscommand", "hostkeyalias", "identityagent",
           "certificatefile", "pkcs11provider", "securitykeyprovider", "stricthostkeychecking",
           "userknownhostsfile")
_MATCH_CRITERIA = ("all", "canonical", "final", "host", "originalhost", "user", "localuser")
_NOT_HONOURED = {
    "proxycommand": ("gpuk8s never runs a ProxyCommand: this host is connected to directly",
                     "use ProxyJump (or ssh.bastion in the inventory) for a jump host"),
    "localcommand": ("gpuk8s never runs a LocalCommand", "nothing to do; it is ignored"),
    "knownhostscommand": ("gpuk8s never runs a KnownHostsCommand: host keys come from the known_hosts file",
                          "put the host keys in the known_hosts file (ssh.known_hosts)"),
    "hostkeyalias": ("HostKeyAlias is not honoured: the host key is looked up under the address connected to",
                     "add the host key to known_hosts under that address ([address]:port for a port other than 22)"),
    "identityagent": ("IdentityAgent is not honoured: the agent is the one $SSH_AUTH_SOCK names",
                      "export SSH_AUTH_SOCK, or name the key with IdentityFile / ssh.identity_file"),
    "certificatefile": ("CertificateFile is not honoured: certificates are not offered",
                        "use a plain key (IdentityFile / ssh.identity_file)"),
    "pkcs11provider": ("PKCS11Provider is not honoured", "load the token's keys into ssh-agent instead"),
    "securitykeyprovider": ("SecurityKeyProvider is not honoured", "load the keys into ssh-agent instead"),
    "stricthostkeychecking": ("StrictHostKeyChecking is not honoured: host keys are always verified against "
                              "known_hosts (ssh.host_key_policy: accept-new trusts hosts seen the first time)",
                              "remove it for these hosts, or set ssh.host_key_policy in the inventory"),
}


class SSHConfigError(GpuK8sError):
    """The ssh config cannot be used; the message names the file and line."""

    def __init__(self, message: str, remedy: str = "", file: str = "", line: int = 0) -> None:
        super().__init__(message, remedy, "ssh-config")
        self.file = file
        self.line = line


@dataclass(frozen=True)
class Note:
    """A keyword of the ssh config gpuk8s read but does not honour, where it was written."""

    file: str
    line: int
    key: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.key}: {self.message} (fix: {self.fix})"


@dataclass(frozen=True)
class Hop:
    """One SSH connection: where, as whom, with which keys, through which jump host (via)."""

    name: str  # as written (inventory address, ssh.alias or a ProxyJump entry), for messages
    address: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()  # empty: the agent and the default keys (~/.ssh/id_*)
    allow_agent: bool = True
    look_for_keys: bool = True
    via: Hop | None = None
    source: str = ""  # "" (inventory only) or the config file that shaped this hop

    def connect_kwargs(self, timeout: float) -> dict[str, object]:
        kw: dict[str, object] = {"banner_timeout": timeout, "auth_timeout": timeout, "channel_timeout": timeout,
                                 "allow_agent": self.allow_agent, "look_for_keys": self.look_for_keys}
        if self.identity_files:
            kw["key_filename"] = list(self.identity_files)
        return kw

    def chain(self) -> list[Hop]:
        """The jump hosts, first connected first, then this hop."""
        out: list[Hop] = []
        h: Hop | None = self
        while h is not None:
            out.append(h)
            h = h.via
        return out[::-1]


@dataclass(frozen=True)
class Resolved:
    target: Hop
    known_hosts: str
    notes: tuple[Note, ...] = ()


@dataclass
class _Line:
    file: str
    line: int
    key: str
    value: str
    index: int  # position in the expanded file: which of two values was obtained first


@dataclass
class ParsedConfig:
    """One ssh config file, expanded and made safe, ready for lookups."""

    path: str
    config: SSHConfig
    lines: list[_Line]
    notes: list[Note] = field(default_factory=list)  # file-level: Match exec, unknown Match criteria

    def source(self, value: object) -> _Line | None:
        m = _TAG.match(value) if isinstance(value, str) else None
        return self.lines[int(m.group(1))] if m else None


def config_path(settings: SSHSettings) -> str | None:
    """The ssh config file these settings read, or None (ssh.config_file: none)."""
    name = settings.config_file
    if name is None or name.lower() == "none":
        return None
    return os.path.expanduser(name)


def parse(path: str, text: str | None = None) -> ParsedConfig:
    """Parse one ssh config file (and what it includes). Raises SSHConfigError with file:line."""
    lines: list[_Line] = []
    notes: list[Note] = []
    out: list[str] = []
    _expand(path, text, out, lines, notes, 0)
    try:
        cfg = SSHConfig.from_text("\n".join(out) + "\n")
    except paramiko.ssh_exception.ConfigParseError as e:  # pre-checked line by line; a remaining case
        raise SSHConfigError(f"{path}: cannot be parsed: {e}", "fix the ssh config", path) from None
    return ParsedConfig(path, cfg, lines, notes)


def _expand(path: str, text: str | None, out: list[str], lines: list[_Line], notes: list[Note], depth: int,
            ) -> None:
    if text is None:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
        except OSError as e:
            raise SSHConfigError(f"cannot read the ssh config {path}: {e.strerror or type(e).__name__}",
                                 "fix ssh.config_file in the inventory, or write ssh.config_file: none", path) from None
        if len(data) > MAX_BYTES:
            raise SSHConfigError(f"the ssh config {path} is larger than 1 MiB", "name the right file", path)
        text = data.decode("utf-8", "replace")
    header = "Host *"  # the section open at this point, restored after an Include
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SETTING.match(line)
        if not m:
            raise SSHConfigError(f"{path}:{no}: cannot parse {line[:80]!r}",
                                 "write 'Keyword value' (see man ssh_config)", path, no)
        key, value = m.group(1).lower(), m.group(2).strip()
        if key == "host":
            try:
                patterns = shlex.split(value)
            except ValueError:
                raise SSHConfigError(f"{path}:{no}: cannot parse the Host patterns", "check the quotes",
                                     path, no) from None
            # OpenSSH patterns know only * and ?; fnmatch would read [..] as a set. Hosts compare lowercased.
            header = "Host " + " ".join(shlex.quote(p.lower().replace("[", "[[]")) for p in patterns)
            out.append(header)
        elif key == "match":
            header = _match(path, no, value, notes)
            out.append(header)
        elif key == "include":
            if depth >= MAX_INCLUDE_DEPTH:
                raise SSHConfigError(f"{path}:{no}: Include nested more than {MAX_INCLUDE_DEPTH} deep",
                                     "check for a file that includes itself", path, no)
            try:
                names = shlex.split(value)
            except ValueError:
                raise SSHConfigError(f"{path}:{no}: cannot parse the Include", "check the quotes",
                                     path, no) from None
            for name in names:
                name = os.path.expanduser(name)
                if not os.path.isabs(name):  # OpenSSH: relative to ~/.ssh for the user's config
                    name = os.path.join(os.path.expanduser("~/.ssh"), name)
                for inc in sorted(glob.glob(name)):
                    _expand(inc, None, out, lines, notes, depth + 1)
            out.append(header)
        elif key in _TAGGED:
            lines.append(_Line(path, no, key, _unquote(value), len(lines)))
            out.append(f"{key} gpuk8s-line-{len(lines) - 1}")
        else:
            out.append(line)


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


def _match(path: str, no: int, value: str, notes: list[Note]) -> str:
    never = "Match host !*"  # a section paramiko never applies
    try:
        tokens = shlex.split(value)
    except ValueError:
        raise SSHConfigError(f"{path}:{no}: cannot parse the Match criteria", "check the quotes", path, no) from None
    criteria = [t.lstrip("!").lower() for i, t in enumerate(tokens)
                if i == 0 or tokens[i - 1].lstrip("!").lower() in ("all", "canonical", "final")
                or _is_criterion(tokens, i)]
    if "exec" in criteria:
        notes.append(Note(path, no, "Match exec", "gpuk8s never runs the command of a Match exec: this section is "
                          "treated as not matching", "use Host patterns for the hosts of the cluster"))
        return never
    unknown = [c for c in criteria if c not in _MATCH_CRITERIA]
    if unknown:
        notes.append(Note(path, no, "Match", f"the Match criteria {', '.join(unknown)} are not supported: this "
                          "section is treated as not matching", "use Host patterns for the hosts of the cluster"))
        return never
    return "Match " + " ".join(shlex.quote(t) for t in tokens)


def _is_criterion(tokens: list[str], i: int) -> bool:
    """Whether tokens[i] is a criterion keyword (rather than the argument of the one before it)."""
    pos = 0
    while pos < len(tokens):
        if pos == i:
            return True
        word = tokens[pos].lstrip("!").lower()
        pos += 1 if word in ("all", "canonical", "final") else 2
    return False


_cache: dict[str, tuple[float, ParsedConfig]] = {}
_DEFAULTS = SSHSettings()
_OVERRIDABLE = ("user", "port", "identity_file", "known_hosts", "bastion")


def load(path: str) -> ParsedConfig | None:
    """The parsed file, or None when it does not exist; re-parsed only when it changed on disk."""
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return None
    cached = _cache.get(path)
    if cached is None or cached[0] != mtime:
        cached = (mtime, parse(path))
        _cache[path] = cached
    return cached[1]


def resolve(address: str, settings: SSHSettings, alias: str | None = None,
            config: ParsedConfig | None = None) -> Resolved:
    """How to reach the host at `address` (looked up in the ssh config as ssh.alias, else as the address).

    `config` is the parsed file; by default the one settings.config_file names (none when it is absent).
    """
    if config is None:
        path = config_path(settings)
        config = load(path) if path else None
    direct = Hop(
        alias or address, address, settings.port, settings.user,
        (os.path.expanduser(settings.identity_file),) if settings.identity_file else (),
        allow_agent=not settings.identity_file, look_for_keys=not settings.identity_file,
        via=_bastion(settings),
    )
    if config is None:
        return Resolved(direct, settings.known_hosts)
    notes: list[Note] = list(config.notes)
    # written in the inventory, or set by a program to something other than the default: wins over the file
    explicit = settings.explicit | {k for k in _OVERRIDABLE if getattr(settings, k) != getattr(_DEFAULTS, k)}
    opts = config.config.lookup((alias or address).lower())
    user = settings.user if "user" in explicit else opts.get("user", settings.user)
    port = settings.port if "port" in explicit else _port(opts.get("port"), config, notes, settings.port)
    _unhonoured(opts, config, notes)  # whichever keys are used: not inside the identity lookup below
    if "identity_file" in explicit:
        ids, agent, look = direct.identity_files, False, False
    else:
        ids, agent, look = _identities(opts, config, notes)
    tokens = {"%h": opts.get("hostname") or address, "%p": str(port), "%r": user, "%n": alias or address}
    via = direct.via if "bastion" in explicit else _jump(opts, config, notes, (), 0, tokens)
    known = settings.known_hosts
    ukh = config.source(opts.get("userknownhostsfile"))
    if "known_hosts" not in explicit and ukh is not None and ukh.value.split():
        # the tokens a user's known_hosts path uses (ssh_config TOKENS: %d home, %u local user)
        first = ukh.value.split()[0].replace("%d", os.path.expanduser("~")).replace("%u", getpass.getuser())
        if first.lower() != "none":
            problem = _unusable_known_hosts(first)
            if problem:
                notes.append(Note(ukh.file, ukh.line, "UserKnownHostsFile", f"{first} {problem}: ignored, host keys "
                                  f"are checked against {settings.known_hosts} (ssh.known_hosts)",
                                  "remove it for these hosts, or name a regular known_hosts file"))
            else:
                known = first
    target = Hop(alias or address, opts.get("hostname") or address, port, user, ids, agent, look, via, config.path)
    return Resolved(target, known, tuple(dict.fromkeys(notes)))


def _unusable_known_hosts(path: str) -> str:
    """Why `path` cannot be a known_hosts file ('' when it can): /dev/null (or any file that is not a regular
    readable file) would hold no key, so accept-new would trust every key on every run. A file that does
    not exist yet is fine: accept-new creates it, and without accept-new every key is refused."""
    p = os.path.expanduser(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return ""
    except OSError as e:
        return f"cannot be read ({e.strerror or type(e).__name__})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if not os.access(p, os.R_OK):
        return "cannot be read"
    return ""


def _bastion(settings: SSHSettings) -> Hop | None:
    b = settings.bastion
    if b is None:
        return None
    key = b.identity_file or settings.identity_file
    return Hop(b.address, b.address, b.port, b.user, (os.path.expanduser(key),) if key else (),
               allow_agent=not key, look_for_keys=not key)


def _port(value: object, config: ParsedConfig, notes: list[Note], default: int) -> int:
    if value is None:
        return default
    try:
        port = int(str(value))
        if 0 < port < 65536:
            return port
    except ValueError:
        pass
    raise SSHConfigError(f"{config.path}: Port {value!r} is not a port number", "write a number from 1 to 65535",
                         config.path)


def _identities(opts: Mapping[str, Any], config: ParsedConfig, notes: list[Note],
                ) -> tuple[tuple[str, ...], bool, bool]:
    """IdentityFile (all of them, in order; missing files skipped as OpenSSH does), the agent unless
    IdentitiesOnly or IdentityAgent none; the default keys only when no IdentityFile is named."""
    files = [os.path.expanduser(f) for f in opts.get("identityfile") or []]
    files = [f for f in files if f.lower() != "none"]
    agent = str(opts.get("identitiesonly", "no")).lower() != "yes"
    src = config.source(opts.get("identityagent"))
    if src is not None:
        if src.value.lower() == "none":
            agent = False
        elif src.value not in ("SSH_AUTH_SOCK", "$SSH_AUTH_SOCK"):
            notes.append(_note(src))
    for key in _IDENTITY_KEYS:
        src = config.source(opts.get(key))
        if src is not None:
            notes.append(_note(src))
    existing = tuple(f for f in files if os.path.exists(f))
    return existing, agent, not files


# What only the file's own identities would use: reported where they are (not with ssh.identity_file).
_IDENTITY_KEYS = ("certificatefile", "pkcs11provider", "securitykeyprovider")
# Reported for every host looked up, whatever its keys: what would run a command or change the host key check.
_HOST_KEYS = ("localcommand", "knownhostscommand", "hostkeyalias", "stricthostkeychecking")


def _unhonoured(opts: Mapping[str, Any], config: ParsedConfig, notes: list[Note]) -> None:
    """Note, at file:line, each keyword of the looked-up host that gpuk8s never honours (LocalCommand,
    KnownHostsCommand, HostKeyAlias, StrictHostKeyChecking other than yes). Nothing is executed either way."""
    for key in _HOST_KEYS:
        src = config.source(opts.get(key))
        if src is not None and not (key == "stricthostkeychecking" and src.value.lower() == "yes"):
            notes.append(_note(src))


def _note(src: _Line) -> Note:
    message, fix = _NOT_HONOURED[src.key]
    return Note(src.file, src.line, _KEY_NAMES.get(src.key, src.key), message, fix)


_KEY_NAMES = {"proxycommand": "ProxyCommand", "localcommand": "LocalCommand", "knownhostscommand": "KnownHostsCommand",
              "hostkeyalias": "HostKeyAlias", "identityagent": "IdentityAgent", "certificatefile": "CertificateFile",
              "pkcs11provider": "PKCS11Provider", "securitykeyprovider": "SecurityKeyProvider",
              "stricthostkeychecking": "StrictHostKeyChecking", "proxyjump": "ProxyJump"}


def _jump(opts: Mapping[str, Any], config: ParsedConfig, notes: list[Note], seen: tuple[str, ...], depth: int,
          tokens: Mapping[str, str]) -> Hop | None:
    """The jump host of a looked-up host: its ProxyJump (or a reported ProxyCommand, whichever came first)."""
    pj, pc = config.source(opts.get("proxyjump")), config.source(opts.get("proxycommand"))
    # OpenSSH: whichever of ProxyJump and ProxyCommand is obtained first wins ("none" included)
    if pc is not None and (pj is None or pc.index < pj.index):
        if pc.value.lower() != "none":
            notes.append(_note(pc))
        return None
    if pj is None or pj.value.lower() == "none":
        return None
    return _chain(pj, config, notes, seen, depth, tokens)


def _with_tokens(value: str, tokens: Mapping[str, str]) -> str:
    """ssh_config's TOKENS in a ProxyJump (%h, %n, %p, %r, %%) of the host it is for."""
    return re.sub(r"%[%hnpr]", lambda m: "%" if m.group() == "%%" else tokens.get(m.group(), m.group()), value)


def _chain(src: _Line, config: ParsedConfig, notes: list[Note], seen: tuple[str, ...], depth: int,
           tokens: Mapping[str, str]) -> Hop:
    """ProxyJump a,b,c: c is the last jump before the target, reached through b, reached through a; a is
    reached as its own config says (its own ProxyJump included), as `ssh -J` does."""
    specs = [s.strip() for s in _with_tokens(src.value, tokens).split(",") if s.strip()]
    if not specs:
        raise SSHConfigError(f"{src.file}:{src.line}: ProxyJump is empty", "write [user@]host[:port]",
                             src.file, src.line)
    via: Hop | None = None
    for i, spec in enumerate(specs):
        via = _hop(spec, src, config, notes, seen, depth + i + 1, via if i else _MISSING_VIA)
    assert via is not None
    return via


_MISSING_VIA = Hop("", "", 0, "")  # marker: take the jump host's own ProxyJump


def _hop(spec: str, src: _Line, config: ParsedConfig, notes: list[Note], seen: tuple[str, ...], depth: int,
         via: Hop | None) -> Hop:
    user, host, port = _parse_jump(spec, src)
    if depth > MAX_HOPS or host.lower() in seen:
        # OpenSSH refuses the same: "jumphost loop via %s" (ssh.c)
        raise SSHConfigError(f"{src.file}:{src.line}: ProxyJump {spec!r}: jumphost loop via {host} (or more than "
                             f"{MAX_HOPS} jumps)", "exclude the jump host from the Host pattern that names it as a "
                             "jump, e.g. Host * !jump", src.file, src.line)
    opts = config.config.lookup(host.lower())
    _unhonoured(opts, config, notes)
    ids, agent, look = _identities(opts, config, notes)
    port = port or _port(opts.get("port"), config, notes, 22)
    user = user or opts.get("user") or getpass.getuser()
    if via is _MISSING_VIA:
        tokens = {"%h": opts.get("hostname") or host, "%p": str(port), "%r": user, "%n": host}
        via = _jump(opts, config, notes, (*seen, host.lower()), depth, tokens)
    return Hop(spec, opts.get("hostname") or host, port, user, ids, agent, look, via, config.path)


_JUMP = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@/\s]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^:@/\[\]\s]+)"
                   r"(?::(?P<port>\d{1,5}))?/?$")


def _parse_jump(spec: str, src: _Line) -> tuple[str | None, str, int | None]:
    m = _JUMP.match(spec)
    port = int(m.group("port")) if m and m.group("port") else None
    if not m or (port is not None and not 0 < port < 65536):
        raise SSHConfigError(f"{src.file}:{src.line}: ProxyJump {spec!r} is not [user@]host[:port]",
                             "write e.g. ProxyJump ops@jump.example.com:2222", src.file, src.line)
    return m.group("user"), m.group("host").strip("[]"), port
