"""`gpuk8s doctor [POD | node/NAME] [--all] [--fix]`: why a GPU pod is Pending or failing, why a GPU node lacks its
GPUs. Reads the cluster through the kube client seam and each node concerned over SSH (one round trip), names the
causes (gpuk8s/doctor/classify.py) as findings with evidence and a remedy; exit 0 when nothing is wrong, 1 when a
cause was found. `--fix` re-runs the install phases that remedy what gpuk8s knows how to fix (node preparation:
the runtime default; gpu: the device plugin's manifests and config, the node's labels), shown first and asked."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpuk8s import gpuplan, ui
from gpuk8s.commands.common import passwords
from gpuk8s.commands.status import Cluster, connect
from gpuk8s.doctor import classify, evidence
from gpuk8s.doctor.evidence import ClusterEvidence
from gpuk8s.exitcodes import ExitCode
from gpuk8s.findings import Finding
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube import state
from gpuk8s.kube.client import KubeError
from gpuk8s.logs import mask
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.remote import Session, for_each_host
from gpuk8s.report import findings as report
from gpuk8s.text import clean

SCHEMA_VERSION = 1


class Diagnosis:
    """One doctor run: the evidence read, what was looked at, and the causes found."""

    def __init__(self, ev: ClusterEvidence, pods: list[tuple[str, str]], nodes: list[str],
                 found: list[Finding]) -> None:
        self.ev, self.pods, self.nodes, self.findings = ev, pods, nodes, found

    def to_json(self, fixes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "ok": not self.findings,
                "checked": {"pods": [f"{ns}/{n}" for ns, n in self.pods], "nodes": list(self.nodes)},
                **report.to_json(self.findings), "fixes": fixes or []}


def _find_pod(ev: ClusterEvidence, target: str) -> tuple[str, str] | None:
    if "/" in target:
        ns, _, name = target.partition("/")
        return (ns, name) if ev.pod(ns, name) is not None else None
    hits = [classify.pod_key(p) for p in ev.pods if (p.get("metadata") or {}).get("name") == target]
    return hits[0] if len(hits) == 1 else None


def diagnose(inv: Inventory, cluster: Cluster, target: str | None, every: bool, ssh: bool,
             sudo: dict[str, str]) -> Diagnosis:
    """Read, select what to look at, read its hosts and logs, classify."""
    kube = cluster.kube
    ev = evidence.read_cluster(kube)
    ev.plans = gpuplan.plans(inv)
    hosts = {h.name: h for h in inv.hosts}
    pods: list[tuple[str, str]] = []
    nodes: list[str] = []
    if target and target.startswith("node/"):
        nodes = [target[len("node/"):]]
        if nodes[0] not in ev.nodes and nodes[0] not in ev.plans:
            raise LookupError(f"no node {nodes[0]} in the cluster or the inventory")
    elif target:
        key = _find_pod(ev, target)
        if key is None:
            raise LookupError(f"no pod {target} (give NAMESPACE/NAME when the name is in several namespaces)")
        pods = [key]
    else:
        gpu_pods = [p for p in ev.pods if classify.is_gpu_pod(p)]
        pods = [classify.pod_key(p) for p in gpu_pods if every or classify.troubled(p)]
        nodes = [n for n, p in ev.plans.items() if p.gpu_node and (every or classify.node_problem(n, ev))]
    # the hosts concerned: the nodes, and the nodes the pods are bound to
    concern = set(nodes)
    for ns, name in pods:
        p = ev.pod(ns, name)
        if p is not None and (p.get("spec") or {}).get("nodeName"):
            concern.add(str(p["spec"]["nodeName"]))
    if ssh:
        def read(h: Host) -> evidence.HostEvidence:
            with Session(h, sudo.get(h.name)) as s:
                return evidence.read_host(s, inv.cluster.container_runtime)

        got = for_each_host([hosts[n] for n in sorted(concern) if n in hosts], read, 16)
        for n, v in got.items():
            ev.hosts[n] = v if isinstance(v, evidence.HostEvidence) else evidence.HostEvidence(
                unreachable=f"reading the host failed: {mask(clean(str(v)))[:300]}",
                runtime=inv.cluster.container_runtime)
        facts = {n: h.facts for n, h in ev.hosts.items() if h.facts is not None}
        ev.plans = gpuplan.plans(inv, facts)
    logs = [k for k in pods if (ev.pod(*k) or {}).get("spec", {}).get("nodeName")]
    for n in concern:
        plugin = classify.plugin_pod(ev, n)
        if plugin is not None:
            logs.append(classify.pod_key(plugin))
    evidence.read_logs(kube, ev, logs)
    found: list[Finding] = []
    for n in nodes:
        h = ev.hosts.get(n)
        if h is not None and h.unreachable and n not in ev.nodes:
            continue
        found += classify.node_causes(n, ev)
    for ns, name in pods:
        p = ev.pod(ns, name)
        if p is not None:
            found += classify.pod_causes(p, ev)
    return Diagnosis(ev, pods, sorted(nodes), found)


def _fix_targets(d: Diagnosis) -> dict[str, set[str]]:
    """phase -> the hosts whose causes it remedies."""
    out: dict[str, set[str]] = {}
    for f in d.findings:
        phase = classify.fixable(f, d.ev)
        node = _finding_node(d, f)
        if phase and node:
            out.setdefault(phase, set()).add(node)
    return out


def apply_fixes(inv: Inventory, targets: dict[str, set[str]], sudo: dict[str, str], output: Output) -> list[Any]:
    """Re-run prepare on the hosts that need it, then the gpu phase (manifests, labels) with every GPU node's plan
    from fresh facts; the results of each phase."""
    from gpuk8s.phases.base import Context, Options, run_phases
    from gpuk8s.phases.gpu import GPUNodes, RestartPlugin
    from gpuk8s.phases.lock import Lock
    from gpuk8s.phases.prepare import Prepare, refresh_facts
    from gpuk8s.report.cluster import phase_printer

    hosts = {h.name: h for h in inv.hosts}
    names = sorted({n for ns in targets.values() for n in ns})
    ctx = Context(inv, options=Options(only=[hosts[n] for n in names if n in hosts]), sudo_passwords=sudo,
                  emit=phase_printer(output))
    results: list[Any] = []
    try:
        cp = inv.control_planes[0]
        ctx.sessions[cp.name] = Session(cp, sudo.get(cp.name))
        phases: list[Any] = [Lock()] + ([Prepare()] if "prepare" in targets else [])
        if run_phases(phases, ctx, results) and all(r.status != "failed" for r in results):
            sessions = {h.name: Session(h, sudo.get(h.name)) for h in inv.hosts if h.name not in ctx.sessions}
            ctx.sessions.update(sessions)
            facts = refresh_facts({n: s for n, s in ctx.sessions.items()}, ctx.concurrency)
            ctx.facts = facts
            ctx.plans = gpuplan.plans(inv, facts)
            if {"prepare", "gpu"} & set(targets):
                run_phases([GPUNodes()], ctx, results)
            restarted = {n for r in results if r.name == "gpu" for n, what in r.hosts.items()
                         if "device plugin restarted" in what}
            if set(targets.get("plugin", ())) - restarted:
                run_phases([RestartPlugin(sorted(set(targets["plugin"]) - restarted))], ctx, results)
    finally:
        ctx.close()
    return results


# After a fix, a restarted plugin registers and a relabelled node's plugin reloads its config within seconds:
# the diagnosis is taken again, for at most this long, while a node that was fixed still shows a cause.
SETTLE_S = 60.0
SETTLE_EVERY_S = 5.0


def _finding_node(d: Diagnosis, f: Finding) -> str:
    if f.subject is None:
        return ""
    if f.subject.kind == "node":
        return f.subject.name
    ns, _, name = f.subject.name.partition("/")
    return str(((d.ev.pod(ns, name) or {}).get("spec") or {}).get("nodeName", "") or "")


def _unsettled(d: Diagnosis, fixed: set[str]) -> bool:
    """A node that was fixed still shows a cause a fix acts on (a pod's cause, such as a pod started without the
    nvidia runtime, stays until the pod is made again: not waited for)."""
    return any(f.subject is not None and f.subject.kind == "node" and f.subject.name in fixed
               and classify.fixable(f, d.ev) for f in d.findings)


def settle(d: Diagnosis, again: Callable[[], Diagnosis], fixed: set[str], timeout: float = SETTLE_S,
           every: float = SETTLE_EVERY_S, say: Callable[[str], None] = lambda _: None) -> Diagnosis:
    """The diagnosis once the fixed nodes show no cause a fix acts on, or the last one taken when `timeout` ran
    out (or when taking it again failed)."""
    if not _unsettled(d, fixed):
        return d
    say(f"waiting up to {timeout:.0f} s for {', '.join(sorted(fixed))} to settle")
    deadline = time.monotonic() + timeout
    while _unsettled(d, fixed) and time.monotonic() + every < deadline:
        time.sleep(every)
        try:
            d = again()
        except typer.Exit:
            break
    return d


def _describe(targets: dict[str, set[str]]) -> list[str]:
    what = {"prepare": "re-run node preparation (runtime default, container toolkit; the device plugin restarted "
                       "where the runtime is reconfigured) on",
            "gpu": "re-run the gpu phase (device plugin manifests and config, node labels) for",
            "plugin": "restart the device plugin pod on"}
    order = sorted(targets.items(), key=lambda kv: list(what).index(kv[0]))
    return [f"{what[p]} {', '.join(sorted(ns))}" for p, ns in order]


def _render(d: Diagnosis, output: Output, fixes: list[dict[str, Any]]) -> None:
    if output == Output.json:
        ui.emit_json(d.to_json(fixes))
    elif d.findings:
        rows, styles = report.rows(d.findings, "subject")
        for r, f in zip(rows, d.findings, strict=True):
            r[0] = str(f.subject) if f.subject is not None else ""
        ui.table("gpuk8s doctor", ["subject", *report.COLUMNS], rows, styles)
    else:
        what = (f"{len(d.pods)} GPU pod(s), {len(d.nodes)} GPU node(s) looked at" if (d.pods or d.nodes)
                else "no Pending or failing GPU pod, no GPU node short of its plan")
        ui.say(ui.console(), f"doctor: nothing wrong found ({what})")


def register(app: typer.Typer, load_inventory: Any) -> None:
    @app.command()
    def doctor(
        target: str | None = typer.Argument(None, help="A pod (NAME or NAMESPACE/NAME) or node/NAME; default: every "  # noqa: UP007
                                            "Pending or failing GPU pod and every GPU node short of its plan."),
        every: bool = typer.Option(False, "--all", help="Look at every GPU pod and GPU node, not only those that "
                                   "look wrong."),
        fix: bool = typer.Option(False, "--fix", help="Apply the remedies gpuk8s knows how to apply safely (re-run "
                                 "node preparation or the gpu phase on the nodes concerned, restart a device plugin "
                                 "pod); shown first and asked."),
        yes: bool = typer.Option(False, "--yes", "-y", help="With --fix: do not ask."),
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        kubeconfig: Path | None = typer.Option(  # noqa: UP007
            None, "--kubeconfig", help="Use this machine's kubectl with this kubeconfig instead of kubectl on the "
            "first control plane; hosts are then not read over SSH."),
        context: str | None = typer.Option(None, "--context", help="The kubeconfig context (with --kubeconfig)."),  # noqa: UP007
    ) -> None:
        """Why a GPU pod is Pending or failing, why a GPU node lacks its GPUs: causes with evidence and remedies
        (docs/troubleshooting.md)."""
        inv = load_inventory(inventory, output)
        err = ui.console(stderr=True)
        sudo = passwords(inv) if kubeconfig is None else {}

        def run() -> Diagnosis:
            cluster = connect(inv, kubeconfig, context, sudo)
            try:
                return diagnose(inv, cluster, target, every, kubeconfig is None, sudo)
            except LookupError as e:
                ui.say(err, str(e))
                raise typer.Exit(ExitCode.USAGE) from None
            except (KubeError, state.StateError) as e:
                ui.say(err, f"cannot read the cluster: {e}")
                raise typer.Exit(ExitCode.FAILED) from None
            finally:
                cluster.close()

        d = run()
        fixes: list[dict[str, Any]] = []
        if fix and d.findings:
            targets = _fix_targets(d)
            if not targets:
                ui.say(err, "none of these causes is one gpuk8s can fix by itself: see each remedy")
            elif kubeconfig is not None:
                ui.say(err, "--fix re-runs install phases over SSH: leave out --kubeconfig")
            else:
                plan = _describe(targets)
                ui.say(err, "gpuk8s doctor --fix would:\n" + "\n".join(f"  {line}" for line in plan))
                if not yes:
                    if not sys.stdin.isatty():
                        ui.say(err, "not applied: pass --yes to apply without a prompt")
                        _render(d, output, fixes)
                        raise typer.Exit(ExitCode.FAILED)
                    if not typer.confirm("apply?", default=False, err=True):
                        raise typer.Exit(ExitCode.FAILED)
                results = apply_fixes(inv, targets, sudo, output)
                fixes = [r.to_json() for r in results]
                d = run()  # what is left after the fix
                if all(r.status != "failed" for r in results) and any(r.status == "changed" for r in results):
                    d = settle(d, run, {n for ns in targets.values() for n in ns}, say=lambda m: ui.say(err, m))
        _render(d, output, fixes)
        raise typer.Exit(ExitCode.FAILED if d.findings else ExitCode.OK)
