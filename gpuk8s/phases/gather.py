"""The gather step of the flows that start on a running cluster (verify, upgrade, driver upgrade, allocator, reset,
doctor --fix): connect to the hosts, read their facts, derive their GPU plans, in one place.

install and join gather in their prepare phase (preflight reads the facts in the same round trip as its checks).
A host that does not answer is named in `ctx.unreachable` (why, cleaned) and left out of `ctx.sessions`; where the
flow needs the first control plane (kubectl runs there), its absence stops the flow before any phase runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gpuk8s.inventory.model import Host
from gpuk8s.phases.base import Context, PhaseError
from gpuk8s.phases.prepare import refresh_facts
from gpuk8s.remote import Session, for_each_host
from gpuk8s.text import clean


def _connect_one(passwords: Mapping[str, str]) -> Callable[[Host], Session]:
    def connect(h: Host) -> Session:
        s = Session(h, passwords.get(h.name))
        try:
            s.connect()
        except BaseException:
            s.close()
            raise
        return s
    return connect


def connect(ctx: Context, hosts: Iterable[Host], *, need_cp: bool = False) -> None:
    """A session to each of `hosts` not connected yet, `ctx.concurrency` at a time; why each other one could not be
    reached in `ctx.unreachable`. need_cp: PhaseError (message and remedy of the connection's error) when the first
    control plane is not reachable."""
    todo = [h for h in hosts if h.name not in ctx.sessions]
    got = for_each_host(todo, _connect_one(ctx.sudo_passwords), ctx.concurrency)
    for name, s in got.items():
        if isinstance(s, Session):
            ctx.sessions[name] = s
        else:
            ctx.unreachable[name] = clean(str(getattr(s, "message", s)))[:300]
    if need_cp and ctx.cp.name not in ctx.sessions:
        err = got.get(ctx.cp.name)
        raise PhaseError(f"the first control plane is not reachable: {ctx.unreachable.get(ctx.cp.name, '')}",
                         str(getattr(err, "remedy", "") or "bring it back, then re-run"))


def read_facts(ctx: Context, names: Iterable[str] | None = None, *, drop_unread: bool = False) -> None:
    """The facts of the connected hosts `names` (default: every connected host), one probe each, merged with those
    read before; every GPU plan follows (Context.set_facts). drop_unread: a host whose facts could not be read is
    closed and left out of `ctx.sessions` (verify judges it unreachable)."""
    wanted = [n for n in (ctx.sessions if names is None else names) if n in ctx.sessions]
    fresh = refresh_facts({n: ctx.sessions[n] for n in wanted}, ctx.concurrency) if wanted else {}
    if drop_unread:
        for name in [n for n in wanted if n not in fresh]:
            ctx.sessions.pop(name).close()
            ctx.unreachable.setdefault(name, "its facts could not be read")
    ctx.set_facts({**ctx.facts, **fresh})


def gather(ctx: Context, hosts: Iterable[Host], *, facts: bool = True, need_cp: bool = False,
           drop_unread: bool = False) -> None:
    """connect, then (facts) read_facts on the hosts connected; every connection closed again when it stops the flow
    (need_cp), so that nothing is left open before the flow's own try/finally."""
    hosts = list(hosts)
    try:
        connect(ctx, hosts, need_cp=need_cp)
        if facts:
            read_facts(ctx, [h.name for h in hosts], drop_unread=drop_unread)
    except BaseException:
        ctx.close()
        raise
