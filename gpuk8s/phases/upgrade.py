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
from typing import Any

import yaml

from gpuk8s import findings, gpuplan, plainyaml, versions
from gpuk8s.errors import GpuK8sError
from gpuk8s.install.prepare import prepare
from gpuk8s.inventory.model import Host, InstallSettings, Inventory
from gpuk8s.kube import state
from gpuk8s.kube.client import KubeError, drain_args
from gpuk8s.phases import shell
from gpuk8s.phases.base import Change, Context, Phase, PhaseError, PhasePlan, PhaseResult, before_steps
from gpuk8s.phases.gpu import GPUNodes
from gpuk8s.phases.hostfiles import tail
from gpuk8s.remote import Session, for_each_host

log = logging.getLogger("gpuk8s.upgrade")

APISERVER_MANIFEST = "/etc/kubernetes/manifests/kube-apiserver.yaml"
# set on a node before the upgrade cordons it, removed after its uncordon: a node found cordoned without it was
# cordoned by someone else (maintenance) and stays cordoned; with it, a resumed run knows to uncordon it. Under
# node-restriction.kubernetes.io: the NodeRestriction admission plugin (on in every kubeadm cluster) forbids a
# kubelet to set such a label on its own Node, so a host cannot mark itself for gpuk8s to uncordon (gardener's
# IsNodeLabelAllowedForKubelet states the rule; the former key, gpuk8s.io/cordoned-by-upgrade, was settable).
CORDONED_BY_UPGRADE = "gpuk8s.io.node-restriction.kubernetes.io/cordoned-by"
_VERSION = re.compile(r"^v?1\.(\d{1,3})\.(\d{1,3})")
_IMAGE_TAG = re.compile(r":v?(1\.\d{1,3}\.\d{1,3})(?:[-+@].*)?$")
MAX_MANIFEST = 256 << 10  # kubeadm's kube-apiserver.yaml is about 4 KiB; a larger one is not read


class NodeFailure(PhaseError):
    """A node's upgrade stopped; `id` is its finding (gpuk8s/findings.py)."""

    def __init__(self, finding_id: str, message: str, remedy: str = "") -> None:
        super().__init__(message, remedy)
        self.id = finding_id


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
    cordoned_by_upgrade: set[str] = field(default_factory=set)  # nodes carrying CORDONED_BY_UPGRADE

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
            if CORDONED_BY_UPGRADE in (n.get("metadata", {}).get("labels") or {})}
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


def gpu_pods(ctx: Context, node: str) -> list[str]:
    """The pods on `node` that hold GPUs and have not finished (namespace/name), DaemonSets' left out."""
    return state.gpu_pods(ctx.kube.get("pods", namespace="*"), node)


@dataclass
class UpgradeOptions:
    to: str  # the minor of this step, "1.N"
    max_unavailable: int = 1
    gpu_pod_timeout: float = 3600
    drain_timeout: int = 600
    poll: float = 2.0
    findings: list[findings.Finding] = field(default_factory=list)  # one per node done or failed, all steps


