"""Kubespray/Ansible inventories (INI or YAML) read and mapped onto a gpuk8s inventory, pure and offline.

`parse` reads Ansible's two static inventory formats into groups, hosts and variables, each with the line
it was written on; `convert` maps what gpuk8s has an equivalent for (the role groups, the connection
variables, a bastion, a few cluster variables) and returns a commented gpuk8s inventory plus one `Note`
per thing it did not map, with its line. Nothing of the file is executed or evaluated: a `{{ }}` value is
reported, never rendered, and a secret (a password) is reported by its name only, never copied.
Why a parser of our own rather than ansible-core's InventoryManager: docs/import.md.

The file is someone else's text, so every walk is bounded per file, not per line: hosts, host-in-group
entries, groups, child entries and variables each have a cap for the whole file (the first line past one is
noted, the rest of that kind skipped); group walks keep a visited set (a YAML alias may make the groups a DAG,
or a cycle); a YAML list or mapping where a variable's value was is never constructed or turned into text (an
alias bomb expands there), and a key path is imported only if it is a regular file of key size (its type and
size are looked at with stat, never its content) or does not exist here.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import stat
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode

from gpuk8s import versions
from gpuk8s.errors import GpuK8sError
from gpuk8s.inventory.loader import _USER, MAX_BYTES, _valid_address
from gpuk8s.logs import mask
from gpuk8s.text import clean, one_line

CONTROL_PLANE_GROUPS = ("kube_control_plane", "kube-master", "kube_master")
NODE_GROUPS = ("kube_node", "kube-node")
ETCD_GROUPS = ("etcd",)
CLUSTER_GROUPS = ("k8s_cluster", "k8s-cluster")
BASTION_GROUPS = ("bastion",)
# groups of Kubespray's layout that need no mapping of their own (their hosts get roles from the others)
_STRUCTURAL = ("all", "ungrouped", *CLUSTER_GROUPS)
_CALICO_RR = ("calico_rr", "calico-rr")

_SECRETS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password", "ansible_become_password",
            "ansible_become_pass", "ansible_sudo_pass", "ansible_sudo_password",
            "ansible_ssh_private_key_passphrase")
_HOST_KEYS = ("ansible_host", "ansible_ssh_host")
_USER_KEYS = ("ansible_user", "ansible_ssh_user", "ansible_remote_user")
_PORT_KEYS = ("ansible_port", "ansible_ssh_port")
_KEY_KEYS = ("ansible_ssh_private_key_file", "ansible_private_key_file")
_ARGS_KEYS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
# mapped (or checked) per host; each of these is consumed by convert()
_CONNECTION = (*_HOST_KEYS, *_USER_KEYS, *_PORT_KEYS, *_KEY_KEYS, *_ARGS_KEYS, "ansible_become",
               "ansible_become_user", "ansible_become_method", "ansible_connection", "ip", "access_ip",
               "ansible_python_interpreter")
_CLUSTER_VARS = ("kube_network_plugin", "kube_pods_subnet", "kube_service_addresses", "kube_version",
                 "container_manager")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_RANGE = re.compile(r"\[([0-9]+):([0-9]+)\]")
_SECTION = re.compile(r"^\[([^\]\s]+)\]\s*([#;].*)?$")
_HOSTPORT = re.compile(r"^(?P<host>[^:\[\]]+):(?P<port>[0-9]{1,5})$")
_MAX_RANGE = 4096  # hosts one pattern may expand to
# Bounds per file (a file of 2 KB could name millions of hosts, one pattern at a time): the first entry past one
# is noted with its line, and every later entry of that kind is skipped.
_MAX_HOSTS = 5000  # distinct hosts (Kubernetes' own bound on a cluster's nodes)
_MAX_MEMBERSHIPS = 20000  # host-in-group entries, each host a pattern expands to counted
_MAX_GROUPS = 256  # group names (sections, YAML keys, children); Kubespray's layout has about ten
_MAX_CHILDREN = 4096  # child-group entries
_MAX_VARS = 65536  # variables, a host line's counted once per host its pattern expands to
_MAX_KEY_FILE = 64 << 10  # an SSH private key is a few KiB; a larger file (or /dev/zero) is not one


class KubesprayImportError(GpuK8sError):
    """The file cannot be read as an Ansible inventory at all; `line` locates the cause, `message` says what
    (without the line)."""

    kind = "kubespray-import"

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = mask(clean(message))


@dataclass(frozen=True)
class Note:
    """Something of the source that was not imported (or imported with a change), located by line."""

    line: int
    key: str
    message: str
    kind: str = "not-imported"  # not-imported | changed | info

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "key": self.key, "kind": self.kind, "message": self.message}


@dataclass
class Var:
    key: str
    value: Any
    line: int
    owner: str  # "host NAME" or "group NAME"


@dataclass
class Group:
    name: str
    line: int
    hosts: dict[str, int] = field(default_factory=dict)  # host -> line of its membership
    children: dict[str, int] = field(default_factory=dict)  # child group -> line
    vars: dict[str, Var] = field(default_factory=dict)


@dataclass
class AHost:
    name: str
    line: int
    vars: dict[str, Var] = field(default_factory=dict)


@dataclass
class Ansible:
    """A static Ansible inventory as written: groups, hosts, variables, each with its line."""

    fmt: str
    groups: dict[str, Group] = field(default_factory=dict)
    hosts: dict[str, AHost] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)
    # what the file used of its bounds (the _MAX_* above), and the bounds already noted
    names: set[str] = field(default_factory=set)  # group names, defined or named as a child
    memberships: int = 0
    child_entries: int = 0
    variables: int = 0
    exhausted: set[str] = field(default_factory=set)

    def group(self, name: str, line: int) -> Group | None:
        """The group `name`, created at `line` if new; None (noted) past the file's bound on groups."""
        if name not in self.groups:
            if not self.admit_name(name, line):
                return None
            self.groups[name] = Group(name, line)
        return self.groups[name]

    def host(self, name: str, line: int) -> AHost:
        if name not in self.hosts:
            self.hosts[name] = AHost(name, line)
        return self.hosts[name]

    def over(self, kind: str, line: int, key: str, message: str) -> None:
        """Note, once per file, that a bound was reached at `line`; everything later of that kind is skipped."""
        if kind not in self.exhausted:
            self.exhausted.add(kind)
            self.notes.append(Note(line, key, message))

    def admit_name(self, name: str, line: int) -> bool:
        if name in self.names:
            return True
        if len(self.names) >= _MAX_GROUPS:
            self.over("groups", line, name, f"more than {_MAX_GROUPS} groups in the file: group {one_line(name)} "
                      "and every later new group are not imported")
            return False
        self.names.add(name)
        return True

    def child(self, parent: Group, name: str, line: int) -> bool:
        """Record `name` as a child of `parent` (first line kept); False (noted) past the file's bounds."""
        if name in parent.children:
            return True
        if self.child_entries >= _MAX_CHILDREN:
            self.over("children", line, name, f"more than {_MAX_CHILDREN} child-group entries in the file: this "
                      "and every later one are not imported")
            return False
        if not self.admit_name(name, line):
            return False
        self.child_entries += 1
        parent.children[name] = line
        return True

    def admit_vars(self, count: int, line: int, key: str) -> bool:
        if "vars" in self.exhausted or self.variables + count > _MAX_VARS:
            self.over("vars", line, key, f"more than {_MAX_VARS} variables in the file (a host line's counted "
                      "once per host it names): these and every later ones are not imported")
            return False
        self.variables += count
        return True

    def members(self, pattern: str, line: int, nvars: int) -> list[str]:
        """The hosts `pattern` names (its ranges expanded), within the file's bounds on hosts, host-in-group
        entries and variables (`nvars` per host); [] (noted) past one."""
        if self.exhausted & {"hosts", "memberships"} or nvars and "vars" in self.exhausted:
            return []
        names = _expand(pattern, line, self.notes)
        if not names:
            return []
        new = (names[0] not in self.hosts) if len(names) == 1 else len(set(names).difference(self.hosts))
        if len(self.hosts) + new > _MAX_HOSTS:
            self.over("hosts", line, pattern, f"more than {_MAX_HOSTS} hosts in the file: host pattern "
                      f"{one_line(pattern)} and every later host entry are not imported")
            return []
        if self.memberships + len(names) > _MAX_MEMBERSHIPS:
            self.over("memberships", line, pattern, f"more than {_MAX_MEMBERSHIPS} host-in-group entries in the "
                      f"file: host pattern {one_line(pattern)} and every later host entry are not imported")
            return []
        if nvars and not self.admit_vars(nvars * len(names), line, pattern):
            return []
        self.memberships += len(names)
        return names


