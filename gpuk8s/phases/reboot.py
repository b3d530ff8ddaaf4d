"""Rebooting a host from a phase (--allow-reboot): ask it to reboot, wait until SSH goes away and answers again.

Used by the MIG phase (a GPU reset refused) and the driver phase (nouveau in the initramfs, or another nvidia module
loaded); each reads the host's facts again afterwards.
"""

from __future__ import annotations

import contextlib

from gpuk8s.errors import GpuK8sError
from gpuk8s.inventory.model import Host
from gpuk8s.kube.client import SSHKubectl
from gpuk8s.phases.base import Context
from gpuk8s.phases.poll import until
from gpuk8s.remote import RemoteError, Session

REBOOT = "sudo systemctl reboot"
DOWN_TIMEOUT = 180.0  # how long a host may keep answering SSH after `systemctl reboot` before it counts as failed
POLL = 0.5


def reboot(ctx: Context, host: Host, why: str) -> tuple[Session | None, str]:
    """Reboot `host` and wait for it: its fresh session (also put in ctx.sessions), or None and what went wrong."""
    old = ctx.sessions[host.name]
    # the connection may drop before the exit status comes back: that is the reboot too
    with contextlib.suppress(RemoteError):
        old.run("systemctl reboot", sudo=True, timeout=60, display="systemctl reboot (--allow-reboot)")
    old.close()
    password = ctx.sudo_passwords.get(host.name)
    if not wait_down(host, password, DOWN_TIMEOUT):
        return None, (f"reboot asked ({why}) but {host.name} still answered SSH after {DOWN_TIMEOUT:g} s: "
                      f"check that {REBOOT} works there, reboot it by hand, then re-run")
    fresh = wait_up(host, password, ctx.options.reboot_timeout)
    if fresh is None:
        return None, (f"{host.name} did not answer SSH within {ctx.options.reboot_timeout:g} s after the "
                      "reboot: check its console (BIOS, fsck, network); re-run gpuk8s install once it is back")
    ctx.sessions[host.name] = fresh
    if isinstance(ctx.kube_client, SSHKubectl) and ctx.kube_client.session is old:
        ctx.kube_client = None  # kubectl went over the ended connection: the next use opens it on the new one
    if ctx.locked and ctx.relock is not None and host.name == ctx.cp.name:
        # the cluster lock was held on the connection the reboot ended: taken again before anything else, or the
        # run stops (another run took it while the host was down)
        try:
            ctx.relock(fresh)
        except GpuK8sError as e:
            ctx.locked = False
            ctx.lock_lost = (f"{host.name} is back after the reboot, but the cluster lock could not be taken again: "
                             f"{e.message}; this run stops here ({e.remedy})")
            return None, ctx.lock_lost
    for again in ctx.after_reboot:
        problem = again(host)
        if problem:
            return None, problem
    return fresh, ""


def _answers(host: Host, password: str | None) -> Session | None:
    """A fresh session to the host when it runs a command now, else None."""
    s = Session(host, password)
    try:
        if s.run("true", timeout=30, display="true (is SSH there?)").ok:
            return s
    except RemoteError:
        pass
    s.close()
    return None


def wait_down(host: Host, password: str | None, timeout: float) -> bool:
    """Poll until the host stops answering SSH (True), or False at the timeout."""
    def gone() -> tuple[bool, None]:
        s = _answers(host, password)
        if s is not None:
            s.close()
        return s is None, None

    return until(gone, timeout, POLL)[0]


def wait_up(host: Host, password: str | None, timeout: float) -> Session | None:
    """Poll until the host answers SSH again: the open session, or None at the timeout."""
    def back() -> tuple[bool, Session | None]:
        s = _answers(host, password)
        return s is not None, s

    return until(back, timeout, POLL)[1]
