"""Phase kubeconfig: the admin kubeconfig to the operator's machine, 0600, never through a symbolic link.

Written to a new file or one with the same content; an existing file with other content only with
--force; or merged into an existing kubeconfig (~/.kube/config) as a context of its own (gpuk8s/localfiles.py).
A failure here leaves the cluster alone: the phases after it go on.
"""

from __future__ import annotations

from pathlib import Path

from gpuk8s.kube.client import ADMIN
from gpuk8s.localfiles import LocalFileError, admin_kubeconfig, merge_kubeconfig, write_private
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult


def destination(ctx: Context) -> Path:
    o = ctx.options
    if o.kubeconfig_out is not None:
        return o.kubeconfig_out
    return Path.home() / ".kube" / "config" if o.kubeconfig_merge else Path.cwd() / f"{ctx.inv.cluster.name}.kubeconfig"


def _safe(text: str) -> str:
    try:
        return admin_kubeconfig(text)
    except LocalFileError:
        return ""


class Kubeconfig(Phase):
    name = "kubeconfig"
    title = "fetch the admin kubeconfig"
    fatal = False

    def plan(self, ctx: Context) -> PhasePlan:
        dest = destination(ctx)
        how = "merged as a context into" if ctx.options.kubeconfig_merge else "written (mode 0600) to"
        if ctx.initialized() and not ctx.options.kubeconfig_merge and dest.is_file() and not dest.is_symlink():
            res = ctx.cp_session().run(f"cat {ADMIN}", sudo=True, quiet=True)
            if res.ok and dest.read_text(errors="replace") == _safe(res.stdout):
                return self.planned("unchanged", f"{dest} holds the admin kubeconfig of {ctx.cp.name}")
            if res.ok and not ctx.options.kubeconfig_force:
                return self.planned("would-change", f"{dest} holds something else: this phase would fail "
                                    "without --force (or use --kubeconfig-merge)")
        return self.planned("would-change", f"the admin kubeconfig of {ctx.cp.name}, {how} {dest}",
                            [Change(f"read {ADMIN}", ctx.cp.name, f"cat {ADMIN}")])

    def run(self, ctx: Context) -> PhaseResult:
        dest = destination(ctx)
        res = ctx.cp_session().run(f"cat {ADMIN}", sudo=True, quiet=True)
        if not res.ok or "apiVersion" not in res.stdout:
            raise PhaseError(f"cannot read {ADMIN} on {ctx.cp.name}", "check that kubeadm init finished")
        try:
            text = admin_kubeconfig(res.stdout)  # only what kubeadm writes: never a command for kubectl to run
            w = (merge_kubeconfig(dest, text, ctx.inv.cluster.name) if ctx.options.kubeconfig_merge
                 else write_private(dest, text, force=ctx.options.kubeconfig_force))
        except LocalFileError as e:
            raise PhaseError(e.message, e.remedy) from None
        ctx.kubeconfig = str(dest)
        return self.result("changed" if w.changed else "unchanged", w.message)
