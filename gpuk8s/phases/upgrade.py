"""The upgrade phases: one Kubernetes minor at a time, in kubeadm's order, resumable from the cluster's state.

For one step (minor N to N+1): the hosts prepared for the new minor by install's playbooks (preflight for that
minor, its package repository, the container runtime raised to its floor) without the Kubernetes packages;
the first control plane (kubeadm of the new minor, `kubeadm upgrade plan` shown, `kubeadm upgrade apply`),
the other control planes (`kubeadm upgrade node`), each drained, its kubelet and kubectl upgraded, held and
restarted, uncordoned; then the workers the same way, one at a time or --max-unavailable at once, GPU pods
on a worker named and waited for before its drain; then the manifests (device plugin, ...) moved to the
new minor's pins (gpuk8s/phases/gpu.py with the new minor's inventory).

What is done is read from the cluster itself, never from a file of gpuk8s: a control plane is upgraded when
its kube-apiserver static pod runs the new minor's image, a node when its kubelet reports the new minor.
Re-running after an interruption skips what is done.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import yaml

from gpuk8s import findings, plainyaml, versions
from gpuk8s.errors import GpuK8sError
from gpuk8s.install.prepare import prepare
from gpuk8s.inventory.model import Host, InstallSettings, Inventory
from gpuk8s.phases import nodeops, shell
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult, before_steps
from gpuk8s.phases.gpu import GPUNodes
from gpuk8s.phases.hostfiles import tail
from gpuk8s.phases.nodeops import NodeOutcome
from gpuk8s.remote import Session

log = logging.getLogger("gpuk8s.upgrade")

APISERVER_MANIFEST = "/etc/kubernetes/manifests/kube-apiserver.yaml"
UPGRADE_MARK = "true"  # the value of nodeops.CORDONED_BY that gpuk8s upgrade's cordon carries
_VERSION = re.compile(r"^v?1\.(\d{1,3})\.(\d{1,3})")
_IMAGE_TAG = re.compile(r":v?(1\.\d{1,3}\.\d{1,3})(?:[-+@].*)?$")
MAX_MANIFEST = 256 << 10  # kubeadm's kube-apiserver.yaml is about 4 KiB; a larger one is not read


class UpgradeRefused(GpuK8sError):
    """The upgrade asked for cannot be done; `message` says why, `remedy` what to do."""

    kind = "upgrade-refused"


def minor(version: str | None) -> int | None:
    """13 for "v1.13.2", "1.13" or "1.13.2"; None when it is no Kubernetes version."""
    if not version:
        return None
    m = re.match(r"^v?1\.(\d{1,3})(?:\.\d{1,3})?", version.strip())
    return int(m.group(1)) if m else None


def steps(current: int, to: str | None, minors: list[str]) -> list[str]:
    """The minors to upgrade through, one at a time (kubeadm's rule), from `current` (the oldest minor any node
    runs) to `to` (default: the next one). Every minor on the way must be in `minors` (the version matrix)."""
    known = {minor(m) for m in minors}
    target = current + 1 if to is None else minor(to)
    if target is None or to is not None and not re.match(r"^v?1\.\d{1,3}$", to.strip()):
        raise UpgradeRefused(f"{to!r} is not a Kubernetes minor", "write --to 1.N (a minor of gpuk8s versions)")
    if target < current:
        raise UpgradeRefused(f"the cluster runs 1.{current}; 1.{target} would be a downgrade, which kubeadm does "
                             "not do", f"name a newer minor, e.g. --to 1.{current + 1}")
    known_list = ", ".join(sorted(minors, key=lambda m: minor(m) or 0))
    out = []
    for n in range(current + 1, target + 1):
        if n not in known:
            raise UpgradeRefused(
                f"1.{n} is not in gpuk8s's version matrix: kubeadm upgrades one minor at a time, so 1.{current} "
                f"cannot reach 1.{target} without it",
                f"upgrade to 1.{n - 1} at most (the minors gpuk8s knows: {known_list})"
                if n - 1 > current else "update gpuk8s (its version matrix names the minors it can install)")
        out.append(f"1.{n}")
    return out


def target_inventory(inv: Inventory, to_minor: str) -> Inventory:
    """The inventory as if it named `to_minor`: its pins where the inventory kept the defaults of its own minor;
    a value the inventory set itself (a mirror, a pinned device plugin) stays."""
    old = versions.install_defaults(inv.cluster.kubernetes_version)
    new = versions.install_defaults(to_minor)
    moved = {k: new[k] for k in new if getattr(inv.install, k) == old[k]}  # type: ignore[literal-required]
    install: InstallSettings = replace(inv.install, **moved)
    return replace(inv, cluster=replace(inv.cluster, kubernetes_version=to_minor), install=install)


@dataclass
class NodeVersions:
    """What the cluster says now: each node's kubelet, each control plane's kube-apiserver (its static pod)."""

    kubelet: dict[str, str]
    apiserver: dict[str, str | None]
    unschedulable: set[str]
    cordoned_by_upgrade: set[str] = field(default_factory=set)  # nodes carrying gpuk8s upgrade's cordon mark

    def oldest(self) -> int:
        found = [minor(v) for v in [*self.kubelet.values(), *self.apiserver.values()]]
        got = [m for m in found if m is not None]
        if not got:
            raise PhaseError("the cluster reports no node versions", "check the cluster with gpuk8s verify")
        return min(got)


class ManifestError(PhaseError):
    """The control plane's kube-apiserver manifest is not plain data kubeadm could have written."""


