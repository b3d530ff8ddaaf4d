"""Phase prepare: preflight every host, then prepare the ones that passed with the playbooks.

One remote script per host (gpuk8s/install/prepare.py, playbooks/*.yaml). Afterwards the context holds
the connections of the hosts that are ready, their facts (read again where the playbooks changed
something) and every node's GPU plan. A worker that fails is reported and left out of the cluster
phases; the first control plane failing stops the flow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpuk8s import gpuplan
from gpuk8s.facts.model import HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.health.run import EXTRA
from gpuk8s.install.prepare import Event, PrepareReport, prepare
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.preflight.runner import gather
from gpuk8s.remote import Session, for_each_host


def health_sections(inv: Inventory) -> Callable[[Host], str] | None:
    """The health sections preflight runs with the probe on a GPU host, where the health phase will judge them
    (health.before_join): they ride in preflight's round trip."""
    if inv.health.before_join == "off":
        return None
    return lambda h: EXTRA if is_gpu_node(h) else ""


def refresh_facts(sessions: dict[str, Session], concurrency: int) -> dict[str, HostFacts]:
    """Facts as they are now (after the playbooks changed the hosts): one probe run per host."""
    hosts = [s.host for s in sessions.values()]
    got = for_each_host(hosts, lambda h: gather(sessions[h.name])[0], concurrency)
    return {n: v for n, v in got.items() if isinstance(v, HostFacts)}


class Prepare(Phase):
    name = "prepare"
    title = "preflight and node preparation"
    fatal = False

    def __init__(self, on_event: Callable[[Event], None] | None = None, measure_network: bool = False,
                 apply: bool = True) -> None:
        self.on_event = on_event
        self.measure_network = measure_network
        # apply=False: --skip-phases prepare (or --only-phase another): preflight and the steps' checks still run,
        # so that the later phases have every host's connection, facts and GPU plan; no step is applied
        self.apply = apply

    def _target(self, ctx: Context) -> Inventory:
        if ctx.options.only is None:
            return ctx.inv
        names = {ctx.cp.name} | {h.name for h in ctx.options.only}
        return replace(ctx.inv, hosts=tuple(h for h in ctx.inv.hosts if h.name in names))

    def _prepare(self, ctx: Context, dry_run: bool) -> PrepareReport:
        rep = prepare(self._target(ctx), concurrency=ctx.concurrency, ignore=ctx.ignore,
                      sudo_passwords=ctx.sudo_passwords, dry_run=dry_run, measure_network=self.measure_network,
                      on_event=self.on_event, sessions=ctx.sessions, extra=health_sections(ctx.inv))
        ctx.prepare_report = rep
        done = {h.host.name for h in rep.hosts if h.status == "done"}
        for name in [n for n in ctx.sessions if n not in done and n != ctx.cp.name]:
            ctx.sessions.pop(name).close()
        changed = {h.host.name for h in rep.hosts if h.count("changed")}
        facts = {r.host.name: r.facts for r in rep.preflight
                 if r.facts is not None and r.host.name in done and r.host.name not in changed}
        facts.update(refresh_facts({n: s for n, s in ctx.sessions.items() if n in changed}, ctx.concurrency))
        ctx.facts = facts
        ctx.health = {r.host.name: (facts[r.host.name], r.health) for r in rep.preflight
                      if r.health is not None and facts.get(r.host.name) is r.facts}
        ctx.plans = gpuplan.plans(ctx.inv, facts)
        return rep

    def plan(self, ctx: Context) -> PhasePlan:
        rep = self._prepare(ctx, dry_run=True)
        changes = [Change(f"{s.step.playbook}/{s.step.name}: {s.step.title}", h.host.name, s.step.run,
                          stdin=f"{s.step.file_path}:\n{s.step.file_content}" if s.step.file_path else "")
                   for h in rep.hosts for s in h.steps if s.outcome.status == "would-change"]
        blocked = [f"{h.host.name}: {h.status}" for h in rep.hosts if h.status != "done"]
        return self.planned("would-change" if changes else "unchanged",
                            "; ".join(blocked) if blocked else "every host passed preflight", changes)

    def run(self, ctx: Context) -> PhaseResult:
        rep = self._prepare(ctx, dry_run=not self.apply)
        done = [h for h in rep.hosts if h.status == "done"]
        bad = [h for h in rep.hosts if h.status != "done"]
        n_changed = sum(h.count("changed") for h in rep.hosts)
        if self.apply:
            r = self.result("changed" if n_changed else "unchanged",
                            f"{len(done)} of {len(rep.hosts)} host(s) ready, {n_changed} step(s) changed")
        else:
            pending = sum(h.count("would-change") for h in rep.hosts)
            r = self.result("skipped", f"skipped: preflight read {len(done)} of {len(rep.hosts)} host(s); "
                            f"{pending} step(s) that would change were not applied")
        r.hosts = {h.host.name: h.status for h in rep.hosts}
        cp = next((h for h in rep.hosts if h.host.name == ctx.cp.name), None)
        if cp is None or cp.status != "done" or not ctx.locked:
            r.status, r.stop = "failed", True
            r.message = (f"the first control plane {ctx.cp.name} was not prepared" if cp is None or
                         cp.status != "done" else f"the cluster lock on {ctx.cp.name} was not taken")
            r.remedy = "fix it (see above) and re-run"
        elif bad:
            r.status = "failed"
            r.message += "; not ready: " + ", ".join(f"{h.host.name} ({h.status})" for h in bad)
            r.remedy = "see the host table; the cluster phases go on without them"
        return r
