"""Private files on the operator's machine: the admin kubeconfig (it carries a client key).

`write_private` never follows a symbolic link, never truncates an existing file in place (the content goes
to a new 0600 file in the same directory, fsynced, then renamed over the target, so a reader sees the old
file or the new one and the key is never in a file with a wider mode), and never replaces a file that
holds something else unless asked to. `merge_kubeconfig` adds one cluster to an existing kubeconfig
(`~/.kube/config`) under names of its own, keeping every other entry and the current context.

Messages and return values name paths and entries only: never the content, which holds a private key.
Kubeconfigs are read as plain YAML (gpuk8s/plainyaml.py): bounded, and one with anchors or aliases is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from gpuk8s import plainyaml
from gpuk8s.errors import GpuK8sError

MAX_READ = 16 << 20  # an existing kubeconfig larger than this is not one we should parse
MAX_ADMIN = 1 << 20  # kubeadm's admin.conf is about 6 KiB
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")


class LocalFileError(GpuK8sError):
    """A local file was not written; `remedy` says what to do. Neither ever holds the file's content."""

    kind = "local-file"


Status = Literal["created", "replaced", "unchanged", "merged"]


@dataclass(frozen=True)
class Written:
    """What happened to the file: `status` is created, replaced, unchanged or merged."""

    path: Path
    status: Status
    message: str

    @property
    def changed(self) -> bool:
        return self.status != "unchanged"

    def __str__(self) -> str:
        return self.message


def write_private(path: str | os.PathLike[str], text: str, *, force: bool = False) -> Written:
    """Write `text` to `path` with mode 0600, atomically, never through a symbolic link.

    The same content already there: nothing is written ("unchanged"; a mode wider than 0600 is narrowed).
    Different content: refused unless `force`. A symbolic link or anything but a regular file: always
    refused. A missing parent directory is created with mode 0700.
    """
    target = Path(os.path.expanduser(os.fspath(path)))
    data = text.encode("utf-8")
    with _directory(target) as dfd:
        name = target.name
        st = _lstat(name, dfd)
        if st is not None:
            _refuse_unless_regular(target, st)
            old = _read_at(target, name, dfd, len(data) + 1)
            if old == data:
                mode = stat.S_IMODE(st.st_mode)
                if mode & 0o077:
                    _narrow_mode(target, name, dfd)
                    return Written(target, "unchanged",
                                   f"{target} already holds this content; its mode {mode:04o} is now 0600")
                return Written(target, "unchanged", f"{target} already holds this content (mode 0600)")
            if not force:
                raise LocalFileError(
                    f"{target} exists and holds something else (another kubeconfig?); it was not replaced",
                    "choose another path (--kubeconfig-out), add this cluster to it (--kubeconfig-merge), "
                    "or replace it (--force)")
        _replace(target, name, dfd, data)
    if st is None:
        return Written(target, "created", f"written with mode 0600: {target}")
    return Written(target, "replaced", f"replaced with mode 0600: {target}")


