"""Phase init: `kubeadm init` on the first control plane, unless it already runs one.

The bootstrap token (and, with several control planes, the certificate key) is minted here, registered as
a secret, and reaches kubeadm in a 0600 file of this run sent on stdin (playbooks/cluster/kubeadm-init.sh),
which the host removes when kubeadm ends. A copy of the configuration without them is kept for reference.
"""

from __future__ import annotations

from gpuk8s.inventory.model import Inventory
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


class Init(Phase):
    name = "init"
    title = "kubeadm init"

    def plan(self, ctx: Context) -> PhasePlan:
        if ctx.initialized() and ctx.api_problem:
            return self.planned("unknown", f"{ADMIN} exists on {ctx.cp.name} but its API server does not "
                                f"answer ({ctx.api_problem}): install will stop here and say what to do")
        if ctx.initialized():
            return self.planned("unchanged", f"{ctx.cp.name} already runs a control plane ({ADMIN} exists)")
        inv, cp = ctx.inv, ctx.cp
        f = ctx.facts.get(cp.name)
        version = init_version(inv, f.kubeadm if f is not None else None) or \
            f"v{inv.cluster.kubernetes_version}.<the patch of the kubeadm prepare installs>"
        several = len(inv.control_planes) > 1
        placeholder = render.kubeadm_init_config(inv, cp, version, "<token minted at run time>",
                                                 "<certificate key minted at run time>" if several else None,
                                                 ctx.quarantine_taints(cp.name))
        return self.planned("would-change", f"{cp.name} runs no control plane yet", [
            Change(f"keep the configuration for reference in {REFERENCE}", cp.name,
                   shell.command("put-file", path=REFERENCE)),
            Change(f"kubeadm init {version} on {cp.name}", cp.name,
                   shell.command("kubeadm-init", config="/etc/kubernetes/gpuk8s-init-RANDOM.yaml",
                                 size=len(placeholder.encode()), upload_certs=several),
                   stdin=placeholder)])

    def run(self, ctx: Context) -> PhaseResult:
        cp = ctx.cp
        if ctx.initialized() and ctx.api_problem:
            raise PhaseError(f"{ADMIN} exists on {cp.name} but its API server does not answer ({ctx.api_problem}): "
                             "an earlier kubeadm init may have stopped half-way",
                             f"on {cp.name}: 'journalctl -u kubelet' says why the control plane is not up; if it "
                             "cannot be mended, 'kubeadm reset -f' there (gpuk8s reset --all), then re-run gpuk8s "
                             "install")
        if ctx.initialized():
            return self.result("unchanged", f"{cp.name} already runs a control plane ({ADMIN} exists)")
        s = ctx.cp_session()
        # the one decision the plan showed (init_version); the installed kubeadm is read only where it decides
        version = (init_version(ctx.inv, None) or init_version(ctx.inv, kubeadm_version(s, ""))
                   or render.full_version(ctx.inv))
        token = render.new_token()
        key = render.new_certificate_key() if len(ctx.inv.control_planes) > 1 else None
        register_secret(token)
        register_secret(key)
        # a quarantined first control plane registers with the taint: a run stopped before the gpu phase must not
        # leave it untainted (a re-run does not judge it again)
        taints = ctx.quarantine_taints(cp.name)
        put_file(s, REFERENCE, render.kubeadm_init_config(ctx.inv, cp, version, None, None, taints))
        res = run_with_secret(s, "kubeadm-init", "init",
                              render.kubeadm_init_config(ctx.inv, cp, version, token, key, taints),
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
        return self.result("changed", f"control plane {version} on {cp.name}, API at {render.endpoint(ctx.inv)}")