# -- parsing ------------------------------------------------------------------------------------------


def parse(text: str, filename: str = "") -> Ansible:
    """INI or YAML, by the file name (.yml/.yaml/.json) or else by its first meaningful line."""
    if len(text) > MAX_BYTES:
        raise KubesprayImportError(1, f"the file is larger than {MAX_BYTES >> 20} MiB: not an inventory")
    low = filename.lower()
    if low.endswith((".yml", ".yaml", ".json")):
        return parse_yaml(text)
    if low.endswith(".ini"):
        return parse_ini(text)
    for raw in text.splitlines():
        s = raw.strip()
        if s and not s.startswith(("#", ";")):
            return parse_ini(text) if s.startswith("[") or "=" in s or ":" not in s else parse_yaml(text)
    return parse_ini(text)


def _value(text: str) -> Any:
    """A value as Ansible's INI parser reads it: a Python literal if it is one, else the string.
    ast.literal_eval evaluates literals only (numbers, strings, lists...): nothing runs."""
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return text
    return v if isinstance(v, (int, float, bool, str, list, dict, tuple)) else text


def _expand(pattern: str, line: int, notes: list[Note]) -> list[str]:
    """Ansible's numeric host ranges (node[01:10]); anything else is the name itself. The number of hosts
    (the product of every range of the pattern) is checked before anything is expanded."""
    ranges = _RANGE.findall(pattern)
    if any(len(b) > 9 for r in ranges for b in r):  # also keeps int() clear of Python's digit limit
        notes.append(Note(line, pattern, f"host pattern {one_line(pattern)} has a bound of more than 9 digits: "
                          "not imported"))
        return []
    total = 1
    for lo, hi in ranges:
        total *= max(int(hi) - int(lo) + 1, 0)
        if total == 0 or total > _MAX_RANGE:
            break
    if ranges and (total == 0 or total > _MAX_RANGE):
        size = "empty" if total == 0 else f"{_count(ranges)} hosts, more than {_MAX_RANGE}"
        notes.append(Note(line, pattern, f"host pattern {one_line(pattern)} is {size}: not imported"))
        return []
    return _expand_ranges(pattern)


def _count(ranges: list[tuple[str, str]]) -> int:
    n = 1
    for lo, hi in ranges:
        n *= int(hi) - int(lo) + 1
    return n


def _expand_ranges(pattern: str) -> list[str]:
    m = _RANGE.search(pattern)
    if not m:
        return [pattern]
    lo, hi = m.group(1), m.group(2)
    width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
    out: list[str] = []
    for i in range(int(lo), int(hi) + 1):
        out += _expand_ranges(pattern[:m.start()] + str(i).zfill(width) + pattern[m.end():])
    return out


