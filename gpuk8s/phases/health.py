"""Phase health: the GPU health check of a host before it joins (inventory health.before_join; docs/health.md).

The quick level's readings ride in preflight's round trip (phases/prepare.health_sections); a host whose facts a
later phase read again (a driver installed, a reboot) is read once more here, one round trip. The standard and long
levels add DCGM's diagnostic (dcgmi diag -r 2 / -r 3), one more round trip per host. Only GPU hosts that
are not yet nodes of the cluster are judged: a node that joined is `gpuk8s health`'s business, and a quarantine
taint it has stays until `gpuk8s health --release`.

What a failing host gets (health.on_failure):
- quarantine: it joins with the taint gpuk8s.io/quarantine=<finding>:NoSchedule (kubeadm's JoinConfiguration
  nodeRegistration.taints, so that no pod lands on it between its registration and the gpu phase; the gpu phase
  taints a first control plane), named in the report with its evidence; verify does not run a test pod on it;
- skip: it is not joined, the others are; the phase fails, the run goes on (exit status 1);
- fail: the run stops before any host is initialised or joined.
"""

from __future__ import annotations

from gpuk8s import findings
from gpuk8s.findings import Finding
from gpuk8s.gpuplan import is_gpu_node, quarantine_taint
from gpuk8s.health.checks import judge
from gpuk8s.health.run import DCGM_RUNS, check_session, dcgm
from gpuk8s.inventory.model import Host
from gpuk8s.kube import state
from gpuk8s.phases.base import Context, Phase, PhasePlan, PhaseResult
from gpuk8s.remote import for_each_host