def manifest_version(text: str) -> str | None:
    """The version of the kube-apiserver image in the text of its static pod manifest; None when it names none
    (not YAML, no spec.containers[0].image string, no version tag).

    The text is a host's: bounded (MAX_MANIFEST), without anchors or aliases (an alias bomb expanded 9-fold per
    level when the image was turned into text), nested at most plainyaml.MAX_DEPTH deep (deeper raised an
    uncaught RecursionError), every field type-checked. A text that is not plain data is a ManifestError: kubeadm
    never writes one, so something else did."""
    try:
        doc = plainyaml.load(text, MAX_MANIFEST)
    except plainyaml.PlainYAMLError as e:
        raise ManifestError(f"{APISERVER_MANIFEST} {e}: not a manifest kubeadm wrote",
                            f"look at {APISERVER_MANIFEST} on this control plane: kubeadm writes it without anchors "
                            "or aliases; put kubeadm's back (kubeadm upgrade keeps earlier ones in "
                            "/etc/kubernetes/tmp/kubeadm-backup-manifests-*), then re-run gpuk8s upgrade") from None
    except yaml.YAMLError:
        return None
    spec = doc.get("spec") if isinstance(doc, dict) else None
    containers = spec.get("containers") if isinstance(spec, dict) else None
    first = containers[0] if isinstance(containers, list) and containers else None
    image = first.get("image") if isinstance(first, dict) else None
    if not isinstance(image, str) or len(image) > 512:
        return None
    m = _IMAGE_TAG.search(image)
    return "v" + m.group(1) if m else None


def apiserver_version(s: Session) -> str | None:
    """The version of the kube-apiserver image in this control plane's static pod manifest, or None (no file,
    or it names no version). A manifest that is not plain data: ManifestError (a PhaseError), naming the host."""
    res = s.run(f"cat {APISERVER_MANIFEST}", sudo=True)
    if not res.ok:
        return None
    try:
        return manifest_version(res.stdout)
    except ManifestError as e:
        raise ManifestError(f"{s.host.name}: {e.message}", e.remedy) from None


def read_versions(ctx: Context) -> NodeVersions:
    nodes = ctx.kube.get("nodes")
    kubelet = {n["metadata"]["name"]: str(n.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""))
               for n in nodes}
    unschedulable = {n["metadata"]["name"] for n in nodes if n.get("spec", {}).get("unschedulable")}
    ours = {n["metadata"]["name"] for n in nodes
            if (n.get("metadata", {}).get("labels") or {}).get(nodeops.CORDONED_BY) == UPGRADE_MARK}
    api: dict[str, str | None] = {}
    for h in ctx.inv.control_planes:
        s = ctx.sessions.get(h.name)
        api[h.name] = apiserver_version(s) if s is not None else None
    return NodeVersions(kubelet, api, unschedulable, ours)


