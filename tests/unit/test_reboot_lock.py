"""Issue 41: rebooting the first control plane (the driver or MIG phase with --allow-reboot, driver upgrade) ended the
SSH connection the cluster lock was held on, and nothing took it again: a second install, upgrade or allocator run
could start beside the first. phases/reboot.reboot takes it again on the new connection before the phase goes on, and
stops the run when another run took it meanwhile; kubectl over the ended connection is dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuk8s.inventory.model import Cluster, Host, Inventory, SSHSettings
from gpuk8s.kube.client import SSHKubectl
from gpuk8s.phases import reboot as rb
from gpuk8s.phases.base import Context
from gpuk8s.phases.lock import ClusterBusy

CP = Host("cp-1", "10.0.0.10", "control-plane", SSHSettings(), gpus=8)
W = Host("gpu-1", "10.0.0.11", "worker", SSHSettings(), gpus=8)


class Conn:
    def __init__(self, host: Host) -> None:
        self.host, self.closed = host, False

    def run(self, *a: Any, **k: Any) -> Any:
        raise rb.RemoteError("ssh", "connection lost")  # the reboot drops it

    def close(self) -> None:
        self.closed = True


def ctx_with(monkeypatch: pytest.MonkeyPatch, relock: Any) -> tuple[Context, dict[str, Conn]]:
    inv = Inventory(Path("i.yaml"), Cluster(), SSHSettings(), (CP, W))
    old = {h.name: Conn(h) for h in (CP, W)}
    ctx = Context(inv, sessions=dict(old), locked=True, relock=relock)  # type: ignore[arg-type]
    ctx.kube_client = SSHKubectl(old["cp-1"])  # type: ignore[arg-type]
    monkeypatch.setattr(rb, "wait_down", lambda *a: True)
    monkeypatch.setattr(rb, "wait_up", lambda host, *a: Conn(host))
    return ctx, old


def test_the_lock_is_taken_again_on_the_first_control_planes_new_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[Conn] = []
    ctx, old = ctx_with(monkeypatch, taken.append)
    fresh, problem = rb.reboot(ctx, CP, "nouveau holds the GPUs")
    assert problem == "" and fresh is not None and taken == [fresh] and ctx.locked
    assert ctx.sessions["cp-1"] is fresh and old["cp-1"].closed and ctx.kube_client is None
    fresh, problem = rb.reboot(ctx, W, "nouveau holds the GPUs")  # a worker's reboot leaves the lock alone
    assert problem == "" and taken == [ctx.sessions["cp-1"]]


def test_a_lock_another_run_took_meanwhile_stops_this_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def busy(_s: Any) -> None:
        raise ClusterBusy("cp-1", "alice@ws 2026-12-04T05:00:00Z pid 4242")
    ctx, _old = ctx_with(monkeypatch, busy)
    fresh, problem = rb.reboot(ctx, CP, "driver 580 -> 595")
    assert fresh is None and not ctx.locked
    assert "the cluster lock could not be taken again: another gpuk8s run is changing this cluster: alice@ws" in problem


def test_a_lost_lock_stops_the_run_after_the_phase_that_lost_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s.phases.base import Phase, PhaseResult, run_phases

    def busy(_s: Any) -> None:
        raise ClusterBusy("cp-1", "alice@ws")
    ctx, _old = ctx_with(monkeypatch, busy)
    ran: list[str] = []

    class Rebooting(Phase):
        name, title, fatal = "driver", "driver", False

        def run(self, c: Context) -> PhaseResult:
            ran.append(self.name)
            rb.reboot(c, CP, "nouveau")  # the phase itself only names the host as failed
            return self.result("changed", "1 of 2 node(s) with their driver loaded")

    class Next(Phase):
        name, title = "join", "join"

        def run(self, c: Context) -> PhaseResult:
            ran.append(self.name)
            return self.result("changed", "joined")

    results: list[PhaseResult] = []
    assert not run_phases([Rebooting(), Next()], ctx, results)
    assert ran == ["driver"] and results[0].status == "failed" and "lock could not be taken again" in results[0].message