class Health(Phase):
    name = "health"
    title = "GPU health before joining"
    fatal = False  # skip: the others go on; fail and the first control plane stop the flow (PhaseResult.stop)

    @staticmethod
    def _hosts(ctx: Context) -> list[Host]:
        """The GPU hosts this run would join (or initialise) that are not nodes of the cluster yet."""
        if ctx.inv.health.before_join == "off":
            return []
        present = set(state.by_name(ctx.kube.get("nodes"))) if ctx.initialized() else set()
        wanted = ctx.inv.hosts if ctx.options.only is None else ctx.options.only
        return [h for h in wanted if is_gpu_node(h) and h.name in ctx.sessions and h.name in ctx.facts
                and h.name not in present]

    @staticmethod
    def _judge(ctx: Context, h: Host, planning: bool = False) -> list[Finding]:
        """The host's failing findings: from preflight's reading where its facts are still those preflight read,
        else from a fresh one (one round trip); DCGM's diagnostic at the standard and long levels, not when
        `planning` (a dry run does not run minutes of GPU tests)."""
        got = ctx.health.get(h.name)
        level = "quick" if planning else ctx.inv.health.before_join
        if got is not None and got[0] is ctx.facts.get(h.name):
            found = judge(h, got[0], got[1])
            if level in DCGM_RUNS and got[0].gpu.state == "ok":
                found.append(dcgm(ctx.sessions[h.name], level))
        else:
            found = check_session(ctx.sessions[h.name], level).findings
        bad = [f.about(findings.host(h.name)) for f in found if f.status == "fail"]
        # the cause first: a GPU missing from the count is what an Xid 79 leaves behind, so the Xid names the
        # quarantine where both fail
        return sorted(bad, key=lambda f: f.id == "health.gpu-count")

    def plan(self, ctx: Context) -> PhasePlan:
        if ctx.inv.health.before_join == "off":
            return self.planned("unchanged", "skipped (inventory health.before_join: off)")
        hosts = self._hosts(ctx)
        if not hosts:
            return self.planned("unchanged", "no GPU host to join")
        # read-only: a host whose facts were read again is probed again, as the run would
        bad = {h.name: self._judge(ctx, h, planning=True) for h in hosts}
        verdicts = [f"{n}: {self._action(ctx, n)} ({fs[0].id}: {fs[0].message})" for n, fs in bad.items() if fs]
        reason = (f"{len(hosts)} GPU host(s) judged before joining (the quick level"
                  + (f"; the run adds dcgmi diag -r {DCGM_RUNS[ctx.inv.health.before_join]} on each)"
                     if ctx.inv.health.before_join in DCGM_RUNS else ")")
                  + ("; " + "; ".join(verdicts) if verdicts else ": healthy"))
        return self.planned("would-change" if verdicts else "unchanged", reason)

    @staticmethod
    def _action(ctx: Context, name: str) -> str:
        policy = ctx.inv.health.on_failure
        if policy == "quarantine" or (policy == "skip" and name == ctx.cp.name):
            return "would join quarantined" if name != ctx.cp.name else "would be quarantined"
        return "would not be joined" if policy == "skip" else "would stop the run"

    def run(self, ctx: Context) -> PhaseResult:
        if ctx.inv.health.before_join == "off":
            return self.result("skipped", "skipped (inventory health.before_join: off)")
        hosts = self._hosts(ctx)
        if not hosts:
            return self.result("unchanged", "no GPU host to join")
        r = self.result("passed")
        bad: dict[str, list[Finding]] = {}
        for name, v in for_each_host(hosts, lambda h: self._judge(ctx, h), ctx.concurrency).items():
            if isinstance(v, BaseException):
                v = [findings.failed("facts.parse", f"gpuk8s failed while judging its health: {v!r}",
                                     "see the log file and report it", subject=findings.host(name))]
            if v:
                bad[name] = v
            else:
                r.hosts[name] = "healthy"
        ctx.findings.extend(f for fs in bad.values() for f in fs)
        policy = ctx.inv.health.on_failure
        unread = {n for n, fs in bad.items() if fs[0].id in ("ssh.reachable", "facts.parse")}
        for name, fs in bad.items():
            what = f"{fs[0].id}: {fs[0].message}" + (f" (and {len(fs) - 1} more)" if len(fs) > 1 else "")
            if name in unread:
                r.hosts[name] = f"not checked: {what}"
                self._hold(ctx, name, f"its GPU health could not be read: {what}")
            elif policy == "quarantine" or (policy == "skip" and name == ctx.cp.name):
                ctx.quarantine[name] = fs[0].id
                r.hosts[name] = f"quarantined ({quarantine_taint(fs[0].id)}): {what}"
                ctx.emit(f"{name}: quarantined: {what}")
            elif policy == "skip":
                r.hosts[name] = f"not joined: {what}"
                self._hold(ctx, name, f"GPU health failed: {what}")
            else:
                r.hosts[name] = f"failed: {what}"
        healthy = len(hosts) - len(bad)
        r.message = f"{healthy} of {len(hosts)} GPU host(s) healthy"
        if ctx.quarantine:
            r.message += "; quarantined: " + ", ".join(f"{n} ({i})" for n, i in sorted(ctx.quarantine.items()))
        failed = sorted(n for n in bad if n not in ctx.quarantine)
        if failed and (policy == "fail" or ctx.cp.name in failed):
            r.status, r.stop = "failed", True
            r.message += "; unhealthy: " + ", ".join(failed) + ": the run stops before any host joins"
            r.remedy = ("see `gpuk8s health " + " ".join(failed) + "` (docs/health.md); fix the GPUs, or set "
                        "health.on_failure: quarantine to join them tainted")
        elif failed:
            r.status = "failed"
            r.message += "; not joined: " + ", ".join(failed)
            r.remedy = "see `gpuk8s health " + " ".join(failed) + "`; the other hosts go on"
        elif ctx.quarantine:
            r.remedy = ("the quarantined nodes take no new pods; after the fault is fixed: gpuk8s health --release "
                        + " ".join(sorted(ctx.quarantine)))
        return r

    @staticmethod
    def _hold(ctx: Context, name: str, why: str) -> None:
        """Leave a host out of the phases after this one (never the first control plane's connection: the
        cluster's phases run over it)."""
        ctx.held[name] = why
        if name != ctx.cp.name and name in ctx.sessions:
            ctx.sessions.pop(name).close()
