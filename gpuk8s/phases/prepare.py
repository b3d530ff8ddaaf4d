"""Phase prepare: preflight every host, then prepare the ones that passed with the playbooks.

One remote script per host (gpuk8s/install/prepare.py, playbooks/*.yaml). Afterwards the context holds
the connections of the hosts that are ready, their facts (read again where the playbooks changed
something) and every node's GPU plan. A worker that fails is reported and left out of the cluster
phases; the first control plane failing stops the flow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuk8s.errors import GpuK8sError
from gpuk8s.facts.health import HealthFacts, read_health
from gpuk8s.facts.model import HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.health.run import sections
from gpuk8s.install.prepare import Event, PrepareReport, prepare
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube import state
from gpuk8s.kube.client import SSHKubectl
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult, before_steps
from gpuk8s.preflight.runner import probe
from gpuk8s.remote import Session, for_each_host

log = logging.getLogger("gpuk8s.phases")


def health_sections(ctx: Context) -> tuple[Callable[[Host], str] | None, set[str]]:
    """The health sections preflight runs with the probe on each GPU host the health phase will judge (not yet a
    node of the cluster; inventory health.before_join): they ride in preflight's round trip. And the nodes in
    quarantine already (their GPUs' faults are known: a GPU missing there does not block their preparation).

    The nodes are read once over the first control plane's connection (the lock's; a dry run takes no lock, so it
    is opened here, and kept only if it connects), by kubectl of its own: nothing of the context's cluster state
    (initialized, its kubectl) is set before the playbooks run. A cluster that cannot be read (none yet, its API
    down) counts as no node: every GPU host's sections are read; the health phase reads the nodes again itself."""
    if ctx.inv.health.before_join == "off":
        return None, set()
    nodes: dict[str, Any] = {}
    s = ctx.sessions.get(ctx.cp.name)
    try:
        if s is None:
            s = Session(ctx.cp, ctx.sudo_passwords.get(ctx.cp.name))
            try:
                s.connect()
            except GpuK8sError:
                s.close()  # preflight names the unreachable control plane
                raise
            ctx.sessions[ctx.cp.name] = s
        nodes = state.by_name(SSHKubectl(s).get("nodes"))
    except Exception as e:  # no cluster yet (no admin.conf, no kubectl), or unreadable: read every GPU host
        log.info("the cluster's nodes could not be read before preflight: %s", getattr(e, "message", repr(e)))
    held = {n for n, obj in nodes.items() if state.quarantined(obj)}
    extra = sections(ctx.inv.health.before_join)
    return (lambda h: extra if is_gpu_node(h) and h.name not in nodes else ""), held


def lenient(extra: Callable[[Host], str] | None, quarantined: set[str]) -> Callable[[Host], bool]:
    """The hosts whose missing GPU does not block their preparation: those the health phase judges, and nodes it
    quarantined before."""
    return lambda h: bool(extra and extra(h)) or h.name in quarantined


def reread(sessions: dict[str, Session], concurrency: int, extra: Callable[[Host], str] | None = None
           ) -> tuple[dict[str, HostFacts], dict[str, HealthFacts]]:
    """Facts as they are now (after the playbooks changed the hosts): one probe run per host, with the health
    sections where `extra` gives them (their reading in the second dict)."""
    hosts = [s.host for s in sessions.values()]

    def one(h: Host) -> tuple[HostFacts, HealthFacts | None]:
        more = extra(h) if extra is not None else ""
        facts, _, _, stdout = probe(sessions[h.name], "", more)
        return facts, read_health(stdout) if more else None

    got = for_each_host(hosts, one, concurrency)
    ok = {n: v for n, v in got.items() if isinstance(v, tuple)}
    return {n: v[0] for n, v in ok.items()}, {n: v[1] for n, v in ok.items() if v[1] is not None}


def refresh_facts(sessions: dict[str, Session], concurrency: int) -> dict[str, HostFacts]:
    """Facts as they are now (after the playbooks changed the hosts): one probe run per host."""
    return reread(sessions, concurrency)[0]


class Prepare(Phase):
    name = "prepare"
    title = "preflight and node preparation"
    fatal = False

    def __init__(self, on_event: Callable[[Event], None] | None = None, measure_network: bool = False,
                 apply: bool = True) -> None:
        # whether the health phase runs after this one (flows.health_selected sets it from the phase list): only then
        # do its readings ride in preflight's round trip, and only then is a GPU missing its to judge
        self.health = False
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
        extra, quarantined = health_sections(ctx) if self.health else (None, set())
        rep = prepare(self._target(ctx), concurrency=ctx.concurrency, ignore=ctx.ignore,
                      sudo_passwords=ctx.sudo_passwords, dry_run=dry_run, measure_network=self.measure_network,
                      on_event=self.on_event, sessions=ctx.sessions, extra=extra,
                      lenient=lenient(extra, quarantined), bundle=ctx.bundle, before=before_steps(ctx))
        ctx.prepare_report = rep
        done = {h.host.name for h in rep.hosts if h.status == "done"}
        for name in [n for n in ctx.sessions if n not in done and n != ctx.cp.name]:
            ctx.sessions.pop(name).close()
        changed = {h.host.name for h in rep.hosts if h.count("changed")}
        facts = {r.host.name: r.facts for r in rep.preflight
                 if r.facts is not None and r.host.name in done and r.host.name not in changed}
        health = {r.host.name: (r.facts, r.health) for r in rep.preflight
                  if r.health is not None and r.facts is not None and r.host.name in facts}
        # a host the playbooks changed is read again, its health sections with it (one round trip, as before)
        fresh, readings = reread({n: s for n, s in ctx.sessions.items() if n in changed}, ctx.concurrency, extra)
        facts.update(fresh)
        health.update({n: (fresh[n], h) for n, h in readings.items()})
        ctx.set_facts(facts)
        ctx.health = health
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