class UpgradeStep(Phase):
    """Base of the per-step phases: the step's target minor and the per-node upgrade."""

    resume = "gpuk8s upgrade"  # the command that resumes the run, named in remedies (gpuk8s driver upgrade too)

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

    def _node(self, ctx: Context, h: Host, first: bool, emit: Callable[[str], None]) -> str:
        """Upgrade one node in kubeadm's order; what was done, in words. Its finding goes to opts.findings."""
        subject = findings.node(h.name)
        try:
            done = self._upgrade_node(ctx, h, first, emit)
        except NodeFailure as e:
            self.opts.findings.append(findings.failed(e.id, f"{h.name}: {e.message}", e.remedy, subject=subject))
            raise
        except GpuK8sError as e:
            self.opts.findings.append(findings.failed("upgrade.node-failed", f"{h.name}: {e.message}",
                                                      str(e.remedy), subject=subject))
            raise
        self.opts.findings.append(findings.passed("upgrade.node-upgraded", f"{h.name} runs {self.opts.to}: {done}",
                                                  subject=subject))
        return done

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
        mine, waited = self._vacate(ctx, h, emit, "upgrade.drain-failed")
        if waited:
            did.append(f"waited for GPU pods {', '.join(waited)}")
        _packages(ctx, h, to, "kubelet kubectl", restart=True)
        back = _give_back(ctx, h.name) if mine else "left cordoned (it was cordoned before the upgrade)"
        seconds = time.monotonic() - t0
        self.on_node(h.name, seconds)
        emit(f"{h.name}: upgraded to {to} in {seconds:.1f} s")
        return "; ".join([*did, "drained", f"kubelet and kubectl {to} (held)", back, f"{seconds:.1f} s"])

    def _vacate(self, ctx: Context, h: Host, emit: Callable[[str], None], drain_id: str) -> tuple[bool, list[str]]:
        """Cordon the node (marked), wait for its GPU pods, drain it: whether the cordon is gpuk8s's to undo, and the
        GPU pods waited for. NodeFailure(drain_id) when the drain fails (the node stays cordoned)."""
        mine = self._take_cordon(ctx, h)
        waited = self._wait_gpu_pods(ctx, h, emit, mine)
        try:
            ctx.kube.drain(h.name, self.opts.drain_timeout)
        except KubeError as e:
            raise NodeFailure(drain_id, f"drain of {h.name} failed: {e.message}",
                              f"see why its pods cannot leave; re-run {self.resume} (it resumes), or "
                              f"'kubectl uncordon {h.name}' to put it back as it was") from None
        return mine, waited

    cordon_mark = "true"  # the value of CORDONED_BY_UPGRADE this command's cordon carries

    def _take_cordon(self, ctx: Context, h: Host) -> bool:
        """Whether the cordon of this upgrade is gpuk8s's to undo: a node cordoned by someone else before
        gpuk8s touched it stays cordoned; one gpuk8s cordons is marked first (CORDONED_BY_UPGRADE), so that a
        run stopped before its uncordon is finished by the next."""
        found = ctx.kube.get("nodes", h.name)
        node = found[0] if found else {}
        if CORDONED_BY_UPGRADE in (node.get("metadata", {}).get("labels") or {}):
            return True
        if node.get("spec", {}).get("unschedulable"):
            return False
        ctx.kube.label(h.name, {CORDONED_BY_UPGRADE: self.cordon_mark})
        return True

    def _resume_done(self, ctx: Context, v: NodeVersions, h: Host) -> str:
        """A node found at the target: uncordoned when an interrupted run of gpuk8s left it cordoned."""
        if h.name in v.cordoned_by_upgrade:
            return f"already at {self.opts.to}; {_give_back(ctx, h.name)} (an earlier run stopped before it)"
        return f"already at {self.opts.to}"

    def _wait_gpu_pods(self, ctx: Context, h: Host, emit: Callable[[str], None], mine: bool = True) -> list[str]:
        """Cordon, then wait for the node's GPU pods to finish (never killed silently); their names. On a
        timeout the node is put back as it was: uncordoned only when the cordon was gpuk8s's (`mine`)."""
        pods = gpu_pods(ctx, h.name)
        if not pods:
            return []
        emit(f"{h.name}: waiting up to {self.opts.gpu_pod_timeout:g} s for GPU pods to finish: {', '.join(pods)}")
        ctx.kube.cordon(h.name)  # no new pod lands on the node while its GPU pods finish
        deadline = time.monotonic() + self.opts.gpu_pod_timeout
        left = pods
        while left:
            if time.monotonic() > deadline:
                state = _give_back(ctx, h.name) if mine else "cordoned, as it was before the upgrade"
                raise NodeFailure("upgrade.gpu-pods-timeout",
                                  f"{h.name}: GPU pods still running after {self.opts.gpu_pod_timeout:g} s: "
                                  f"{', '.join(left)}; the node was left as it was ({state})",
                                  "let them finish or stop them, or raise --gpu-pod-timeout; then re-run "
                                  f"{self.resume} (it resumes)")
            time.sleep(self.opts.poll)
            left = gpu_pods(ctx, h.name)
        emit(f"{h.name}: GPU pods finished: {', '.join(pods)}")
        return pods


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
        ctx.facts = {r.host.name: r.facts for r in rep.preflight if r.host.name in passed and r.facts is not None}
        ctx.plans = gpuplan.plans(ctx.inv, ctx.facts)
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
        r = self.result("pending")
        v = read_versions(ctx)
        for i, h in enumerate(ctx.inv.control_planes):
            if self._done(v, h):
                r.hosts[h.name] = self._resume_done(ctx, v, h)
                continue
            if h.name not in ctx.sessions:
                raise PhaseError(f"control plane {h.name} is not reachable", "bring it back, then re-run")
            r.hosts[h.name] = self._node(ctx, h, first=i == 0, emit=ctx.emit)
        changed = [n for n, s in r.hosts.items() if not s.startswith("already") or "uncordoned" in s]
        r.status = "changed" if changed else "unchanged"
        r.message = f"upgraded {', '.join(changed)}" if changed else f"every control plane runs {self.opts.to}"
        return r