_PACKAGES = ("kubeadm", "kubelet", "kubectl")


def _package_list(packages: str) -> list[str]:
    """The package names of "kubelet kubectl" as a list, each one of the Kubernetes packages gpuk8s upgrades
    (the script renders one quoted word per package)."""
    names = packages.split()
    bad = [n for n in names if n not in _PACKAGES]
    if bad or not names:
        raise ValueError(f"not a Kubernetes package gpuk8s upgrades: {bad or packages!r}")
    return names


def _packages_values(ctx: Context, h: Host, to: str, packages: list[str], restart: bool) -> dict[str, Any]:
    """playbooks/cluster/upgrade-packages.sh's values. The OS family of the host's facts decides the package manager
    (one place decides it: a RHEL-family host with an apt-get on its PATH got apt, issue 41); without facts the
    script looks for apt-get."""
    f = ctx.facts.get(h.name)
    family = f.os.family if f is not None and f.os.family in ("debian", "rhel") else ""
    return {"minor": to, "packages": packages, "restart": "yes" if restart else "no", "family": family,
            "lock_timeout": ctx.inv.install.package_lock_timeout}


def _packages(ctx: Context, h: Host, to: str, packages: str, restart: bool) -> bool:
    """Install the packages of minor `to` on h (held); whether anything changed."""
    s = ctx.sessions[h.name]
    res = s.run(shell.script("upgrade-packages", **_packages_values(ctx, h, to, _package_list(packages), restart)),
                sudo=True, display=f"gpuk8s upgrade: {packages} {to} on {h.name}", timeout=900)
    if not res.ok or "@@gpuk8s-packages-done" not in res.stdout:
        raise PhaseError(f"{h.name}: installing {packages} {to} failed: {tail(res)}",
                         f"fix the package manager on {h.name} (is the v{to} repository reachable?), then re-run "
                         "gpuk8s upgrade: it resumes here")
    return "@@gpuk8s-upgraded" in res.stdout


def _kubeadm(ctx: Context, h: Host, action: str, version: str = "") -> str:
    s = ctx.sessions[h.name]
    res = s.run(shell.script("kubeadm-upgrade", action=action, version=version), sudo=True,
                display=f"kubeadm upgrade {action} {version}".strip(), timeout=1800)
    if not res.ok:
        raise PhaseError(f"kubeadm upgrade {action} on {h.name} failed (exit status {res.exit_status}): {tail(res)}",
                         f"fix the cause on {h.name}, then re-run gpuk8s upgrade: it resumes here")
    return res.stdout


@dataclass
class UpgradeOptions(nodeops.NodeOptions):
    to: str  # the minor of this step, "1.N"


