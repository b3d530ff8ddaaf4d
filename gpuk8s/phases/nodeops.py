"""Node operations: what `gpuk8s upgrade`, `gpuk8s driver upgrade` and `gpuk8s allocator` do to a node around their
own work, and the one executor that runs that work over the nodes.

Around a node's work: its cordon taken and marked with the command's own value of CORDONED_BY (a run stopped between
its cordon and its uncordon is finished by the next run of the same command, never by another one, and a node
someone else cordoned stays cordoned); its GPU pods named and waited for (never killed); its drain. After the work,
the cordon given back: uncordon, then the mark dropped (in this order: a stop in between is redone).

The executor (`each_node`) runs the work `max_unavailable` nodes at a time and gives one typed outcome per node
(done, already, resumed or failed, with its finding); a phase's result is drawn from those outcomes (`node_result`),
never from the words of their details.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from gpuk8s import findings
from gpuk8s.errors import GpuK8sError
from gpuk8s.inventory.model import Host
from gpuk8s.kube import state
from gpuk8s.kube.client import KubeClient, KubeError, drain_args
from gpuk8s.phases.base import Change, Phase, PhaseError, PhaseResult
from gpuk8s.phases.poll import until
from gpuk8s.remote import for_each_host

# set on a node before a command cordons it, removed after its uncordon; its value names the command ("true":
# gpuk8s upgrade, "driver-upgrade", "allocator"). A node found cordoned without it was cordoned by someone else
# (maintenance) and stays cordoned; with the command's own value, a resumed run knows to uncordon it. Under
# node-restriction.kubernetes.io: the NodeRestriction admission plugin (on in every kubeadm cluster) forbids a kubelet
# to set such a label on its own Node, so a host cannot mark itself for gpuk8s to uncordon (gardener's
# IsNodeLabelAllowedForKubelet states the rule; the former key, gpuk8s.io/cordoned-by-upgrade, was settable).
CORDONED_BY = "gpuk8s.io.node-restriction.kubernetes.io/cordoned-by"

Status = Literal["done", "already", "resumed", "failed"]


class NodeFailure(PhaseError):
    """A node's operation stopped; `id` is its finding (gpuk8s/findings.py)."""

    def __init__(self, finding_id: str, message: str, remedy: str = "") -> None:
        super().__init__(message, remedy)
        self.id = finding_id


@dataclass(kw_only=True)
class NodeOptions:
    """How the node operations of one command run: how many nodes at once, how long GPU pods and a drain may take."""

    max_unavailable: int = 1
    gpu_pod_timeout: float = 3600
    drain_timeout: int = 600
    poll: float = 2.0
    findings: list[findings.Finding] = field(default_factory=list)  # one per node done or failed


@dataclass(frozen=True)
class NodeOutcome:
    """What became of one node: `detail` in words (the report's per-host line)."""

    status: Status
    detail: str
    remedy: str = ""

    def shown(self) -> str:
        return f"failed: {self.detail}" if self.status == "failed" else self.detail


def gpu_pods(kube: KubeClient, node: str) -> list[str]:
    """The pods on `node` that hold GPUs and have not finished (namespace/name), DaemonSets' left out."""
    return state.gpu_pods(kube.get("pods", namespace="*"), node)


def marked(kube: KubeClient, mark: str) -> set[str]:
    """The nodes that carry this command's cordon mark, in one read: the command stopped between their cordon and
    their uncordon (another command's mark is that command's to finish)."""
    return {name for name, node in state.by_name(kube.get("nodes")).items()
            if state.node_state(node).labels.get(CORDONED_BY) == mark}


def take_cordon(kube: KubeClient, node: str, mark: str) -> bool:
    """Whether the cordon of this command is gpuk8s's to undo: the node carries this command's mark (an earlier run
    of it stopped), or it is schedulable and gets the mark now (also over another command's mark: a run of that one
    stopped before its cordon or after its uncordon, and nothing holds the node); a node cordoned by someone else,
    or by another command of gpuk8s (its mark, the node unschedulable), is not."""
    found = kube.get("nodes", node)
    labels = state.node_state(found[0]).labels if found else {}  # a malformed object: StateError
    spec = found[0].get("spec") if found else None
    if labels.get(CORDONED_BY) == mark:
        return True
    if isinstance(spec, dict) and spec.get("unschedulable"):
        return False
    kube.label(node, {CORDONED_BY: mark})
    return True


def give_back(kube: KubeClient, node: str) -> str:
    """Uncordon a node gpuk8s cordoned, then drop its mark (in this order: a stop in between is redone)."""
    kube.uncordon(node)
    kube.label(node, {CORDONED_BY: None})
    return "uncordoned"


def left_as_it_was(kube: KubeClient, node: str, mine: bool) -> str:
    """The cordon given back where it was this command's; else the node stays cordoned as someone left it."""
    return give_back(kube, node) if mine else "left cordoned (it was cordoned before)"


def wait_gpu_pods(kube: KubeClient, node: str, opts: NodeOptions, emit: Callable[[str], None], resume: str,
                  mine: bool = True) -> list[str]:
    """Cordon, then wait for the node's GPU pods to finish (never killed silently); their names. On a timeout the
    node is put back as it was (uncordoned only when the cordon was gpuk8s's, `mine`): NodeFailure."""
    pods = gpu_pods(kube, node)
    if not pods:
        return []
    emit(f"{node}: waiting up to {opts.gpu_pod_timeout:g} s for GPU pods to finish: {', '.join(pods)}")
    kube.cordon(node)  # no new pod lands on the node while its GPU pods finish

    def finished() -> tuple[bool, list[str]]:
        left = gpu_pods(kube, node)
        return not left, left

    ok, left = until(finished, opts.gpu_pod_timeout, opts.poll)
    if not ok:
        back = give_back(kube, node) if mine else "cordoned, as it was before"
        raise NodeFailure("upgrade.gpu-pods-timeout",
                          f"GPU pods still running after {opts.gpu_pod_timeout:g} s: {', '.join(left)}; the node "
                          f"was left as it was ({back})",
                          f"let them finish or stop them, or raise --gpu-pod-timeout; then re-run {resume} (it "
                          "resumes)")
    emit(f"{node}: GPU pods finished: {', '.join(pods)}")
    return pods