def parse_ini(text: str) -> Ansible:
    """Ansible's INI dialect: [group], [group:vars], [group:children]; host lines `name k=v ...`
    (shlex-split, `#` starts a comment); hosts before any section are in `ungrouped`."""
    inv = Ansible("ini")
    section, kind = "ungrouped", "hosts"
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s or s.startswith(("#", ";")):
            continue
        m = _SECTION.match(s)
        if m:
            name, _, kind = m.group(1).partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children") or not name:
                inv.notes.append(Note(n, m.group(1), f"section [{one_line(m.group(1))}] is not [group], "
                                      "[group:vars] or [group:children]: its lines are not imported"))
                section, kind = "", "skip"
                continue
            section = name
            if inv.group(name, n) is None:
                section, kind = "", "skip"
            continue
        if kind == "skip":
            continue
        if kind == "vars":
            key, eq, val = s.partition("=")
            if not eq or not key.strip():
                inv.notes.append(Note(n, "", f"[{section}:vars] line is not key=value: not imported"))
                continue
            if inv.admit_vars(1, n, key.strip()):
                inv.groups[section].vars[key.strip()] = Var(key.strip(), _value(val.strip()), n, f"group {section}")
            continue
        if kind == "children":
            inv.child(inv.groups[section], s.split()[0], n)
            continue
        try:
            tokens = shlex.split(s, comments=True)
        except ValueError as e:
            inv.notes.append(Note(n, "", f"host line cannot be read ({e}): not imported"))
            continue
        if not tokens:
            continue
        pattern, *pairs = tokens
        port = None
        hp = _HOSTPORT.match(pattern)
        if hp:
            pattern, port = hp.group("host"), hp.group("port")
        hvars: dict[str, Var] = {}
        if port:
            hvars["ansible_port"] = Var("ansible_port", int(port), n, f"host {pattern}")
        for t in pairs:
            k, eq, v = t.partition("=")
            if not eq or not k:
                inv.notes.append(Note(n, t, f"{one_line(t)!r} after the host name is not key=value: not imported"))
                continue
            hvars[k] = Var(k, _value(v), n, f"host {pattern}")
        group = inv.group(section, n)
        if group is None:
            continue
        for name in inv.members(pattern, n, len(hvars)):
            h = inv.host(name, n)
            for k, hv in hvars.items():
                h.vars[k] = Var(k, hv.value, n, f"host {name}")
            group.hosts.setdefault(name, n)
    return inv


class _Constructor(SafeConstructor):
    pass


@dataclass(frozen=True)
class Composite:
    """Where a YAML variable's value is a list or a mapping: its kind, never the value. gpuk8s maps only single
    values, and constructing (then printing or comparing) an aliased structure expands it: an alias bomb."""

    kind: str  # "list" or "mapping"

    def __str__(self) -> str:
        return f"<a {self.kind}>"


# libyaml's parser and composer when PyYAML has them: the same nodes and marks, in C (the pure-Python
# composer took 0.15 s for 23 KB); libyaml refuses nesting deeper than 1000 levels with an error
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MAX_ENTRIES = 1 << 18  # YAML entries walked in all (aliases repeat entries; 5000 hosts with 50 variables each fit)


def parse_yaml(text: str) -> Ansible:
    """Ansible's YAML inventory: GROUP: {hosts: {NAME: {vars}}, vars: {...}, children: {GROUP: ...}}.

    The groups are walked with an explicit stack and a visited set of (group name, node): an alias can make
    them a DAG (walked once per name, not once per path) or a cycle (walked once), and no nesting recurses."""
    inv = Ansible("yaml")
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise KubesprayImportError(mark.line + 1 if mark else 1, f"YAML syntax error: {e.problem or e}") from None
    except (yaml.YAMLError, RecursionError) as e:
        raise KubesprayImportError(1, f"not readable as YAML: {type(e).__name__}") from None
    if root is None:
        return inv
    if not isinstance(root, MappingNode):
        raise KubesprayImportError(root.start_mark.line + 1, "the top level must be a mapping of groups (all: ...)")
    con = _Constructor()
    walked = [0]  # entries walked so far (a list: the nested functions add to it)

    def line(node: Node) -> int:
        return node.start_mark.line + 1

    def pyval(node: Node) -> Any:
        """A scalar's value; a list or mapping by its kind only (never constructed: see Composite)."""
        if not isinstance(node, ScalarNode):
            return Composite("mapping" if isinstance(node, MappingNode) else "list")
        try:
            return con.construct_object(node, deep=True)
        except (yaml.YAMLError, RecursionError, TypeError, ValueError):
            return "<unreadable>"

    def items(node: Node, where: str, what: str) -> list[tuple[Node, Node]]:
        """A mapping's (key, value) nodes; an empty value has none, anything else is noted as not imported."""
        if isinstance(node, ScalarNode) and node.value in ("", "~", "null"):
            return []
        if not isinstance(node, MappingNode):
            inv.notes.append(Note(line(node), where, f"{what} must be a mapping: not imported"))
            return []
        walked[0] += len(node.value)
        if walked[0] > _MAX_ENTRIES:
            raise KubesprayImportError(line(node), f"the file's YAML entries, repeated by its aliases, are more than "
                                           f"{_MAX_ENTRIES}: not an inventory to import")
        return list(node.value)

    def vars_of(node: Node, owner: str, where: str) -> dict[str, Var]:
        out: dict[str, Var] = {}
        for k, v in items(node, where, where):
            key = str(k.value) if isinstance(k, ScalarNode) else "?"
            out[key] = Var(key, pyval(v), line(k), owner)
        return out

    def group(name: str, node: Node, at: int) -> Iterator[tuple[str, Node, int]]:
        """Read one group's entry; yield its children (name, node, line), which the caller walks."""
        g = inv.group(name, at)
        if g is None:
            return
        if isinstance(node, ScalarNode) and node.value in ("", "~", "null"):
            return
        if not isinstance(node, MappingNode):
            inv.notes.append(Note(at, name, f"group {one_line(name)} must be a mapping: not imported"))
            return
        for k, v in items(node, name, f"group {one_line(name)}"):
            key = k.value if isinstance(k, ScalarNode) else "?"
            if key == "hosts":
                if inv.exhausted & {"hosts", "memberships"}:
                    continue  # noted once already; an alias may repeat a long hosts mapping in every group
                for hk, hv in items(v, f"{name}.hosts", "hosts"):
                    hname = str(hk.value) if isinstance(hk, ScalarNode) else "?"
                    hvars = vars_of(hv, f"host {hname}", f"host {hname}")
                    for expanded in inv.members(hname, line(hk), len(hvars)):
                        h = inv.host(expanded, line(hk))
                        for vk, var in hvars.items():
                            h.vars[vk] = Var(vk, var.value, var.line, f"host {expanded}")
                        g.hosts.setdefault(expanded, line(hk))
            elif key == "vars":
                gvars = vars_of(v, f"group {name}", f"{name}.vars")
                if gvars and inv.admit_vars(len(gvars), line(k), f"{name}.vars"):
                    g.vars.update(gvars)
            elif key == "children":
                for ck, cv in items(v, f"{name}.children", "children"):
                    cname = str(ck.value) if isinstance(ck, ScalarNode) else "?"
                    if inv.child(g, cname, line(ck)):
                        yield cname, cv, line(ck)
            else:
                inv.notes.append(Note(line(k), f"{name}.{key}", f"{one_line(str(key))!r} in group "
                                      f"{one_line(name)} is not hosts, vars or children: not imported"))

    def top() -> Iterator[tuple[str, Node, int]]:
        for k, v in items(root, "", "the top level"):
            yield (str(k.value) if isinstance(k, ScalarNode) else "?"), v, line(k)

    visited: set[tuple[str, int]] = set()
    stack: list[Iterator[tuple[str, Node, int]]] = [top()]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            continue
        name, node, at = entry
        if (name, id(node)) in visited:  # a group entry seen before (through an alias): nothing new in it
            continue
        visited.add((name, id(node)))
        stack.append(group(name, node, at))
    return inv


