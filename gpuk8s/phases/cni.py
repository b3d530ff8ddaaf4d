"""Phase cni: the pod network (Calico or Flannel), applied once from its pinned manifest.

The manifest is fetched on the control plane over https and its sha256 checked against the pin (the
version matrix for the default URLs, or the inventory's install.*_manifest_sha256) before anything is
applied as cluster-admin (playbooks/cluster/cni-apply.sh).
"""

from __future__ import annotations

from gpuk8s import mirrors
from gpuk8s.kube import state
from gpuk8s.phases import shell
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult
from gpuk8s.phases.hostfiles import tail

DAEMONSETS = {"calico": "calico-node", "flannel": "kube-flannel-ds"}


def manifest_url(ctx: Context) -> str:
    """Where the manifest is fetched from: install.*_manifest, below registry.manifests when set (gpuk8s/mirrors.py)."""
    return mirrors.cni_manifest_url(ctx.inv)


def cni_values(ctx: Context) -> dict[str, object]:
    """What playbooks/cluster/cni-apply.sh is rendered with."""
    c, url = ctx.inv.cluster, manifest_url(ctx)
    pin = mirrors.manifest_sha256(ctx.inv, c.cni) or ""
    if not url.startswith("https://") and not pin:  # the inventory refuses it; never applied unchecked
        raise PhaseError(f"{url} is plain http and has no sha256 pin", f"set install.{c.cni}_manifest_sha256")
    return {"url": url, "https": url.startswith("https://"), "sha256": pin,
            "pod_cidr": c.pod_cidr if c.cni == "flannel" else "",
            # its image: lines taken to the inventory's registry mirror (gpuk8s/mirrors.py), after the sha256 check
            "rewrites": mirrors.sed_rewrites(ctx.inv)}



class CNI(Phase):
    name = "cni"
    title = "CNI"

    def __init__(self, cni: str = "") -> None:
        if cni:
            self.title = f"CNI ({cni})"

    def _present(self, ctx: Context) -> bool:
        return DAEMONSETS[ctx.inv.cluster.cni] in state.by_name(ctx.kube.get("daemonsets", namespace="*"))

    def plan(self, ctx: Context) -> PhasePlan:
        c = ctx.inv.cluster
        if ctx.initialized() and self._present(ctx):
            return self.planned("unchanged", f"{DAEMONSETS[c.cni]} DaemonSet exists")
        return self.planned("would-change", f"{c.cni} with pod CIDR {c.pod_cidr}",
                            [Change(f"apply {c.cni}", ctx.cp.name, shell.command("cni-apply", **cni_values(ctx)))])

    def run(self, ctx: Context) -> PhaseResult:
        c = ctx.inv.cluster
        if self._present(ctx):
            return self.result("unchanged", f"{DAEMONSETS[c.cni]} DaemonSet exists")
        url = manifest_url(ctx)
        res = ctx.cp_session().run(shell.script("cni-apply", **cni_values(ctx)), sudo=True, timeout=300,
                                   display=f"apply {c.cni} from {url}")
        if not res.ok:
            raise PhaseError(f"applying {c.cni} from {url} failed: {tail(res)}",
                             "check that the control plane reaches that URL (or set install.*_manifest to a mirror, "
                             "with its sha256)")
        return self.result("changed", f"applied {url}")