class UpgradeStep(Phase):
    """Base of the per-step phases: the step's target minor and the per-node upgrade."""

    resume = "gpuk8s upgrade"  # the command that resumes the run, named in remedies

    def __init__(self, opts: UpgradeOptions, on_node: Callable[[str, float], None] | None = None) -> None:
        self.opts = opts
        self.on_node = on_node or (lambda name, seconds: None)

    @property
    def target(self) -> int:
        m = minor(self.opts.to)
        assert m is not None
        return m

    def _done(self, v: NodeVersions, h: Host) -> bool:
        kubelet_ok = minor(v.kubelet.get(h.name)) == self.target
        if h.is_control_plane:
            return kubelet_ok and minor(v.apiserver.get(h.name)) == self.target
        return kubelet_ok

    def _todo(self, ctx: Context, v: NodeVersions, hosts: list[Host]) -> tuple[list[Host], dict[str, NodeOutcome]]:
        """Of `hosts`, those to upgrade, and the outcomes of the others: at the target already (an interrupted run's
        cordon given back), or not reachable."""
        todo, out = [], {}
        for h in hosts:
            if self._done(v, h):
                out[h.name] = self._resume_done(ctx, v, h)
            elif h.name not in ctx.sessions:
                out[h.name] = nodeops.unreachable(self.opts, h.name, "upgrade.node-failed",
                                                  ctx.unreachable.get(h.name, "no SSH session"), self.resume)
            else:
                todo.append(h)
        return todo, out

    def _node(self, ctx: Context, h: Host, first: bool) -> NodeOutcome:
        """Upgrade one node in kubeadm's order; its finding goes to opts.findings (a failure's: nodeops.attempt)."""
        done = self._upgrade_node(ctx, h, first, ctx.emit)
        self.opts.findings.append(findings.passed("upgrade.node-upgraded", f"{h.name} runs {self.opts.to}: {done}",
                                                  subject=findings.node(h.name)))
        return NodeOutcome("done", done)

    def _upgrade_node(self, ctx: Context, h: Host, first: bool, emit: Callable[[str], None]) -> str:
        t0 = time.monotonic()
        to = self.opts.to
        _packages(ctx, h, to, "kubeadm", restart=False)
        did = []
        if h.is_control_plane and first:
            version = ctx.sessions[h.name].run("kubeadm version -o short", sudo=True).stdout.strip()
            if not _VERSION.match(version) or minor(version) != self.target:
                raise PhaseError(f"kubeadm on {h.name} reports {version!r}, not a {to} release",
                                 f"check the v{to} package repository on {h.name}")
            if minor(apiserver_version(ctx.sessions[h.name])) != self.target:
                plan = _kubeadm(ctx, h, "plan", version)
                for line in plan.splitlines():
                    emit(f"{h.name}: {line}")
                _kubeadm(ctx, h, "apply", version)
                did.append(f"kubeadm upgrade apply {version}")
        else:
            _kubeadm(ctx, h, "node")
            did.append("kubeadm upgrade node")
        mine, waited = nodeops.vacate(ctx.kube, h.name, UPGRADE_MARK, self.opts, emit, self.resume,
                                      "upgrade.drain-failed")
        if waited:
            did.append(f"waited for GPU pods {', '.join(waited)}")
        _packages(ctx, h, to, "kubelet kubectl", restart=True)
        back = nodeops.left_as_it_was(ctx.kube, h.name, mine)
        seconds = time.monotonic() - t0
        self.on_node(h.name, seconds)
        emit(f"{h.name}: upgraded to {to} in {seconds:.1f} s")
        return "; ".join([*did, "drained", f"kubelet and kubectl {to} (held)", back, f"{seconds:.1f} s"])

    def _resume_done(self, ctx: Context, v: NodeVersions, h: Host) -> NodeOutcome:
        """A node found at the target: uncordoned when an interrupted run of gpuk8s upgrade left it cordoned."""
        if h.name in v.cordoned_by_upgrade:
            return NodeOutcome("resumed", f"already at {self.opts.to}; {nodeops.give_back(ctx.kube, h.name)} (an "
                               "earlier run stopped before it)")
        return NodeOutcome("already", f"already at {self.opts.to}")


