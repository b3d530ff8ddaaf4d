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
from gpuk8s.errors import GpuK8sError
from gpuk8s.findings import Finding
from gpuk8s.gpuplan import is_gpu_node, quarantine_taint
from gpuk8s.health.checks import DCGM_RUNS
from gpuk8s.health.run import check_session, dcgm, judge_level
from gpuk8s.inventory.model import Host
from gpuk8s.kube import state
from gpuk8s.phases.base import Change, Context, Phase, PhasePlan, PhaseResult
from gpuk8s.remote import for_each_host

# A host whose health could not be read at all (or only without root): held back whatever the policy
UNREAD = ("ssh.reachable", "ssh.sudo", "facts.parse")


class Health(Phase):
    name = "health"
    title = "GPU health before joining"
    fatal = False  # skip: the others go on; fail and the first control plane stop the flow (PhaseResult.stop)

    @staticmethod
    def _hosts(ctx: Context) -> list[Host]:
        """The GPU hosts this run would join (or initialise) that are not nodes of the cluster yet."""
        if ctx.inv.health.before_join == "off":
            return []
        # admin.conf without an API server that answers (a half-way kubeadm init): no node can be known, every GPU
        # host is judged, and init (or join) stops the run with the API's own message
        live = ctx.initialized() and not ctx.api_problem
        present = set(state.by_name(ctx.kube.get("nodes"))) if live else set()
        wanted = ctx.inv.hosts if ctx.options.only is None else ctx.options.only
        return [h for h in wanted if is_gpu_node(h) and h.name in ctx.sessions and h.name in ctx.facts
                and h.name not in present]

    @staticmethod
    def _quick(ctx: Context, h: Host) -> tuple[list[Finding], bool]:
        """The host's quick-level findings about it, and whether its GPUs could be checked at all (for DCGM): from
        the reading taken with its facts where those are still the context's, else from a fresh one (one round
        trip: a later phase read its facts again)."""
        got = ctx.health.get(h.name)
        level = ctx.inv.health.before_join
        if got is not None and got[0] is ctx.facts.get(h.name):
            found, gpu_ok = judge_level(h, got[0], got[1], level), got[0].gpu.state == "ok"
        else:
            # DCGM's diagnostic runs after, on the hosts this passes (_judge): not inside this reading
            res = check_session(ctx.sessions[h.name], "fabric" if level == "fabric" else "quick")
            found, gpu_ok = res.findings, res.facts is not None and res.facts.gpu.state == "ok"
        return [f.about(findings.host(h.name)) for f in found], gpu_ok

    def _judge(self, ctx: Context, hosts: list[Host], planning: bool = False) -> dict[str, list[Finding]]:
        """Every host's findings that matter here (failures, the cause first; a DCGM diagnostic that was not run).
        The standard and long levels add DCGM's diagnostic on the hosts the quick level passed (a failing host's
        verdict is made; minutes of GPU tests would not change it), all at once: it is the hosts' work, not this
        machine's. Not when `planning`: a dry run does not run GPU tests."""
        out: dict[str, list[Finding]] = {}
        can_dcgm: list[Host] = []
        for name, v in for_each_host(hosts, lambda h: self._quick(ctx, h), ctx.concurrency).items():
            if isinstance(v, BaseException):  # a bug: named, never a healthy host
                out[name] = [findings.failed("facts.parse", f"gpuk8s failed while judging its health: {v!r}",
                                             "see the log file and report it", subject=findings.host(name))]
                continue
            found, gpu_ok = v
            # the failures, and a kernel log that could not be read (said: its Xids are unknown)
            out[name] = [f for f in found if f.status == "fail" or (f.id == "health.xid" and f.status == "skip")]
            if not out[name] and gpu_ok:
                can_dcgm.append(ctx.inv.host(name))
        level = ctx.inv.health.before_join
        if level in DCGM_RUNS and not planning and can_dcgm:
            ctx.emit(f"DCGM's diagnostic (dcgmi diag -r {DCGM_RUNS[level]}) on {len(can_dcgm)} host(s) ...")
            ran = for_each_host(can_dcgm, lambda h: dcgm(ctx.sessions[h.name], level), min(len(can_dcgm), 128))
            for name, f in ran.items():
                if isinstance(f, BaseException):
                    f = findings.failed("health.dcgm-diag", f"gpuk8s failed while running DCGM's diagnostic: {f!r}",
                                        "see the log file and report it")
                if f.status in ("fail", "skip"):
                    out[name].append(f.about(findings.host(name)))
        for fs in out.values():
            # the cause first: a GPU missing from the count is what an Xid 79 leaves behind, so the Xid names the
            # quarantine where both fail
            fs.sort(key=lambda f: (f.status != "fail", f.id == "health.gpu-count"))
        return out

    def plan(self, ctx: Context) -> PhasePlan:
        if ctx.inv.health.before_join == "off":
            return self.planned("unchanged", "skipped (inventory health.before_join: off)")
        hosts = self._hosts(ctx)
        # a host whose driver gpuk8s installs has none yet in a dry run (the driver phase's plan changes nothing):
        # it is judged after the driver phase, not now
        later = [h for h in hosts if h.gpu.driver.manage and ctx.facts[h.name].gpu.state != "ok"]
        hosts = [h for h in hosts if h not in later]
        after = (f"; {len(later)} host(s) judged once the driver phase has installed their driver: "
                 + ", ".join(h.name for h in later)) if later else ""
        if not hosts:
            return self.planned("unchanged", ("no GPU host to join" if not later else "no host judged now") + after)
        # read-only: a host whose facts were read again is probed again, as the run would; the decisions are
        # recorded in the context as the run records them, so that join's and the gpu phase's plans show the taint
        r = self._decide(ctx, hosts, self._judge(ctx, hosts, planning=True), planning=True)
        reason = (f"{len(hosts)} GPU host(s) judged before joining (the quick level"
                  + (f"; the run adds dcgmi diag -r {DCGM_RUNS[ctx.inv.health.before_join]} on each)"
                     if ctx.inv.health.before_join in DCGM_RUNS else ")") + ": " + r.message + after)
        changes = [Change(f"{n}: {what}", n) for n, what in r.hosts.items() if what != "healthy"]
        return self.planned("would-change" if changes else "unchanged", reason, changes)

    def run(self, ctx: Context) -> PhaseResult:
        if ctx.inv.health.before_join == "off":
            return self.result("skipped", "skipped (inventory health.before_join: off)")
        try:
            hosts = self._hosts(ctx)
        except GpuK8sError as e:
            # which hosts are new cannot be told: none may join unjudged (preflight left their GPU count to this
            # phase), so the run stops here
            r = self.result("failed", f"the cluster's nodes could not be read, so no host was judged: {e.message}",
                            "check the first control plane's API server (kubectl get nodes there), then re-run")
            r.stop = True
            return r
        if not hosts:
            return self.result("unchanged", "no GPU host to join")
        return self._decide(ctx, hosts, self._judge(ctx, hosts))

    def _decide(self, ctx: Context, hosts: list[Host], judged: dict[str, list[Finding]],
                planning: bool = False) -> PhaseResult:
        """What the policy does with each host (in the context: quarantine, held), and the phase's result."""
        r = self.result("passed")
        ctx.findings.extend(f for fs in judged.values() for f in fs)
        policy = ctx.inv.health.on_failure
        # what happens to a host, as the run says it and as a dry run's plan says it would
        says = {"unread": ("not checked", "would not be checked"),
                "quarantine": ("quarantined", "would be quarantined"),
                "skip": ("not joined", "would not be joined"), "fail": ("failed", "would stop the run")}
        word = {k: v[1] if planning else v[0] for k, v in says.items()}
        bad: dict[str, list[Finding]] = {}
        for h in hosts:
            fs = judged.get(h.name, [])
            failing = [f for f in fs if f.status == "fail"]
            if not failing:
                unsaid = [("the quick level only: DCGM is not installed" if f.id == "health.dcgm-diag" else
                           f"its kernel log was not read: {f.message}") for f in fs]
                r.hosts[h.name] = "healthy" + (f" ({'; '.join(unsaid)})" if unsaid else "")
                continue
            bad[h.name] = failing
            what = f"{failing[0].id}: {failing[0].message}" + (
                f" (and {len(failing) - 1} more)" if len(failing) > 1 else "")
            if failing[0].id in UNREAD:
                r.hosts[h.name] = f"{word['unread']}: {what}"
                self._hold(ctx, h.name, f"its GPU health could not be read: {what}", planning)
            elif policy == "quarantine" or (policy == "skip" and h.name == ctx.cp.name):
                ctx.quarantine[h.name] = failing[0].id
                r.hosts[h.name] = f"{word['quarantine']} ({quarantine_taint(failing[0].id)}): {what}"
                if not planning:
                    ctx.emit(f"{h.name}: quarantined: {what}")
            elif policy == "skip":
                r.hosts[h.name] = f"{word['skip']}: {what}"
                self._hold(ctx, h.name, f"GPU health failed: {what}", planning)
            else:
                r.hosts[h.name] = f"{word['fail']}: {what}"
        r.message = f"{len(hosts) - len(bad)} of {len(hosts)} GPU host(s) healthy"
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
    def _hold(ctx: Context, name: str, why: str, planning: bool = False) -> None:
        """Leave a host out of the phases after this one (never the first control plane's connection: the
        cluster's phases run over it; a dry run keeps every connection, its later plans only read)."""
        ctx.held[name] = why
        if not planning and name != ctx.cp.name and name in ctx.sessions:
            ctx.sessions.pop(name).close()