def merge_kubeconfig(path: str | os.PathLike[str], text: str, context_name: str,
                     context_as: str | None = None) -> Written:
    """Add the cluster of the kubeconfig `text` (kubeadm's admin.conf) to the kubeconfig at `path`.

    Its cluster, user and context are renamed NAME, NAME-admin and NAME-admin@NAME (kubeadm calls them
    kubernetes, kubernetes-admin and kubernetes-admin@kubernetes in every cluster, so they would clash);
    entries with those names are replaced, every other entry is kept, and current-context is set only if
    the file has none. A missing file is created. Written with `write_private(force=True)`.

    `context_as` names the context instead of NAME-admin@NAME. An existing file is edited in place where
    its layout allows (block lists): every other entry, comment and line keeps its bytes; the old file is
    kept as PATH.gpuk8s.bak (0600) before it is replaced.
    """
    if not _NAME.match(context_name or ""):
        raise LocalFileError(f"{context_name!r} cannot name a kubeconfig context",
                             "use letters, digits, '.', '-' and '_' (the inventory's cluster.name is)")
    target = Path(os.path.expanduser(os.fspath(path)))
    new = _parse(text, "the kubeconfig fetched from the control plane",
                 "check /etc/kubernetes/admin.conf on the control plane (kubeadm init finished?)")
    cluster, user, context = _entries(new)
    cname, uname, xname = context_name, f"{context_name}-admin", f"{context_name}-admin@{context_name}"
    if context_as is not None:
        if not _ENTRY.fullmatch(context_as):
            raise LocalFileError(f"{context_as!r} cannot name a kubeconfig context",
                                 "use letters, digits, '.', '-', '_', '@' and ':'")
        xname = context_as
    cluster = {**cluster, "name": cname}
    user = {**user, "name": uname}
    context = {**context, "name": xname,
               "context": {**(context.get("context") or {}), "cluster": cname, "user": uname}}

    with _directory(target) as dfd:
        st = _lstat(target.name, dfd)
        if st is not None:
            _refuse_unless_regular(target, st)
            raw = _read_at(target, target.name, dfd, MAX_READ + 1)
            if len(raw) > MAX_READ:
                raise LocalFileError(f"{target} is larger than {MAX_READ >> 20} MiB: not a kubeconfig to merge into",
                                     "choose another path (--kubeconfig-out)")
            try:
                old_text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise LocalFileError(f"{target} is not UTF-8 text: not a kubeconfig",
                                     "choose another path (--kubeconfig-out)") from None
            old = _parse(old_text, str(target), "fix or move that file, or choose another path (--kubeconfig-out)")
        else:
            old = {}
    if not isinstance(old, dict):
        raise LocalFileError(f"{target} is not a kubeconfig (not a mapping of keys)",
                             "fix or move that file, or choose another path (--kubeconfig-out)")

    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", **old}
    for section, entry in (("clusters", cluster), ("users", user), ("contexts", context)):
        merged[section] = _upsert(target, section, merged.get(section), entry)
    merged.setdefault("preferences", {})
    if not merged.get("current-context"):
        merged["current-context"] = xname

    if st is not None and merged == old:
        return Written(target, "unchanged", f"{target} already has the context {xname} with these credentials")
    out = _splice(old_text, merged, (cluster, user, context)) if st is not None else None
    if out is None:  # a new file, or a layout the splice does not handle: the whole file dumped again
        out = yaml.safe_dump(merged, default_flow_style=False, sort_keys=False)
    if st is not None:
        write_private(target.with_name(target.name + ".gpuk8s.bak"), old_text, force=True)
    write_private(target, out, force=True)
    current = merged["current-context"]
    note = "" if current == xname else f"; current context still {current} (kubectl --context {xname})"
    verb = "added to" if st is not None else "written with mode 0600 as"
    return Written(target, "merged", f"context {xname} {verb} {target}{note}")