# -- mapping ------------------------------------------------------------------------------------------


@dataclass
class MappedHost:
    name: str
    address: str
    role: str
    line: int
    groups: list[str]
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    bastion: tuple[str, str, int] | None = None  # (address, user, port)
    sudo_password: bool = False


@dataclass
class Result:
    text: str  # the gpuk8s inventory (YAML with comments)
    hosts: list[MappedHost]
    notes: list[Note]
    cluster: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"hosts": [{"name": h.name, "address": h.address, "role": h.role, "line": h.line}
                          for h in self.hosts],
                "cluster": self.cluster, "not_imported": [n.to_json() for n in self.notes]}


def _ancestors(inv: Ansible) -> dict[str, list[str]]:
    """Each group with every group above it (itself first), in walk order; a set of what was seen keeps each
    walk linear in the groups and child entries (a list made a chain of groups cubic)."""
    parents: dict[str, set[str]] = {g: set() for g in inv.groups}
    for g in inv.groups.values():
        for c in g.children:
            parents.setdefault(c, set()).add(g.name)
    ordered = {g: sorted(ps) for g, ps in parents.items()}
    out: dict[str, list[str]] = {}
    for gname in parents:
        seen: dict[str, None] = {}  # insertion-ordered set
        todo = [gname]
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen[x] = None
            todo += [p for p in ordered.get(x, ()) if p not in seen]
        out[gname] = list(seen)
    return out


def _depths(inv: Ansible) -> dict[str, int]:
    """A group's depth below `all` (Ansible merges group vars shallow to deep); cycles cut."""
    depth = {"all": 0}
    changed = True
    rounds = 0
    while changed and rounds < len(inv.groups) + 2:
        changed, rounds = False, rounds + 1
        for g in inv.groups.values():
            base = depth.get(g.name, 1 if g.name != "all" else 0)
            depth.setdefault(g.name, base)
            for c in g.children:
                if depth.get(c, -1) < base + 1:
                    depth[c] = base + 1
                    changed = True
    return depth


def _is_jinja(v: Any) -> bool:
    return isinstance(v, str) and ("{{" in v or "{%" in v)


def _single(v: Any) -> bool:
    """A single value (what every variable gpuk8s maps is): not a list or mapping (INI literal or YAML)."""
    return v is None or isinstance(v, (str, int, float))


def _usable(v: Any) -> bool:
    """A value gpuk8s may map: a single value that is no Jinja expression."""
    return _single(v) and not _is_jinja(v)


_MAPPED = frozenset((*_CONNECTION, *_CLUSTER_VARS, *_SECRETS))


def _mapped(vs: dict[str, Var]) -> dict[str, Var]:
    """The variables convert() reads (connection, cluster, secrets): the others are only reported."""
    return {k: v for k, v in vs.items() if k in _MAPPED}


def _key_file_problem(path: str, cache: dict[str, str]) -> str:
    """Why `path` cannot be imported as an SSH private key ('' when it can): a device (/dev/zero), a FIFO, a
    directory or a file larger than _MAX_KEY_FILE would be read whole by every SSH connection. Its type and size
    only (stat), never its content; a path that does not exist here is imported (the key may be elsewhere)."""
    if path not in cache:
        try:
            st = os.stat(os.path.expanduser(path))
        except (FileNotFoundError, NotADirectoryError):
            cache[path] = ""
        except (OSError, ValueError) as e:
            cache[path] = f"cannot be checked ({getattr(e, 'strerror', None) or type(e).__name__})"
        else:
            cache[path] = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
                           f"is larger than {_MAX_KEY_FILE >> 10} KiB: not a private key"
                           if st.st_size > _MAX_KEY_FILE else "")
    return cache[path]