class UpgradePrepare(UpgradeStep):
    name = "upgrade-prepare"
    title = "preflight and prepare every host for the new minor"

    def _run(self, ctx: Context, dry_run: bool) -> tuple[dict[str, str], list[Change]]:
        # install's prepare (preflight, then the playbooks) for the new minor, over the flow's connections; the
        # Kubernetes packages move node by node, in kubeadm's order (UpgradeNodes), never all at once
        rep = prepare(target_inventory(ctx.inv, self.opts.to), concurrency=ctx.concurrency, ignore=ctx.ignore,
                      sudo_passwords=ctx.sudo_passwords, dry_run=dry_run, sessions=ctx.sessions,
                      wanted=lambda s: not s.name.startswith("kubernetes-packages"), before=before_steps(ctx))
        passed = {r.host.name for r in rep.hosts if r.status not in ("unreachable", "blocked")}
        ctx.set_facts({r.host.name: r.facts for r in rep.preflight if r.host.name in passed and r.facts is not None})
        status: dict[str, str] = {}
        changes: list[Change] = []
        for run in rep.hosts:
            name = run.host.name
            if run.status == "unreachable":
                status[name] = "unreachable"
            elif run.status == "blocked":
                status[name] = "blocked: " + run.message.removeprefix("preflight failed: ")
            elif run.status == "failed":
                status[name] = f"failed: {run.message}"
            elif not dry_run and run.count("changed"):
                status[name] = f"done ({run.count('changed')} step(s) changed)"
            else:
                status[name] = run.status
            changes += [Change(f"{s.step.playbook}/{s.step.name}: {s.step.title}", name, s.step.run)
                        for s in run.steps if s.outcome.status == "would-change"]
        return status, changes

    def plan(self, ctx: Context) -> PhasePlan:
        status, changes = self._run(ctx, dry_run=True)
        bad = {n: s for n, s in status.items() if s != "done"}
        return self.planned("would-change" if changes else "unchanged",
                            "; ".join(f"{n}: {s}" for n, s in bad.items()) or f"every host passed preflight for "
                            f"{self.opts.to}", changes)

    def run(self, ctx: Context) -> PhaseResult:
        status, _ = self._run(ctx, dry_run=False)
        r = self.result("changed" if any("changed" in s for s in status.values()) else "unchanged",
                        f"{sum(1 for s in status.values() if s.startswith('done'))} of {len(status)} host(s) "
                        f"ready for {self.opts.to}")
        r.hosts = status
        bad = [n for n, s in status.items() if not s.startswith("done")]
        for n in bad:
            self.opts.findings.append(findings.failed(
                "upgrade.host-blocked", f"{n}: {status[n]}", "fix the host (gpuk8s preflight shows why), then "
                "re-run gpuk8s upgrade", subject=findings.host(n)))
        if bad:
            r.status = "failed"
            r.message = "; ".join(f"{n}: {status[n]}" for n in bad)
            r.remedy = "fix these hosts (gpuk8s preflight shows why), then re-run gpuk8s upgrade"
        return r


class UpgradeControlPlanes(UpgradeStep):
    name = "upgrade-control-planes"
    title = "upgrade the control planes"

    def plan(self, ctx: Context) -> PhasePlan:
        v = read_versions(ctx)
        changes = []
        for i, h in enumerate(ctx.inv.control_planes):
            if self._done(v, h):
                continue
            changes.append(Change(f"kubeadm {self.opts.to} (held) on {h.name}", h.name,
                                  shell.command("upgrade-packages",
                                                **_packages_values(ctx, h, self.opts.to, ["kubeadm"], False))))
            if i == 0:
                changes.append(Change("kubeadm upgrade plan, then kubeadm upgrade apply (the newest "
                                      f"{self.opts.to} release of the repository) -y", h.name,
                                      shell.command("kubeadm-upgrade", action="apply", version="VERSION")))
            else:
                changes.append(Change("kubeadm upgrade node", h.name,
                                      shell.command("kubeadm-upgrade", action="node", version="")))
            changes += _drain_changes(ctx, h, self.opts)
        if not changes:
            return self.planned("unchanged", f"every control plane runs {self.opts.to}")
        return self.planned("would-change", f"control planes not at {self.opts.to}: "
                            + ", ".join(sorted({c.host for c in changes})), changes)

    def run(self, ctx: Context) -> PhaseResult:
        # one at a time, in order: the first control plane's kubeadm upgrade apply before any other's upgrade node; a
        # failure stops the phase (and the flow) there
        v = read_versions(ctx)
        out: dict[str, NodeOutcome] = {}
        for i, h in enumerate(ctx.inv.control_planes):
            if self._done(v, h):
                out[h.name] = self._resume_done(ctx, v, h)
                continue
            if h.name not in ctx.sessions:
                raise PhaseError(f"control plane {h.name} is not reachable", "bring it back, then re-run")
            got = nodeops.attempt(h, partial(self._node, ctx, first=i == 0), self.opts, "upgrade.node-failed",
                                  self.resume)
            if got.status == "failed":
                raise PhaseError(got.detail if got.detail.startswith(h.name) else f"{h.name}: {got.detail}",
                                 got.remedy)
            out[h.name] = got
        return nodeops.node_result(self, out, remedy="", unchanged=f"every control plane runs {self.opts.to}",
                                   changed=lambda done, resumed: f"upgraded {', '.join([*done, *resumed])}")


