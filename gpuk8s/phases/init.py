"""Phase init: `kubeadm init` on the first control plane, unless it already runs one.

The bootstrap token (and, with several control planes, the certificate key) is minted here, registered as
a secret, and reaches kubeadm in a 0600 file of this run sent on stdin (playbooks/cluster/kubeadm-init.sh),
which the host removes when kubeadm ends. A copy of the configuration without them is kept for reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuk8s.inventory.model import Inventory, Taint
from gpuk8s.kube import render
from gpuk8s.kube.client import ADMIN
from gpuk8s.logs import register_secret
from gpuk8s.phases import shell
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult
from gpuk8s.phases.hostfiles import put_file, run_with_secret, tail
from gpuk8s.remote import Session

REFERENCE = "/etc/kubernetes/gpuk8s-kubeadm.yaml"


def kubeadm_version(s: Session, fallback: str) -> str:
    ver = s.run("kubeadm version -o short", sudo=True)
    return ver.stdout.strip() if ver.ok and ver.stdout.strip().startswith("v") else fallback


def init_version(inv: Inventory, installed: str | None) -> str | None:
    """The Kubernetes version kubeadm init gets, decided once for the plan (--dry-run) and the run: a pinned patch
    is the version prepare installs kubeadm at; with a minor alone, the installed kubeadm's own patch (prepare keeps
    a kubeadm of that minor, else installs the newest one the repository has). `installed`: `kubeadm version -o
    short` of the first control plane (its facts for the plan, read again after prepare for the run). None: not
    known until prepare has installed kubeadm (the plan says so)."""
    if inv.cluster.kubernetes_version.count(".") == 2:
        return render.full_version(inv)
    if installed and installed.startswith(f"v{inv.cluster.kubernetes_version}."):
        return installed
    return None


@dataclass(frozen=True)
class InitDecision:
    """What the init phase decided: nothing (a control plane runs), stop (admin.conf without an API server), or
    kubeadm init of `version` ('' in a dry run where prepare has not installed kubeadm yet)."""

    action: str  # unchanged | broken | init
    reason: str = ""
    version: str = ""
    several: bool = False  # more than one control plane: a certificate key, --upload-certs
    taints: tuple[Taint, ...] = ()


class Init(Phase):
    name = "init"
    title = "kubeadm init"

    @staticmethod
    def decide(ctx: Context, planning: bool) -> InitDecision:
        """The one decision of the plan and the run. planning: the version from the first control plane's facts
        (a run reads its kubeadm again, after prepare installed it)."""
        cp = ctx.cp
        if ctx.initialized() and ctx.api_problem:
            return InitDecision("broken", f"{ADMIN} exists on {cp.name} but its API server does not answer "
                                f"({ctx.api_problem})")
        if ctx.initialized():
            return InitDecision("unchanged", f"{cp.name} already runs a control plane ({ADMIN} exists)")
        if planning:
            f = ctx.facts.get(cp.name)
            version = init_version(ctx.inv, f.kubeadm if f is not None else None) or ""
        else:  # the installed kubeadm is read only where it decides
            version = (init_version(ctx.inv, None) or init_version(ctx.inv, kubeadm_version(ctx.cp_session(), ""))
                       or render.full_version(ctx.inv))
        # a quarantined first control plane registers with the taint: a run stopped before the gpu phase must not
        # leave it untainted (a re-run does not judge it again)
        return InitDecision("init", f"{cp.name} runs no control plane yet", version, len(ctx.inv.control_planes) > 1,
                            tuple(ctx.quarantine_taints(cp.name)))

    def plan(self, ctx: Context) -> PhasePlan:
        d = self.decide(ctx, planning=True)
        if d.action == "broken":
            return self.planned("unknown", f"{d.reason}: install will stop here and say what to do")
        if d.action == "unchanged":
            return self.planned("unchanged", d.reason)
        inv, cp = ctx.inv, ctx.cp
        version = d.version or f"v{inv.cluster.kubernetes_version}.<the patch of the kubeadm prepare installs>"
        placeholder = render.kubeadm_init_config(inv, cp, version, "<token minted at run time>",
                                                 "<certificate key minted at run time>" if d.several else None,
                                                 list(d.taints))
        return self.planned("would-change", d.reason, [
            Change(f"keep the configuration for reference in {REFERENCE}", cp.name,
                   shell.command("put-file", path=REFERENCE)),
            Change(f"kubeadm init {version} on {cp.name}", cp.name,
                   shell.command("kubeadm-init", config="/etc/kubernetes/gpuk8s-init-RANDOM.yaml",
                                 size=len(placeholder.encode()), upload_certs=d.several),
                   stdin=placeholder)])

    def run(self, ctx: Context) -> PhaseResult:
        cp = ctx.cp
        d = self.decide(ctx, planning=False)
        if d.action == "broken":
            raise PhaseError(f"{d.reason}: an earlier kubeadm init may have stopped half-way",
                             f"on {cp.name}: 'journalctl -u kubelet' says why the control plane is not up; if it "
                             "cannot be mended, 'kubeadm reset -f' there (gpuk8s reset --all), then re-run gpuk8s "
                             "install")
        if d.action == "unchanged":
            return self.result("unchanged", d.reason)
        s = ctx.cp_session()
        token = render.new_token()
        key = render.new_certificate_key() if d.several else None
        register_secret(token)
        register_secret(key)
        taints = list(d.taints)
        put_file(s, REFERENCE, render.kubeadm_init_config(ctx.inv, cp, d.version, None, None, taints))
        res = run_with_secret(s, "kubeadm-init", "init",
                              render.kubeadm_init_config(ctx.inv, cp, d.version, token, key, taints),
                              timeout=900, upload_certs=key is not None)
        if res.ok and "@@gpuk8s-initialized-meanwhile" in res.stdout:
            ctx.initialized_cache = True
            return self.result("unchanged", f"{cp.name} runs a control plane: an earlier, interrupted run's kubeadm "
                               "init finished while this run waited for it")
        if not res.ok:
            raise PhaseError(f"kubeadm init on {cp.name} failed (exit status {res.exit_status}): "
                             f"{tail(res)}",
                             f"fix the cause on {cp.name}; if kubeadm left a partial control plane, run "
                             "'kubeadm reset -f' there; then re-run gpuk8s install")
        ctx.initialized_cache = True
        return self.result("changed", f"control plane {d.version} on {cp.name}, API at {render.endpoint(ctx.inv)}")