def _bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("yes", "true", "on", "1", "y"):
        return True
    if isinstance(v, str) and v.lower() in ("no", "false", "off", "0", "n"):
        return False
    return None


def _jump(spec: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` as (user, host, port)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    m = _HOSTPORT.match(rest)
    if m:
        host, port = m.group("host"), int(m.group("port"))
    return (user or None), host, port


def bastion_of_args(args: str) -> tuple[tuple[str | None, str, int | None] | None, list[str]]:
    """The jump host of ansible_ssh_common_args (-J / -o ProxyJump / -o ProxyCommand="ssh -W %h:%p ..."),
    and the options that are not a jump host (reported as not imported), by name only: a value may hold a
    secret (ProxyCommand="sshpass -p ..."), so none is ever echoed."""
    try:
        toks = shlex.split(args)
    except ValueError:
        return None, ["the options (unbalanced quotes: cannot be split)"]
    jump: tuple[str | None, str, int | None] | None = None
    other: list[str] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        opt = None
        if t == "-o" and i + 1 < len(toks):
            opt, i = toks[i + 1], i + 2
        elif t.startswith("-o") and len(t) > 2:
            opt, i = t[2:], i + 1
        elif t == "-J" and i + 1 < len(toks):
            jump, i = _jump(toks[i + 1].split(",")[0]), i + 2
            if "," in toks[i - 1]:
                other.append("-J hops after the first")
            continue
        else:
            # a flag by its name; an argument (which may be a flag's secret value) only as "an argument"
            flag = t[:2] if re.fullmatch(r"-[A-Za-z0-9]", t[:2]) else ""
            other.append(f"the option {flag}" if flag else "an argument")
            i += 1
            continue
        k, _, v = opt.replace(" ", "=", 1).partition("=") if "=" not in opt else opt.partition("=")
        k = k.strip()
        if k.lower() == "proxyjump":
            jump = _jump(v.split(",")[0])
            if "," in v:
                other.append("ProxyJump hops after the first")
        elif k.lower() == "proxycommand":
            jump = _proxy_command(v)
            if jump is None:
                other.append("-o ProxyCommand (not an `ssh -W %h:%p` jump host)")
        else:
            name = _option_name(k)
            other.append(f"-o {name}" if name else "an -o option")
    return jump, other


def _option_name(word: str) -> str:
    """`word` when it looks like an ssh_config keyword (letters and digits), else ''."""
    return word if re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,40}", word) else ""


def _proxy_command(cmd: str) -> tuple[str | None, str, int | None] | None:
    """`ssh -W %h:%p [-q] [-p PORT] [-l USER] [-i KEY] [user@]HOST` (Kubespray's bastion form)."""
    try:
        toks = shlex.split(cmd)
    except ValueError:
        return None
    if not toks or toks[0].rsplit("/", 1)[-1] != "ssh" or "-W" not in toks:
        return None
    user = port = None
    target = None
    i = 1
    with_arg = {"-W", "-p", "-l", "-i", "-o", "-F", "-J", "-b", "-c", "-m", "-E"}
    while i < len(toks):
        t = toks[i]
        if t in with_arg and i + 1 < len(toks):
            if t == "-p" and toks[i + 1].isdecimal():
                port = int(toks[i + 1])
            elif t == "-l":
                user = toks[i + 1]
            i += 2
        elif t.startswith("-"):
            i += 1
        else:
            target = t
            i += 1
    if target is None:
        return None
    u, h, p = _jump(target)
    return (u or user), h, (p or port)


def convert(inv: Ansible, source: str = "FILE") -> Result:
    """The gpuk8s inventory for `inv`, and a note for everything not mapped (by line)."""
    notes: list[Note] = list(inv.notes)
    anc = _ancestors(inv)
    depth = _depths(inv)

    # children that are named but never defined (no hosts, no vars, no children of their own)
    for g in inv.groups.values():
        for c, ln in g.children.items():
            cg = inv.groups.get(c)
            undefined = cg is None or (not cg.hosts and not cg.children and not cg.vars and cg.line == ln)
            if undefined and c not in _CALICO_RR:
                notes.append(Note(ln, c, f"child group {one_line(c)} of {one_line(g.name)} is not defined "
                                  "anywhere in the file (no hosts): nothing imported from it"))
    for g in sorted(inv.groups.values(), key=lambda g: g.line):
        known = (*CONTROL_PLANE_GROUPS, *NODE_GROUPS, *ETCD_GROUPS, *BASTION_GROUPS, *_STRUCTURAL, *_CALICO_RR)
        if g.name not in known and (g.hosts or g.children):
            notes.append(Note(g.line, g.name, f"group {one_line(g.name)} is not a Kubespray role group: it gives "
                              "its hosts no role (labels are not created from groups)", "info"))
        if g.name in _CALICO_RR and g.hosts:
            notes.append(Note(g.line, g.name, "calico route reflectors (calico_rr) have no gpuk8s equivalent: "
                              "their hosts get a role only from kube_control_plane/kube_node"))

    # a host's groups and the group variables it sees depend only on the groups it is listed in: computed once
    # per such list (thousands of hosts of one range share one), never by scanning every group per host
    direct: dict[str, list[str]] = {}
    for g in inv.groups.values():
        for hname in g.hosts:
            direct.setdefault(hname, []).append(g.name)
    seen_groups: dict[tuple[str, ...], tuple[list[str], dict[str, Var]]] = {}

    def group_view(host: str) -> tuple[list[str], dict[str, Var]]:
        key = tuple(direct.get(host, ()))
        if key not in seen_groups:
            out: dict[str, None] = {}  # insertion-ordered set
            for d in key:
                out.update(dict.fromkeys(anc.get(d, [d])))
            out.setdefault("all")
            gvars: dict[str, Var] = {}
            for gname in sorted(out, key=lambda g: (depth.get(g, 1), g)):
                if gname in inv.groups:
                    gvars.update(_mapped(inv.groups[gname].vars))
            seen_groups[key] = (list(out), gvars)
        return seen_groups[key]

    def groups_of(host: str) -> list[str]:
        return list(group_view(host)[0])

    def effective(host: str) -> dict[str, Var]:
        """The variables gpuk8s maps that apply to the host, as Ansible merges them (shallow to deep groups,
        then the host's own)."""
        return {**group_view(host)[1], **_mapped(inv.hosts[host].vars)}

    # every declaration of a variable, reported once (by its line), whatever it applies to
    for owner, vs in [(f"group {g.name}", g.vars) for g in inv.groups.values()] + \
                     [(f"host {h.name}", h.vars) for h in inv.hosts.values()]:
        for v in vs.values():
            if v.key in _SECRETS:
                notes.append(Note(v.line, v.key, f"{v.key} ({owner}) is a secret: not imported (gpuk8s never "
                                  "keeps one in the inventory); a sudo password is read from the environment "
                                  "variable named by ssh.sudo.password_env (GPUK8S_SUDO_PASSWORD) or a prompt; "
                                  "SSH logs in with keys only"))
            elif _is_jinja(v.value):
                notes.append(Note(v.line, v.key, f"{v.key} ({owner}) is a Jinja expression: not evaluated, not "
                                  "imported; write its value in the gpuk8s inventory by hand"))
            elif (v.key in _CONNECTION or v.key in _CLUSTER_VARS) and not _single(v.value):
                notes.append(Note(v.line, v.key, f"{v.key} ({one_line(owner)}) is a list or mapping, not a single "
                                  "value: not imported"))
            elif v.key in _CONNECTION or v.key in _CLUSTER_VARS:
                continue
            else:
                notes.append(Note(v.line, v.key, f"{one_line(v.key)} ({one_line(owner)}) has no gpuk8s "
                                  "equivalent: not imported"))

    # bastion group (Kubespray's special group): the jump host of every connection
    group_bastion: tuple[str, str, int] | None = None
    bastion_hosts: set[str] = set()
    key_files: dict[str, str] = {}  # key path -> why it is not imported ('' when it is), stat'ed once
    for bg in BASTION_GROUPS:
        bgroup = inv.groups.get(bg)
        if bgroup and bgroup.hosts:
            bname = next(iter(bgroup.hosts))
            bastion_hosts |= set(bgroup.hosts)
            ev = effective(bname)
            addr = next((str(ev[k].value) for k in _HOST_KEYS if k in ev and _usable(ev[k].value)), bname)
            user = next((str(ev[k].value) for k in _USER_KEYS if k in ev and _usable(ev[k].value)), None)
            port = next((ev[k].value for k in _PORT_KEYS if k in ev and _usable(ev[k].value)), 22)
            if user is None:
                notes.append(Note(bgroup.hosts[bname], bname, "the bastion has no ansible_user: not imported "
                                  "(gpuk8s's ssh.bastion needs a user)"))
            elif not _valid_address(addr) or not _USER.match(user):
                notes.append(Note(bgroup.hosts[bname], bname, "the bastion's address or user is not valid: "
                                  "not imported"))
            else:
                group_bastion = (addr, user, int(port) if str(port).isdecimal() else 22)
            if len(bgroup.hosts) > 1:
                notes.append(Note(bgroup.line, bg, "more than one bastion: only the first is imported"))

    hosts: list[MappedHost] = []
    seen_names: dict[str, str] = {}
    for h in sorted(inv.hosts.values(), key=lambda h: h.line):
        if h.name in bastion_hosts:
            continue
        gs = groups_of(h.name)
        ev = effective(h.name)
        is_cp = any(g in gs for g in CONTROL_PLANE_GROUPS)
        is_node = any(g in gs for g in NODE_GROUPS)
        in_etcd = any(g in gs for g in ETCD_GROUPS)
        if not is_cp and not is_node:
            why = ("an etcd host outside the control planes: gpuk8s runs etcd stacked on its control planes"
                   if in_etcd else "in no role group (kube_control_plane, kube_node or the legacy kube-master, "
                   "kube-node)")
            notes.append(Note(h.line, h.name, f"host {one_line(h.name)} is {why}: not imported"))
            continue
        name = h.name.lower().replace("_", "-")
        if not _NODE_NAME.match(name) or len(name) > 63:
            notes.append(Note(h.line, h.name, f"host name {one_line(h.name)!r} cannot be a Kubernetes node name "
                              "(lowercase RFC 1123): not imported"))
            continue
        if name != h.name:
            notes.append(Note(h.line, h.name, f"host {one_line(h.name)} renamed {name} (Kubernetes node names "
                              "are lowercase RFC 1123)", "changed"))
        if name in seen_names:
            notes.append(Note(h.line, h.name, f"host {one_line(h.name)} has the same node name as "
                              f"{one_line(seen_names[name])}: not imported"))
            continue

        def val(keys: Iterable[str], ev: dict[str, Var] = ev) -> Var | None:
            for k in keys:
                v = ev.get(k)
                if v is not None and _usable(v.value):
                    return v
            return None

        if any(k in ev and not _usable(ev[k].value) for k in _HOST_KEYS):
            what = ("a Jinja expression" if any(k in ev and _is_jinja(ev[k].value) for k in _HOST_KEYS)
                    else "a list or mapping")
            notes.append(Note(h.line, h.name, f"host {one_line(h.name)}: its address is {what}: host not imported"))
            continue
        av = val(_HOST_KEYS)
        address = str(av.value) if av else h.name
        if not _valid_address(address):
            notes.append(Note(av.line if av else h.line, "ansible_host", f"host {one_line(h.name)}: "
                              f"{one_line(address)!r} is not an IP address or host name: host not imported"))
            continue
        for k in ("ip", "access_ip"):
            ipv = ev.get(k)
            if ipv is not None and _usable(ipv.value) and str(ipv.value) != address:
                notes.append(Note(ipv.line, k, f"host {name}: {k}={one_line(str(ipv.value))} (the address Kubernetes "
                                  f"binds/advertises) differs from the SSH address {address}: not imported; "
                                  "kubelet and kubeadm use the node's default-route address", "info"))
        mh = MappedHost(name, address, "control-plane" if is_cp else "worker", h.line, gs)
        if is_cp and is_node:
            notes.append(Note(h.line, h.name, f"host {name} is in both the control plane and kube_node groups: "
                              "imported as a control plane (gpuk8s control planes may carry GPUs: set gpus: N)",
                              "info"))
        uv = val(_USER_KEYS)
        if uv is not None:
            if not _USER.match(str(uv.value)):
                notes.append(Note(uv.line, uv.key, f"host {name}: {one_line(str(uv.value))!r} is not a POSIX user "
                                  "name: host not imported"))
                continue
            mh.user = str(uv.value)
        pv = val(_PORT_KEYS)
        if pv is not None:
            if isinstance(pv.value, int) and 0 < pv.value < 65536:
                mh.port = pv.value
            else:
                notes.append(Note(pv.line, pv.key, f"host {name}: {pv.key} is not a port number: not imported"))
        kv = val(_KEY_KEYS)
        if kv is not None:
            problem = _key_file_problem(str(kv.value), key_files)
            if problem:
                notes.append(Note(kv.line, kv.key, f"host {name}: {kv.key} {one_line(str(kv.value))!r} {problem}: "
                                  "not imported"))
            else:
                mh.identity_file = str(kv.value)
        cv = ev.get("ansible_connection")
        if cv is not None and _single(cv.value) and str(cv.value) not in ("ssh", "paramiko", "smart"):
            notes.append(Note(cv.line, "ansible_connection", f"host {name}: ansible_connection="
                              f"{one_line(str(cv.value))}: gpuk8s always connects over SSH"))
        bv = ev.get("ansible_become")
        buser = ev.get("ansible_become_user")
        if buser is not None and _single(buser.value) and str(buser.value) != "root":
            notes.append(Note(buser.line, "ansible_become_user", f"host {name}: gpuk8s becomes root with sudo, "
                              f"not {one_line(str(buser.value))}"))
        bm = ev.get("ansible_become_method")
        if bm is not None and _single(bm.value) and str(bm.value) != "sudo":
            notes.append(Note(bm.line, "ansible_become_method", f"host {name}: become method "
                              f"{one_line(str(bm.value))} is not supported: gpuk8s uses sudo"))
        if bv is not None and _bool(bv.value) is False and mh.user not in (None, "root"):
            notes.append(Note(bv.line, "ansible_become", f"host {name}: ansible_become is off, but gpuk8s runs its "
                              f"commands with sudo as {mh.user}: that user needs sudo", "info"))
        if any(k in ev for k in ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass",
                                 "ansible_sudo_password")):
            mh.sudo_password = True
        for k in _ARGS_KEYS:
            av2 = ev.get(k)
            if av2 is None or not _usable(av2.value):
                continue
            jump, other = bastion_of_args(str(av2.value))
            if jump is not None:
                ju, jh, jp = jump
                ju = ju or mh.user
                if ju is None or not _valid_address(jh) or not _USER.match(ju):
                    notes.append(Note(av2.line, k, f"host {name}: the jump host in {k} has no user or no valid "
                                      "address: bastion not imported"))
                else:
                    mh.bastion = (jh, ju, jp or 22)
            for o in other:
                hint = (" (gpuk8s always verifies host keys: use ssh.host_key_policy: accept-new to trust new ones)"
                        if "stricthostkeychecking" in o.lower() or "userknownhostsfile" in o.lower() else "")
                notes.append(Note(av2.line, k, f"host {name}: {one_line(o)} in {k} is not imported{hint}"))
        if mh.bastion is None and group_bastion is not None:
            mh.bastion = group_bastion
        seen_names[name] = h.name
        hosts.append(mh)

    # cluster-wide variables, as the first control plane sees them
    cluster: dict[str, Any] = {}
    first_cp = next((h for h in hosts if h.role == "control-plane"), None)
    if first_cp is None:
        raise KubesprayImportError(1, "no host is in kube_control_plane (or the legacy kube-master) with a usable name "
                              "and address: gpuk8s needs at least one control plane")
    cev = effective(seen_names[first_cp.name])
    for key in _CLUSTER_VARS:
        cvar = cev.get(key)
        if cvar is None or not _usable(cvar.value):
            continue
        s = str(cvar.value)
        if key == "kube_network_plugin":
            if s in ("calico", "flannel"):
                cluster["cni"] = s
            else:
                notes.append(Note(cvar.line, key, f"kube_network_plugin={one_line(s)}: gpuk8s installs calico or "
                                  "flannel; calico is written"))
        elif key == "container_manager":
            if s in ("containerd", "docker"):
                cluster["container_runtime"] = s
            else:
                notes.append(Note(cvar.line, key, f"container_manager={one_line(s)}: gpuk8s uses containerd or "
                                  "docker; containerd is written"))
        elif key in ("kube_pods_subnet", "kube_service_addresses"):
            target = "pod_cidr" if key == "kube_pods_subnet" else "service_cidr"
            if re.fullmatch(r"[0-9a-fA-F:.]+/[0-9]{1,3}", s):
                cluster[target] = s
            else:
                notes.append(Note(cvar.line, key, f"{key} is not a CIDR: not imported"))
        elif key == "kube_version":
            m = re.fullmatch(r"v?(1\.[0-9]{1,3})(\.[0-9]{1,3})?", s)
            if m and m.group(1) in versions.matrix().minors:
                cluster["kubernetes_version"] = m.group(1)
                if m.group(2):
                    notes.append(Note(cvar.line, key, f"kube_version={one_line(s)}: the minor {m.group(1)} is "
                                      "imported; gpuk8s installs that minor's pinned patch", "changed"))
            else:
                notes.append(Note(cvar.line, key, f"kube_version={one_line(s)} is not a minor gpuk8s installs "
                                  f"(gpuk8s versions): the default {versions.default_minor()} is written"))
    notes += _inherited(hosts)
    notes.sort(key=lambda n: (n.line, n.key))
    return Result(render(hosts, cluster, notes, source, inv.fmt), hosts, notes, cluster)


def _inherited(hosts: list[MappedHost]) -> list[Note]:
    """A host without a setting most others have inherits theirs from `ssh:` (gpuk8s cannot unset it)."""
    out = []
    for attr, what in (("user", "ansible_user"), ("identity_file", "ansible_ssh_private_key_file"),
                       ("bastion", "a bastion")):
        common = _most_common([getattr(h, attr) for h in hosts])
        if common is None:
            continue
        for h in hosts:
            if getattr(h, attr) is None:
                out.append(Note(h.line, h.name, f"host {h.name} had no {what}; it gets the one most hosts have "
                                "(ssh: at the top): check it", "changed"))
    return out


# -- writing ------------------------------------------------------------------------------------------


def _q(v: object) -> str:
    """A YAML scalar that reads back as exactly `v` (a JSON string is a YAML double-quoted scalar)."""
    import json
    return json.dumps(v) if isinstance(v, str) else str(v)


def _comment(text: str) -> str:
    return one_line(text).replace("\u2028", " ").replace("\u2029", " ").replace("\x85", " ")


def _most_common(values: list[Any]) -> Any:
    """The value most often in `values` (the first seen among equals; None for none): one count, not one per
    value (list.count per value was quadratic in the hosts)."""
    counts = Counter(values)
    best, count = None, 0
    for v, c in counts.items():  # in first-seen order: a later value must be strictly more common
        if c > count:
            best, count = v, c
    return best


def render(hosts: list[MappedHost], cluster: dict[str, Any], notes: list[Note], source: str, fmt: str) -> str:
    """The gpuk8s inventory text: the shared SSH settings hoisted to `ssh:`, each host's own below it."""
    users = [h.user for h in hosts]
    ports = [h.port for h in hosts]
    keys = [h.identity_file for h in hosts]
    basts = [h.bastion for h in hosts]
    user, port, key, bast = (_most_common(users), _most_common(ports), _most_common(keys), _most_common(basts))
    sudo_pw = any(h.sudo_password for h in hosts)
    out = [f"# gpuk8s inventory, imported from {_comment(source)} ({fmt.upper()}) by gpuk8s inventory import.",
           "# Reference: docs/inventory.md.  Check it with: gpuk8s inventory validate -i THIS-FILE"]
    if notes:
        out.append(f"# Not imported or changed ({len(notes)}; the command listed each with its line):")
        for n in notes:
            out.append(f"#   line {n.line}: {_comment(n.key)}: {n.kind}")
    out += ["", "cluster:",
            "  name: gpu-cluster",
            f"  kubernetes_version: {_q(cluster.get('kubernetes_version', versions.default_minor()))}"
            "   # a minor of `gpuk8s versions`",
            f"  pod_cidr: {_q(cluster.get('pod_cidr', '10.244.0.0/16'))}",
            f"  service_cidr: {_q(cluster.get('service_cidr', '10.96.0.0/12'))}",
            f"  cni: {cluster.get('cni', 'calico')}                     # calico or flannel",
            f"  container_runtime: {cluster.get('container_runtime', 'containerd')}",
            "",
            "# SSH defaults for every host (the values most hosts had); a host's own 'ssh:' block wins.",
            "ssh:"]
    if user is not None:
        out.append(f"  user: {_q(user)}")
    else:
        out.append("  # user: root                  # no ansible_user: Ansible would log in as your local user")
    if port is not None:
        out.append(f"  port: {port}")
    if key is not None:
        out.append(f"  identity_file: {_q(key)}")
    out += ["  known_hosts: ~/.ssh/known_hosts  # host keys are verified against this file",
            "  host_key_policy: strict          # or accept-new to trust a host seen for the first time"]
    if bast is not None:
        out.append(f"  bastion: {{address: {_q(bast[0])}, user: {_q(bast[1])}, port: {bast[2]}}}")
    out.append("  sudo:")
    if sudo_pw:
        out += ["    mode: password                 # the inventory had a become password (not imported):",
                "    password_env: GPUK8S_SUDO_PASSWORD   # export it there, or set prompt: true"]
    else:
        out.append("    mode: nopasswd                 # or password (from password_env or a prompt)")
    out += ["", "hosts:"]
    for h in hosts:
        out.append(f"  - name: {_q(h.name)}               # line {h.line}: {_comment(', '.join(h.groups))}")
        out.append(f"    address: {_q(h.address)}")
        out.append(f"    role: {h.role}")
        own = []
        if h.user != user and h.user is not None:
            own.append(f"user: {_q(h.user)}")
        if h.port != port and h.port is not None:
            own.append(f"port: {h.port}")
        if h.identity_file != key and h.identity_file is not None:
            own.append(f"identity_file: {_q(h.identity_file)}")
        if h.bastion != bast and h.bastion is not None:
            b = h.bastion
            own.append(f"bastion: {{address: {_q(b[0])}, user: {_q(b[1])}, port: {b[2]}}}")
        if own:
            out.append(f"    ssh: {{{', '.join(own)}}}")
        if h.role == "worker":
            out.append("    # gpus: 8                      # optional: preflight compares with nvidia-smi")
    return "\n".join(out) + "\n"
