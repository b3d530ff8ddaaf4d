"""Files gpuk8s writes on hosts for the cluster phases, and commands that read a configuration with secrets.

A configuration holding a token or a certificate key goes on stdin into a 0600 file whose name is unique to
this run, whole or not at all, and the same remote command removes it when it ends, also when gpuk8s has
gone away (playbooks/cluster/_lib.sh). It never appears on a command line or in a fixed path.
"""

from __future__ import annotations

import secrets

from gpuk8s.lines import lines_that_matter
from gpuk8s.phases import shell
from gpuk8s.remote import RemoteError, Result, Session


def secret_path(name: str) -> str:
    return f"/etc/kubernetes/gpuk8s-{name}-{secrets.token_hex(6)}.yaml"


def run_with_secret(s: Session, template: str, name: str, content: str, timeout: float | None = None,
                    **values: object) -> Result:
    """Run playbooks/cluster/TEMPLATE.sh with `content` on its stdin, in a file secret_path(name)."""
    data = content.encode()
    config = secret_path(name)
    return s.run(shell.script(template, config=config, size=len(data), **values), sudo=True, stdin=data,
                 timeout=timeout, display=f"{template} (configuration {config} from stdin)")


def put_file(s: Session, path: str, content: str) -> None:
    """A 0600 file written from stdin through a temporary file and a rename."""
    res = s.run(shell.command("put-file", path=path), sudo=True, stdin=content.encode(), display=f"write {path}")
    if not res.ok:
        raise RemoteError("write", f"cannot write {path} on {s.host.name}: {tail(res)}", "check the disk")


def tail(res: Result, n: int = 8) -> str:
    """The lines of a command's output that say what went wrong, on one line."""
    return " | ".join(lines_that_matter(res.stderr + "\n" + res.stdout, n))