def _give_back(ctx: Context, node: str) -> str:
    """Uncordon a node gpuk8s cordoned, then drop its mark (in this order: a stop in between is redone)."""
    ctx.kube.uncordon(node)
    ctx.kube.label(node, {CORDONED_BY_UPGRADE: None})
    return "uncordoned"


def _drain_changes(ctx: Context, h: Host, opts: UpgradeOptions) -> list[Change]:
    return [
        Change(f"wait (at most {opts.gpu_pod_timeout:g} s) for the GPU pods on {h.name}, then drain it", "",
               "kubectl " + " ".join(drain_args(h.name, opts.drain_timeout))),
        Change(f"kubelet and kubectl {opts.to} (held), kubelet restarted", h.name,
               shell.command("upgrade-packages", **_packages_values(ctx, h, opts.to, ["kubelet", "kubectl"], True))),
        Change(f"uncordon {h.name}", "", f"kubectl uncordon {h.name}"),
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
            pods = gpu_pods(ctx, h.name)
            if pods:
                changes.append(Change(f"GPU pods on {h.name} waited for: {', '.join(pods)}"))
            changes += _drain_changes(ctx, h, self.opts)
        return self.planned("would-change", f"{len(todo)} worker(s) not at {self.opts.to}, "
                            f"{self.opts.max_unavailable} at a time", changes)

    def run(self, ctx: Context) -> PhaseResult:
        r = self.result("pending")
        v = read_versions(ctx)
        todo = []
        for h in ctx.inv.workers:
            if self._done(v, h):
                r.hosts[h.name] = self._resume_done(ctx, v, h)
            elif h.name not in ctx.sessions:
                r.hosts[h.name] = "failed: not reachable"
            else:
                todo.append(h)
        for name, res in for_each_host(todo, lambda h: self._node(ctx, h, first=False, emit=ctx.emit),
                                       self.opts.max_unavailable).items():
            r.hosts[name] = (f"failed: {getattr(res, 'message', res)}" if isinstance(res, BaseException)
                             else str(res))
        failed = [n for n, s in r.hosts.items() if s.startswith("failed")]
        done = [n for n, s in r.hosts.items()
                if not s.startswith(("failed", "already")) or s.startswith("already") and "uncordoned" in s]
        if failed:
            r.status = "failed"
            r.message = "; ".join(f"{n}: {r.hosts[n]}" for n in failed)
            r.remedy = "fix the cause, then re-run gpuk8s upgrade: upgraded nodes are skipped"
        else:
            r.status = "changed" if done else "unchanged"
            r.message = f"upgraded {len(done)} worker(s)" if done else f"every worker runs {self.opts.to}"
        return r


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