def vacate(kube: KubeClient, node: str, mark: str, opts: NodeOptions, emit: Callable[[str], None], resume: str,
           drain_id: str) -> tuple[bool, list[str]]:
    """Cordon the node (marked), wait for its GPU pods, drain it: whether the cordon is gpuk8s's to undo, and the GPU
    pods waited for. NodeFailure(drain_id) when the drain fails (the node stays cordoned)."""
    mine = take_cordon(kube, node, mark)
    waited = wait_gpu_pods(kube, node, opts, emit, resume, mine)
    try:
        kube.drain(node, opts.drain_timeout)
    except KubeError as e:
        raise NodeFailure(drain_id, f"drain of {node} failed: {e.message}",
                          f"see why its pods cannot leave; re-run {resume} (it resumes), or 'kubectl uncordon "
                          f"{node}' to put it back as it was") from None
    return mine, waited


def drain_change(node: str, opts: NodeOptions) -> Change:
    """--dry-run's line for vacate: the GPU pods waited for, then the drain."""
    return Change(f"wait (at most {opts.gpu_pod_timeout:g} s) for the GPU pods on {node}, then drain it", "",
                  "kubectl " + " ".join(drain_args(node, opts.drain_timeout)))


def uncordon_change(node: str) -> Change:
    return Change(f"uncordon {node}", "", f"kubectl uncordon {node}")


def attempt(h: Host, work: Callable[[Host], NodeOutcome], opts: NodeOptions, failure_id: str,
            resume: str) -> NodeOutcome:
    """One node's work, its failure turned into an outcome and a finding (NodeFailure's id, else `failure_id`); the
    work records the finding of a node it brought through."""
    try:
        return work(h)
    except GpuK8sError as e:
        fid = e.id if isinstance(e, NodeFailure) else failure_id
        remedy = str(e.remedy) or f"fix the cause, then re-run {resume}"
        message = e.message if e.message.startswith(h.name) else f"{h.name}: {e.message}"
        opts.findings.append(findings.failed(fid, message, remedy, subject=findings.node(h.name)))
        return NodeOutcome("failed", e.message, remedy)


def each_node(hosts: list[Host], work: Callable[[Host], NodeOutcome], opts: NodeOptions, failure_id: str,
              resume: str, at_once: int | None = None) -> dict[str, NodeOutcome]:
    """`work` on every host, `at_once` (default: opts.max_unavailable) at a time; one node's failure never stops
    another. An error that is no GpuK8sError (a defect) fails its node with its type named."""
    at_once = opts.max_unavailable if at_once is None else at_once
    got: dict[str, NodeOutcome | BaseException] = {}
    if at_once <= 1 or len(hosts) <= 1:
        # one at a time: in this thread, so that Ctrl-C stops the work where it is (a worker thread would go on
        # draining and relabelling after the run released the cluster lock)
        for h in hosts:
            try:
                got[h.name] = attempt(h, work, opts, failure_id, resume)
            except Exception as e:  # a defect: its node fails, the others go on, as for_each_host does
                got[h.name] = e
    else:
        got = for_each_host(hosts, lambda h: attempt(h, work, opts, failure_id, resume), at_once)
    out: dict[str, NodeOutcome] = {}
    for h in hosts:
        res = got[h.name]
        if isinstance(res, NodeOutcome):
            out[h.name] = res
        else:
            opts.findings.append(findings.failed(failure_id, f"{h.name}: {type(res).__name__}: {res}",
                                                 f"re-run {resume}", subject=findings.node(h.name)))
            out[h.name] = NodeOutcome("failed", f"{type(res).__name__}: {res}")
    return out


def unreachable(opts: NodeOptions, name: str, failure_id: str, why: str, resume: str) -> NodeOutcome:
    """A node the command could not reach: failed, with its finding."""
    remedy = f"bring it back, then re-run {resume}"
    opts.findings.append(findings.failed(failure_id, f"{name}: not reachable ({why})", remedy,
                                         subject=findings.node(name)))
    return NodeOutcome("failed", f"not reachable ({why})", remedy)


def node_result(phase: Phase, outcomes: dict[str, NodeOutcome], *, remedy: str, unchanged: str,
                changed: Callable[[list[str], list[str]], str]) -> PhaseResult:
    """A phase's result from its nodes' outcomes: failed (each failed node named, `remedy`), else changed where a
    node was done or resumed (`changed(done, resumed)` says it), else unchanged (`unchanged`)."""
    r = phase.result("pending")
    r.hosts = {n: o.shown() for n, o in outcomes.items()}
    failed = [n for n, o in outcomes.items() if o.status == "failed"]
    done = [n for n, o in outcomes.items() if o.status == "done"]
    resumed = [n for n, o in outcomes.items() if o.status == "resumed"]
    if failed:
        r.status, r.remedy = "failed", remedy
        r.message = "; ".join(f"{n}: {r.hosts[n]}" for n in failed)
    elif done or resumed:
        r.status, r.message = "changed", changed(done, resumed)
    else:
        r.status, r.message = "unchanged", unchanged
    return r
