"""Phase join: the other control planes and the workers join, with a token minted for this run.

The token (and, for control planes, a certificate key for the uploaded certificates) is minted here and
registered as a secret; each host gets its JoinConfiguration on stdin (playbooks/cluster/kubeadm-join.sh).
Hosts are joined in parallel; one that fails is named with its cause and the others go on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuk8s.gpuplan import quarantine_taint
from gpuk8s.inventory.model import Host
from gpuk8s.kube import render, state
from gpuk8s.logs import register_secret
from gpuk8s.phases import shell
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult
from gpuk8s.phases.hostfiles import run_with_secret, tail
from gpuk8s.remote import RemoteError, for_each_host

_JOIN = re.compile(r"kubeadm join (\S+) .*--discovery-token-ca-cert-hash (sha256:[0-9a-f]{64})")


@dataclass(frozen=True)
class JoinDecision:
    """What the join phase decided: the hosts it joins, those already nodes, those it leaves out (name -> why)."""

    todo: tuple[Host, ...]
    present: tuple[Host, ...]
    skipped: dict[str, str]


class Join(Phase):
    name = "join"
    title = "join control planes and workers"
    fatal = False  # the hosts that joined are verified

    @staticmethod
    def decide(ctx: Context) -> JoinDecision:
        """The one decision of the plan and the run: the hosts to join (prepared: their connection is open), those in
        the cluster already, and those left out with why (held back by the health phase, or not prepared)."""
        present = set(state.by_name(ctx.kube.get("nodes"))) if ctx.initialized() else set()
        want = ctx.hosts_to_join()
        absent = [h for h in want if h.name not in present]
        # held back by the health phase (a dry run keeps its connection) or not prepared (no connection): not joined
        left = {h.name: ctx.held.get(h.name, "not prepared") for h in absent
                if h.name in ctx.held or h.name not in ctx.sessions}
        return JoinDecision(tuple(h for h in absent if h.name not in left), tuple(h for h in want if h.name in present),
                            left)

    def plan(self, ctx: Context) -> PhasePlan:
        d = self.decide(ctx)
        left = "; ".join(f"{n} not joined: {why}" for n, why in d.skipped.items())
        if not d.todo:
            return self.planned("unchanged", left or "every host is already in the cluster")
        changes = [Change("a bootstrap token for this run", ctx.cp.name,
                          shell.command("kubeadm-token", config="/etc/kubernetes/gpuk8s-token-RANDOM.yaml", size=0),
                          stdin="InitConfiguration with the token (minted at run time)")]
        if any(h.is_control_plane for h in d.todo):
            changes.append(Change("upload the control-plane certificates", ctx.cp.name,
                                  shell.command("upload-certs", config="/etc/kubernetes/gpuk8s-certs-RANDOM.yaml",
                                                size=0), stdin="the certificate key (minted at run time)"))
        for h in d.todo:
            placeholder = render.join_config(ctx.inv, h, render.endpoint(ctx.inv), "<token>", "sha256:<CA hash>",
                                             "<certificate key>" if h.is_control_plane else None,
                                             ctx.quarantine_taints(h.name))
            changes.append(Change(f"kubeadm join {h.name}", h.name,
                                  shell.command("kubeadm-join", config="/etc/kubernetes/gpuk8s-join-RANDOM.yaml",
                                                size=len(placeholder.encode())), stdin=placeholder))
        return self.planned("would-change", f"{len(d.todo)} host(s) not in the cluster" + (f"; {left}" if left else ""),
                            changes)

    def run(self, ctx: Context) -> PhaseResult:
        r = self.result("pending")
        d = self.decide(ctx)
        for h in d.present:
            r.hosts[h.name] = "already in the cluster"
        for name, why in d.skipped.items():  # not prepared, or held back: the phase that left it out says why
            r.hosts[name] = f"skipped: {why}"
        todo = list(d.todo)
        if not todo:
            r.status, r.message = "unchanged", "every prepared host is already in the cluster"
            if any(n in ctx.held for n in r.hosts):
                r.message = "no host to join: " + ", ".join(n for n in r.hosts if n in ctx.held) + " held back"
            return r
        api, ca_hash, token, key = self._credentials(ctx, any(h.is_control_plane for h in todo))

        def one(h: Host) -> str:
            res = run_with_secret(ctx.sessions[h.name], "kubeadm-join", "join",
                                  render.join_config(ctx.inv, h, api, token, ca_hash, key,
                                                     ctx.quarantine_taints(h.name)), timeout=900)
            if "@@gpuk8s-joined-elsewhere" in res.stdout:
                if ctx.kube.get("node", h.name):  # an earlier, interrupted run's kubeadm join finished meanwhile
                    return "joined (by an earlier run's kubeadm, which this run waited for)"
                raise PhaseError(f"{h.name} has /etc/kubernetes/kubelet.conf but is not a node of this cluster "
                                 "(joined elsewhere, or a half-finished join)",
                                 f"run 'kubeadm reset -f' on {h.name} if it belongs to no other cluster, then re-run")
            if not res.ok and "dial tcp" in res.stderr + res.stdout:
                raise PhaseError(f"{h.name} cannot reach the API server at {api}: {tail(res)}",
                                 f"let {h.name} reach TCP {api} (firewall, route, security group), then run "
                                 "gpuk8s join again")
            if not res.ok:
                raise PhaseError(f"kubeadm join on {h.name} failed (exit status {res.exit_status}): {tail(res)}",
                                 f"fix the cause on {h.name} (can it reach {api}?), then re-run")
            if h.name in ctx.quarantine:
                ctx.emit(f"{h.name}: joined, quarantined")
                return f"joined, quarantined ({quarantine_taint(ctx.quarantine[h.name])})"
            ctx.emit(f"{h.name}: joined")
            return "joined"

        problems: list[BaseException] = []
        for name, v in for_each_host(todo, one, ctx.concurrency).items():
            if isinstance(v, BaseException):
                msg = v.message if isinstance(v, (PhaseError, RemoteError)) else f"{type(v).__name__}: {v}"
                r.hosts[name] = f"failed: {msg}"
                problems.append(v)
            else:
                r.hosts[name] = v
        if problems:
            r.status = "failed"
            r.message = "; ".join(f"{n}: {t}" for n, t in r.hosts.items() if t.startswith("failed"))
            first = problems[0]
            r.remedy = first.remedy if isinstance(first, (PhaseError, RemoteError)) else "re-run"
        else:
            r.status, r.message = "changed", f"joined {len(todo)} host(s)"
        return r

    def _credentials(self, ctx: Context, control_plane: bool) -> tuple[str, str, str, str | None]:
        """(API endpoint, CA hash, token, certificate key or None), minted on the first control plane."""
        s = ctx.cp_session()
        token = render.new_token()
        register_secret(token)
        res = run_with_secret(s, "kubeadm-token", "token", render.token_config(ctx.inv, token))
        m = _JOIN.search(res.stdout)
        if not res.ok or not m:
            raise PhaseError(f"kubeadm token create on {ctx.cp.name} failed: {tail(res)}",
                             "check the control plane, then re-run")
        key = None
        if control_plane:
            key = render.new_certificate_key()
            register_secret(key)
            up = run_with_secret(s, "upload-certs", "certs", render.upload_certs_config(ctx.inv, key))
            if not up.ok:
                raise PhaseError(f"uploading control-plane certificates failed: {tail(up)}", "re-run")
        return m.group(1), m.group(2), token, key
