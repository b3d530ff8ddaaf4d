"""Phase lock: take the cluster lock on the first control plane, held until the flow ends.

flock(2) on /var/lib/gpuk8s/cluster.lock, by a command that waits on its stdin over the run's own SSH
connection (playbooks/cluster/cluster-lock.sh): when gpuk8s finishes, dies or loses the connection, stdin
ends and the kernel releases the lock. A second run stops at once, naming the holder and since when.
"""

from __future__ import annotations

from gpuk8s.install.prepare import owner
from gpuk8s.phases import shell
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult
from gpuk8s.remote import Held, RemoteError, Session

_BUSY = "@@gpuk8s-cluster-lock busy "
_HELD = "@@gpuk8s-cluster-lock held"


class ClusterBusy(PhaseError):
    def __init__(self, host: str, holder: str) -> None:
        super().__init__(f"another gpuk8s run is changing this cluster: {holder or 'owner unknown'} (lock on {host})",
                         "wait for it to finish, then re-run; if that run is gone (a connection that dropped "
                         "without closing holds the lock until sshd notices), end the holder on "
                         f"{host}: sudo fuser -k /var/lib/gpuk8s/cluster.lock")


def acquire(session: Session, who: str) -> Held:
    """Take the cluster lock on `session`'s host or raise ClusterBusy (naming the holder) or RemoteError."""
    held, first = session.hold(shell.command("cluster-lock", owner=who), until=_HELD, display="take the cluster lock")
    if held is not None and _HELD in first.splitlines():  # a login script may print before it
        return held
    if held is not None:
        held.release()
    busy = next((ln for ln in first.splitlines() if ln.startswith(_BUSY)), None)
    if busy is not None:
        raise ClusterBusy(session.host.name, busy[len(_BUSY):].strip())
    raise RemoteError("lock", f"cannot take the cluster lock on {session.host.name}: "
                      f"{(first.strip().splitlines() or ['no output'])[-1][:300]}",
                      "check that sudo works there and /var/lib/gpuk8s is writable")


class Lock(Phase):
    name = "lock"
    title = "take the cluster lock"

    def __init__(self) -> None:
        self.held: Held | None = None

    def plan(self, ctx: Context) -> PhasePlan:
        return self.planned("would-change", "one gpuk8s run at a time changes a cluster", [
            Change(f"hold the cluster lock on {ctx.cp.name} until the run ends", ctx.cp.name,
                   shell.command("cluster-lock", owner=owner()))])

    def run(self, ctx: Context) -> PhaseResult:
        s = ctx.sessions.get(ctx.cp.name)
        if s is None:
            s = Session(ctx.cp, ctx.sudo_passwords.get(ctx.cp.name))
        try:
            self.held = acquire(s, owner())
        except RemoteError as e:
            # no host is changed without the lock: a second run could be preparing or joining them
            s.close()
            raise PhaseError(f"the cluster lock cannot be taken on {ctx.cp.name}: {e.message}",
                             f"{e.remedy}; to prepare the other hosts meanwhile: gpuk8s install --prepare-only "
                             "(host locks only)") from None
        except BaseException:
            s.close()
            raise
        ctx.sessions[ctx.cp.name] = s
        ctx.locked = True
        ctx.relock = self.relock
        ctx.on_exit.append(self.release)
        return self.result("changed", f"held on {ctx.cp.name} until this run ends")

    def relock(self, session: Session) -> None:
        """The lock again, on a new connection to its host (the old one ended with a reboot, and the lock with it):
        ClusterBusy when another run took it meanwhile (this run must stop), RemoteError when it cannot be taken."""
        self.release()
        self.held = acquire(session, owner())

    def release(self) -> None:
        if self.held is not None:
            self.held.release()
            self.held = None
