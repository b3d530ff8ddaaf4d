"""The cluster lock: one gpuk8s run at a time changes a cluster, held on its first control plane.

The lock is flock(2) on /var/lib/gpuk8s/cluster.lock, taken by a command that then waits on its stdin
over the run's own SSH connection: when gpuk8s finishes, dies or loses the connection, stdin ends and
the kernel releases the lock. No pid file, no expiry to guess. The holder writes who it is and since
when beside the lock, so a second run can say whom it waits for.
"""

from __future__ import annotations

import shlex

from gpuk8s.remote import Held, RemoteError, Session

LOCK_DIR = "/var/lib/gpuk8s"
_BUSY = "@@gpuk8s-cluster-lock busy "
_HELD = "@@gpuk8s-cluster-lock held"


class ClusterBusy(Exception):
    """Another gpuk8s run holds the cluster lock."""

    def __init__(self, host: str, holder: str) -> None:
        self.host = host
        self.holder = holder or "owner unknown"
        self.message = f"another gpuk8s run is changing this cluster: {self.holder} (lock on {host})"
        self.remedy = "wait for it to finish, then re-run"
        super().__init__(self.message)


def lock_script(owner: str) -> str:
    return (
        f"d={LOCK_DIR}; mkdir -p \"$d\" && exec 9>>\"$d/cluster.lock\" || exit 1\n"
        f"if ! flock -n 9; then printf '{_BUSY}%s\\n' \"$(head -c 300 \"$d/cluster.lock.owner\" 2>/dev/null)\"; "
        "exit 75; fi\n"
        f"printf '%s, since %s\\n' {shlex.quote(owner)} \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" "
        "> \"$d/cluster.lock.owner\"\n"
        f"echo '{_HELD}'\n"
        "cat >/dev/null\n"
        "rm -f \"$d/cluster.lock.owner\"\n"
    )


def acquire(session: Session, owner: str) -> Held:
    """Take the cluster lock on `session`'s host or raise ClusterBusy (naming the holder) or RemoteError."""
    held, first = session.hold(lock_script(owner), display="take the cluster lock")
    if held is not None and first.strip() == _HELD:
        return held
    if held is not None:
        held.release()
    text = first.strip()
    busy = next((ln for ln in text.splitlines() if ln.startswith(_BUSY)), None)
    if busy is not None:
        raise ClusterBusy(session.host.name, busy[len(_BUSY):].strip())
    raise RemoteError("lock", f"cannot take the cluster lock on {session.host.name}: "
                      f"{(text.splitlines() or ['no output'])[-1][:300]}",
                      "check that sudo works there and /var/lib/gpuk8s is writable")