def _splice(old_text: str, merged: dict[str, Any], entries: tuple[dict[str, Any], ...]) -> str | None:
    """`old_text` with the three entries replaced or appended in place, every other byte kept; None when the
    layout is not one this handles (flow lists, an empty section) or the result would not parse to `merged`."""
    try:
        root = yaml.compose(old_text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None
    if not isinstance(root, yaml.MappingNode):
        return None
    lines = old_text.splitlines(keepends=True)
    keys = {k.value: v for k, v in root.value if isinstance(k, yaml.ScalarNode)}
    edits: list[tuple[int, int, str]] = []  # (first line, line after the last, new text)
    tail: list[str] = []
    for section, entry in zip(("clusters", "users", "contexts"), entries, strict=True):
        seq = keys.get(section)
        if seq is None:
            tail.append(yaml.safe_dump({section: [entry]}, default_flow_style=False, sort_keys=False))
            continue
        if not (isinstance(seq, yaml.SequenceNode) and not seq.flow_style and seq.value):
            return None
        items = seq.value
        first = items[0].start_mark
        dash = lines[first.line].rfind("-", 0, first.column)
        if dash < 0 or lines[first.line][:dash].strip():
            return None
        item = yaml.safe_dump([entry], default_flow_style=False, sort_keys=False)
        item = "".join(" " * dash + ln for ln in item.splitlines(keepends=True))
        spans = [(it.start_mark.line, _last_line(it) + 1) for it in items]
        same = [i for i, it in enumerate(items) if isinstance(it, yaml.MappingNode)
                and any(isinstance(k, yaml.ScalarNode) and k.value == "name" and isinstance(v, yaml.ScalarNode)
                        and v.value == entry["name"] for k, v in it.value)]
        if same:
            edits.append((*spans[same[0]], item))
        else:
            edits.append((spans[-1][1], spans[-1][1], item))
    for key in ("apiVersion", "kind", "preferences", "current-context"):
        if key not in keys:
            tail.append(yaml.safe_dump({key: merged[key]}, default_flow_style=False, sort_keys=False))
    if not keys.get("current-context", yaml.ScalarNode("", "x")).value:
        return None  # an empty current-context is set by the merge: the layout of that line is not ours
    for start, end, text in sorted(edits, reverse=True):
        if end > len(lines) or (end and not lines[end - 1].endswith("\n")):
            lines[end - 1:end] = [lines[end - 1] + "\n"] if end else []
        lines[start:end] = [text]
    out = "".join(lines)
    if tail:
        out += ("" if out.endswith("\n") or not out else "\n") + "".join(tail)
    try:
        return out if yaml.safe_load(out) == merged else None
    except yaml.YAMLError:
        return None


def _last_line(node: yaml.Node) -> int:
    """The last line a node's text is on (a block scalar's end mark is on the line after it)."""
    end = node.end_mark
    last = end.line if end.column > 0 else end.line - 1
    return max(last, node.start_mark.line)


def _no_foreign_links(path: Path) -> None:
    """Refuse a path with a symbolic link on the way that neither root nor this user made (root's links, such as
    /var -> /private/var, are the system's; another user's link decides where the files go)."""
    cur = Path("/")
    for part in Path(os.path.abspath(path)).parts[1:]:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except OSError:
            return  # from here on the path does not exist: makedirs creates it
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
            raise LocalFileError(f"{cur} is a symbolic link of another user (uid {st.st_uid}): not followed, "
                                 "nothing written", "choose a directory of your own")


def write_into(directory: str | os.PathLike[str], files: dict[str, str]) -> list[Written]:
    """Write each of `files` (file name -> text) into `directory`, as `write_private` writes: mode 0600, a new
    file renamed over the old, never through a symbolic link (`gpuk8s render --output-dir`).

    The directory is created 0700 when missing. One that belongs to another user, or that group or others may
    write, is refused: whoever can write it could swap a file for a link between two runs. Every name is
    checked before anything is written: a link, or anything but a regular file, refuses the whole lot.
    """
    target = Path(os.path.expanduser(os.fspath(directory)))
    _no_foreign_links(target)
    try:
        os.makedirs(target, mode=0o700, exist_ok=True)
        # O_NOFOLLOW: the directory itself is never a link (another user's /tmp/out pointing at a directory of the
        # operator's own would pass every check below and have its files replaced)
        dfd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(target):  # O_DIRECTORY may say ENOTDIR
            raise LocalFileError(f"{target} is a symbolic link: not followed, nothing written",
                                 "name the directory itself, or choose another") from None
        raise LocalFileError(f"cannot use the directory {target}: {e.strerror or type(e).__name__}",
                             "choose a directory you can write") from None
    try:
        st = os.fstat(dfd)  # the directory opened, whatever a link on the way named
        if st.st_uid != os.geteuid():
            raise LocalFileError(f"{target} belongs to another user (uid {st.st_uid}): nothing written",
                                 "choose a directory of your own (a new path is created with mode 0700)")
        if stat.S_IMODE(st.st_mode) & 0o022:
            raise LocalFileError(f"{target} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                                 "nothing written", f"run: chmod go-w {target}, or choose a directory of your own")
        for name in files:
            if not name or name in (".", "..") or "/" in name or "\0" in name:
                raise LocalFileError(f"{name!r} is not a file name: nothing written", "a bug: report it")
            found = _lstat(name, dfd)
            if found is not None and stat.S_ISLNK(found.st_mode):
                raise LocalFileError(f"{target / name} is a symbolic link: not followed, nothing written",
                                     "remove the link, or choose another directory")
            if found is not None and not stat.S_ISREG(found.st_mode):
                raise LocalFileError(f"{target / name} exists and is not a regular file: nothing written",
                                     "move it away, or choose another directory")
        out = []
        for name, text in files.items():
            existed = _lstat(name, dfd) is not None
            _replace(target / name, name, dfd, text.encode("utf-8"))
            out.append(Written(target / name, "replaced" if existed else "created",
                               f"{'replaced' if existed else 'written'} with mode 0600: {target / name}"))
    finally:
        os.close(dfd)
    return out


# -- helpers -------------------------------------------------------------------------------------

@contextlib.contextmanager
def _directory(target: Path) -> Iterator[int]:
    """An fd of the target's directory (created 0700 when missing): every step is relative to it."""
    parent = target.parent
    try:
        if not parent.exists():
            os.makedirs(parent, mode=0o700, exist_ok=True)
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise LocalFileError(f"cannot use the directory {parent}: {e.strerror or type(e).__name__}",
                             "choose a path in a directory you can write") from None
    try:
        yield dfd
    finally:
        os.close(dfd)


def _lstat(name: str, dfd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _refuse_unless_regular(target: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise LocalFileError(f"{target} is a symbolic link: not followed, nothing written",
                             "pass the path of the file itself, or remove the link")
    if not stat.S_ISREG(st.st_mode):
        raise LocalFileError(f"{target} exists and is not a regular file: nothing written",
                             "choose another path (--kubeconfig-out)")


def _read_at(target: Path, name: str, dfd: int, limit: int) -> bytes:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        raise LocalFileError(f"cannot read {target}: {e.strerror or type(e).__name__}",
                             "choose another path (--kubeconfig-out)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LocalFileError(f"{target} is not a regular file: nothing written",
                                 "choose another path (--kubeconfig-out)")
        chunks, left = [], limit
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _narrow_mode(target: Path, name: str, dfd: int) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
    except OSError as e:
        raise LocalFileError(f"{target} is readable by others and its mode cannot be changed: "
                             f"{e.strerror or type(e).__name__}", f"run: chmod 600 {target}") from None


def _replace(target: Path, name: str, dfd: int, data: bytes) -> None:
    """A new 0600 file next to the target, fsynced, renamed over it; no temporary file is ever left."""
    tmp = f".{name}.gpuk8s-{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    except OSError as e:
        raise LocalFileError(f"cannot create a file in {target.parent}: {e.strerror or type(e).__name__}",
                             "choose a path in a directory you can write") from None
    try:
        try:
            os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        if isinstance(e, OSError):
            raise LocalFileError(f"cannot write {target}: {e.strerror or type(e).__name__}",
                                 "check the free space and permissions there") from None
        raise
    with contextlib.suppress(OSError):
        os.fsync(dfd)  # the rename itself survives a crash


def _parse(text: str, what: str, remedy: str) -> Any:
    """A kubeconfig's text as data. Anchors and aliases are refused (plainyaml): kubectl writes none, and the
    merge compares and dumps what it loaded, which expands an alias bomb (745 bytes took 120 s)."""
    try:
        data = plainyaml.load(text, MAX_READ)
    except plainyaml.PlainYAMLError as e:
        where = f" (line {e.line})" if e.line else ""
        raise LocalFileError(f"{what} {e.reason}{where}: gpuk8s reads only plain kubeconfigs (kubectl writes "
                             "no anchors or aliases)", remedy) from None
    except yaml.MarkedYAMLError as e:
        # the exception's own text quotes the file: only its position is kept
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1})" if mark else ""
        raise LocalFileError(f"{what} is not valid YAML{where}", remedy) from None
    except (yaml.YAMLError, RecursionError):
        raise LocalFileError(f"{what} is not valid YAML", remedy) from None
    return {} if data is None else data


def _entries(cfg: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The context the fetched kubeconfig uses, with its cluster and user entries."""
    bad = LocalFileError("the kubeconfig fetched from the control plane has no usable cluster, user and context",
                         "check /etc/kubernetes/admin.conf on the control plane (kubeadm init finished?)")
    if not isinstance(cfg, dict):
        raise bad
    lists: list[list[dict[str, Any]]] = []
    for k in ("clusters", "users", "contexts"):
        x = cfg.get(k)
        if not (isinstance(x, list) and x and all(isinstance(e, dict) for e in x)):
            raise bad
        lists.append(x)
    clusters, users, contexts = lists
    current = cfg.get("current-context")
    ctx = next((c for c in contexts if c.get("name") == current), contexts[0])
    ref = ctx.get("context")
    if not isinstance(ref, dict):
        raise bad
    cluster = next((c for c in clusters if c.get("name") == ref.get("cluster")), None)
    user = next((u for u in users if u.get("name") == ref.get("user")), None)
    if cluster is None or user is None:
        raise bad
    return cluster, user, ctx


def _upsert(target: Path, section: str, entries: Any, entry: dict[str, Any]) -> list[Any]:
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise LocalFileError(f"{target}: '{section}' is not a list: not a kubeconfig",
                             "fix or move that file, or choose another path (--kubeconfig-out)")
    out = list(entries)
    for i, e in enumerate(out):
        if isinstance(e, dict) and e.get("name") == entry["name"]:
            out[i] = entry
            return out
    out.append(entry)
    return out


_B64 = re.compile(r"[A-Za-z0-9+/=\s]{1,1048576}")
_ENTRY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,252}")  # kubeadm: kubernetes-admin@kubernetes


def admin_kubeconfig(text: str) -> str:
    """The admin kubeconfig a control plane sent, rebuilt from the only fields kubeadm writes in it.

    A kubeconfig can name commands that kubectl runs on this machine (users[].user.exec, auth-provider)
    or files it reads (tokenFile, client-key paths): from a hostile control plane that would be code on
    the operator's machine. Only one cluster (https server, CA data), one user (client certificate and
    key data) and one context are taken; anything else is refused. Errors never quote the content.
    """
    try:
        cfg = plainyaml.load(text, MAX_ADMIN)
    except plainyaml.PlainYAMLError as e:
        raise LocalFileError(f"the control plane's admin.conf {e.reason}: not what kubeadm writes",
                             _ADMIN_FIX) from None
    except yaml.YAMLError:
        raise LocalFileError("the control plane's admin.conf is not YAML", _ADMIN_FIX) from None
    if not isinstance(cfg, dict):
        raise LocalFileError("the control plane's admin.conf is not a kubeconfig", _ADMIN_FIX)
    clusters, users, contexts = cfg.get("clusters"), cfg.get("users"), cfg.get("contexts")
    if not (isinstance(clusters, list) and isinstance(users, list) and isinstance(contexts, list)
            and len(clusters) == len(users) == len(contexts) == 1):
        raise LocalFileError("the control plane's admin.conf does not have exactly one cluster, user and context",
                             _ADMIN_FIX)
    cl, us, cx = clusters[0], users[0], contexts[0]
    cluster = cl.get("cluster") if isinstance(cl, dict) else None
    user = us.get("user") if isinstance(us, dict) else None
    context = cx.get("context") if isinstance(cx, dict) else None
    if not (isinstance(cluster, dict) and isinstance(user, dict) and isinstance(context, dict)):
        raise LocalFileError("the control plane's admin.conf is not a kubeadm admin kubeconfig", _ADMIN_FIX)
    extra = (set(cluster) - {"server", "certificate-authority-data"}) | (
        set(user) - {"client-certificate-data", "client-key-data"})
    if extra:
        raise LocalFileError("the control plane's admin.conf has fields kubeadm does not write there ("
                             + ", ".join(sorted(str(k)[:40] for k in extra)[:5]) + "); refused: a kubeconfig "
                             "can make kubectl run commands on this machine", _ADMIN_FIX)
    server = cluster.get("server")
    names = [cl.get("name"), us.get("name"), cx.get("name"), context.get("cluster"), context.get("user")]
    data = [cluster.get("certificate-authority-data"), user.get("client-certificate-data"),
            user.get("client-key-data")]
    if not (isinstance(server, str) and re.fullmatch(r"https://[A-Za-z0-9.\-\[\]:]{1,300}", server)
            and all(isinstance(n, str) and _ENTRY.fullmatch(n) for n in names)
            and all(isinstance(d, str) and _B64.fullmatch(d) for d in data)
            and context.get("cluster") == cl.get("name") and context.get("user") == us.get("name")):
        raise LocalFileError("the control plane's admin.conf is not a kubeadm admin kubeconfig "
                             "(server, names or certificate data)", _ADMIN_FIX)
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": cx["name"],
        "clusters": [{"name": cl["name"], "cluster": {"server": server, "certificate-authority-data": data[0]}}],
        "contexts": [{"name": cx["name"], "context": {"cluster": cl["name"], "user": us["name"]}}],
        "users": [{"name": us["name"], "user": {"client-certificate-data": data[1], "client-key-data": data[2]}}],
    }, sort_keys=False)


_ADMIN_FIX = ("check /etc/kubernetes/admin.conf on the first control plane (kubeadm writes it); "
              "re-run kubeadm init there")