def _drain_changes(ctx: Context, h: Host, opts: UpgradeOptions) -> list[Change]:
    """--dry-run's lines for one node's drain, kubelet and uncordon."""
    return [
        nodeops.drain_change(h.name, opts),
        Change(f"kubelet and kubectl {opts.to} (held), kubelet restarted", h.name,
               shell.command("upgrade-packages", **_packages_values(ctx, h, opts.to, ["kubelet", "kubectl"], True))),
        nodeops.uncordon_change(h.name),
    ]


class UpgradeWorkers(UpgradeStep):
    name = "upgrade-workers"
    title = "upgrade the workers"

    def plan(self, ctx: Context) -> PhasePlan:
        v = read_versions(ctx)
        todo = [h for h in ctx.inv.workers if not self._done(v, h)]
        if not todo:
            return self.planned("unchanged", f"every worker runs {self.opts.to}")
        changes = []
        for h in todo:
            changes.append(Change(f"kubeadm {self.opts.to} (held), kubeadm upgrade node on {h.name}", h.name,
                                  shell.command("upgrade-packages",
                                                **_packages_values(ctx, h, self.opts.to, ["kubeadm"], False))
                                  + shell.command("kubeadm-upgrade", action="node", version="")))
            pods = nodeops.gpu_pods(ctx.kube, h.name)
            if pods:
                changes.append(Change(f"GPU pods on {h.name} waited for: {', '.join(pods)}"))
            changes += _drain_changes(ctx, h, self.opts)
        return self.planned("would-change", f"{len(todo)} worker(s) not at {self.opts.to}, "
                            f"{self.opts.max_unavailable} at a time", changes)

    def run(self, ctx: Context) -> PhaseResult:
        todo, out = self._todo(ctx, read_versions(ctx), ctx.inv.workers)
        out.update(nodeops.each_node(todo, lambda h: self._node(ctx, h, first=False), self.opts,
                                     "upgrade.node-failed", self.resume))
        return nodeops.node_result(
            self, out, remedy="fix the cause, then re-run gpuk8s upgrade: upgraded nodes are skipped",
            unchanged=f"every worker runs {self.opts.to}",
            changed=lambda done, resumed: f"upgraded {len(done) + len(resumed)} worker(s)")


class UpgradeManifests(UpgradeStep):
    """The GPU manifests (device plugin, ...) at the new minor's pins: the GPU phase with the new minor's
    inventory."""

    name = "upgrade-manifests"
    title = "move the manifests to the new minor's pins"

    def _gpu(self, ctx: Context) -> tuple[Phase, Context]:

        return GPUNodes(), replace(ctx, inv=target_inventory(ctx.inv, self.opts.to))

    def plan(self, ctx: Context) -> PhasePlan:
        phase, tctx = self._gpu(ctx)
        p = phase.plan(tctx)
        return self.planned(p.status, p.reason, p.changes)

    def run(self, ctx: Context) -> PhaseResult:
        phase, tctx = self._gpu(ctx)
        res = phase.run(tctx)
        return self.result(res.status, res.message, res.remedy)


def step_phases(opts: UpgradeOptions, on_node: Callable[[str, float], None] | None = None) -> list[Phase]:
    return [UpgradePrepare(opts), UpgradeControlPlanes(opts, on_node), UpgradeWorkers(opts, on_node),
            UpgradeManifests(opts)]


def current_state(ctx: Context) -> NodeVersions:
    """The node versions as the cluster reports them (for the flow's choice of steps)."""
    if not ctx.initialized():
        raise PhaseError(f"{ctx.cp.name} runs no control plane", "run gpuk8s install first")
    return read_versions(ctx)

